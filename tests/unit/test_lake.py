"""The lake (otel_verl.store._query / _compact): one read path, the same numbers as the store's
trajectory model (the step statistics written out in Python, tests/_step_oracle.py), before,
during and after compaction; crash-safe compaction; hostile lines read without crashing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import _hostile_spans as H
import _lake_store as S
import _step_oracle as REF
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl.store import group_trajectories, read_spans, sampling_reports
from otel_verl.store._compact import Manifest, compact, lake_dir
from otel_verl.store._query import Lake

write_store = S.write_store


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(a - b) <= 1e-9 * max(1.0, abs(a))
    return bool(a == b)


_MODEL_FIELDS = ("traced", "by_reason", "estimated", "reward_mean", "reward_mean_unweighted",
                 "error_rate", "ran", "dropped")
_INDEX_FIELDS = ("trajectories", "weight", "reward_mean", "reward_std", "pass_rate",
                 "reward_min", "reward_max", "turns_mean", "tokens_in_mean", "tokens_out_mean",
                 "tool_calls", "tool_errors", "with_errors", "prompts", "partial", "error_rate",
                 "sampling_reasons", "ran", "dropped")


def _assert_same(lake_rows: list[dict[str, Any]], other: list[dict[str, Any]],
                 fields: tuple[str, ...]) -> None:
    key = lambda r: (str(r["experiment"]), bool(r["validate"]), r["step"])  # noqa: E731
    mine = {key(r): r for r in lake_rows}
    theirs = {key(r): r for r in other}
    assert set(mine) == set(theirs)
    for k, row in theirs.items():
        for name in fields:
            if name in row:
                assert _close(mine[k].get(name), row[name]), (k, name, mine[k].get(name), row[name])


def _model_steps(directory: Path) -> list[dict[str, Any]]:
    spans = list(read_spans(directory))
    return [s.as_dict() for s in REF.step_statistics(group_trajectories(spans),
                                                   sampling_reports(spans))]


def _index_steps(directory: Path, tmp: Path) -> list[dict[str, Any]]:
    """The viewer's per-step figures (what the SQLite index's overview computed), from the
    trajectory model in Python."""
    spans = list(read_spans(directory))
    return REF.step_rows(group_trajectories(spans), sampling_reports(spans))


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), files=st.integers(1, 3))
def test_step_statistics_match_the_model_and_the_index(tmp_path_factory: Any, seed: int,
                                                        files: int) -> None:
    """The lake's steps = the trajectory model's step statistics and the viewer's per-step
    figures (the reference in Python), raw, half compacted (a file appended to after
    compaction) and fully compacted."""
    tmp = tmp_path_factory.mktemp("lake")
    store = tmp / "store"
    write_store(store, seed, files=files)
    model, index = _model_steps(store), _index_steps(store, tmp)
    with Lake.open(store) as lake:
        _assert_same(lake.steps(), model, _MODEL_FIELDS)
        _assert_same(lake.steps(), index, _INDEX_FIELDS)
        compact(store, live_bytes=0, chunk_spans=50)
        lake.refresh()
        assert lake.state.raw_spans == 0 and lake.state.segments > 0 and lake.state.cached
        _assert_same(lake.steps(), model, _MODEL_FIELDS)
        _assert_same(lake.steps(), index, _INDEX_FIELDS)
        write_store(store, seed + 1, steps=4, files=files, base=10_000)  # appended: raw tails after segments
        model, index = _model_steps(store), _index_steps(store, tmp / "again")
        lake.refresh()
        assert lake.state.raw_spans > 0 and lake.state.segment_rows > 0 and lake.state.cached
        _assert_same(lake.steps(), model, _MODEL_FIELDS)
        _assert_same(lake.steps(), index, _INDEX_FIELDS)


def test_trajectory_rows_match_the_model(tmp_path: Path) -> None:
    write_store(tmp_path, 7)
    trajectories = group_trajectories(read_spans(tmp_path))
    compact(tmp_path, live_bytes=0, chunk_spans=40)
    with Lake.open(tmp_path) as lake:
        page = lake.trajectories(limit=None)
        assert page["total"] == len(trajectories)
        rows = {(r["trace_id"], r["span_id"]): r for r in page["rows"]}
        for t in trajectories:
            row = rows[(t.trace_id, t.span_id or "")]
            assert row["reward"] == t.reward
            assert row["status"] == t.status
            assert row["spans"] == len(t.spans)
            assert row["errors"] == len(t.errors)
            assert (row["step"], row["sample_index"], row["rollout_n"]) == (
                t.step, t.sample_index, t.rollout_n)
            spans = lake.trajectory(t.trace_id)
            assert {s["SpanId"] for s in spans} >= {s["span_id"] for s in t.spans}


def _read_all(store: Path) -> list[tuple[str, str]]:
    with Lake.open(store) as lake:
        return sorted(lake.sql("SELECT TraceId, SpanId FROM spans").fetchall())


def test_compaction_interrupted_after_renaming_leaves_a_store_that_reads_the_same(
        tmp_path: Path) -> None:
    """Segments renamed but never committed are invisible and removed; the next run finishes."""
    write_store(tmp_path, 3, steps=4)
    before = _read_all(tmp_path)

    class Killed(Exception):
        pass

    calls = []

    def die() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise Killed

    with pytest.raises(Killed):
        compact(tmp_path, live_bytes=0, chunk_spans=30, _after_rename=die)
    manifest = Manifest.load(lake_dir(tmp_path))
    assert manifest.segments  # the first chunk was committed
    assert _read_all(tmp_path) == before  # no duplicates, nothing lost
    compact(tmp_path, live_bytes=0, chunk_spans=30)
    assert _read_all(tmp_path) == before
    with Lake.open(tmp_path) as lake:
        assert lake.state.raw_spans == 0
        on_disk = {str(p.relative_to(lake_dir(tmp_path)))
                   for p in Path(lake_dir(tmp_path), "spans").rglob("*.parquet")}
        assert on_disk == set(Manifest.load(lake_dir(tmp_path)).segments)  # orphans removed


def test_a_replaced_store_file_is_read_as_it_is_now(tmp_path: Path) -> None:
    write_store(tmp_path, 1, files=1)
    compact(tmp_path, live_bytes=0)
    (path,) = tmp_path.glob("*.jsonl")
    path.write_bytes(b"")
    write_store(tmp_path, 2, steps=1, files=1, base=10_000)  # same name, new content
    expected = sorted((s["trace_id"], s["span_id"]) for s in read_spans(tmp_path))
    assert _read_all(tmp_path) == expected
    compact(tmp_path, live_bytes=0)
    assert _read_all(tmp_path) == expected


def test_live_files_stay_raw_until_big(tmp_path: Path) -> None:
    """A file whose writer is alive (this process) is left raw unless it passed live_bytes."""
    write_store(tmp_path, 4, files=1)
    (path,) = tmp_path.glob("*.jsonl")
    live = tmp_path / f"otel_verl-{H.__name__ and _host()}-{os.getpid()}-20260101T000000000Z.jsonl"
    path.rename(live)
    assert compact(tmp_path).skipped_live == 1
    assert Manifest.load(lake_dir(tmp_path)).segments == []
    assert compact(tmp_path, live_bytes=1).spans > 0


def _host() -> str:
    import re
    import socket
    return re.sub(r"[^A-Za-z0-9._-]+", "_", socket.gethostname()) or "host"


def test_hostile_lines_read_without_crashing(tmp_path: Path) -> None:
    """Every poisoned line of tests/_hostile_spans.py: Lake.open, compaction and every query
    answer, and the good trajectories keep their numbers."""
    H.write_good_store(tmp_path, 6)
    good = {t.trace_id: t.reward for t in group_trajectories(read_spans(tmp_path))}
    H.poison_store(tmp_path)
    for compacted in (False, True):
        if compacted:
            compact(tmp_path, live_bytes=0)
        with Lake.open(tmp_path) as lake:
            rows = lake.trajectories(limit=None)["rows"]
            by_trace = {r["trace_id"]: r for r in sorted(rows, key=lambda r: bool(r["span_id"]))}
            for trace_id, reward in good.items():
                assert by_trace[trace_id]["reward"] == reward
            lake.steps()
            lake.flat_groups()
            for r in rows:
                lake.trajectory(r["trace_id"])


def test_trajectories_split_between_segments_and_raw_lines(tmp_path: Path) -> None:
    """A trace whose first lines were compacted and whose last ones are still raw (its
    trajectory span arrives after compaction) is one trajectory with all its numbers."""
    write_store(tmp_path / "whole", 11, files=1)
    (whole,) = (tmp_path / "whole").glob("*.jsonl")
    lines = whole.read_bytes().splitlines(keepends=True)
    store = tmp_path / "store"
    store.mkdir()
    target = store / whole.name
    for cut in (len(lines) // 3, 2 * len(lines) // 3):
        target.write_bytes(b"".join(lines[:cut]))
        compact(store, live_bytes=0)
        target.write_bytes(b"".join(lines))
        model = _model_steps(store)
        with Lake.open(store) as lake:
            assert lake.state.cached and lake.state.raw_spans > 0
            _assert_same(lake.steps(), model, _MODEL_FIELDS)
            assert lake.trajectories(limit=0)["total"] == len(
                group_trajectories(read_spans(store)))
        shutil.rmtree(lake_dir(store))
