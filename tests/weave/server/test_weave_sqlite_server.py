"""End to end against Weave's own trace server code: OTel spans -> exporter -> HTTP ->
ExternalTraceServer(SqliteTraceServer) -> queried back with Weave's query API."""

from __future__ import annotations

import json

import pytest

# every test here uses the weave_server fixture, which needs weave==0.52.42 + trace-server extras
from _common import API_KEY, PROJECT_ID
from _rollout import (
    COMPLETION_TOKENS,
    EXPERIMENT,
    MODEL,
    PROMPT_TOKENS,
    TRAJECTORIES,
    TURNS,
    OtelDriver,
    calls_per_trajectory,
    ops_per_trajectory,
    otel_sdk_provider,
)
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_weave_exporter import WeaveSpanExporter, replay


def _exporter(shim, **options):
    return WeaveSpanExporter(project=PROJECT_ID, api_key=API_KEY, base_url=shim.url, **options)


def _send_all(shim, memory=None, **options):
    exporter = _exporter(shim, **options)
    extra = [SimpleSpanProcessor(memory)] if memory is not None else []
    with otel_sdk_provider(exporter, *extra) as tracer:
        driver = OtelDriver(tracer)
        for traj in TRAJECTORIES:
            driver.run(*traj)
    return exporter


def _expr(op, field, value):
    return {op: [{"$getField": field}, {"$literal": value}]}


def _as_int(field):
    return {"$convert": {"input": {"$getField": field}, "to": "int"}}


@pytest.fixture
def loaded(weave_server):
    memory = InMemorySpanExporter()
    exporter = _send_all(weave_server, memory)
    assert exporter.stats()["undelivered"] == 0
    return weave_server, memory


def test_call_tree_equals_span_tree(loaded):
    shim, memory = loaded
    spans = memory.get_finished_spans()
    expected = {
        (
            format(s.context.span_id, "016x"),
            format(s.context.trace_id, "032x"),
            format(s.parent.span_id, "016x") if s.parent is not None else None,
            s.name,
        )
        for s in spans
    }
    calls = shim.calls(PROJECT_ID)
    got = {(c.id, c.trace_id, c.parent_id, c.op_name) for c in calls}
    assert len(calls) == len(TRAJECTORIES) * calls_per_trajectory()
    assert got == expected
    # every call kept its timing, inputs and output
    by_name = {c.op_name: c for c in calls}
    gen = by_name["AsyncLLMServerManager.generate"]
    assert gen.started_at <= gen.ended_at
    assert "prompt_ids" in gen.inputs and gen.output["stop_reason"] == "stop"


def test_roots_only_one_per_trajectory(loaded):
    shim, _ = loaded
    roots = shim.calls(PROJECT_ID, trace_roots_only=True)
    assert len(roots) == len(TRAJECTORIES)
    assert {r.op_name for r in roots} == {"rollout_trace"}  # the trajectory span
    assert len({r.trace_id for r in roots}) == len(TRAJECTORIES)
    # the reward set on the trajectory span after the run returned is on its root call
    assert all(r.attributes["reward"] == 1.0 for r in roots)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # attributes are stored as JSON: compare as strings, or $convert for numbers
        (_expr("$eq", "attributes.sample_index", "1"), {(1, 1, 0)}),
        (_expr("$eq", "attributes.experiment_name", EXPERIMENT), {t[:3] for t in TRAJECTORIES}),
        (_expr("$eq", "attributes.experiment_name", "other"), set()),
        ({"$eq": [_as_int("attributes.step"), {"$literal": 2}]}, {(2, 0, 0)}),
        ({"$eq": [_as_int("attributes.rollout_n"), {"$literal": 1}]}, {(1, 0, 1)}),
        ({"$and": [{"$eq": [_as_int("attributes.step"), {"$literal": 1}]},
                   {"$eq": [_as_int("attributes.sample_index"), {"$literal": 0}]}]},
         {(1, 0, 0), (1, 0, 1)}),
        ({"$gte": [_as_int("attributes.step"), {"$literal": 1}]}, {t[:3] for t in TRAJECTORIES}),
    ],
)
def test_attribute_filters_return_exactly_the_expected_calls(loaded, query, expected):
    shim, _ = loaded
    calls = shim.calls(PROJECT_ID, query=query)
    got = [(c.attributes["step"], c.attributes["sample_index"], c.attributes["rollout_n"]) for c in calls]
    assert set(got) == expected
    assert len(got) == len(expected) * calls_per_trajectory()  # every call of those trajectories
    from weave.trace_server import trace_server_interface as tsi

    stats = shim.server.calls_query_stats(
        tsi.CallsQueryStatsReq(project_id=PROJECT_ID, query=tsi.Query(**{"$expr": query}))
    )
    assert stats.count == len(got)


