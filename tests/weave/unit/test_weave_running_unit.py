"""Running calls on their own (no weave package): otel_verl's in-flight span -> the start of the
stuck op's call, the op's span -> its end; what goes to which route, and what a 409 means."""

from __future__ import annotations

import json

from _common import API_KEY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_weave_exporter import WeaveSpanExporter
from otel_weave_exporter._running import in_flight_op_id, start_call
from otel_weave_exporter._translate import Translator, iso_time

IN_FLIGHT = "otel_verl.in_flight"
START_PATH = "/v2/ent/proj/call/start"
END_PATH = "/v2/ent/proj/call/end"
COMPLETE_PATH = "/v2/ent/proj/calls/complete"


def _stuck_op(extra: dict | None = None):
    """(in-flight span, the op's span, its parent's span), as otel_verl's live tracker sends
    them: the in-flight span is a child of the op, from the op's start."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "unit"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("unit")
    start_ns = 1_764_590_000_123_456_789  # not a float-exact second count
    with tracer.start_as_current_span("agent", attributes={"rollout.step": 3}) as agent:
        op = tracer.start_span("tool", start_time=start_ns, attributes={
            "rollout.step": 3, "rollout.sample_index": 1, "rollout.rollout_n": 0,
            "rollout.experiment_name": "exp", "input.value": '{"q": "slow"}',
            "input.mime_type": "application/json"})
        attrs = {
            "rollout.step": 3, "rollout.sample_index": 1, "rollout.rollout_n": 0,
            "rollout.experiment_name": "exp",
            "otel_verl.live.op": "tool", "otel_verl.live.span_id":
                format(op.get_span_context().span_id, "016x"),
            "otel_verl.live.parent_span_id": format(agent.get_span_context().span_id, "016x"),
            "otel_verl.live.start_ns": start_ns, "otel_verl.live.elapsed_s": 2.5,
            "otel_verl.live.input": '{"q": "slow"}',
            "otel_verl.live.input_mime_type": "application/json",
            **(extra or {}),
        }
        flight = tracer.start_span(IN_FLIGHT, context=otel_trace.set_span_in_context(op),
                                   start_time=int(start_ns / 1e9 * 1e9), attributes=attrs)
        flight.end()
        op.set_attribute("output.value", "done")
        op.end()
    spans = {s.name: s for s in memory.get_finished_spans()}
    return spans[IN_FLIGHT], spans["tool"], spans["agent"]


def test_in_flight_span_translates_to_the_start_of_the_stuck_ops_call():
    flight, op, agent = _stuck_op()
    op_id = in_flight_op_id(flight)
    assert op_id == format(op.context.span_id, "016x")
    assert in_flight_op_id(op) is None and in_flight_op_id(agent) is None
    start = start_call(Translator("ent", "proj"), flight, op_id)
    assert start["id"] == op_id  # the op's own call, not one for the in-flight span
    assert start["trace_id"] == format(op.context.trace_id, "032x")
    assert start["parent_id"] == format(agent.context.span_id, "016x")
    assert start["started_at"] == iso_time(op.start_time)  # exact: the complete call's start
    assert start["op_name"] == "tool" and start["project_id"] == "ent/proj"
    assert start["inputs"].text == '{"q": "slow"}'  # JSON as its producer declared it
    assert start["attributes"]["step"] == 3 and start["attributes"]["sample_index"] == 1
    assert start["attributes"]["otel"]["live"]["elapsed_s"] == 2.5
    assert start["thread_id"] == "exp/step=3/sample=1/n=0" and start["wb_run_step"] == 3
    assert "ended_at" not in start and "output" not in start


def _exporter(rec, **options) -> WeaveSpanExporter:
    options = {"timeout_s": 5.0, "backoff_initial_s": 0.01, **options}
    return WeaveSpanExporter(project="ent/proj", api_key=API_KEY, base_url=rec.url, **options)


def _sent(rec):
    return [(r["path"], json.loads(r["body"])) for r in rec.requests]


def test_start_then_end_instead_of_a_complete_call(recorder):
    flight, op, agent = _stuck_op()
    op_id = format(op.context.span_id, "016x")
    exporter = _exporter(recorder)
    try:
        d = exporter.export_detailed([flight])
        assert d.accepted == (0,) and not d.retryable and not d.rejected
        ((path, doc),) = _sent(recorder)
        assert path == START_PATH and doc["start"]["id"] == op_id
        assert doc["start"]["inputs"] == {"q": "slow"}
        assert exporter.export_detailed([flight]).accepted == (0,)  # a retry sends nothing
        assert len(recorder.requests) == 1
        d = exporter.export_detailed([op, agent])
        assert sorted(d.accepted) == [0, 1]
        (end_path, end), (complete_path, batch) = _sent(recorder)[1:]
        assert end_path == END_PATH and end["end"]["id"] == op_id
        assert end["end"]["output"] == "done" and end["end"]["ended_at"] == iso_time(op.end_time)
        assert end["end"]["started_at"] == iso_time(op.start_time)
        assert complete_path == COMPLETE_PATH
        assert [c["id"] for c in batch["batch"]] == [format(agent.context.span_id, "016x")]
        assert exporter.running_stats()["started"] == 1
        assert exporter.running_stats()["ended"] == 1
    finally:
        exporter.shutdown()


def test_export_path_starts_and_ends_too(recorder):
    flight, op, agent = _stuck_op()
    exporter = _exporter(recorder)
    try:
        assert exporter.export([flight]).name == "SUCCESS"
        assert exporter.export([op, agent]).name == "SUCCESS"
    finally:
        exporter.shutdown()
    assert [p for p, _ in _sent(recorder)] == [START_PATH, END_PATH, COMPLETE_PATH]


def test_op_in_the_same_batch_needs_no_start(recorder):
    flight, op, agent = _stuck_op()
    exporter = _exporter(recorder)
    try:
        assert sorted(exporter.export_detailed([flight, op, agent]).accepted) == [0, 1, 2]
        assert exporter.export_detailed([flight]).accepted == (0,)  # late: its op ended
    finally:
        exporter.shutdown()
    ((path, doc),) = _sent(recorder)
    assert path == COMPLETE_PATH and len(doc["batch"]) == 2  # tool and agent, complete


def test_conflict_on_start_is_done_and_on_complete_becomes_the_end(recorder):
    flight, op, agent = _stuck_op()
    exporter = _exporter(recorder)
    try:
        recorder.statuses = [409]  # "that id exists": started by an earlier process
        assert exporter.export_detailed([flight]).accepted == (0,)
    finally:
        exporter.shutdown()
    fresh = _exporter(recorder)  # a restart: nothing remembered
    try:
        recorder.statuses = [409]  # the complete call of an id the server has
        d = fresh.export_detailed([op])
        assert d.accepted == (0,) and not d.retryable and not d.rejected
    finally:
        fresh.shutdown()
    paths = [p for p, _ in _sent(recorder)]
    assert paths == [START_PATH, COMPLETE_PATH, END_PATH]
    assert _sent(recorder)[2][1]["end"]["id"] == format(op.context.span_id, "016x")


def test_start_not_delivered_is_retryable_and_the_op_then_completes(recorder):
    flight, op, _ = _stuck_op()
    exporter = _exporter(recorder, timeout_s=0.5)
    try:
        recorder.statuses = [503] * 50
        assert exporter.export_detailed([flight]).retryable == (0,)
        recorder.statuses = []
        assert exporter.export_detailed([op]).accepted == (0,)  # never started: complete
    finally:
        exporter.shutdown()
    assert _sent(recorder)[-1][0] == COMPLETE_PATH


_text = st.one_of(st.none(), st.text(max_size=40), st.integers(), st.booleans(),
                  st.sampled_from(["0" * 16, "zz" * 8, "abcdef0123456789", "1" * 32]))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(span_id=_text, parent=_text, start_ns=_text, op_name=_text, raw_input=_text,
       mime=_text)
def test_hostile_in_flight_spans_never_break_export(recorder, span_id, parent, start_ns,
                                                    op_name, raw_input, mime):
    extra = {k: v for k, v in {
        "otel_verl.live.span_id": span_id, "otel_verl.live.parent_span_id": parent,
        "otel_verl.live.start_ns": start_ns, "otel_verl.live.op": op_name,
        "otel_verl.live.input": raw_input, "otel_verl.live.input_mime_type": mime,
    }.items() if v is not None}
    flight, op, agent = _stuck_op(extra)
    exporter = _exporter(recorder)
    try:
        d = exporter.export_detailed([flight, op, agent])
        every = sorted([*d.accepted, *(i for i, _ in d.rejected), *d.retryable])
        assert every == [0, 1, 2]
        assert not d.rejected and not d.retryable
    finally:
        exporter.shutdown()


def test_trajectory_child_is_a_root_without_trajectory_calls():
    """keep_trajectory_spans=False: the trajectory span is no call, its children are roots; the
    start of a stuck op directly under it is a root too (as its complete call would be)."""
    flight, _, agent = _stuck_op({"otel_verl.live.trajectory_child": True})
    op_id = in_flight_op_id(flight)
    kept = start_call(Translator("ent", "proj"), flight, op_id)
    assert kept["parent_id"] == format(agent.context.span_id, "016x")
    dropped = start_call(Translator("ent", "proj", keep_trajectory_spans=False), flight, op_id)
    assert dropped["parent_id"] is None


def test_live_keys_are_otel_verls():
    """The exporter copies otel_verl's in-flight keys (it does not import otel_verl)."""
    from otel_verl import semconv
    from otel_weave_exporter import _running as r

    assert r.IN_FLIGHT_SPAN == semconv.IN_FLIGHT_SPAN
    for name in ("OP", "SPAN_ID", "PARENT_SPAN_ID", "START_NS", "INPUT", "INPUT_MIME_TYPE",
                 "TRAJECTORY_CHILD"):
        assert getattr(r, f"LIVE_{name}") == getattr(semconv, f"OTEL_VERL_LIVE_{name}"), name
