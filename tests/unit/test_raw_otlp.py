"""The log's stored OTLP/JSON lines sent as protobuf bytes (otel_verl.exporters._raw_otlp).

What is sent must be exactly what the SDK's own exporter would send for the same spans (the same
request bytes, path, headers, compression, metadata), and any line the writer does not know must
send nothing and say so (the caller decodes it instead)."""

from __future__ import annotations

import json
import math
import sys
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceState

from otel_verl import _otlp_json
from otel_verl.exporters._raw_otlp import ACCEPTED, REFUSED, RETRY, encode_lines, raw_sender_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared stub servers
from _servers import LocalServer, QuietHandler  # noqa: E402

RESOURCE = Resource.create({"service.name": "raw", "rollout.project_name": "p", "n": 3})
SCOPE = InstrumentationScope("otel_verl", "1.2", "https://schema", {"scope.key": "v"})

_int64 = st.integers(-(2**63), 2**63 - 1)
_text = st.text(max_size=40)
# NaN as the one NaN JSON can carry (a NaN's payload bits do not survive OTLP/JSON)
_float = st.floats(allow_nan=False) | st.just(math.nan)
_scalar = st.one_of(_text, st.booleans(), _int64, _float)
_value = st.one_of(_scalar, st.lists(_text, max_size=3), st.lists(_int64, max_size=3),
                   st.lists(st.booleans(), max_size=3), st.lists(_float, max_size=3))
_attrs = st.dictionaries(st.text(min_size=1, max_size=12), _value, max_size=6)
_ids = st.integers(1, 2**64 - 1)


@st.composite
def _spans(draw: Any) -> ReadableSpan:
    trace_id = draw(st.integers(1, 2**128 - 1))
    context = SpanContext(trace_id, draw(_ids), False,
                          trace_state=TraceState([("k", "v")]) if draw(st.booleans()) else None)
    parent = None
    if draw(st.booleans()):
        parent = SpanContext(trace_id, draw(_ids), draw(st.booleans()))
    start = draw(st.integers(0, 2**63))
    events = [Event(draw(_text), draw(_attrs), draw(st.integers(0, 2**63)))
              for _ in range(draw(st.integers(0, 2)))]
    links = [Link(SpanContext(draw(st.integers(1, 2**128 - 1)), draw(_ids), draw(st.booleans())),
                  draw(_attrs)) for _ in range(draw(st.integers(0, 2)))]
    code = draw(st.sampled_from(list(StatusCode)))
    status = Status(code, draw(_text) if code is StatusCode.ERROR else None)
    return ReadableSpan(name=draw(_text), context=context, parent=parent, resource=RESOURCE,
                        attributes=draw(_attrs), events=events, links=links,
                        kind=draw(st.sampled_from(list(SpanKind))), status=status,
                        start_time=start, end_time=start + draw(st.integers(0, 10**12)),
                        instrumentation_scope=SCOPE)


def _span(name: str, resource: Resource = RESOURCE, **attributes: Any) -> ReadableSpan:
    return ReadableSpan(name=name, context=SpanContext(0xABC, abs(hash(name)) % 2**63 + 1, False),
                        resource=resource, attributes={"x": name, **attributes},
                        start_time=1, end_time=2, instrumentation_scope=SCOPE)


def _parsed(line: bytes) -> bytes:
    """What protobuf's own JSON mapping parses from ``line``, serialised."""
    request = _otlp_json.otlp_json_to_request(json.loads(line), ExportTraceServiceRequest())
    return request.SerializeToString(deterministic=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_spans(), min_size=1, max_size=5))
def test_stored_lines_become_the_sdk_exporters_request_byte_for_byte(spans):
    lines = [_otlp_json.encode_span_line(span) for span in spans]
    assert encode_lines(lines) == encode_spans(spans).SerializeToString(deterministic=True)
    for line in lines:  # and each line is what protobuf's JSON mapping reads from it
        assert encode_lines([line]) == _parsed(line)