def test_attributes_use_verl_names_and_wb_run_step(loaded):
    shim, _ = loaded
    for call in shim.calls(PROJECT_ID):
        a = call.attributes
        assert {"step", "sample_index", "rollout_n", "validate", "experiment_name"} <= set(a)
        assert not any(k.startswith("rollout.") for k in a)
        assert call.wb_run_step == a["step"]
        assert a["otel"]["resource"]["service.name"] == "weave-exporter-test"


def test_failing_tool_call_carries_its_exception(loaded):
    shim, _ = loaded
    failed = [c for c in shim.calls(PROJECT_ID) if c.exception]
    assert len(failed) == 1
    call = failed[0]
    assert call.op_name == "CalcTool.execute" and call.attributes["sample_index"] == 1
    exc = json.loads(call.exception)
    assert exc["type"] == "ToolFailed"
    assert exc["message"] == "calculator exploded on turn 1"
    assert "Traceback" in exc["stacktrace"]
    # the server derives the call status from it
    assert call.summary["weave"]["status"] == "error"
    # its root shows "descendant error" (status counts rolled up, as the weave client does)
    roots = {c.attributes["sample_index"]: c for c in shim.calls(PROJECT_ID, trace_roots_only=True)}
    assert roots[1].summary["weave"]["status"] == "descendant_error"
    assert roots[1].summary["status_counts"] == {"success": 8, "error": 1}
    assert roots[0].summary["weave"]["status"] == "success"


def test_usage_summed_per_llm_call_and_rolled_up_to_the_root(loaded):
    shim, _ = loaded
    gens = shim.calls(PROJECT_ID, op_names=["AsyncLLMServerManager.generate"])
    assert len(gens) == len(TRAJECTORIES) * len(PROMPT_TOKENS)
    assert sum(c.summary["usage"][MODEL]["prompt_tokens"] for c in gens) == len(TRAJECTORIES) * sum(PROMPT_TOKENS)
    for root in shim.calls(PROJECT_ID, trace_roots_only=True):
        usage = root.summary["usage"][MODEL]
        assert usage["prompt_tokens"] == sum(PROMPT_TOKENS)
        assert usage["completion_tokens"] == sum(COMPLETION_TOKENS)
        assert usage["requests"] == len(PROMPT_TOKENS)


def test_verl_tree_shape_drops_the_trajectory_span(weave_server):
    _send_all(weave_server, keep_trajectory_spans=False)
    roots = weave_server.calls(PROJECT_ID, trace_roots_only=True)
    assert len(roots) == len(TRAJECTORIES)
    assert {r.op_name for r in roots} == {"ToolAgentLoop.run"}
    # the reward of the dropped trajectory span is carried onto its root (same export batch)
    assert all(r.attributes["reward"] == 1.0 for r in roots)
    assert len(weave_server.calls(PROJECT_ID)) == len(TRAJECTORIES) * ops_per_trajectory()
    # usage reaches the root call too
    assert all(r.summary["usage"][MODEL]["requests"] == len(PROMPT_TOKENS) for r in roots)


def test_threads_view_reads_each_trajectory_as_a_conversation(loaded):
    """Weave's own thread query (``threads_query_stream``, what the Threads view lists): one
    thread per trajectory, one turn per LLM call, turns in order; the thread's calls are the
    trajectory's."""
    from weave.trace_server import trace_server_interface as tsi

    shim, _ = loaded
    threads = list(shim.server.threads_query_stream(tsi.ThreadsQueryReq(project_id=PROJECT_ID)))
    expected = {f"{EXPERIMENT}/step={s}/sample={i}/n={n}" for s, i, n, _ in TRAJECTORIES}
    assert {t.thread_id for t in threads} == expected
    assert all(t.turn_count == TURNS for t in threads)
    calls = shim.calls(PROJECT_ID)
    for t in threads:
        mine = shim.calls(PROJECT_ID, thread_ids=[t.thread_id])
        assert len(mine) == calls_per_trajectory()
        turns = sorted((c for c in mine if c.turn_id == c.id), key=lambda c: c.started_at)
        assert [c.op_name for c in turns] == ["AsyncLLMServerManager.generate"] * TURNS
        assert t.first_turn_id == turns[0].id and t.last_turn_id == turns[-1].id
    assert sum(1 for c in calls if c.turn_id) == len(TRAJECTORIES) * TURNS


