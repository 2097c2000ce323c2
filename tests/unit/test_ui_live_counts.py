"""The Live board's counts (``/api/live``, :func:`otel_verl.ui.views.live_view`) agree with its
rows: a trajectory in flight is a row of the ops table too (its own span), stuck as soon as one
of its ops is, so the STUCK rows are the stuck trajectories plus the stuck ops, on the board and
per worker. (The header used to count the stuck ops alone, "2 stuck" above three STUCK rows,
while the worker row said 3.)"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl.ui.server import api

_OP = st.fixed_dictionaries({"age": st.floats(0, 10), "threshold": st.one_of(
    st.none(), st.floats(0.5, 5)), "kind": st.sampled_from(["TOOL", "LLM", "CHAIN"])})
#: a worker: its trajectories, each with its ops; lost or live
_WORKER = st.tuples(st.lists(st.lists(_OP, max_size=3), max_size=3), st.booleans())


def _write(directory: Path, workers: list[tuple[list[list[dict[str, Any]]], bool]],
           now: float) -> None:
    live = directory / "live"
    live.mkdir(parents=True, exist_ok=True)
    for w, (trajectories, lost) in enumerate(workers):
        ops = []
        for t, children in enumerate(trajectories):
            root = f"{w:04x}{t:04x}00000000"
            ops.append({"span_id": root, "name": "agent_loop", "kind": "AGENT", "trajectory": True,
                        "start": now - 20, "step": 5, "sample_index": t, "rollout_n": 0})
            for c, op in enumerate(children):
                ops.append({"span_id": f"{w:04x}{t:04x}{c + 1:08x}", "name": f"op{c}",
                            "kind": op["kind"], "start": now - op["age"],
                            "threshold_s": op["threshold"], "trajectory_span_id": root,
                            "step": 5, "sample_index": t, "rollout_n": 0})
        (live / f"host-{w}.json").write_text(json.dumps({
            "worker": f"host:{w}", "interval_s": 1.0, "ops": ops,
            "heartbeat": now - (60 if lost else 0)}))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(workers=st.lists(_WORKER, max_size=3))
def test_the_counts_are_the_rows(tmp_path_factory: Any, workers: list[Any]) -> None:
    directory = tmp_path_factory.mktemp("live")
    _write(directory, workers, time.time())
    board = api(SimpleNamespace(trace_dir=str(directory)), "live", {})
    ops, counts = board["ops"], board["counts"]
    assert counts["trajectories"] == sum(1 for o in ops if o.get("trajectory"))
    assert counts["ops"] == sum(1 for o in ops if not o.get("trajectory"))
    assert counts["trajectories_stuck"] == sum(1 for o in ops if o["stuck"] and o.get("trajectory"))
    assert counts["ops_stuck"] == sum(1 for o in ops if o["stuck"] and not o.get("trajectory"))
    stuck_rows = sum(1 for o in ops if o["stuck"])
    assert counts["trajectories_stuck"] + counts["ops_stuck"] == stuck_rows
    assert len(board["workers"]) == len(workers)
    for w in board["workers"]:  # the worker row: the same two counts, adding up to its stuck
        mine = [o for o in ops if o["worker"] == w["worker"]]
        assert w["stuck_trajectories"] == sum(1 for o in mine if o["stuck"] and o.get("trajectory"))
        assert w["stuck_ops"] == sum(1 for o in mine if o["stuck"] and not o.get("trajectory"))
        assert w["stuck_trajectories"] + w["stuck_ops"] == w["stuck"]
        assert w["trajectories"] == sum(1 for o in mine if o.get("trajectory"))


def test_the_screenshots_board_one_stuck_tool_inside_its_trajectory(tmp_path: Path) -> None:
    """docs/img/ui-live.png's case: a tool past its threshold, the agent loop's run waiting on it
    (also past its own), the trajectory: three STUCK rows, 1 stuck trajectory and 2 stuck ops."""
    now = time.time()
    _write(tmp_path, [([[{"age": 1.8, "threshold": 1.0, "kind": "TOOL"},
                         {"age": 1.9, "threshold": 1.0, "kind": "CHAIN"}]], False)], now)
    board = api(SimpleNamespace(trace_dir=str(tmp_path)), "live", {})
    assert sum(o["stuck"] for o in board["ops"]) == 3
    assert board["counts"] == {"trajectories": 1, "trajectories_stuck": 1, "ops": 2,
                               "ops_stuck": 2}
    (worker,) = board["workers"]
    assert (worker["stuck"], worker["stuck_trajectories"], worker["stuck_ops"]) == (3, 1, 2)
