"""Compaction's trajectories cache built from the rows it holds in memory (and, on a later run,
from the previous cache plus the traces the run touched) is the cache built by reading every
segment back (store/_query.write_trajectory_cache's full path): the same rows, texts, steps,
reports and trace index, on stores whose trajectories are split across files and compactions,
with replaced files, without trajectories, and with poisoned lines."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

import _hostile_spans as H
import _lake_store as S
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl.store import _compact, _query, list_files
from otel_verl.store._compact import Manifest, compact, lake_dir
from otel_verl.store._query import (
    Lake,
    cache_path,
    reports_path,
    steps_path,
    texts_path,
    traces_path,
    write_trajectory_cache,
)


def _key(value: Any) -> Any:
    """A sort key for rows holding None, NaN and nested values."""
    return repr(value)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or abs(a - b) <= 1e-12 * max(1.0, abs(a), abs(b))
    if isinstance(a, list) and isinstance(b, list):  # (list(DISTINCT ..) has no order)
        a, b = sorted(a, key=_key), sorted(b, key=_key)
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) and type(a) is type(b)


def _cache_files(lake: str) -> dict[str, Any]:
    """Everything the cache of the lake's current run holds (rows in file order where the
    order is the layout's: the cache and its texts row for row, the trace index by trace)."""
    runs = Manifest.load(lake).runs
    cache = pq.read_table(cache_path(lake, runs))
    texts = pq.read_table(texts_path(lake, runs))
    assert cache.num_rows == texts.num_rows
    rows = [tuple(a.items()) + tuple(b.items()) for a, b in
            zip(cache.to_pylist(), texts.to_pylist(), strict=True)]
    order = [(dict(r)["experiment"], dict(r)["validate"], dict(r)["step"], dict(r)["start_ns"],
              dict(r)["trace_id"]) for r in rows]
    traces = pq.read_table(traces_path(lake, runs)).to_pylist()
    return {
        "names": cache.schema.names + texts.schema.names,
        "types": [str(t) for t in cache.schema.types + texts.schema.types],
        "rows": sorted(rows, key=_key),
        "order": order,
        "traces": sorted((tuple(t.values()) for t in traces), key=_key),
        "traces_sorted": [t["trace_id"] for t in traces] == sorted(t["trace_id"] for t in traces),
        "reports": sorted((tuple(r.items()) for r in pq.read_table(
            reports_path(lake, runs)).to_pylist()), key=_key),
        "steps": sorted((tuple(r.items()) for r in pq.read_table(
            steps_path(lake, runs)).to_pylist()), key=lambda r: _key(r[:3])),
    }


def _full_path(lake: str, scratch: Path) -> dict[str, Any]:
    """The cache the full path (every segment read back) builds for the same manifest, in a
    copy of the lake (the store's own cache stays the one compaction left)."""
    copy = scratch / "lake-copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(lake, copy)
    write_trajectory_cache(str(copy), Manifest.load(str(copy)))
    return _cache_files(str(copy))


def _assert_same_cache(store: Path, scratch: Path) -> dict[str, Any]:
    lake = lake_dir(store)
    mine, full = _cache_files(lake), _full_path(lake, scratch)
    assert mine["names"] == full["names"] and mine["types"] == full["types"]
    assert mine["traces"] == full["traces"] and mine["traces_sorted"]
    assert mine["reports"] == full["reports"]
    assert [[k for k, _ in r] for r in mine["rows"]] == [[k for k, _ in r] for r in full["rows"]]
    assert mine["rows"] == full["rows"]
    assert mine["order"] == sorted(mine["order"], key=lambda k: tuple(
        (v is None, v) for v in k))  # the layout's order (NULLS LAST)
    assert len(mine["steps"]) == len(full["steps"])
    for a, b in zip(mine["steps"], full["steps"], strict=True):
        assert [k for k, _ in a] == [k for k, _ in b]
        for (name, x), (_, y) in zip(a, b, strict=True):
            assert _same_value(x, y), (name, x, y)
    return mine


