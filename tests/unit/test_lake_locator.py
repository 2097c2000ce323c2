"""A trajectory page costs the trajectory, not the store: compaction's locator (``TraceId ->
(segment, row, rows)``, ``locate-<run>.parquet``) names the row groups that hold a trace's
spans and payloads, and :meth:`Lake.trajectory` / :meth:`Lake.payloads_of` read only those.

The stores here are the hard case for row-group pruning: random trace ids, engine spans (no
trajectory identity) compacted before their rollouts (the spans-without-a-step partition, read
for every page before the locator), many small chunks, spans stored twice with disagreeing
copies, and a raw tail not compacted yet."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from _lake_store import _line, _span

from otel_verl.store._compact import Manifest, compact, lake_dir
from otel_verl.store._query import Lake, locator_path, write_locator

_RESOURCE = {"service.name": "rollout", "rollout.project_name": "p"}


def _write(store: Path, seed: int, traces: int = 40, tail: bool = True) -> list[str]:
    """Engine spans in files compacted first, rollouts (some spans twice, the copies
    disagreeing) in later ones; with ``tail``, a third file written after compaction (raw)."""
    rng = random.Random(seed)
    store.mkdir(parents=True, exist_ok=True)
    engine: list[bytes] = []
    rollout: list[bytes] = []
    later: list[bytes] = []
    ids = []
    for i in range(traces):
        trace = f"{rng.getrandbits(128):032x}"
        ids.append(trace)
        ident = {"rollout.experiment_name": "e", "rollout.step": i % 4,
                 "rollout.sample_index": i % 5, "rollout.rollout_n": i % 3}
        t0 = 10**18 + i * 10**6
        root = f"{rng.getrandbits(64):016x}"
        llm = f"{rng.getrandbits(64):016x}"
        spans = [
            _span(trace, root, None, "traj", t0, {**ident, "otel_verl.trajectory": True,
                                                  "rollout.reward": rng.choice([0.0, 1.0])}),
            _span(trace, llm, root, "chat", t0 + 10, {
                **ident, "gen_ai.operation.name": "chat", "gen_ai.usage.output_tokens": i,
                "input.value": f'{{"messages": [{{"role": "user", "content": "q{i}"}}]}}'}),
            _span(trace, f"{rng.getrandbits(64):016x}", root, "calc", t0 + 20, {
                **ident, "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calc",
                "output.value": '{"ok": true}'}, error=rng.random() < 0.2)]
        for span in spans:
            for _ in range(rng.choice([1, 1, 2])):  # stored twice: the copies disagree
                copy = dict(span, endTimeUnixNano=str(int(span["startTimeUnixNano"])
                                                       + rng.choice([500, 1000, 2000])))
                rollout.append(_line([copy], _RESOURCE))
        engine.append(_line([_span(trace, f"{rng.getrandbits(64):016x}", llm, "llm_request",
                                   t0 + 11, {"output.value": f"answer {i}"})], _RESOURCE))
        if tail and rng.random() < 0.3:  # more of the trace after compaction: raw lines
            later.append(_line([_span(trace, f"{rng.getrandbits(64):016x}", root, "late",
                                      t0 + 30, dict(ident))], _RESOURCE))
            later.append(_line([spans[0]], _RESOURCE))  # and a copy of a compacted span
    rng.shuffle(rollout)
    for k in range(8):  # a chunk per file at least: many segments
        (store / f"a-engine-{k}.jsonl").write_bytes(b"".join(engine[k::8]))
    for k in range(4):
        (store / f"b-rollout-{k}.jsonl").write_bytes(b"".join(rollout[k::4]))
    compact(store, live_bytes=0, chunk_spans=10)
    if later:
        (store / "c-tail.jsonl").write_bytes(b"".join(later))
    return ids


class _Reads:
    """Which span segment files a page opens and how many of their row groups it decodes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, spans_dir: str) -> None:
        self.groups: dict[str, set[int]] = {}
        init, read = pq.ParquetFile.__init__, pq.ParquetFile.read_row_groups
        reads = self

        def opened(self: Any, source: Any, *args: Any, **kwargs: Any) -> None:
            self._test_path = os.fspath(source)
            init(self, source, *args, **kwargs)

        def read_groups(self: Any, groups: Any, *args: Any, **kwargs: Any) -> Any:
            path = getattr(self, "_test_path", "")
            if path.startswith(spans_dir):
                reads.groups.setdefault(path, set()).update(groups)
            return read(self, groups, *args, **kwargs)

        monkeypatch.setattr(pq.ParquetFile, "__init__", opened)
        monkeypatch.setattr(pq.ParquetFile, "read_row_groups", read_groups)


