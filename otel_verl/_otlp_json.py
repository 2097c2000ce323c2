"""OTLP/JSON, the one codec: SDK spans to OTLP/JSON and OTLP/JSON back to span dicts or SDK spans.

Everything in otel_verl that writes or reads OTLP/JSON goes through this module: the local store's
writer (:class:`otel_verl.exporters.FileSpanExporter`), its reader (:mod:`otel_verl.store`), the
write-ahead log of :class:`otel_verl.exporters.DurableSpanExporter` and its replay, and the OTLP
receivers of the demo and the tests (:func:`request_to_otlp_json` bridges a protobuf
``ExportTraceServiceRequest``).

The encoding is the OpenTelemetry Collector ``file`` exporter's:

- proto3 JSON mapping: lowerCamelCase field names, fields at their default value omitted, 64-bit
  integers (``startTimeUnixNano``, ``intValue``) as decimal strings, doubles as numbers (``"NaN"``,
  ``"Infinity"`` and ``"-Infinity"`` as strings), bytes as base64;
- OTLP/JSON's two exceptions: ``traceId``/``spanId``/``parentSpanId`` are lowercase hex (not base64)
  and enums (``kind``, ``status.code``) are integers.

The encoder is hand-written (it produces the same message as
``opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans`` followed by
``json_format.MessageToJson``, which the unit tests check field by field) because it is several
times faster; ``bench/bench_file_exporter.py`` measures both. The dicts are serialised by orjson
where it writes the stdlib's bytes, else by the stdlib (``_dumps_bytes``): a line is the bytes of
``json.dumps(..., ensure_ascii=False, separators=(",", ":"))`` either way, orjson installed or
not (``bench/bench_export_thread.py`` measures the two). The decoder accepts both id
encodings (hex and base64) and both field spellings (camelCase and snake_case); it raises
:class:`ValueError`-family errors on malformed input, never anything else.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

try:  # the fast encoder (a core dependency); without it every line is the stdlib's, byte for byte
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

__all__ = [
    "DecodeError",
    "decode_line",
    "encode_line",
    "encode_request",
    "encode_span_line",
    "iter_spans",
    "otlp_json_to_request",
    "readable_span",
    "request_to_otlp_json",
    "spans_from_otlp_json",
    "spans_of_request",
]

_logger = logging.getLogger("otel_verl")

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_UINT64_MAX = 2**64 - 1
#: OTLP span flags: bit 8 says whether bit 9 (parent is remote) is known
_FLAGS_HAS_IS_REMOTE = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_FLAGS_IS_REMOTE = 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_STATUS_CODES = ("UNSET", "OK", "ERROR")

#: what the decoder raises on malformed input (anything else would be a bug)
DecodeError = (ValueError, TypeError, AttributeError, KeyError, RecursionError, binascii.Error,
               UnicodeDecodeError, OverflowError)

# --- the OTLP/JSON encoder ----------------------------------------------------------------------


class _Unencodable(Exception):
    """An attribute value OTLP cannot carry (the attribute is dropped, as encode_spans does)."""


def _any_value(value: Any) -> dict[str, Any]:
    """``AnyValue`` in proto3 JSON form (the oneof member is always written, even when empty)."""
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _Unencodable(f"integer of {value.bit_length()} bits does not fit in int64")
        return {"intValue": str(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"doubleValue": value}
        if math.isnan(value):
            return {"doubleValue": "NaN"}
        return {"doubleValue": "Infinity" if value > 0 else "-Infinity"}
    if isinstance(value, (bytes, bytearray)):
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Sequence):
        values = [_any_value(v) for v in value]
        return {"arrayValue": {"values": values} if values else {}}
    if isinstance(value, Mapping):
        kvs = [{"key": str(k), "value": _any_value(v)} for k, v in value.items()]
        return {"kvlistValue": {"values": kvs} if kvs else {}}
    raise _Unencodable(f"invalid type {type(value).__name__}")


def _attributes(attributes: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    if not attributes:
        return []
    out = []
    for key, value in attributes.items():
        # the common scalar cases inline: this loop is the encoder's hot path
        cls = type(value)
        if cls is str:
            out.append({"key": key, "value": {"stringValue": value}})
        elif cls is bool:
            out.append({"key": key, "value": {"boolValue": value}})
        elif cls is int and _INT64_MIN <= value <= _INT64_MAX:
            out.append({"key": key, "value": {"intValue": str(value)}})
        else:
            try:
                out.append({"key": key, "value": _any_value(value)})
            except (_Unencodable, RecursionError, ValueError, TypeError) as error:
                _logger.warning("otel_verl: dropped attribute %r: %s", key, error)
    return out


def _nanos(value: int | None) -> str | None:
    return str(value) if value else None


def _flags(parent: Any) -> int:
    if parent is not None and parent.is_remote:
        return _FLAGS_HAS_IS_REMOTE | _FLAGS_IS_REMOTE
    return _FLAGS_HAS_IS_REMOTE


def _span(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    if ctx is None:
        raise ValueError("a span without a context")
    out: dict[str, Any] = {"traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}"}
    if ctx.trace_state:
        out["traceState"] = ",".join(f"{k}={v}" for k, v in ctx.trace_state.items())
    parent = span.parent
    if parent is not None:
        out["parentSpanId"] = f"{parent.span_id:016x}"
    if span.name:
        out["name"] = span.name
    out["kind"] = span.kind.value + 1  # SDK INTERNAL=0.. -> OTLP SPAN_KIND_INTERNAL=1..
    if span.start_time:
        out["startTimeUnixNano"] = str(span.start_time)
    if span.end_time:
        out["endTimeUnixNano"] = str(span.end_time)
    attributes = _attributes(span.attributes)
    if attributes:
        out["attributes"] = attributes
    if span.dropped_attributes:
        out["droppedAttributesCount"] = span.dropped_attributes
    if span.events:
        events = []
        for event in span.events:
            ev: dict[str, Any] = {}
            if event.timestamp:
                ev["timeUnixNano"] = str(event.timestamp)
            if event.name:
                ev["name"] = event.name
            ev_attributes = _attributes(event.attributes)
            if ev_attributes:
                ev["attributes"] = ev_attributes
            if event.dropped_attributes:
                ev["droppedAttributesCount"] = event.dropped_attributes
            events.append(ev)
        out["events"] = events
    if span.dropped_events:
        out["droppedEventsCount"] = span.dropped_events
    if span.links:
        links = []
        for link in span.links:
            lctx = link.context
            lk: dict[str, Any] = {"traceId": f"{lctx.trace_id:032x}", "spanId": f"{lctx.span_id:016x}"}
            if lctx.trace_state:
                lk["traceState"] = ",".join(f"{k}={v}" for k, v in lctx.trace_state.items())
            link_attributes = _attributes(link.attributes)
            if link_attributes:
                lk["attributes"] = link_attributes
            if link.dropped_attributes:
                lk["droppedAttributesCount"] = link.dropped_attributes
            lk["flags"] = _flags(lctx)
            links.append(lk)
        out["links"] = links
    if span.dropped_links:
        out["droppedLinksCount"] = span.dropped_links
    status: dict[str, Any] = {}
    if span.status.description:
        status["message"] = span.status.description
    if span.status.status_code.value:
        status["code"] = span.status.status_code.value  # UNSET/OK/ERROR = 0/1/2 in both
    out["status"] = status
    out["flags"] = _flags(parent)
    return out


_Groups = list[tuple[Any, list[tuple[Any, list[ReadableSpan]]]]]


def _grouped(spans: Sequence[ReadableSpan]) -> _Groups:
    """``spans`` by resource, then scope (by object identity: hashing a Resource serialises it
    to JSON on every call), in first-seen order."""
    groups: dict[int, tuple[Any, dict[int, tuple[Any, list[ReadableSpan]]]]] = {}
    for span in spans:
        resource = span.resource
        scope = span.instrumentation_scope
        scopes = groups.get(id(resource))
        if scopes is None:
            scopes = groups[id(resource)] = (resource, {})
        entry = scopes[1].get(id(scope))
        if entry is None:
            entry = scopes[1][id(scope)] = (scope, [])
        entry[1].append(span)
    return [(resource, list(by_scope.values())) for resource, by_scope in groups.values()]


def _request(groups: _Groups, spans_of: Callable[[list[ReadableSpan]], Any]) -> dict[str, Any]:
    """The ``ExportTraceServiceRequest`` dict of ``groups``; each scope's ``spans`` member is
    ``spans_of(its spans)``."""
    resource_spans = []
    for resource, by_scope in groups:
        scope_spans = []
        for scope, members in by_scope:
            scope_json: dict[str, Any] = {}
            if scope is not None:
                if scope.name:
                    scope_json["name"] = scope.name
                if scope.version:
                    scope_json["version"] = scope.version
                scope_attributes = _attributes(scope.attributes)
                if scope_attributes:
                    scope_json["attributes"] = scope_attributes
            item: dict[str, Any] = {"scope": scope_json, "spans": spans_of(members)}
            if scope is not None and scope.schema_url:
                item["schemaUrl"] = scope.schema_url
            scope_spans.append(item)
        resource_json: dict[str, Any] = {}
        resource_attributes = _attributes(resource.attributes) if resource is not None else []
        if resource_attributes:
            resource_json["attributes"] = resource_attributes
        rs: dict[str, Any] = {"resource": resource_json, "scopeSpans": scope_spans}
        if resource is not None and resource.schema_url:
            rs["schemaUrl"] = resource.schema_url
        resource_spans.append(rs)
    return {"resourceSpans": resource_spans}


def encode_request(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """``ExportTraceServiceRequest`` for ``spans`` as an OTLP/JSON dict (grouped by resource, scope).

    Args:
        spans: finished SDK spans.

    Returns:
        ``{"resourceSpans": [...]}``, ready for ``json.dumps``.
    """
    return _request(_grouped(spans), lambda members: [_span(s) for s in members])


def _dumps(value: Any) -> str:
    """The reference encoding of the file format (the stdlib's, compact, non-ASCII as is)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _dumps_stdlib(value: Any) -> bytes:
    # "replace": a lone surrogate in an attribute must not cost the whole batch
    return _dumps(value).encode("utf-8", "replace")


#: the key of a double: the bytes cannot occur inside a JSON string (a quote there is always
#: escaped), and an ``AnyValue`` holds one member, so the number runs to the next ``}``
_DOUBLE = b'"doubleValue":'


def _doubles_as_stdlib(out: bytes) -> bytes:
    """orjson's ``out`` with each double written as the stdlib writes it (``float.__repr__``):
    orjson writes some in another notation (``1e-05`` as ``0.00001``, ``2.5e-07`` as
    ``2.5e-7``), the same number."""
    parts: list[bytes] = []
    last = 0
    pos = out.find(_DOUBLE)
    while pos != -1:
        start = pos + len(_DOUBLE)
        end = out.find(b"}", start)
        number = out[start:end]
        if number[:1] != b'"':  # "NaN", "Infinity", "-Infinity" are strings already
            text = repr(float(number)).encode("ascii")
            if text != number:
                parts.append(out[last:start])
                parts.append(text)
                last = end
        pos = out.find(_DOUBLE, end)
    if not parts:
        return out
    parts.append(out[last:])
    return b"".join(parts)


def _dumps_bytes(value: Any) -> bytes:
    """``_dumps(value)`` as UTF-8, byte for byte, by orjson where it gives the same bytes.

    orjson writes what the stdlib writes (same escapes, non-ASCII as is, keys in insertion order,
    compact separators) except: it refuses lone surrogates (the stdlib's line has ``?`` for
    each), integers beyond 64 bits, subclasses of float and nesting past 254 levels (it raises:
    the stdlib encodes those), and it writes some doubles in another notation (rewritten by
    ``_doubles_as_stdlib``). ``tests/unit/test_encode_fast.py`` checks the two against each other
    on hostile spans.
    """
    if _orjson is None:
        return _dumps_stdlib(value)
    try:
        out: bytes = _orjson.dumps(value)
    except Exception:  # noqa: BLE001 - whatever orjson refuses, the stdlib decides
        return _dumps_stdlib(value)
    return _doubles_as_stdlib(out) if _DOUBLE in out else out


_SPAN_SENTINEL = "\x00otel_verl-span\x00"
#: spans encoded between two releases of the GIL (~0.5 ms of work on the rollout stub's spans): a
#: batch of 512 would otherwise keep a waking event loop waiting for the interpreter's switch
#: interval (5 ms) several times over
_YIELD_EVERY = 16
_SENTINEL_BYTES = _dumps_stdlib(_SPAN_SENTINEL)[1:-1]


def encode_line(spans: Sequence[ReadableSpan]) -> bytes:
    """One OTLP/JSON line (UTF-8, newline-terminated) holding ``spans``: the bytes of
    ``json.dumps(encode_request(spans))`` (compact, ``ensure_ascii=False``, lone surrogates as
    ``?``), built span by span.

    Each span's dict is encoded and dropped before the next one is built, so a batch never holds
    thousands of short-lived dicts at once: those fed the cyclic GC's young generation on the
    export thread (a collection per ~700 live objects), and each collection also scanned the
    rollout's fresh token lists while holding the GIL.
    """
    groups = _grouped(spans)
    bodies: list[list[ReadableSpan]] = []

    def placeholder(members: list[ReadableSpan]) -> str:
        bodies.append(members)
        return f"{_SPAN_SENTINEL}{len(bodies) - 1}"

    # the request around one placeholder per scope, encoded once; each placeholder becomes its
    # spans' list, written span by span (json.dumps of a list is its items' encodings joined
    # with these separators: the same bytes)
    rest = _dumps_bytes(_request(groups, placeholder))
    if rest.count(_SENTINEL_BYTES) != len(bodies):
        # a resource or scope attribute that spells a placeholder: no splitting on it
        return _dumps_bytes(encode_request(spans)) + b"\n"
    out: list[bytes] = []
    done = 0
    for index, members in enumerate(bodies):
        head, rest = rest.split(_dumps_bytes(f"{_SPAN_SENTINEL}{index}"), 1)
        out.append(head)
        encoded = []
        for span in members:
            encoded.append(_dumps_bytes(_span(span)))
            done += 1
            if done % _YIELD_EVERY == 0:
                time.sleep(0)  # let a thread waiting for the GIL (the rollout's loop) take it
        out.append(b"[" + b",".join(encoded) + b"]")
    out.append(rest)
    return b"".join(out) + b"\n"


#: (resource, scope) -> the line's bytes around its one span; keyed by identity, objects kept
_FRAMES: dict[tuple[int, int], tuple[Any, Any, bytes, bytes]] = {}


def _frame(span: ReadableSpan) -> tuple[bytes, bytes] | None:
    """The encoded request around one span of this resource and scope (cached: the resource's
    attributes are the same for every span of a process, so they are encoded once); None when
    a resource or scope attribute spells the placeholder."""
    resource, scope = span.resource, span.instrumentation_scope
    key = (id(resource), id(scope))
    entry = _FRAMES.get(key)
    if entry is None or entry[0] is not resource or entry[1] is not scope:
        request = encode_request((span,))
        request["resourceSpans"][0]["scopeSpans"][0]["spans"] = [_SPAN_SENTINEL]
        text = _dumps_bytes(request)
        if text.count(_SENTINEL_BYTES) != 1:
            return None
        head, tail = text.split(_dumps_bytes(_SPAN_SENTINEL), 1)
        if len(_FRAMES) >= 64:
            _FRAMES.clear()
        entry = _FRAMES[key] = (resource, scope, head, tail + b"\n")
    return entry[2], entry[3]


def encode_span_line(span: ReadableSpan) -> bytes:
    """One OTLP/JSON line holding one span (the write-ahead log's record); the same bytes as
    ``encode_line((span,))``, with the resource and scope encoded once per process."""
    frame = _frame(span)
    if frame is None:
        return encode_line((span,))
    return frame[0] + _dumps_bytes(_span(span)) + frame[1]


# --- the decoder --------------------------------------------------------------------------------

#: a callback told about each span (or resourceSpans/scopeSpans entry) the decoder skipped
OnBad = Callable[[str], None]


def _ignore(_: str) -> None:
    pass


def _get(obj: dict[str, Any], camel: str, snake: str, default: Any = None) -> Any:
    """Field by its proto3 JSON name, or its original proto name (both are valid proto3 JSON)."""
    value = obj.get(camel)
    if value is None:
        value = obj.get(snake, default)
    return value


def decode_line(raw: bytes | str) -> list[Any]:
    """The ``resourceSpans`` list of one OTLP/JSON line.

    Raises:
        ValueError: not JSON, not an object, no ``resourceSpans`` list, or nested too deeply
        (every failure is a ``ValueError``, whatever the line holds).
    """
    try:
        request = json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8: {error}") from None
    if not isinstance(request, dict):
        kind = type(request).__name__
        raise ValueError(f"a JSON {kind}, not an object")  # noqa: TRY004 - one type for bad lines
    resource_spans = _get(request, "resourceSpans", "resource_spans")
    if not isinstance(resource_spans, list):
        raise ValueError("no resourceSpans list")  # noqa: TRY004
    return resource_spans


def iter_spans(resource_spans: list[Any], on_bad: OnBad = _ignore) -> Iterator[dict[str, Any]]:
    """The span dicts of a ``resourceSpans`` list; malformed entries go to ``on_bad``."""
    for rs in resource_spans:
        try:
            resource = _dec_attributes((rs.get("resource") or {}).get("attributes"))
            scope_spans = _get(rs, "scopeSpans", "scope_spans", None)
            if scope_spans is None:  # OTLP before 0.15 called them instrumentationLibrarySpans
                scope_spans = rs.get("instrumentationLibrarySpans") or []
            if not isinstance(scope_spans, list):
                raise TypeError("scopeSpans is not a list")
        except DecodeError as error:
            on_bad(f"bad resourceSpans entry: {error!r}"[:300])
            continue
        for ss in scope_spans:
            try:
                raw_scope = ss.get("scope") or ss.get("instrumentationLibrary") or {}
                scope = {"name": raw_scope.get("name", ""), "version": raw_scope.get("version", "")}
                spans = ss.get("spans") or []
                if not isinstance(spans, list):
                    raise TypeError("spans is not a list")
            except DecodeError as error:
                on_bad(f"bad scopeSpans entry: {error!r}"[:300])
                continue
            for raw in spans:
                try:
                    yield _dec_span(raw, dict(resource), scope)
                except DecodeError as error:
                    on_bad(f"bad span: {error!r}"[:300])


def spans_from_otlp_json(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The spans of one ``ExportTraceServiceRequest`` in OTLP/JSON form, as span dicts.

    The same decoding as ``read_spans`` (bad spans are skipped and logged once).
    """
    bad: list[str] = []
    resource_spans = _get(request, "resourceSpans", "resource_spans", None) or []
    spans = list(iter_spans(resource_spans, bad.append))
    if bad:
        _logger.warning("otel_verl: skipped %d bad span(s) in a request (first: %s)", len(bad),
                        bad[0])
    return spans


def _id(value: Any, nbytes: int) -> str | None:
    """A trace/span id as lowercase hex: OTLP/JSON writes hex, plain proto3 JSON writes base64."""
    if not value:
        return None
    if len(value) == 2 * nbytes:
        raw = bytes.fromhex(value)  # ValueError when not hex
    else:
        raw = base64.b64decode(value, validate=True)
        if len(raw) != nbytes:
            raise ValueError(f"id {value!r} is not {nbytes} bytes")
    return raw.hex() if any(raw) else None  # all zeros is OTLP's "no id"


def _enum(value: Any, names: tuple[str, ...], prefix: str) -> str:
    if value is None:
        return names[0]
    if isinstance(value, int):
        return names[value] if 0 <= value < len(names) else str(value)
    return str(value).removeprefix(prefix)


def _dec_value(any_value: Any) -> Any:
    """Decode an OTLP ``AnyValue``; a member of the wrong type raises (the span is bad)."""
    if not any_value:
        return None
    for key, raw in any_value.items():
        if key in ("stringValue", "string_value"):
            if not isinstance(raw, str):
                raise TypeError(f"stringValue is a {type(raw).__name__}")
            return raw
        if key in ("intValue", "int_value"):
            return _int64(raw, "intValue")
        if key in ("doubleValue", "double_value"):
            if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
                raise TypeError(f"doubleValue is a {type(raw).__name__}")
            return float(raw)  # "NaN" / "Infinity" / "-Infinity" strings included
        if key in ("boolValue", "bool_value"):
            if not isinstance(raw, bool):
                raise TypeError(f"boolValue is a {type(raw).__name__}")
            return raw
        if key in ("arrayValue", "array_value"):
            return [_dec_value(v) for v in (raw or {}).get("values", [])]
        if key in ("kvlistValue", "kvlist_value"):
            return _dec_attributes((raw or {}).get("values"))
        if key in ("bytesValue", "bytes_value"):
            return base64.b64decode(raw)
    return None


def _int64(raw: Any, what: str, low: int = _INT64_MIN, high: int = _INT64_MAX) -> int:
    """A proto3 JSON 64-bit integer (a decimal string or a JSON integer) within its range."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise TypeError(f"{what} is a {type(raw).__name__}")
    value = int(raw)
    if not low <= value <= high:
        raise ValueError(f"{what} {str(raw)[:30]} is out of range")
    return value


def _dec_attributes(key_values: Any) -> dict[str, Any]:
    if not key_values:
        return {}
    out = {}
    for kv in key_values:
        key = kv["key"]
        if not isinstance(key, str):
            raise TypeError(f"attribute key is a {type(key).__name__}")
        out[key] = _dec_value(kv.get("value"))
    return out


def _dec_nanos(value: Any) -> int | None:
    """A fixed64 time in nanoseconds (None when absent)."""
    return _int64(value, "time", 0, _UINT64_MAX) if value is not None else None


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} is a {type(value).__name__}, not a string")
    return value


def _dec_span(raw: dict[str, Any], resource: dict[str, Any], scope: dict[str, str]) -> dict[str, Any]:
    trace_id = _id(_get(raw, "traceId", "trace_id"), 16)
    span_id = _id(_get(raw, "spanId", "span_id"), 8)
    if trace_id is None or span_id is None:
        raise ValueError("span without traceId or spanId")
    status = raw.get("status") or {}
    return {
        "name": _text(raw.get("name", ""), "span name"),
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": _id(_get(raw, "parentSpanId", "parent_span_id"), 8),
        "start_ns": _dec_nanos(_get(raw, "startTimeUnixNano", "start_time_unix_nano")),
        "end_ns": _dec_nanos(_get(raw, "endTimeUnixNano", "end_time_unix_nano")),
        "kind": _enum(raw.get("kind"), _KINDS, "SPAN_KIND_"),
        "attributes": _dec_attributes(raw.get("attributes")),
        "status": {
            "code": _enum(status.get("code"), _STATUS_CODES, "STATUS_CODE_"),
            "message": _text(status.get("message", ""), "status message"),
        },
        "events": [
            {
                "name": _text(ev.get("name", ""), "event name"),
                "time_ns": _dec_nanos(_get(ev, "timeUnixNano", "time_unix_nano")),
                "attributes": _dec_attributes(ev.get("attributes")),
            }
            for ev in raw.get("events") or ()
        ],
        "links": [
            {
                "trace_id": _id(_get(lk, "traceId", "trace_id"), 16),
                "span_id": _id(_get(lk, "spanId", "span_id"), 8),
                "attributes": _dec_attributes(lk.get("attributes")),
            }
            for lk in raw.get("links") or ()
        ],
        "resource": resource,
        "scope": scope,
        "parent_is_remote": _parent_is_remote(raw.get("flags")),
    }


def _parent_is_remote(flags: Any) -> bool | None:
    """From the span's OTLP flags (None when the sender does not say, e.g. older SDKs)."""
    try:
        flags = int(flags or 0)
    except (TypeError, ValueError):
        return None
    if not flags & _FLAGS_HAS_IS_REMOTE:
        return None
    return bool(flags & _FLAGS_IS_REMOTE)


# --- back to SDK spans (replay) -----------------------------------------------------------------


def readable_span(span: dict[str, Any]) -> ReadableSpan:
    """Rebuild an SDK ``ReadableSpan`` from a span dict (replay through any exporter).

    The parent keeps its remote flag (a child of a local span stays local); links keep theirs.
    """
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

    sampled = TraceFlags(TraceFlags.SAMPLED)
    trace_id = int(span["trace_id"], 16)
    context = SpanContext(trace_id, int(span["span_id"], 16), is_remote=False,
                          trace_flags=sampled)
    parent = None
    if span.get("parent_span_id"):
        parent = SpanContext(trace_id, int(span["parent_span_id"], 16),
                             is_remote=bool(span.get("parent_is_remote")), trace_flags=sampled)
    status = span.get("status") or {}
    code = status.get("code", "UNSET")
    code = StatusCode[code] if isinstance(code, str) else StatusCode(code)
    kind = span.get("kind", "INTERNAL")
    if isinstance(kind, str):
        kind = SpanKind.__members__.get(kind.replace("SPAN_KIND_", ""), SpanKind.INTERNAL)
    else:
        kind = SpanKind(max(0, int(kind) - 1))  # OTLP numbers kinds from 1 (INTERNAL)
    scope = span.get("scope") or {}
    links = [Link(SpanContext(int(lk["trace_id"], 16), int(lk["span_id"], 16), is_remote=True,
                              trace_flags=sampled), lk.get("attributes") or None)
             for lk in span.get("links") or () if lk.get("trace_id") and lk.get("span_id")]
    return ReadableSpan(
        name=span["name"],
        context=context,
        parent=parent,
        resource=_resource(Resource, span.get("resource") or {}),
        attributes=span.get("attributes") or {},
        events=[Event(e["name"], e.get("attributes") or {}, e.get("time_ns"))
                for e in span.get("events") or ()],
        links=links,
        kind=kind,
        status=Status(code, status.get("message") or None) if code is not StatusCode.UNSET
        else Status(code),
        start_time=span.get("start_ns"),
        end_time=span.get("end_ns"),
        instrumentation_scope=InstrumentationScope(scope.get("name") or "otel_verl",
                                                   scope.get("version") or None),
    )


_RESOURCES: dict[str, Any] = {}


def _resource(resource_cls: Any, attributes: dict[str, Any]) -> Any:
    """One Resource object per distinct attribute set, so encoders group spans per resource."""
    try:
        key = json.dumps(attributes, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return resource_cls(attributes)
    found = _RESOURCES.get(key)
    if found is None:
        if len(_RESOURCES) > 256:
            _RESOURCES.clear()
        found = _RESOURCES[key] = resource_cls(attributes)
    return found


# --- the protobuf bridge (OTLP receivers) -------------------------------------------------------

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(obj: Any) -> None:
    """OTLP/JSON writes ids as hex; protobuf's JSON mapping writes bytes as base64: fix in place."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in _ID_KEYS and isinstance(value, str):
                obj[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(obj, list):
        for item in obj:
            _hex_ids(item)


def _b64_ids(obj: Any) -> None:
    """The reverse of ``_hex_ids``: OTLP/JSON hex ids -> base64, for ``json_format``."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in _ID_KEYS and isinstance(value, str):
                try:
                    obj[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
                except ValueError:
                    pass  # not hex: leave it for the parser to judge
            else:
                _b64_ids(value)
    elif isinstance(obj, list):
        for item in obj:
            _b64_ids(item)


def otlp_json_to_request(document: dict[str, Any], request: Any) -> Any:
    """Fill a protobuf ``ExportTraceServiceRequest`` from an OTLP/JSON document (hex ids)."""
    from google.protobuf import json_format

    _b64_ids(document)
    json_format.ParseDict(document, request, ignore_unknown_fields=True)
    return request


def request_to_otlp_json(request: Any) -> dict[str, Any]:
    """A protobuf ``ExportTraceServiceRequest`` in OTLP/JSON form (the collector file format).

    Needs ``protobuf`` (a dependency of the OTLP exporters and of ``opentelemetry-proto``).
    """
    from google.protobuf import json_format

    data: dict[str, Any] = json_format.MessageToDict(request, use_integers_for_enums=True)
    _hex_ids(data)
    return data


def spans_of_request(request: Any) -> list[dict[str, Any]]:
    """A protobuf ``ExportTraceServiceRequest``'s spans as span dicts (the store's shape)."""
    return spans_from_otlp_json(request_to_otlp_json(request))
