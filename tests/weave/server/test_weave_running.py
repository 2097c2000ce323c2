"""Running calls (issue 20, docs/weave.md "Running calls") against Weave's own server code.

A stuck op (a real traced tool that sleeps past ``stuck_after_s`` with ``live=true``) is stored
in Weave's SqliteTraceServer as a call started and not ended while it hangs, and once it ends as
one call with its end and output; otel_verl's ``otel_verl.in_flight`` span is no call of its own.
Sending the same batches again (retry) and replaying them in a new exporter (a restart) leaves
the same calls, without errors.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from _common import API_KEY, PROJECT_ID

otel_verl = pytest.importorskip("otel_verl", reason="needs the otel_verl core (pip install -e .)")

from opentelemetry.sdk.resources import Resource  # noqa: E402 -- after importorskip
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from otel_verl import SpanKindName, rollout_trace_attr, rollout_trace_op  # noqa: E402
from otel_verl._live import LiveTracker  # noqa: E402
from otel_weave_exporter import WeaveSpanExporter  # noqa: E402

IN_FLIGHT = "otel_verl.in_flight"
STUCK_AFTER_S = 0.5
WAIT_S = 30.0  # generous: the machine is shared; nothing here asserts on timing


def _wait_for(predicate, timeout_s: float = WAIT_S, poll_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        found = predicate()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(poll_s)


class HangingTool:
    def __init__(self) -> None:
        self.release = threading.Event()

    @rollout_trace_op(kind=SpanKindName.TOOL)
    def execute(self, instance_id: str, parameters: dict) -> dict:
        self.release.wait(60)
        return {"text": str(parameters["a"] + parameters["b"])}


class Agent:
    def __init__(self) -> None:
        self.tool = HangingTool()

    @rollout_trace_op(kind=SpanKindName.AGENT)
    def run(self, index: int) -> dict:
        return self.tool.execute(f"i{index}", {"a": index, "b": 2})


def _tool_calls(server):
    return [c for c in server.calls(PROJECT_ID) if c.op_name.endswith("HangingTool.execute")]


def test_stuck_tool_is_a_running_call_then_one_ended_call(weave_server, monkeypatch, tmp_path):
    from otel_verl import RolloutTraceConfig

    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init(PROJECT_ID, "exp-live", backend="weave",
                            weave_base_url=weave_server.url, trace_dir=str(tmp_path / "traces"),
                            live=True, stuck_after_s=STUCK_AFTER_S, schedule_delay_s=0.1,
                            export_delay_s=0.3, export_timeout_s=5.0)
    agent = Agent()
    outcome: dict = {}

    def rollout() -> None:
        with rollout_trace_attr(sample_index=4, step=9, rollout_n=0):
            outcome["result"] = agent.run(4)

    thread = threading.Thread(target=rollout, daemon=True)
    try:
        thread.start()
        running = _wait_for(lambda: _tool_calls(weave_server))
        # while the tool hangs: Weave's server holds its call, started, with no end
        assert running, "the stuck tool's call was not started in Weave while it hung"
        assert thread.is_alive()
        (call,) = running
        assert call.ended_at is None and call.output is None
        assert call.parent_id is not None and len(call.trace_id) == 32
        assert call.attributes["step"] == 9 and call.attributes["sample_index"] == 4
        assert call.inputs["parameters"] == {"a": 4, "b": 2}
        assert call.thread_id == "exp-live/step=9/sample=4/n=0"
        assert not [c for c in weave_server.calls(PROJECT_ID) if c.op_name == IN_FLIGHT]
        started_at = call.started_at

        agent.tool.release.set()
        thread.join(30)
        assert not thread.is_alive()
        assert RolloutTraceConfig.shutdown(timeout_s=20)
    finally:
        agent.tool.release.set()
        RolloutTraceConfig.reset()

    calls = weave_server.calls(PROJECT_ID)
    assert len({c.id for c in calls}) == len(calls)
    (ended,) = _tool_calls(weave_server)
    assert ended.id == call.id and ended.started_at == started_at
    assert ended.ended_at is not None and ended.ended_at > ended.started_at
    assert ended.exception is None
    assert ended.output == {"text": "6"}
    assert ended.summary["status_counts"] == {"success": 1, "error": 0}
    # in its tree: the agent loop's call is its parent, the trajectory's root call above that
    by_id = {c.id: c for c in calls}
    agent_call = by_id[ended.parent_id]
    assert agent_call.op_name.endswith("Agent.run") and agent_call.ended_at is not None
    root = by_id[agent_call.parent_id]
    assert root.parent_id is None and root.attributes["sample_index"] == 4
    assert not [c for c in calls if c.op_name == IN_FLIGHT]
    # sent as Weave's client sends an eager call: one start, one end, for that id
    eager = [r for r in weave_server.requests if r.get("kind")]
    assert [(r["kind"], r["id"], r["status"]) for r in eager] == [
        ("start", call.id, 200), ("end", call.id, 200)]


def _recorded_stuck_op(tmp_path):
    """A real stuck op on an SDK provider with otel_verl's live tracker: the in-flight span
    (sent while the op hung), the op's span and its parent's, as an exporter receives them."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "k2"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("k2")
    tracker = LiveTracker(str(tmp_path), tracer, stuck_after_s=STUCK_AFTER_S)
    provider.add_span_processor(tracker)
    try:
        with tracer.start_as_current_span("agent", attributes={"rollout.step": 2}):
            with tracer.start_as_current_span("tool", attributes={
                "rollout.step": 2, "input.value": json.dumps({"q": "slow"}),
                "input.mime_type": "application/json",
            }) as tool:
                assert _wait_for(lambda: [s for s in memory.get_finished_spans()
                                          if s.name == IN_FLIGHT]), "no in-flight span sent"
                tool.set_attribute("output.value", "done")
    finally:
        tracker.close()
    by_name = {s.name: s for s in memory.get_finished_spans()}
    return by_name[IN_FLIGHT], by_name["tool"], by_name["agent"]