class _Spy:
    """The segment lists the cache's builder binds (create_views), per compaction."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bound: list[list[str]] = []
        real = _query.create_views

        def spy(con: Any, segments: list[str], *args: Any) -> None:
            self.bound.append(list(segments))
            real(con, segments, *args)

        monkeypatch.setattr(_query, "create_views", spy)

    def compact(self, store: Path, **options: Any) -> list[str]:
        """Compact; return this run's new segments, and check the cache read none of them."""
        lake = lake_dir(store)
        before = set(Manifest.load(lake).segments)
        self.bound.clear()
        stats = compact(store, live_bytes=0, **options)
        new = [os.path.join(lake, s) for s in Manifest.load(lake).segments if s not in before]
        if stats.spans:
            assert self.bound, "no cache written"
            read = {p for b in self.bound for p in b}
            assert not read & set(new), "the cache read this run's segments back"
        return new


def _cut_store(source: Path, store: Path, cuts: list[float]) -> list[tuple[Path, list[bytes]]]:
    """``store`` with every file of ``source`` cut at the first ``cuts`` fraction of its lines
    (the rest written by :func:`_grow`)."""
    store.mkdir(parents=True, exist_ok=True)
    out = []
    for path in sorted(source.glob("*.jsonl")):
        lines = path.read_bytes().splitlines(keepends=True)
        out.append((store / path.name, lines))
    _grow(out, cuts[0] if cuts else 1.0)
    return out


def _grow(files: list[tuple[Path, list[bytes]]], fraction: float) -> None:
    for target, lines in files:
        target.write_bytes(b"".join(lines[:max(0, round(len(lines) * fraction))]))


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), files=st.integers(1, 3),
       cuts=st.lists(st.floats(0.05, 0.95), max_size=2).map(sorted),
       chunk=st.sampled_from([9, 60, 200_000]))
def test_the_cache_from_memory_is_the_cache_read_back(tmp_path_factory: Any, seed: int,
                                                      files: int, cuts: list[float],
                                                      chunk: int) -> None:
    """A store grown between compactions (a trajectory's spans in several files, lines and
    runs; duplicated lines; partial trajectories; reports), compacted in chunks of ``chunk``
    spans: after every run, the cache equals the one built by reading every segment back, and
    the run read none of its own segments."""
    tmp = tmp_path_factory.mktemp("cache")
    S.write_store(tmp / "whole", seed, files=files)
    store = tmp / "store"
    grown = _cut_store(tmp / "whole", store, cuts)
    with pytest.MonkeyPatch.context() as mp:
        spy = _Spy(mp)
        for fraction in [*cuts[1:], 1.0]:
            spy.compact(store, chunk_spans=chunk)
            _assert_same_cache(store, tmp)
            _grow(grown, fraction)
        spy.compact(store, chunk_spans=chunk)
    mine = _assert_same_cache(store, tmp)
    with Lake.open(store) as lake:  # and what a reader sees: every trajectory, from the cache
        assert lake.state.cached and lake.state.raw_spans == 0
        assert lake.state.trajectories == len(mine["rows"])


def test_a_later_run_rebuilds_the_traces_it_touches_and_keeps_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run 2 adds the trajectory spans of traces whose children run 1 compacted: their rows
    change (partial -> rooted: spans, reward, status) and equal the full path's; the rows of
    the traces run 2 did not touch (those whose trajectory span never came) are run 1's."""
    S.write_store(tmp_path / "whole", 5, files=1)
    (whole,) = (tmp_path / "whole").glob("*.jsonl")
    lines = whole.read_bytes().splitlines(keepends=True)
    late = [line for line in lines if b"otel_verl.trajectory" in line]
    store = tmp_path / "store"
    store.mkdir()
    (store / whole.name).write_bytes(b"".join(line for line in lines if line not in late))
    spy = _Spy(monkeypatch)
    complete: list[bool] = []
    real = _query._cache_complete
    monkeypatch.setattr(_query, "_cache_complete",
                        lambda *a: complete.append(real(*a)) or complete[-1])
    spy.compact(store)
    first = {dict(r)["trace_id"]: r for r in _assert_same_cache(store, tmp_path)["rows"]}
    with open(store / whole.name, "ab") as handle:  # the trajectory spans, after run 1
        handle.write(b"".join(late))
    spy.compact(store)
    second = {dict(r)["trace_id"]: r for r in _assert_same_cache(store, tmp_path)["rows"]}
    assert len(spy.bound[0]) > 0  # the earlier segments, read for the touched traces
    assert complete == [True]  # run 1's cache kept for the traces run 2 did not touch
    changed = [k for k in first if first[k] != second[k]]
    assert changed and len(changed) < len(first) and set(second) == set(first)