def _holding(lake: Lake, trace: str) -> dict[str, set[int]]:
    """Each span segment's row groups that hold a row of ``trace`` (a full scan)."""
    out: dict[str, set[int]] = {}
    for rel in Manifest.load(lake.lake_dir).segments:
        path = os.path.join(lake.lake_dir, rel)
        reader = pq.ParquetFile(path)
        for g in range(reader.metadata.num_row_groups):
            ids = reader.read_row_group(g, columns=["TraceId"]).column(0)
            if pc.any(pc.equal(ids, trace)).as_py():
                out.setdefault(path, set()).add(g)
    return out


def test_a_page_reads_only_the_row_groups_holding_its_trace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = _write(tmp_path / "store", seed=1, tail=False)
    with Lake.open(tmp_path / "store") as lake:
        assert lake.state.segments > 15  # many small segments, the engine's without a step
        assert any("step=__HIVE" in s for s in Manifest.load(lake.lake_dir).segments)
        holding = {t: _holding(lake, t) for t in ids}
        reads = _Reads(monkeypatch, os.path.join(lake.lake_dir, "spans"))
        for trace in ids:
            reads.groups.clear()
            spans = lake.trajectory(trace)
            assert {s["TraceId"] for s in spans} == {trace} and len(spans) == 4
            assert reads.groups == holding[trace], trace


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_the_located_page_equals_the_partition_scan(tmp_path: Path, seed: int) -> None:
    """The page and the payloads through the locator equal the path without it (partitions
    pruned by min/max, every spans-without-a-step file) and the ``payloads`` view, on stores
    with duplicated spans and a raw tail, and for a trace nobody stored."""
    ids = _write(tmp_path / "store", seed=seed)
    with Lake.open(tmp_path / "store") as lake:
        assert lake._locator is not None and lake.state.raw_spans > 0
        located: dict[str, Any] = {}
        for trace in [*ids, "0" * 32, ids[0].upper()]:
            located[trace] = (lake.trajectory(trace), lake.payloads_of(trace))
        lake._locator = None  # a lake compacted before the locator existed
        for trace, (spans, payloads) in located.items():
            assert spans == lake.trajectory(trace), trace
            assert payloads == lake.payloads_of(trace), trace
        assert sum(len(p) for _, p in located.values()) >= 2 * len(ids)


def test_the_locator_after_many_runs_equals_a_fresh_build(tmp_path: Path) -> None:
    """Each compaction adds its segments to the previous run's locator; the result is the one
    built from every segment (and when the previous locator is gone, it is built again)."""
    store = tmp_path / "store"
    _write(store, seed=5, tail=False)
    rng = random.Random(5)
    for run in range(3):
        if run == 1:  # a lake whose last locator is missing (a crash, an older version)
            lake = lake_dir(store)
            os.remove(locator_path(lake, Manifest.load(lake).runs))
        lines = [_line([_span(f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64):016x}",
                              None, "t", 10**18, {"rollout.step": run, "otel_verl.trajectory":
                                                  True, "input.value": "x" * 2000})], _RESOURCE)
                 for _ in range(15)]
        (store / f"d-more-{run}.jsonl").write_bytes(b"".join(lines))
        compact(store, live_bytes=0, chunk_spans=10)
        lake = lake_dir(store)
        manifest = Manifest.load(lake)
        fresh = str(tmp_path / f"fresh-{run}.parquet")
        write_locator(lake, manifest, None, fresh)
        kept = pq.read_table(locator_path(lake, manifest.runs))
        assert kept.equals(pq.read_table(fresh))
        assert set(kept.column("segment").to_pylist()) == {*manifest.segments,
                                                            *manifest.payloads}
        assert kept.column("TraceId").to_pylist() == sorted(kept.column("TraceId").to_pylist())
        assert pc.min(kept.column("rows")).as_py() >= 1
