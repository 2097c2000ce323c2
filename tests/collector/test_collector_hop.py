"""A real collector hop: otel_verl (backend=otlp) -> rotel (a real OTLP collector, from PyPI)
-> an OTLP receiver in this test, over gRPC and over HTTP/protobuf.

The same rollout workload also runs once into an in-memory exporter; every span that crossed the
collector must match its in-memory twin: name, kind, parent, attributes (all value types,
payload JSON, a 200 KB field), status, events -- and nothing lost or duplicated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _collector_otlp import Span, otlp_receiver, rotel_collector

from otel_verl import (
    RolloutTraceConfig,
    SpanKindName,
    get_tracer,
    record_reward,
    rollout_trace_attr,
    rollout_trace_op,
    semconv,
)
from otel_verl.testing import capture_spans

BIG = "0123456789abcdef" * (200_000 // 16)  # a 200 KB field, like a long chat transcript
CAPS = {"max_field_bytes": 1 << 20, "max_span_bytes": 2 << 20}  # let BIG through uncut


class ToolFailed(RuntimeError):
    pass


class Agent:
    @rollout_trace_op
    def run(self, prompt: str, big: str) -> dict[str, Any]:
        reply = self.generate([{"role": "user", "content": prompt}])
        try:
            self.call_tool("divide", {"a": 1, "b": 0})
        except ToolFailed:
            pass
        return {"reply": reply, "big_len": len(big), "turns": 2}

    @rollout_trace_op(kind=SpanKindName.LLM)
    def generate(self, messages: list[dict[str, str]]) -> str:
        with get_tracer().start_as_current_span("chat tiny-model", attributes={
            semconv.GEN_AI_OPERATION_NAME: "chat",
            semconv.GEN_AI_REQUEST_MODEL: "tiny-model",
            semconv.GEN_AI_REQUEST_TEMPERATURE: 0.7,
            semconv.GEN_AI_USAGE_INPUT_TOKENS: 12,
            semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 34,
            semconv.GEN_AI_RESPONSE_FINISH_REASONS: ["stop"],
            "test.flags": [True, False],
            "test.floats": [0.5, 1.25],
            "test.unicode": "é ü 中文 🚀",
        }):
            return "It is 42."

    @rollout_trace_op(kind=SpanKindName.TOOL, name="execute_tool divide")
    def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        raise ToolFailed(f"{name}: division by zero")


def workload() -> None:
    agent = Agent()
    for sample_index, validate in ((0, False), (3, True)):
        with rollout_trace_attr(sample_index=sample_index, step=1, rollout_n=0,
                                validate=validate):
            agent.run(f"what is 6*7? (sample {sample_index})", BIG)
            record_reward(1.0 if sample_index == 0 else 0.0, label="correct")


def _plain(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _shape(spans: list[dict[str, Any]]) -> list[str]:
    """Id-free, order-free form of a trace forest: each span with its parent's name."""
    by_id = {s["span_id"]: s for s in spans}
    out = []
    for s in spans:
        parent = by_id[s["parent_span_id"]]["name"] if s["parent_span_id"] else None
        out.append(json.dumps({
            "name": s["name"], "kind": s["kind"], "parent": parent,
            "attributes": _plain(s["attributes"]), "status": s["status"],
            "events": _plain(s["events"]),
        }, sort_keys=True))
    return sorted(out)


def _from_sdk(span: Any) -> dict[str, Any]:
    ctx = span.context
    return {
        "name": span.name, "kind": int(span.kind.value), "span_id": f"{ctx.span_id:016x}",
        "trace_id": f"{ctx.trace_id:032x}",
        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "attributes": dict(span.attributes), "status": int(span.status.status_code.value),
        "events": [[e.name, dict(e.attributes)] for e in span.events],
    }


def _from_wire(span: Span) -> dict[str, Any]:
    # OTLP's SpanKind enum is the SDK's + 1 (0 = UNSPECIFIED)
    return {
        "name": span.name, "kind": span.kind - 1, "span_id": span.span_id,
        "trace_id": span.trace_id, "parent_span_id": span.parent_span_id or None,
        "attributes": span.attributes, "status": span.status_code,
        "events": [[n, a] for n, a in span.events],
    }


@pytest.fixture(scope="module")
def expected() -> list[dict[str, Any]]:
    with capture_spans("proj-hop", "exp-hop", **CAPS) as exporter:
        workload()
    spans = [_from_sdk(s) for s in exporter.get_finished_spans()]
    assert len(spans) == 10  # 2 x (trajectory, run, generate, chat, tool)
    return spans


@pytest.mark.parametrize(("app_protocol", "hop_protocol"), [
    ("grpc", "grpc"),
    ("http/protobuf", "http"),
    ("http/protobuf", "grpc"),
])
def test_spans_cross_a_real_collector_intact(tmp_path: Path, expected: list[dict[str, Any]],
                                             app_protocol: str, hop_protocol: str) -> None:
    with otlp_receiver() as receiver:
        port = receiver.grpc_port if hop_protocol == "grpc" else receiver.http_port
        with rotel_collector(tmp_path, forward_to=f"http://127.0.0.1:{port}",
                             forward_protocol=hop_protocol) as rotel:
            endpoint = rotel.grpc_endpoint if app_protocol == "grpc" else rotel.http_endpoint
            RolloutTraceConfig.init("proj-hop", "exp-hop", backend="otlp",
                                    otlp_endpoint=endpoint, otlp_protocol=app_protocol,
                                    processor="batch", service_name="hop-test", **CAPS)
            workload()
            assert RolloutTraceConfig.shutdown(timeout_s=10.0)
            got = receiver.wait_for(len(expected), timeout_s=20.0)
            assert len(got) == len(expected), (len(got), rotel.log())
        assert receiver.transports() == {"grpc" if hop_protocol == "grpc" else "http"}

    wire = [_from_wire(s) for s in got]
    # nothing lost, nothing duplicated, nothing changed on the way
    assert len({s["span_id"] for s in wire}) == len(wire)
    assert _shape(wire) == _shape(expected)

    # parents intact as ids, not just names: every parent id is a span of the same trace
    by_id = {s["span_id"]: s for s in wire}
    roots = [s for s in wire if s["parent_span_id"] is None]
    assert sorted(r["name"] for r in roots) == ["rollout_trace", "rollout_trace"]
    for s in wire:
        if s["parent_span_id"] is not None:
            assert by_id[s["parent_span_id"]]["trace_id"] == s["trace_id"]
    assert len({s["trace_id"] for s in wire}) == 2

    # the things people filter and read on, spot-checked on the wire form
    run = next(s for s in wire if s["name"] == "Agent.run"
               and s["attributes"][semconv.ROLLOUT_SAMPLE_INDEX] == 3)
    assert run["attributes"][semconv.ROLLOUT_VALIDATE] is True
    assert run["attributes"][semconv.ROLLOUT_STEP] == 1
    assert json.loads(run["attributes"][semconv.INPUT_VALUE])["big"] == BIG
    tool = next(s for s in wire if s["name"] == "execute_tool divide")
    assert tool["status"] == 2  # ERROR
    assert [e[0] for e in tool["events"]] == ["exception"]
    assert all(s.resource["service.name"] == "hop-test" for s in got)
    assert all(s.resource[semconv.ROLLOUT_PROJECT_NAME] == "proj-hop" for s in got)
