"""Send what the durable log holds as it is: OTLP/JSON lines to protobuf bytes, no SDK spans between.

The log stores one OTLP/JSON line per span (:mod:`otel_verl._otlp_json`). Sending a backlog
through an exporter means decoding each line into a ``ReadableSpan`` and letting the exporter
encode it again; for the SDK's OTLP exporters (HTTP/protobuf and gRPC) this module turns the
lines straight into the bytes of one ``ExportTraceServiceRequest`` (``orjson`` parses each line,
a small hand-written protobuf writer emits the fields; the resource and scope are written once
per request, as the SDK's ``encode_spans`` groups them) and sends them through the exporter's own
connection: the HTTP exporter's client (its endpoint, headers, session/TLS, compression, timeout
and retries) or the gRPC exporter's channel (its credentials, compression, metadata, timeout).

Usage::

    raw = raw_sender_for(exporter)   # None: not an SDK OTLP exporter we know; use export()
    outcome = raw.send(lines) if raw is not None else None
    if outcome is None:              # a line this writer does not know: decode and export()
        ...
    # else ACCEPTED, REFUSED (the data: a smaller request may pass) or RETRY (an outage)

Honest fallback: :func:`raw_sender_for` answers None for any other exporter (the Weave
exporter, subclasses that override ``export``, an SDK whose exporter has another shape), and
:meth:`RawOtlpSender.send` answers None, sending nothing, for a batch holding any line it
cannot write exactly (an unknown field, a snake_case name, a base64 id, a string enum): the
caller then decodes those lines and calls ``export``. What it writes is the message
``google.protobuf.json_format`` would parse from the same lines (the unit tests check it byte
for byte against ``ParseDict``). The SDK exporter's optional self-metrics
(``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED``) do not count what is sent this way.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import math
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

try:
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency; the stdlib is the fallback
    import json

    _loads = json.loads

from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["ACCEPTED", "REFUSED", "RETRY", "RawOtlpSender", "encode_lines", "encode_lines_counted",
           "raw_sender_for"]

_log = logging.getLogger("otel_verl")

_GRPC_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class _Unwritable(Exception):
    """A line this writer does not know how to write exactly (the caller falls back)."""


# --- the protobuf writer ---------------------------------------------------------------------------
#
# Each writer appends the bytes of one field to ``out`` (a list of chunks, joined once per
# request, so a long string is copied once: from its UTF-8 encoding into the request) and
# returns how many bytes it appended. A message field reserves its header's slot, writes its
# contents, then fills the header in (its length is known only then).

_SMALL = [bytes((n,)) for n in range(128)]
_U64 = struct.Struct("<Q").pack
_U32 = struct.Struct("<I").pack
_F64 = struct.Struct("<d").pack
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_DOUBLES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

Out = list[bytes]
Writer = Callable[[Out, bytes, Any], int]
Fields = tuple[tuple[str, bytes, Writer], ...]


def _varint(n: int) -> bytes:
    if n < 0x80:
        if n < 0:
            n += 1 << 64
        else:
            return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _bytes(out: Out, tag: bytes, data: bytes) -> int:
    """A length-delimited field holding ``data`` (appended as its own chunk)."""
    n = len(data)
    head = tag + (_SMALL[n] if n < 0x80 else _varint(n))
    out.append(head)
    out.append(data)
    return len(head) + n


def _text(out: Out, tag: bytes, value: Any) -> int:
    if type(value) is not str:
        raise _Unwritable("a string field that is not a string")
    return _bytes(out, tag, value.encode("utf-8")) if value else 0


def _uint(out: Out, tag: bytes, value: Any) -> int:
    if type(value) is not int or not 0 <= value <= 0xFFFFFFFF:
        raise _Unwritable("not an unsigned 32-bit integer")
    if not value:
        return 0
    data = tag + _varint(value)
    out.append(data)
    return len(data)


def _enum(out: Out, tag: bytes, value: Any) -> int:
    if type(value) is not int or not -(2**31) <= value < 2**31:  # OTLP/JSON: enums as integers
        raise _Unwritable("an enum that is not an integer")
    if not value:
        return 0
    data = tag + _varint(value)
    out.append(data)
    return len(data)


def _fixed32(out: Out, tag: bytes, value: Any) -> int:
    if type(value) is not int or not 0 <= value <= 0xFFFFFFFF:
        raise _Unwritable("flags")
    if not value:
        return 0
    out.append(tag + _U32(value))
    return len(tag) + 4


def _nanos(out: Out, tag: bytes, value: Any) -> int:
    if type(value) is str:
        n = int(value)  # decimal (ValueError on anything else: the caller falls back)
    elif type(value) is int:
        n = value
    else:
        raise _Unwritable("a time that is neither a decimal string nor an integer")
    if not 0 <= n < 1 << 64:
        raise _Unwritable("a time out of range")
    if not n:
        return 0
    out.append(tag + _U64(n))
    return len(tag) + 8


def _hex_id(nbytes: int) -> Writer:
    def write(out: Out, tag: bytes, value: Any) -> int:
        if type(value) is not str:
            raise _Unwritable("an id that is not a string")
        if not value:
            return 0
        if len(value) != 2 * nbytes:
            raise _Unwritable("an id that is not hex of its length")  # base64, ...
        return _bytes(out, tag, bytes.fromhex(value))

    return write


def _message(out: Out, tag: bytes, obj: Any, fields: Fields) -> int:
    """A message field (written when present, even when empty): ``obj``'s fields in
    field-number order; a key not in ``fields`` raises."""
    if type(obj) is not dict:
        raise _Unwritable("a message that is not an object")
    slot = len(out)
    out.append(b"")
    n = found = 0
    for name, field_tag, write in fields:
        value = obj.get(name)
        if value is not None:
            found += 1
            n += write(out, field_tag, value)
    if found != len(obj):
        raise _Unwritable("a field this writer does not know")
    head = out[slot] = tag + (_SMALL[n] if n < 0x80 else _varint(n))
    return len(head) + n


def _sub(fields: Fields) -> Writer:
    return lambda out, tag, value: _message(out, tag, value, fields)


def _repeated(write: Writer) -> Writer:
    def each(out: Out, tag: bytes, value: Any) -> int:
        if type(value) is not list:
            raise _Unwritable("a repeated field that is not a list")
        return sum([write(out, tag, item) for item in value])

    return each


def _any_value(out: Out, tag: bytes, value: Any) -> int:
    """An ``AnyValue`` field; its oneof member is written even at its default (presence)."""
    if type(value) is not dict:
        raise _Unwritable("an AnyValue that is not an object")
    if len(value) != 1:
        if value:
            raise _Unwritable("an AnyValue with several members")
        out.append(tag + b"\x00")
        return len(tag) + 1
    ((kind, v),) = value.items()
    if kind == "stringValue":
        if type(v) is not str:
            raise _Unwritable("stringValue")
        data = v.encode("utf-8")
        n = len(data)
        inner = b"\x0a" + (_SMALL[n] if n < 0x80 else _varint(n))
        m = len(inner) + n
        head = tag + (_SMALL[m] if m < 0x80 else _varint(m)) + inner
        out.append(head)
        out.append(data)
        return len(head) + n
    if kind == "intValue":
        if type(v) is str:
            number = int(v)
        elif type(v) is int:
            number = v
        else:
            raise _Unwritable("intValue")
        if not _INT64_MIN <= number <= _INT64_MAX:
            raise _Unwritable("intValue out of range")
        body = b"\x18" + _varint(number)
    elif kind == "boolValue":
        if type(v) is not bool:
            raise _Unwritable("boolValue")
        body = b"\x10\x01" if v else b"\x10\x00"
    elif kind == "doubleValue":
        if type(v) is str:
            if v not in _DOUBLES:
                raise _Unwritable("doubleValue")
            body = b"\x21" + _F64(_DOUBLES[v])
        elif type(v) is float or type(v) is int:
            body = b"\x21" + _F64(float(v))
        else:
            raise _Unwritable("doubleValue")
    elif kind == "bytesValue":
        if type(v) is not str:
            raise _Unwritable("bytesValue")
        data = base64.b64decode(v, validate=True)
        slot = len(out)
        out.append(b"")
        n = _bytes(out, b"\x3a", data)
        head = out[slot] = tag + _varint(n)
        return len(head) + n
    elif kind == "arrayValue":
        return _wrapped(out, tag, b"\x2a", v, _ARRAY)
    elif kind == "kvlistValue":
        return _wrapped(out, tag, b"\x32", v, _KVLIST)
    else:
        raise _Unwritable(f"an AnyValue member this writer does not know ({kind[:40]!r})")
    head = tag + _SMALL[len(body)] + body
    out.append(head)
    return len(head)


def _wrapped(out: Out, tag: bytes, member: bytes, value: Any, fields: Fields) -> int:
    """An AnyValue field whose member is a message (arrayValue, kvlistValue)."""
    slot = len(out)
    out.append(b"")
    n = _message(out, member, value, fields)
    head = out[slot] = tag + (_SMALL[n] if n < 0x80 else _varint(n))
    return len(head) + n


def _key_value(out: Out, tag: bytes, kv: Any) -> int:
    if type(kv) is not dict:
        raise _Unwritable("a KeyValue that is not an object")
    key = kv.get("key")
    value = kv.get("value")
    if len(kv) != (key is not None) + (value is not None):
        raise _Unwritable("a KeyValue with a field this writer does not know")
    if type(key) is str and type(value) is dict and len(value) == 1 and \
            type(value.get("stringValue")) is str:  # the common case, in one go
        name = key.encode("utf-8")
        data = value["stringValue"].encode("utf-8")
        n = len(data)
        inner = b"\x0a" + (_SMALL[n] if n < 0x80 else _varint(n))
        m = len(inner) + n
        k = len(name)
        head = ((b"\x0a" + (_SMALL[k] if k < 0x80 else _varint(k)) + name) if k else b"") + \
            b"\x12" + (_SMALL[m] if m < 0x80 else _varint(m)) + inner
        total = len(head) + n
        head = tag + (_SMALL[total] if total < 0x80 else _varint(total)) + head
        out.append(head)
        out.append(data)
        return len(head) + n
    slot = len(out)
    out.append(b"")
    n = _text(out, b"\x0a", key) if key is not None else 0
    if value is not None:
        n += _any_value(out, b"\x12", value)
    head = out[slot] = tag + (_SMALL[n] if n < 0x80 else _varint(n))
    return len(head) + n


_attributes = _repeated(_key_value)
_ARRAY: Fields = (("values", b"\x0a", _repeated(_any_value)),)
_KVLIST: Fields = (("values", b"\x0a", _attributes),)
_STATUS: Fields = (("message", b"\x12", _text), ("code", b"\x18", _enum))
_EVENT: Fields = (("timeUnixNano", b"\x09", _nanos), ("name", b"\x12", _text),
                  ("attributes", b"\x1a", _attributes), ("droppedAttributesCount", b"\x20", _uint))
_LINK: Fields = (("traceId", b"\x0a", _hex_id(16)), ("spanId", b"\x12", _hex_id(8)),
                 ("traceState", b"\x1a", _text), ("attributes", b"\x22", _attributes),
                 ("droppedAttributesCount", b"\x28", _uint), ("flags", b"\x35", _fixed32))
_SPAN: Fields = (("traceId", b"\x0a", _hex_id(16)), ("spanId", b"\x12", _hex_id(8)),
                 ("traceState", b"\x1a", _text), ("parentSpanId", b"\x22", _hex_id(8)),
                 ("name", b"\x2a", _text), ("kind", b"\x30", _enum),
                 ("startTimeUnixNano", b"\x39", _nanos), ("endTimeUnixNano", b"\x41", _nanos),
                 ("attributes", b"\x4a", _attributes), ("droppedAttributesCount", b"\x50", _uint),
                 ("events", b"\x5a", _repeated(_sub(_EVENT))),
                 ("droppedEventsCount", b"\x60", _uint),
                 ("links", b"\x6a", _repeated(_sub(_LINK))), ("droppedLinksCount", b"\x70", _uint),
                 ("status", b"\x7a", _sub(_STATUS)), ("flags", b"\x85\x01", _fixed32))
_RESOURCE: Fields = (("attributes", b"\x0a", _attributes),
                     ("droppedAttributesCount", b"\x10", _uint))
_SCOPE: Fields = (("name", b"\x0a", _text), ("version", b"\x12", _text),
                  ("attributes", b"\x1a", _attributes), ("droppedAttributesCount", b"\x20", _uint))
_SCOPE_SPANS: Fields = (("scope", b"\x0a", _sub(_SCOPE)),
                        ("spans", b"\x12", _repeated(_sub(_SPAN))),
                        ("schemaUrl", b"\x1a", _text))
_RESOURCE_SPANS: Fields = (("resource", b"\x0a", _sub(_RESOURCE)),
                           ("scopeSpans", b"\x12", _repeated(_sub(_SCOPE_SPANS))),
                           ("schemaUrl", b"\x1a", _text))


# --- lines to one request --------------------------------------------------------------------------

_ONE_SPAN_HEAD = b'{"resourceSpans":[{"resource":'
_SPANS_KEY = b'"spans":['
_SCOPE_KEY = b'"scopeSpans":[{"scope":'


class _Group:
    """The spans of one resource and scope in a request: written chunks and their length."""

    __slots__ = ("resource", "rs_tail", "scope", "size", "spans", "ss_tail")

    def __init__(self, resource: bytes, scope: bytes, ss_tail: bytes, rs_tail: bytes) -> None:
        self.resource = resource  # the written ResourceSpans.resource field
        self.scope = scope  # the written ScopeSpans.scope field
        self.ss_tail = ss_tail  # ScopeSpans.schema_url, written
        self.rs_tail = rs_tail  # ResourceSpans.schema_url, written
        self.spans: Out = []
        self.size = 0


#: a line's text before its span -> its resource and scope, written (one entry per process,
#: usually): a line's head is written once, not once per span
_HEADS: dict[bytes, tuple[bytes, bytes]] = {}
_HEADS_LOCK = threading.Lock()


def encode_lines(lines: Sequence[bytes]) -> bytes:
    """The protobuf bytes of one ``ExportTraceServiceRequest`` holding the spans of ``lines``.

    Lines of one span under one resource and scope (what the log and the file exporter write)
    are grouped by resource and scope, so a request carries each resource once; any other
    valid line goes in as its own ``ResourceSpans``.

    Raises:
        ValueError: a line this writer cannot write exactly (the caller decodes it instead),
        or one that is not JSON.
    """
    return encode_lines_counted(lines)[0]


def encode_lines_counted(lines: Sequence[bytes]) -> tuple[bytes, int]:
    """:func:`encode_lines` and the number of spans the request holds."""
    try:
        return _encode_lines(lines)
    except _Unwritable as error:
        raise ValueError(str(error)) from None
    except (TypeError, KeyError, AttributeError, OverflowError, RecursionError,
            UnicodeError) as error:
        raise ValueError(f"{type(error).__name__}: {error}") from None


def _joined(chunks: Out) -> bytes:
    return b"".join(chunks)


def _encode_lines(lines: Sequence[bytes]) -> tuple[bytes, int]:
    count = 0
    groups: dict[tuple[bytes, str, str], _Group] = {}
    loose: Out = []
    for line in lines:
        doc = _loads(line)
        if type(doc) is not dict or len(doc) != 1 or "resourceSpans" not in doc:
            raise _Unwritable("not an OTLP/JSON request of camelCase fields")
        resource_spans = doc["resourceSpans"]
        cut = line.find(_SPANS_KEY) if line.startswith(_ONE_SPAN_HEAD) else -1
        one = _one_span(resource_spans) if cut > 0 and _SCOPE_KEY in line[:cut] else None
        if one is None:
            _repeated(_sub(_RESOURCE_SPANS))(loose, b"\x0a", resource_spans)
            count += sum(len(ss.get("spans") or ()) for rs in resource_spans
                         for ss in rs.get("scopeSpans") or ())
            continue
        rs, ss, span = one
        key = (line[:cut], ss.get("schemaUrl", ""), rs.get("schemaUrl", ""))
        group = groups.get(key)
        if group is None:
            resource, scope = _head(key[0], rs, ss)
            ss_tail: Out = []
            rs_tail: Out = []
            _text(ss_tail, b"\x1a", key[1])
            _text(rs_tail, b"\x1a", key[2])
            group = groups[key] = _Group(resource, scope, _joined(ss_tail), _joined(rs_tail))
        group.size += _message(group.spans, b"\x12", span, _SPAN)
        count += 1
    out: Out = []
    for g in groups.values():
        ss_size = len(g.scope) + g.size + len(g.ss_tail)
        ss_head = b"\x12" + _varint(ss_size)
        rs_size = len(g.resource) + len(ss_head) + ss_size + len(g.rs_tail)
        out.append(b"\x0a" + _varint(rs_size) + g.resource + ss_head + g.scope)
        out.extend(g.spans)
        out.append(g.ss_tail + g.rs_tail)
    out.extend(loose)
    return b"".join(out), count


def _one_span(resource_spans: Any) -> tuple[dict[str, Any], dict[str, Any], Any] | None:
    """(resourceSpans entry, scopeSpans entry, span) of a one-span line, else None."""
    if type(resource_spans) is not list or len(resource_spans) != 1:
        return None
    rs = resource_spans[0]
    if type(rs) is not dict or "resource" not in rs or rs.keys() - {"resource", "scopeSpans",
                                                                    "schemaUrl"}:
        return None
    scope_spans = rs.get("scopeSpans")
    if type(scope_spans) is not list or len(scope_spans) != 1:
        return None
    ss = scope_spans[0]
    if type(ss) is not dict or "scope" not in ss or ss.keys() - {"scope", "spans", "schemaUrl"}:
        return None
    spans = ss.get("spans")
    if type(spans) is not list or len(spans) != 1:
        return None
    return rs, ss, spans[0]


def _head(text: bytes, rs: dict[str, Any], ss: dict[str, Any]) -> tuple[bytes, bytes]:
    """The resource field and the scope field, written once per distinct line head."""
    with _HEADS_LOCK:
        cached = _HEADS.get(text)
    if cached is not None:
        return cached
    resource: Out = []
    scope: Out = []
    _message(resource, b"\x0a", rs["resource"], _RESOURCE)
    _message(scope, b"\x0a", ss["scope"], _SCOPE)
    written = (_joined(resource), _joined(scope))
    with _HEADS_LOCK:
        if len(_HEADS) >= 64:
            _HEADS.clear()
        _HEADS[text] = written
    return written


# --- sending through the exporter's own connection -------------------------------------------------


#: what one request of stored bytes came to
ACCEPTED, REFUSED, RETRY = "accepted", "refused", "retry"
#: answers that refuse the data itself (OTLP: "the client MUST NOT retry"); any other failure
#: (no connection, 429/5xx, UNAVAILABLE, a deadline, credentials) is worth retrying as it is
_REFUSED_HTTP = frozenset({400, 413, 422})


class RawOtlpSender:
    """Sends log lines through one SDK OTLP exporter's connection, as protobuf bytes.

    Attributes:
        protocol: ``"http/protobuf"`` or ``"grpc"``.
    """

    protocol = ""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        #: spans in the last request sent
        self.last_spans = 0

    def send(self, lines: Sequence[bytes]) -> str | None:
        """Send the spans of ``lines`` (ready OTLP/JSON lines) as one request; never raises.

        Returns:
            :data:`ACCEPTED`; :data:`REFUSED` (the receiver refused this request's data: 400,
            413 or 422 over HTTP, ``INVALID_ARGUMENT`` over gRPC; a smaller request may pass);
            :data:`RETRY` (any other failure: the receiver is down, busy or failing, the
            exporter is shut down); or None when a line cannot be written exactly: nothing was
            sent, decode the lines and use the exporter's ``export`` instead.
        """
        try:
            data, self.last_spans = encode_lines_counted(lines)
        except ValueError as error:
            _log.debug("otel_verl: a log line is not sent as stored bytes (%s); decoding", error)
            return None
        if getattr(self.exporter, "_shutdown", False):
            return RETRY
        try:
            return self._post(data)
        except Exception as error:  # noqa: BLE001  # like export(): a failed request, not a raise
            _log.warning("otel_verl: sending the log's stored bytes failed: %r", error)
            return RETRY

    def _post(self, data: bytes) -> str:
        raise NotImplementedError


class _HttpSender(RawOtlpSender):
    """The HTTP exporter's own client: endpoint, headers, session (TLS, credentials),
    compression, timeout and its retries, exactly as its ``export`` uses them."""

    protocol = "http/protobuf"

    def _post(self, data: bytes) -> str:
        exporter: Any = self.exporter
        limit = getattr(exporter, "_max_request_size", 0)
        if isinstance(limit, int) and 0 < limit < len(data):
            _log.warning("otel_verl: a request of %d bytes is over the exporter's "
                         "max_request_size %d", len(data), limit)
            return REFUSED
        result = exporter._client.export(data)
        if result.success:
            return ACCEPTED
        return REFUSED if result.status_code in _REFUSED_HTTP else RETRY


class _GrpcSender(RawOtlpSender):
    """The gRPC exporter's own channel (its credentials and compression), metadata and
    timeout; one attempt per request (the durable log's sender backs off between attempts).
    After UNAVAILABLE the channel is made again, as the exporter's own ``export`` does."""

    protocol = "grpc"

    def __init__(self, exporter: SpanExporter) -> None:
        super().__init__(exporter)
        self._channel: Any = None
        self._call: Any = None

    def _post(self, data: bytes) -> str:
        import grpc

        exporter: Any = self.exporter
        channel = exporter._channel
        if channel is None:
            return RETRY
        if channel is not self._channel:
            self._channel = channel
            # no serializer: the request is sent as the bytes given; the answer is not read
            self._call = channel.unary_unary(_GRPC_METHOD)
        try:
            self._call(data, metadata=exporter._headers or None, timeout=exporter._timeout)
        except grpc.RpcError as error:
            code = error.code() if callable(getattr(error, "code", None)) else None
            from otel_verl.exporters._otlp_endpoint import redact_url

            _log.warning("otel_verl: the OTLP receiver at %s did not take the log's request "
                         "(sent as stored bytes): %s", redact_url(str(exporter._endpoint)), code)
            if code == grpc.StatusCode.UNAVAILABLE:
                reopen = getattr(exporter, "_initialize_channel_and_stub", None)
                if callable(reopen):
                    try:
                        channel.close()
                    finally:
                        reopen()
            return REFUSED if code == grpc.StatusCode.INVALID_ARGUMENT else RETRY
        return ACCEPTED


def raw_sender_for(exporter: SpanExporter) -> RawOtlpSender | None:
    """A sender of stored bytes for ``exporter``, or None where there is none (use export()).

    Only the SDK's own ``OTLPSpanExporter`` classes (HTTP/protobuf and gRPC), and subclasses
    that keep their ``export``, of the shape this module was written against (the HTTP
    exporter's ``_client.export(bytes)``; the gRPC exporter's ``_channel``, ``_headers`` and
    ``_timeout``, checked against opentelemetry-exporter-otlp-proto-* 1.45).
    """
    http_exporter: Any = None
    with contextlib.suppress(ImportError):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        http_exporter = OTLPSpanExporter
    if http_exporter is not None and isinstance(exporter, http_exporter) and \
            type(exporter).export is http_exporter.export:
        client = getattr(exporter, "_client", None)
        if callable(getattr(client, "export", None)):
            return _HttpSender(exporter)
        return None
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )
    except ImportError:
        return None
    if isinstance(exporter, GrpcExporter) and type(exporter).export is GrpcExporter.export and \
            type(exporter)._translate_data is GrpcExporter._translate_data and \
            all(hasattr(exporter, name) for name in ("_channel", "_headers", "_timeout")):
        return _GrpcSender(exporter)
    return None