def test_a_replaced_file_and_its_excluded_rows(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A store file rewritten with other content after compaction: its old rows are excluded,
    so the previous cache cannot be kept; the new cache still equals the full path's."""
    S.write_store(tmp_path, 3, files=2)
    spy = _Spy(monkeypatch)
    spy.compact(tmp_path)
    before = _assert_same_cache(tmp_path, tmp_path / "scratch")
    path = Path(sorted(list_files(tmp_path))[0])
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[len(lines) // 2:]))  # its head changed: a new generation
    spy.compact(tmp_path)
    assert Manifest.load(lake_dir(tmp_path)).excluded
    after = _assert_same_cache(tmp_path, tmp_path / "scratch")
    assert after["rows"] != before["rows"]


def test_a_store_without_trajectories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only sampling reports (no trajectory rows at all), then engine spans without any
    identity (one partial trajectory per trace): the same cache as the full path's."""
    resource = {"service.name": "vllm"}
    report = S._span("f" * 32, "e" * 16, None, "otel_verl.sampling_report", 10**18, {
        "rollout.step": 1, "rollout.experiment_name": "exp", "rollout.sampling.ran": 5,
        "rollout.sampling.dropped": 1})
    (tmp_path / "store").mkdir()
    store = tmp_path / "store"
    (store / "otel_verl-elsewhere-1-20260101T000000000Z.jsonl").write_bytes(
        S._line([report], resource))
    spy = _Spy(monkeypatch)
    spy.compact(store)
    mine = _assert_same_cache(store, tmp_path)
    assert mine["rows"] == [] and len(mine["reports"]) == 1
    engine = [S._span(f"{i:032x}", f"{i:016x}", None, "llm_request", 10**18 + i, {})
              for i in range(1, 6)]
    (store / "otel_verl-elsewhere-2-20260101T000000000Z.jsonl").write_bytes(
        S._line(engine, resource))
    spy.compact(store)
    mine = _assert_same_cache(store, tmp_path)
    assert len(mine["rows"]) == 5


def test_poisoned_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every poisoned line of tests/_hostile_spans.py, compacted in two runs (the poison in
    the second): the same cache as the full path's."""
    H.write_good_store(tmp_path / "store", 6)
    store = tmp_path / "store"
    spy = _Spy(monkeypatch)
    spy.compact(store)
    template = next(t for t in H.raw_traces(store).values()
                    if any(H._is_root(s) for _, _, s in t))
    H.poison_store(store)  # the poison in the middle of a compacted file
    spy.compact(store)
    _assert_same_cache(store, tmp_path)
    (store / "otel_verl-elsewhere-9-20260101T000000000Z.jsonl").write_bytes(b"".join(
        H.poisoned_line(kind, template, f"{0xbee00000 + i:08x}" + "0" * 23 + "1")
        for i, kind in enumerate(H.KINDS)))
    spy.compact(store)  # the poison in a new file of its own
    _assert_same_cache(store, tmp_path)


def test_past_the_memory_bound_the_segments_are_read_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With more rows than CACHE_KEEP_BYTES, compaction drops them and the cache reads the
    segments back: the same cache."""
    S.write_store(tmp_path / "store", 8, files=2)
    monkeypatch.setattr(_compact, "CACHE_KEEP_BYTES", 0)
    bound: list[list[str]] = []
    real = _query.create_views
    monkeypatch.setattr(_query, "create_views",
                        lambda con, segments, *a: (bound.append(list(segments)),
                                                   real(con, segments, *a))[1])
    compact(tmp_path / "store", live_bytes=0, chunk_spans=30)
    lake = lake_dir(tmp_path / "store")
    assert bound[0] == [os.path.join(lake, s) for s in Manifest.load(lake).segments]
    _assert_same_cache(tmp_path / "store", tmp_path)
