"""The demo's/tests' OTLP/HTTP receiver: real SDK exporter in, plain spans + local store out."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from otel_verl.demo.otlp_receiver import OTLPReceiver, joined_spans_only
from otel_verl.store import read_spans


def _emit(url: str, compression=Compression.NoCompression) -> tuple[int, int, int]:
    provider = TracerProvider(resource=Resource.create({"service.name": "fake-vllm"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=url, compression=compression)))
    tracer = provider.get_tracer("vllm.tracing.otel")
    with tracer.start_as_current_span("chat m", kind=SpanKind.CLIENT) as parent:
        with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER, attributes={
                "gen_ai.usage.completion_tokens": 7, "gen_ai.request.top_p": 0.5,
                "list": ["a", "b"]}):
            pass
    provider.shutdown()
    ctx = parent.get_span_context()
    return ctx.trace_id, ctx.span_id, 2


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_receives_sdk_export_and_writes_the_local_store(tmp_path, compression):
    with OTLPReceiver(store_dir=tmp_path) as receiver:
        trace_id, parent_id, n = _emit(receiver.traces_url, compression)
        spans = receiver.wait_for(lambda s: len(s) >= n, timeout_s=10)
    engine = next(s for s in spans if s["name"] == "llm_request")
    assert engine["trace_id"] == f"{trace_id:032x}"
    assert engine["parent_span_id"] == f"{parent_id:016x}"
    assert engine["kind"] == "SERVER" and engine["scope"]["name"] == "vllm.tracing.otel"
    assert engine["attributes"] == {"gen_ai.usage.completion_tokens": 7,
                                    "gen_ai.request.top_p": 0.5, "list": ["a", "b"]}
    assert engine["resource"]["service.name"] == "fake-vllm"
    # the file is part of the local store: otel_verl's own reader gets the same spans back
    (stored,) = [s for s in read_spans(tmp_path) if s["name"] == "llm_request"]
    assert stored["trace_id"] == engine["trace_id"]
    assert stored["parent_span_id"] == engine["parent_span_id"]
    assert stored["attributes"]["gen_ai.usage.completion_tokens"] == 7
    assert stored["resource"]["service.name"] == "fake-vllm"
    line = json.loads(receiver.store_file.read_text().splitlines()[0])
    assert len(line["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"]) == 32  # hex


def test_json_bad_and_unknown_requests():
    with OTLPReceiver() as receiver:
        doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{
            "traceId": "000000000000000000000000000000a1", "spanId": "00000000000000b2",
            "name": "j",
            "kind": 2}]}]}]}
        ok = httpx.post(receiver.traces_url, json=doc)
        assert ok.status_code == 200
        bad = httpx.post(receiver.traces_url, content=b"\xff\x00garbage",
                         headers={"Content-Type": "application/x-protobuf"})
        assert bad.status_code == 400 and receiver.errors
        gz = httpx.post(receiver.traces_url, content=gzip.compress(b"not gzip json"),
                        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert gz.status_code == 400
        missing = httpx.post(receiver.endpoint + "/v1/metrics", content=b"")
        assert missing.status_code == 404
        (span,) = receiver.spans()
    assert span["name"] == "j" and span["span_id"] == "00000000000000b2"
    assert span["trace_id"] == "000000000000000000000000000000a1" and span["kind"] == "SERVER"
    with pytest.raises(TimeoutError):
        receiver.wait_for(lambda s: len(s) > 5, timeout_s=0.2)


def test_joined_spans_only_drops_what_the_engine_traced_on_its_own(tmp_path):
    from opentelemetry import context, propagate

    with OTLPReceiver(store_dir=tmp_path, span_filter=joined_spans_only) as receiver:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
            endpoint=receiver.traces_url)))
        tracer = provider.get_tracer("vllm.tracing.otel")
        with tracer.start_as_current_span("Executor init"):  # engine start-up: own trace
            with tracer.start_as_current_span("Worker init"):
                pass
        token = context.attach(propagate.extract(  # start-up span parented across processes
            {"traceparent": "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"}))
        try:
            with tracer.start_as_current_span("EngineCoreProc init"):
                pass
        finally:
            context.detach(token)
        with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER):  # untraced
            pass
        caller = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
        token = context.attach(propagate.extract(caller))
        try:
            with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER):
                pass
        finally:
            context.detach(token)
        provider.shutdown()
        (kept,) = receiver.wait_for(lambda s: len(s) >= 1, timeout_s=10)
        assert receiver.requests == 5
    assert kept["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert kept["parent_span_id"] == "b7ad6b7169203331" and kept["parent_is_remote"] is True
    assert [s["name"] for s in read_spans(tmp_path)] == ["llm_request"]
    # older senders do not set the flags: a parented SERVER span counts as joined
    assert joined_spans_only({"parent_is_remote": None, "parent_span_id": "ab", "kind": "SERVER"})
    assert not joined_spans_only({"parent_is_remote": None, "parent_span_id": "ab",
                                  "kind": "INTERNAL"})
    assert not joined_spans_only({"parent_is_remote": True, "parent_span_id": "ab",
                                  "kind": "INTERNAL"})  # vLLM start-up span across processes
