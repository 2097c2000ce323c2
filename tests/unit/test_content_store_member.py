"""The content store's thread writes a long node without building its line (issue 18): the
member is compressed piece by piece from the node's bytes, so a 128k-token prompt is not
copied (twice or three times, holding the GIL) on the store's thread while the rollout's loop
waits for it; and what is written still reads back exactly, hostile tokens included."""

from __future__ import annotations

import gzip
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl import _content, _content_store
from otel_verl.store._content import ContentIndex


def _write_one(tmp_path, kind: str, items: list) -> tuple[str, int]:
    """One whole node of ``items`` written through the store's thread; (its id, peak bytes
    traced while the thread wrote it)."""
    store = _content_store.ContentStore(str(tmp_path / "content"), 1 << 40, False)
    step = _content.root_step(kind, items)
    assert step is not None
    tracemalloc.start()
    try:
        assert store.put(kind, step) == "stored"
        assert store.flush(30.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    store.close()
    return step.id, peak


def test_a_long_token_node_is_written_without_its_line_built(tmp_path):
    # ~4 MB of node bytes that compress well: the compressed member is small, so what the
    # write allocates beyond it is the line (the old write: 3 copies of the delta's bytes)
    tokens = [100_000 + (i % 7) for i in range(600_000)]
    delta_bytes = _content.token_bytes(tokens)
    assert delta_bytes is not None and len(delta_bytes) > 4_000_000
    content_id, peak = _write_one(tmp_path, _content.KIND_TOKENS, tokens)
    assert peak < len(delta_bytes) // 2, (peak, len(delta_bytes))
    index = ContentIndex.load(str(tmp_path))
    assert index.rebuild(content_id) == tokens


def test_the_member_inflates_to_the_line_and_zcat_reads_it(tmp_path):
    tokens = list(range(-5, 3000))
    step = _content.root_step(_content.KIND_TOKENS, tokens)
    assert step is not None
    line = _content_store.node_line(_content.KIND_TOKENS, step)
    parts = _content_store._line_parts(_content.KIND_TOKENS, step.id, step.length, None, 0,
                                       step.delta_bytes, None)
    assert gzip.decompress(_content_store._member(parts)) == line


_TOKEN = st.one_of(st.integers(min_value=0, max_value=200_000),
                   st.integers(min_value=-(2**63), max_value=2**64 - 1),
                   st.integers(min_value=2**64, max_value=2**70), st.booleans())


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(tokens=st.lists(_TOKEN, min_size=1, max_size=400),
       messages=st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "tool"]),
                                                "content": st.text(max_size=200)}),
                         min_size=1, max_size=5))
def test_nodes_written_in_pieces_read_back_exactly(tmp_path_factory, tokens, messages):
    tmp_path = tmp_path_factory.mktemp("member")
    store = _content_store.ContentStore(str(tmp_path / "content"), 1 << 30, False)
    written = []
    for kind, items in ((_content.KIND_TOKENS, tokens), (_content.KIND_MESSAGES, messages)):
        step = _content.root_step(kind, items)
        if step is None:  # a bool or a token beyond 64 bits: not delta-coded (the payload
            # keeps it)
            assert kind == _content.KIND_TOKENS
            assert any(type(t) is bool or not -(2**63) <= t < 2**64 for t in tokens)
            continue
        assert store.put(kind, step) == "stored"
        written.append((step.id, items))
    store.close()
    index = ContentIndex.load(str(tmp_path))
    for content_id, items in written:
        assert index.rebuild(content_id) == items