def _exporter(server) -> WeaveSpanExporter:
    return WeaveSpanExporter(project=PROJECT_ID, api_key=API_KEY, base_url=server.url,
                             timeout_s=10.0)


def _accepted(delivery, n: int) -> None:
    assert not delivery.rejected and not delivery.retryable, delivery
    assert sorted(delivery.accepted) == list(range(n))


def _only_two_calls(server, tool_id: str) -> None:
    calls = server.calls(PROJECT_ID)
    assert sorted(c.op_name for c in calls) == ["agent", "tool"], [c.op_name for c in calls]
    tool = next(c for c in calls if c.op_name == "tool")
    assert tool.id == tool_id and tool.ended_at is not None and tool.output == "done"
    assert tool.inputs == {"q": "slow"}


def test_retry_and_replay_duplicate_nothing(weave_server, tmp_path):
    in_flight, tool, agent = _recorded_stuck_op(tmp_path)
    tool_id = format(tool.context.span_id, "016x")
    exporter = _exporter(weave_server)
    try:
        _accepted(exporter.export_detailed([in_flight]), 1)
        (running,) = weave_server.calls(PROJECT_ID)
        assert running.id == tool_id and running.ended_at is None
        assert running.parent_id == format(agent.context.span_id, "016x")
        assert running.inputs == {"q": "slow"}
        _accepted(exporter.export_detailed([in_flight]), 1)  # retried: nothing new
        assert len(weave_server.calls(PROJECT_ID)) == 1
        _accepted(exporter.export_detailed([tool, agent]), 2)
        _only_two_calls(weave_server, tool_id)
        _accepted(exporter.export_detailed([in_flight, tool, agent]), 3)  # the log resends all
        _only_two_calls(weave_server, tool_id)
    finally:
        exporter.shutdown()
    # a restart: a new exporter (nothing remembered) replays the log, in its batches and in one
    for batches in ([[in_flight], [tool, agent]], [[in_flight, tool, agent]]):
        again = _exporter(weave_server)
        try:
            for batch in batches:
                _accepted(again.export_detailed(batch), len(batch))
                _only_two_calls(weave_server, tool_id)
        finally:
            again.shutdown()
    statuses = {r.get("status") for r in weave_server.requests}
    assert statuses <= {200, 409}, weave_server.requests  # 409: "that id exists", handled


