"""Re-reading one store line by its offset and the decoded-line cache (otel_verl/store/_lines.py),
shared by the SQLite index and the viewer's lake."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from otel_verl.store import LineCache, line_at


@given(lines=st.lists(st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"")), min_size=1,
                      max_size=8), last_newline=st.booleans())
def test_line_at_gives_each_line_from_its_start_and_none_elsewhere(tmp_path_factory, lines,
                                                                   last_newline):
    path = tmp_path_factory.mktemp("lines") / "store.jsonl"
    data = b"\n".join(lines) + (b"\n" if last_newline else b"")
    path.write_bytes(data)
    starts, offset = {}, 0
    for i, line in enumerate(lines):
        starts[offset] = line + (b"\n" if i < len(lines) - 1 or last_newline else b"")
        offset += len(line) + 1
    for at in range(len(data) + 1):
        want = starts.get(at, b"" if at == len(data) and data.endswith(b"\n") else None)
        assert line_at(str(path), at) == want, at
    assert line_at(str(path / "missing"), 0) is None


@given(reads=st.lists(st.integers(0, 6), max_size=40), size=st.integers(1, 4))
def test_the_cache_keeps_the_lines_used_last(reads, size):
    cache, recent = LineCache(size), []
    for offset in reads:
        if cache.get("f", offset) is None:
            cache.put("f", offset, [{"offset": offset}])
        recent = [o for o in recent if o != offset] + [offset]
        recent = recent[-size:]
        assert len(cache) == len(recent)
    for offset in range(7):
        got = cache.get("f", offset) if offset in recent else None
        assert got == ([{"offset": offset}] if offset in recent else None)
    cache.clear()
    assert len(cache) == 0 and cache.get("f", reads[-1] if reads else 0) is None