def test_lines_of_two_resources_make_one_resource_spans_each():
    other = Resource.create({"service.name": "other"})
    spans = [_span("a"), _span("b", resource=other), _span("c")]
    request = ExportTraceServiceRequest.FromString(
        encode_lines([_otlp_json.encode_span_line(s) for s in spans]))
    groups = [[s.name for ss in rs.scope_spans for s in ss.spans] for rs in request.resource_spans]
    assert groups == [["a", "c"], ["b"]]
    # a line of several spans (an older writer's, or a collector's file) goes in as it is
    multi = _otlp_json.encode_line(spans)
    assert encode_lines([multi]) == _parsed(multi)


def _line(**span_fields: Any) -> bytes:
    doc = json.loads(_otlp_json.encode_span_line(_span("x")))
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0].update(span_fields)
    return json.dumps(doc).encode() + b"\n"


@pytest.mark.parametrize("line", [
    _line(unknownField=1),  # a field this writer does not know
    _line(span_id="00f067aa0ba902b7"),  # snake_case spelling
    _line(spanId="APBnqguqArc="),  # a base64 id (the decoder reads it; this writer does not)
    _line(kind="SPAN_KIND_SERVER"),  # an enum as its name
    _line(attributes=[{"key": "k", "value": {"stringValue": "v", "intValue": "1"}}]),
    _line(attributes=[{"key": "k", "value": {"stringValueStrindex": 3}}]),
    _line(startTimeUnixNano="12.5"),
    _line(attributes=[{"key": "k", "value": {"intValue": str(2**63)}}]),
    b'{"resourceSpans":[{"resource":{"entityRefs":[{}]},"scopeSpans":[]}]}\n',
    b'{"resource_spans":[]}\n',
    b"not json\n",
    b"[]\n",
])
def test_a_line_this_writer_does_not_know_is_refused_not_guessed(line):
    with pytest.raises(ValueError):
        encode_lines([_otlp_json.encode_span_line(_span("ok")), line])


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.sampled_from(
                         ["resourceSpans", "resource", "scopeSpans", "scope", "spans", "attributes",
                          "key", "value", "stringValue", "intValue", "arrayValue", "values",
                          "kvlistValue", "traceId", "spanId", "name", "status", "code", "events",
                          "links", "flags", "bytesValue", "doubleValue"]), inner, max_size=4),
                     max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(_json)
def test_any_json_line_is_written_or_refused_with_value_error(doc):
    line = json.dumps(doc).encode()
    try:
        data = encode_lines([line])
    except ValueError:
        return
    ExportTraceServiceRequest.FromString(data)  # what it writes is a valid request


def test_only_the_sdks_own_otlp_exporters_get_a_raw_sender():
    http_exporter = HttpExporter(endpoint="http://127.0.0.1:9/v1/traces")
    grpc_exporter = GrpcExporter(endpoint="127.0.0.1:9", insecure=True)

    class Overridden(HttpExporter):
        def export(self, spans):  # a subclass that changes what export does keeps its export
            return super().export(spans)

    assert raw_sender_for(http_exporter).protocol == "http/protobuf"
    assert raw_sender_for(grpc_exporter).protocol == "grpc"
    assert raw_sender_for(Overridden(endpoint="http://127.0.0.1:9/v1/traces")) is None
    assert raw_sender_for(InMemorySpanExporter()) is None
    for exporter in (http_exporter, grpc_exporter):
        exporter.shutdown()


# --- against receivers: what arrives is what the SDK exporter sends -------------------------------


