"""Running calls on the wire against the newest weave (0.54.x): the start and end the exporter
sends for a stuck op (docs/weave.md "Running calls") take the routes and bodies weave's own
client uses for an eager call (``_send_call_start_v2`` / ``_send_call_end_v2``), and validate
against the generated SDK's request types."""

from __future__ import annotations

import json

import pytest
from _common import API_KEY
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_weave_exporter import WeaveSpanExporter

pytestmark = pytest.mark.weave_latest

ENTITY, PROJECT = "wire-ent", "wire-proj"


@pytest.fixture(autouse=True)
def _latest_weave():
    pytest.importorskip("weave.vendor.weave_server_sdk", reason="needs weave>=0.54 (requirements/weave_latest.txt)")


def _stuck_op():
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "wire"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("wire")
    with tracer.start_as_current_span("agent", attributes={"rollout.step": 1}) as agent:
        op = tracer.start_span("tool", attributes={"rollout.step": 1, "input.value": '{"q": 1}',
                                                   "input.mime_type": "application/json"})
        flight = tracer.start_span("otel_verl.in_flight",
                                   context=otel_trace.set_span_in_context(op), attributes={
            "rollout.step": 1, "otel_verl.live.op": "tool",
            "otel_verl.live.span_id": format(op.get_span_context().span_id, "016x"),
            "otel_verl.live.parent_span_id": format(agent.get_span_context().span_id, "016x"),
            "otel_verl.live.start_ns": op.start_time, "otel_verl.live.input": '{"q": 1}',
            "otel_verl.live.input_mime_type": "application/json"})
        flight.end()
        op.set_attribute("output.value", "done")
        op.end()
    spans = {s.name: s for s in memory.get_finished_spans()}
    return spans["otel_verl.in_flight"], spans["tool"]


def _without_nulls(doc):
    return {k: v for k, v in doc.items() if v is not None}


def test_start_and_end_are_what_the_latest_client_sends(recorder):
    from weave.trace_server_bindings.remote_http_trace_server import RemoteHTTPTraceServer

    flight, op = _stuck_op()
    exporter = WeaveSpanExporter(project=PROJECT, entity=ENTITY, api_key=API_KEY,
                                 base_url=recorder.url)
    try:
        assert exporter.export_detailed([flight]).accepted == (0,)
        assert exporter.export_detailed([op]).accepted == (0,)
    finally:
        exporter.shutdown()
    ours = list(recorder.requests)
    assert [r["path"] for r in ours] == [f"/v2/{ENTITY}/{PROJECT}/call/start",
                                         f"/v2/{ENTITY}/{PROJECT}/call/end"]
    start = json.loads(ours[0]["body"])["start"]
    end = json.loads(ours[1]["body"])["end"]
    assert start["id"] == end["id"] == format(op.context.span_id, "016x")

    client = RemoteHTTPTraceServer(recorder.url, password=API_KEY)
    client._send_call_start_v2(start)
    client._send_call_end_v2(end)
    theirs = recorder.requests[len(ours):]
    for mine, their in zip(ours, theirs, strict=True):
        assert their["path"] == mine["path"]
        assert their["headers"]["Authorization"] == mine["headers"]["Authorization"]
        kind = "start" if mine["path"].endswith("start") else "end"
        assert _without_nulls(json.loads(their["body"])[kind]) == \
            _without_nulls(json.loads(mine["body"])[kind])


def test_start_and_end_validate_against_the_latest_sdk_types(recorder):
    import pydantic
    from weave.vendor.weave_server_sdk.types.call_end_params import CallEndParams
    from weave.vendor.weave_server_sdk.types.call_start_params import CallStartParams

    flight, op = _stuck_op()
    exporter = WeaveSpanExporter(project=PROJECT, entity=ENTITY, api_key=API_KEY,
                                 base_url=recorder.url)
    try:
        exporter.export_detailed([flight])
        exporter.export_detailed([op])
    finally:
        exporter.shutdown()
    start_body, end_body = (json.loads(r["body"]) for r in recorder.requests)
    pydantic.TypeAdapter(CallStartParams).validate_python(start_body)
    pydantic.TypeAdapter(CallEndParams).validate_python(end_body)
    broken = {"start": {k: v for k, v in start_body["start"].items() if k != "op_name"}}
    with pytest.raises(pydantic.ValidationError):  # the check can fail
        pydantic.TypeAdapter(CallStartParams).validate_python(broken)
