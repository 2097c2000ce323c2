"""Live records (issue 20, docs/live.md): a SIGKILLed worker shows as lost with what it had in
flight; unsampled trajectories are counted as numbers; the reader survives any live file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_verl import RolloutTraceConfig, rollout_trace_attr
from otel_verl._state import STATE
from otel_verl.store._live import live_board, live_ops, live_workers

WORKER = textwrap.dedent("""
    import sys, time, glob, os
    from otel_verl import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=sys.argv[1], live=True)

    @rollout_trace_op(kind="TOOL")
    def hang():
        print("ready", flush=True)
        time.sleep(600)

    with rollout_trace_attr(step=4, sample_index=9, rollout_n=1):
        while not glob.glob(os.path.join(sys.argv[1], "live", "*.json")):
            time.sleep(0.05)
        hang()
""")


def test_sigkilled_worker_is_lost_with_its_in_flight_trajectory(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.time() + 20
        while time.time() < deadline:  # the snapshot after the tool started
            ops = live_ops(str(tmp_path))
            if any(o["kind"] == "TOOL" for o in ops):
                break
            time.sleep(0.05)
        assert not any(o["lost"] for o in ops)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the file stays (no clean shutdown); read as of 4 intervals later: lost
    later = time.time() + 4.0
    view = live_workers(str(tmp_path), now=later)
    assert len(view["workers"]) == 1
    worker = view["workers"][0]
    assert worker["lost"] is True and worker["pid"] == proc.pid
    trajectories = [o for o in worker["ops"] if o["trajectory"]]
    assert [(t["step"], t["sample_index"], t["rollout_n"]) for t in trajectories] == [(4, 9, 1)]
    assert trajectories[0]["waiting_on"]["name"] == "hang"
    assert all(o["lost"] for o in live_ops(str(tmp_path), now=later))


def test_unsampled_trajectories_are_counted_per_step(tmp_path):
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path), live=True)
    try:
        live = STATE.runtime.live
        with rollout_trace_attr(step=2, sample_index=0, trace=False), \
                rollout_trace_attr(step=2, sample_index=1, trace=False):
            live.tick()
            board = live_board(str(tmp_path))
            assert [(s["step"], s["unsampled"], s["traced"]) for s in board["steps"]] == \
                [(2, 2, 0)]
            assert board["ops"] == []  # numbers only: no op, no content
        live.tick()
        assert live_board(str(tmp_path))["steps"] == []
    finally:
        RolloutTraceConfig.shutdown(5.0)
    assert not list((tmp_path / "live").glob("*.json"))


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                     lambda inner: st.lists(inner, max_size=4) |
                     st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


@settings(max_examples=60, deadline=None)
@given(st.one_of(_json, st.fixed_dictionaries({"ops": st.lists(
    st.dictionaries(st.sampled_from(["start", "threshold_s", "trajectory", "span_id", "stuck",
                                     "trajectory_span_id", "name"]), _json), max_size=4)},
    optional={"heartbeat": _json, "interval_s": _json, "unsampled": _json})),
    st.binary(max_size=64))
def test_reader_survives_any_live_file(tmp_path_factory, data, raw):
    directory = tmp_path_factory.mktemp("store")
    (directory / "live").mkdir()
    (directory / "live" / "a.json").write_text(json.dumps(data))
    (directory / "live" / "b.json").write_bytes(raw)
    view = live_workers(str(directory))
    assert len(view["workers"]) + view["unreadable"] == 2
    live_board(str(directory))
    live_ops(str(directory))


def test_viewer_api_answers_the_live_board(tmp_path):
    """``/api/live`` (the viewer's Live board) reads the live files of the store's directory."""
    from types import SimpleNamespace

    from otel_verl.ui.server import api

    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path), live=True)
    try:
        with rollout_trace_attr(step=3, sample_index=7, rollout_n=0):
            STATE.runtime.live.tick()
            board = api(SimpleNamespace(trace_dir=str(tmp_path)), "live", {})
    finally:
        RolloutTraceConfig.shutdown(5.0)
    assert [(o["step"], o["sample_index"], o["trajectory"]) for o in board["ops"]] == \
        [(3, 7, True)]
    assert [(s["step"], s["traced"]) for s in board["steps"]] == [(3, 1)]


def test_p99_rule_flags_an_op_long_before_the_configured_timeout(tmp_path):
    """Once 20 ops of a name ended in a step, one running 5x their p99 (at least 1 s) is stuck,
    with stuck_after_s far away; an op of another name (no history) is not."""
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path), live=True,
                            stuck_after_s=3600)
    try:
        runtime = STATE.runtime
        tracer = runtime.tracer
        now = time.time_ns()
        with rollout_trace_attr(step=1, sample_index=0):
            for i in range(20):  # 20 ended calls of 10 ms
                tracer.start_span("fetch", start_time=now - 10**9 - i).end(
                    end_time=now - 10**9 - i + 10**7)
            slow = tracer.start_span("fetch", start_time=now - 2 * 10**9)  # running 2 s
            other = tracer.start_span("other", start_time=now - 2 * 10**9)
            snapshot = runtime.live.tick()
            by_name = {op["name"]: op for op in snapshot["ops"]}
            assert by_name["fetch"]["stuck"] is True
            assert by_name["fetch"]["threshold_s"] == 1.0  # 5 x 10 ms, floored at 1 s
            assert by_name["other"]["stuck"] is False
            assert by_name["other"]["threshold_s"] == 3600
            slow.end()
            other.end()
    finally:
        RolloutTraceConfig.shutdown(5.0)
