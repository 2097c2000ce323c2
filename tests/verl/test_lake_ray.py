"""Cluster scale: the lake's step statistics and trajectory rows on Ray Data (a real local Ray
cluster, two worker CPUs) over one store split across three "nodes'" directories equal the
single-machine DuckDB answers over the whole store (otel_verl/store/_ray.py)."""

from __future__ import annotations

import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import _lake_store as S
import pytest

from otel_verl.store._compact import compact
from otel_verl.store._query import Lake

pytestmark = pytest.mark.timeout(600)


#: Ray 2.60 waits a fixed 30 s for its node to register; on a loaded machine that can pass
SLOW_START = "The current node timed out during startup"


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    import ray

    for attempt in (1, 2):
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                     logging_level="ERROR")
            break
        except Exception as exc:
            if SLOW_START not in str(exc) or attempt == 2:
                raise
            sys.stderr.write(f"ray.init: {exc}; retrying once\n")
            ray.shutdown()
    try:
        yield ray
    finally:
        ray.shutdown()


def _same(a: Any, b: Any) -> bool:
    """Equal; floats to 1e-12 (each side sums doubles in its own order)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
    return bool(a == b)


def test_ray_data_over_three_nodes_equals_one_machine(tmp_path: Path, ray_cluster: Any) -> None:
    from otel_verl.store import _ray

    whole = tmp_path / "whole"
    # 4 steps x 3 prompts x 4 rollouts: weights, errors, partial trajectories, duplicated lines,
    # sampling reports; lines round-robin over 3 files, so a trace's spans (the engine's ones
    # included) and a duplicated line often sit on different nodes
    S.write_store(whole, 7, steps=4, prompts=3, n=4, files=3)
    nodes = []
    for i, path in enumerate(sorted(whole.glob("*.jsonl"))):
        node = tmp_path / f"node{i}"
        node.mkdir()
        # every node's file has the same name (a gateway collector's file output on each), so
        # the nodes' source ids are the same ("traces.jsonl#0")
        name = node / "otel_verl-traces.jsonl"
        if i == 0:  # node 0's file was replaced after a compaction: its generation 0 is
            # excluded there, and only there (nodes 1 and 2 read their generation 0)
            S.write_store(tmp_path / "old", 99, steps=1, prompts=1, n=2, files=1)
            shutil.copy(next((tmp_path / "old").glob("*.jsonl")), name)
            compact(node, live_bytes=0)
        shutil.copy(path, name)
        compact(node, live_bytes=0)  # one segment per step partition
        nodes.append(str(node))
    assert _ray.segment_files(nodes[0])[1] and not _ray.segment_files(nodes[1])[1]
    with Lake.open(whole) as lake:
        want_steps = lake.steps()
        want_rows = {r["key"]: r for r in lake.trajectories(limit=None)["rows"]}
    assert len(want_steps) == 4 and len(want_rows) >= 40

    started = time.monotonic()
    span_rows = _ray.spans(nodes).materialize()
    trajectory_rows = _ray.trajectories(nodes, span_rows=span_rows).materialize()
    # one dataset, its groups computed by several tasks (a block per hash bucket: 2 per CPU)
    assert trajectory_rows.num_blocks() >= 2
    got_steps = _ray.step_statistics(nodes, span_rows=span_rows,
                                     trajectory_rows=trajectory_rows)
    got_rows = {r["key"]: r for r in trajectory_rows.take_all()}
    print(f"\nRay Data over {len(nodes)} nodes: {len(got_rows)} trajectories, {len(got_steps)} "
          f"steps in {time.monotonic() - started:.1f}s")

    assert [(s["experiment"], s["validate"], s["step"]) for s in got_steps] == [
        (s["experiment"], s["validate"], s["step"]) for s in want_steps]
    for got, want in zip(got_steps, want_steps, strict=True):
        assert set(got) == set(want)
        for key, value in want.items():
            assert _same(got[key], value), (want["step"], key, got[key], value)
    assert any(s["ran"] for s in got_steps)  # the workers' sampling reports came through
    assert set(got_rows) == set(want_rows)
    for key, want in want_rows.items():
        for column, value in want.items():
            assert _same(got_rows[key][column], value), (key, column, got_rows[key][column],
                                                         value)


def test_a_report_stored_twice_across_nodes_is_read_as_one_machine_reads_it(
        tmp_path: Path, ray_cluster: Any) -> None:
    """The copies of a sampling report that disagree (a replayed spool: one copy with fewer
    counts) sit on different nodes; Ray Data reads the one the lake reads (``REPORT_ORDER``: more
    counts), whichever node's rows its scan meets first."""
    from otel_verl.store import _ray

    whole = tmp_path / "whole"
    S.write_store(whole, 5, steps=2, prompts=2, n=2, files=2)
    # step 0's report again, with fewer counts, first in every file
    fewer = S._line([S._span(f"{0xfeed0000:032x}", f"{0xfeed0000:016x}", None,
                             "otel_verl.sampling_report", 10**18, {
                                 "rollout.step": 0, "rollout.validate": False,
                                 "rollout.experiment_name": "exp", "rollout.sampling.ran": 50})],
                    {"service.name": "rollout", "rollout.experiment_name": "exp"})
    nodes = []
    for i, path in enumerate(sorted(whole.glob("*.jsonl"))):
        node = tmp_path / f"node{i}"
        node.mkdir()
        (node / "otel_verl-traces.jsonl").write_bytes(fewer + path.read_bytes())
        path.write_bytes(fewer + path.read_bytes())
        compact(node, live_bytes=0)
        nodes.append(str(node))
    with Lake.open(whole) as lake:
        want = {(s["step"], s["validate"]): (s["ran"], s["dropped"]) for s in lake.steps()}
    assert want[(0, False)] == (50, 7)  # the copy with more counts
    for order in (nodes, nodes[::-1]):
        got = {(s["step"], s["validate"]): (s["ran"], s["dropped"])
               for s in _ray.step_statistics(order)}
        assert got == want