def test_retries_through_429_and_503_then_delivers(weave_server):
    weave_server.faults = [503, 429]
    exporter = _send_all(weave_server, backoff_initial_s=0.01)
    statuses = [r["status"] for r in weave_server.requests]
    assert statuses[:2] == [503, 429] and statuses[-1] == 200
    assert exporter.stats()["undelivered"] == 0
    assert len(weave_server.calls(PROJECT_ID)) == len(TRAJECTORIES) * calls_per_trajectory()
    assert all(r["auth_ok"] for r in weave_server.requests)


def test_small_request_cap_splits_batches_and_all_calls_arrive(weave_server):
    exporter = _send_all(weave_server, max_request_bytes=8_000, max_call_bytes=4_000)
    sizes = [r["bytes"] for r in weave_server.requests if r["status"] == 200]
    assert len(sizes) > 2 and max(sizes) <= 8_000
    assert exporter.stats()["delivered"] == len(TRAJECTORIES) * calls_per_trajectory()
    assert len(weave_server.calls(PROJECT_ID)) == len(TRAJECTORIES) * calls_per_trajectory()


def test_oversized_call_is_shrunk_with_markers_and_accepted(weave_server):
    from _rollout import otel_sdk_provider as provider

    exporter = _exporter(weave_server, max_call_bytes=20_000, max_request_bytes=100_000)
    with provider(exporter) as tracer, tracer.start_as_current_span("big", attributes={
        "input.value": json.dumps({"prompt": "x" * 200_000, "ids": list(range(50_000))}),
        "output.value": json.dumps({"text": "y" * 10}),
    }):
        pass
    assert exporter.stats()["truncated"] == 1
    (call,) = weave_server.calls(PROJECT_ID)
    assert call.attributes["weave_exporter_truncated"] == ["inputs"]
    assert "truncated" in call.inputs["prompt"] and len(call.inputs["prompt"]) < 20_000
    assert "truncated" in str(call.inputs["ids"][-1])
    assert call.output == {"text": "y" * 10}


def test_undeliverable_calls_are_spooled_and_replayed(weave_server, tmp_path):
    spool = tmp_path / "spool"
    weave_server.faults = [500] * 1000
    exporter = _send_all(weave_server, spool_dir=str(spool), timeout_s=0.3, backoff_initial_s=0.05)
    n = len(TRAJECTORIES) * calls_per_trajectory()
    assert exporter.stats()["undelivered"] == n and exporter.stats()["spooled"] == n
    assert weave_server.calls(PROJECT_ID) == []
    weave_server.faults = []
    counts = replay(spool, api_key=API_KEY, base_url=weave_server.url)
    assert counts["delivered"] == n and counts["files_sent"] == counts["files"] >= 1
    assert len(weave_server.calls(PROJECT_ID)) == n
    assert list(spool.glob("*.jsonl")) == [] and list(spool.glob("*.jsonl.sent"))


def test_weave_server_refusing_one_bad_call_keeps_the_others(weave_server):
    exporter = _exporter(weave_server, timeout_s=10.0)
    with otel_sdk_provider(exporter) as tracer:
        OtelDriver(tracer).run(1, 0, 0, False)
        tracer.start_span("bad", attributes={"output.value": "{oops",
                                             "output.mime_type": "application/json"}).end()
    assert exporter.stats()["undelivered"] == 1
    assert 400 in [r["status"] for r in weave_server.requests]  # weave's own model refused it
    assert len(weave_server.calls(PROJECT_ID)) == calls_per_trajectory()


def test_replay_command_line(weave_server, tmp_path):
    import os
    import subprocess
    import sys

    spool = tmp_path / "spool"
    weave_server.faults = [503] * 1000
    exporter = _send_all(weave_server, spool_dir=str(spool), timeout_s=0.2, backoff_initial_s=0.05)
    assert exporter.stats()["spooled"] == len(TRAJECTORIES) * calls_per_trajectory()
    weave_server.faults = []
    env = {**os.environ, "WANDB_API_KEY": API_KEY}
    done = subprocess.run(
        [sys.executable, "-m", "otel_weave_exporter", "replay", str(spool), "--base-url", weave_server.url],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"delivered={len(TRAJECTORIES) * calls_per_trajectory()}" in done.stdout
    assert len(weave_server.calls(PROJECT_ID)) == len(TRAJECTORIES) * calls_per_trajectory()