def test_op_that_ends_before_its_start_is_sent_is_one_complete_call(weave_server, tmp_path):
    """The in-flight span and the op's own span in one batch (the op ended before the export):
    no start is sent, the op is one complete call; a late in-flight span starts nothing."""
    in_flight, tool, agent = _recorded_stuck_op(tmp_path)
    exporter = _exporter(weave_server)
    try:
        _accepted(exporter.export_detailed([in_flight, tool, agent]), 3)
        _accepted(exporter.export_detailed([in_flight]), 1)
        assert exporter.running_stats()["started"] == 0
    finally:
        exporter.shutdown()
    _only_two_calls(weave_server, format(tool.context.span_id, "016x"))
    assert not [r for r in weave_server.requests if r.get("kind") == "start"]


class HeldServer:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.hold = False

    @rollout_trace_op(kind=SpanKindName.LLM)
    def generate(self, request_id: str, *, prompt_ids: list) -> dict:
        if self.hold:
            self.release.wait(60)
        return {"token_ids": [7, 8], "stop_reason": "stop"}


@pytest.fixture
def objects_server(tmp_path):
    from _weave_objects import WeaveObjectsShim

    with WeaveObjectsShim(str(tmp_path / "weave.sqlite"), API_KEY) as shim:
        yield shim


def test_held_llm_request_starts_with_its_prompt_as_content(objects_server, monkeypatch,
                                                            tmp_path):
    """A held engine request (its prompt delta-coded by otel_verl) is started with the prompt
    read as its complete call reads it: the same token ids, rebuilt from Weave's objects."""
    from otel_verl import RolloutTraceConfig

    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    monkeypatch.setenv("OTEL_EXPORTER_WEAVE_CONTENT_INLINE_BYTES", "64")  # prompts as objects
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init(PROJECT_ID, "exp-held", backend="weave",
                            weave_base_url=objects_server.url, trace_dir=str(tmp_path / "t"),
                            live=True, stuck_after_s=STUCK_AFTER_S, schedule_delay_s=0.1,
                            export_delay_s=0.3, export_timeout_s=5.0)
    server = HeldServer()
    prompt = list(range(100, 400))

    def rollout(sample: int) -> None:
        with rollout_trace_attr(sample_index=sample, step=1, rollout_n=0):
            server.generate(f"req-{sample}", prompt_ids=prompt)

    try:
        rollout(0)  # not held: a complete call, for reference
        server.hold = True
        thread = threading.Thread(target=rollout, args=(1,), daemon=True)
        thread.start()

        def held():
            return [c for c in objects_server.calls(PROJECT_ID)
                    if c.op_name.endswith("HeldServer.generate") and c.ended_at is None
                    and c.parent_id is not None]

        running = _wait_for(held)
        assert running, "the held request's call was not started in Weave while it was held"
        (call,) = running
        assert call.attributes["sample_index"] == 1
        field = call.inputs["prompt_ids"]
        assert isinstance(field, dict) and field.get("segments"), field  # objects, not a list
        assert objects_server.prompt(field) == prompt
        server.release.set()
        thread.join(30)
        assert RolloutTraceConfig.shutdown(timeout_s=20)
    finally:
        server.release.set()
        RolloutTraceConfig.reset()
    calls = [c for c in objects_server.calls(PROJECT_ID)  # the trajectory roots take its name
             if c.op_name.endswith("HeldServer.generate") and c.parent_id is not None]
    assert len(calls) == 2 and all(c.ended_at is not None for c in calls)
    ended = next(c for c in calls if c.id == call.id)
    assert ended.output == {"token_ids": [7, 8], "stop_reason": "stop"}
    assert objects_server.prompt(ended.inputs["prompt_ids"]) == prompt