class _HttpReceiver:
    """Records (path, headers, decompressed body) of every POST; answers 200 (or ``status``)."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        self.status = 200
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.read_body(decompress=True)
                keep = {k.lower(): v for k, v in self.headers.items()
                        if k.lower() in ("content-type", "content-encoding", "x-tenant",
                                         "user-agent")}
                receiver.posts.append((self.path, keep, body))
                self.reply(receiver.status)

        self.server = LocalServer(Handler).start()
        self.url = self.server.url

    def close(self) -> None:
        self.server.close()


def _batch() -> list[ReadableSpan]:
    long = "é" * 20_000  # a long non-ASCII payload
    return [_span(f"s{i}", payload=long, i=i, ok=True, f=math.pi, tags=["a", "b"])
            for i in range(20)]


def test_http_sends_the_same_request_through_the_exporters_own_client():
    receiver = _HttpReceiver()
    try:
        exporter = HttpExporter(endpoint=f"{receiver.url}/tenant/v1/traces?x=1",
                                headers={"x-tenant": "t1"}, compression=Compression.Gzip,
                                timeout=5)
        spans = _batch()
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        raw = raw_sender_for(exporter)
        assert raw is not None
        assert raw.send([_otlp_json.encode_span_line(s) for s in spans]) == ACCEPTED
        (path_sdk, headers_sdk, body_sdk), (path_raw, headers_raw, body_raw) = receiver.posts
        assert path_raw == path_sdk == "/tenant/v1/traces?x=1"
        assert headers_raw == headers_sdk and headers_raw["content-encoding"] == "gzip"
        assert body_raw == body_sdk
        receiver.status = 400  # the data refused: said, never a raise
        assert raw.send([_otlp_json.encode_span_line(spans[0])]) == REFUSED
        receiver.status = 500  # the receiver failing is not the data's fault: retried
        assert raw.send([_otlp_json.encode_span_line(spans[0])]) == RETRY
        exporter.shutdown()
        assert raw.send([_otlp_json.encode_span_line(spans[0])]) == RETRY  # shut down: nothing
        assert len(receiver.posts) == 4
    finally:
        receiver.close()


def test_a_line_it_cannot_write_sends_nothing_and_says_so():
    receiver = _HttpReceiver()
    try:
        exporter = HttpExporter(endpoint=f"{receiver.url}/v1/traces", timeout=5)
        raw = raw_sender_for(exporter)
        assert raw is not None
        assert raw.send([_otlp_json.encode_span_line(_span("a")), _line(unknownField=1)]) is None
        assert receiver.posts == []
        exporter.shutdown()
    finally:
        receiver.close()


class _GrpcReceiver:
    """A TraceService that records (metadata, request bytes); aborts with ``code`` if set."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, str], bytes]] = []
        self.code: grpc.StatusCode | None = None
        receiver = self

        def export(request: bytes, context: grpc.ServicerContext) -> bytes:
            if receiver.code is not None:
                context.abort(receiver.code, "refused")
            receiver.calls.append(({k: v for k, v in context.invocation_metadata()
                                    if k == "x-tenant"}, request))
            return b""

        handler = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService",
            {"Export": grpc.unary_unary_rpc_method_handler(export)})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def close(self) -> None:
        self.server.stop(None).wait(5)


def test_grpc_sends_the_same_request_over_the_exporters_own_channel():
    receiver = _GrpcReceiver()
    try:
        exporter = GrpcExporter(endpoint=f"127.0.0.1:{receiver.port}", insecure=True,
                                headers={"x-tenant": "t2"}, timeout=5,
                                compression=grpc.Compression.Gzip)
        spans = _batch()
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        raw = raw_sender_for(exporter)
        assert raw is not None
        assert raw.send([_otlp_json.encode_span_line(s) for s in spans]) == ACCEPTED
        (meta_sdk, body_sdk), (meta_raw, body_raw) = receiver.calls
        assert meta_raw == meta_sdk == {"x-tenant": "t2"}
        assert body_raw == body_sdk
        receiver.code = grpc.StatusCode.INVALID_ARGUMENT
        assert raw.send([_otlp_json.encode_span_line(spans[0])]) == REFUSED
        receiver.code = grpc.StatusCode.UNAVAILABLE  # the channel is made again, as export does
        channel = exporter._channel
        assert raw.send([_otlp_json.encode_span_line(spans[0])]) == RETRY
        assert exporter._channel is not channel
        receiver.code = None
        assert raw.send([_otlp_json.encode_span_line(spans[0])]) == ACCEPTED
        assert len(receiver.calls) == 3
        exporter.shutdown()
    finally:
        receiver.close()
