"""The local store's writer: spans as OTLP/JSON lines, one file per process.

Each ``export`` call appends ONE line holding one ``ExportTraceServiceRequest`` in the OTLP/JSON
encoding — exactly what the OpenTelemetry Collector's ``file`` exporter writes, so the files can be
replayed into a collector, loaded with ``google.protobuf.json_format`` (ids aside, see below) and
read back with :func:`otel_verl.store.read_spans`:

- proto3 JSON mapping: lowerCamelCase field names, fields at their default value omitted, 64-bit
  integers (``startTimeUnixNano``, ``intValue``) as decimal strings, doubles as numbers (``"NaN"``,
  ``"Infinity"`` and ``"-Infinity"`` as strings), bytes as base64;
- OTLP/JSON's two exceptions: ``traceId``/``spanId``/``parentSpanId`` are lowercase hex (not base64)
  and enums (``kind``, ``status.code``) are integers.

Usage::

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from otel_verl._file_exporter import FileSpanExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(FileSpanExporter("/tmp/traces")))

Configuration: the directory is the ``directory`` argument, else ``$OTEL_VERL_TRACE_DIR``, else
``./otel_verl_traces`` (resolved to an absolute path when the exporter is made). The file is
``otel_verl-<host>-<pid>-<UTC start time>.jsonl``, created on the first export; a forked child
starts its own file, so processes never interleave lines.

The encoder is hand-written (it produces the same message as
``opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans`` followed by
``json_format.MessageToJson``, which the unit tests check field by field) because it is several
times faster; ``bench/bench_file_exporter.py`` measures both.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_verl import _env

__all__ = ["DEFAULT_TRACE_DIR", "ENV_TRACE_DIR", "FileSpanExporter", "resolve_trace_dir"]

_logger = logging.getLogger(__name__)

#: environment variable naming the local store's directory
ENV_TRACE_DIR = _env.OTEL_VERL_TRACE_DIR
#: the local store's directory when neither an argument nor the environment names one
DEFAULT_TRACE_DIR = "otel_verl_traces"
#: file name prefix and suffix of the files this exporter writes
FILE_PREFIX = "otel_verl-"
FILE_SUFFIX = ".jsonl"

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_FLAGS_HAS_IS_REMOTE = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_FLAGS_IS_REMOTE = 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


def resolve_trace_dir(directory: str | os.PathLike[str] | None = None) -> str:
    """The local store's directory as an absolute path.

    Args:
        directory: an explicit directory; wins over the environment.

    Returns:
        ``directory``, else ``$OTEL_VERL_TRACE_DIR`` (when set and not empty), else
        ``./otel_verl_traces``, made absolute against the current working directory.
    """
    if directory is None:
        directory = os.environ.get(ENV_TRACE_DIR) or DEFAULT_TRACE_DIR
    return os.path.abspath(os.fspath(directory))


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
            raise _Unencodable(f"integer {value} does not fit in int64")
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
            except (_Unencodable, RecursionError) as error:
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


def encode_request(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """``ExportTraceServiceRequest`` for ``spans`` as an OTLP/JSON dict (grouped by resource, scope).

    Args:
        spans: finished SDK spans.

    Returns:
        ``{"resourceSpans": [...]}``, ready for ``json.dumps``.
    """
    # group by object identity (hashing a Resource serialises it to JSON on every call)
    groups: dict[int, tuple[Any, dict[int, tuple[Any, list[dict[str, Any]]]]]] = {}
    for span in spans:
        resource = span.resource
        scope = span.instrumentation_scope
        scopes = groups.get(id(resource))
        if scopes is None:
            scopes = groups[id(resource)] = (resource, {})
        entry = scopes[1].get(id(scope))
        if entry is None:
            entry = scopes[1][id(scope)] = (scope, [])
        entry[1].append(_span(span))
    resource_spans = []
    for resource, scopes in groups.values():
        scope_spans = []
        for scope, encoded in scopes.values():
            scope_json: dict[str, Any] = {}
            if scope is not None:
                if scope.name:
                    scope_json["name"] = scope.name
                if scope.version:
                    scope_json["version"] = scope.version
                scope_attributes = _attributes(scope.attributes)
                if scope_attributes:
                    scope_json["attributes"] = scope_attributes
            item: dict[str, Any] = {"scope": scope_json, "spans": encoded}
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


def encode_line(spans: Sequence[ReadableSpan]) -> bytes:
    """One OTLP/JSON line (UTF-8, newline-terminated) holding ``spans``."""
    text = json.dumps(encode_request(spans), ensure_ascii=False, separators=(",", ":"))
    # "replace": a lone surrogate in an attribute must not cost the whole batch
    return text.encode("utf-8", "replace") + b"\n"


# --- the exporter -------------------------------------------------------------------------------

_LIVE_EXPORTERS: weakref.WeakSet[FileSpanExporter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for exporter in list(_LIVE_EXPORTERS):
        exporter._forget_parent_file()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


class FileSpanExporter(SpanExporter):
    """Appends each batch of spans as one OTLP/JSON line to this process's own file.

    Args:
        directory: where to write; default ``$OTEL_VERL_TRACE_DIR`` or ``./otel_verl_traces``.
            Created on the first export.

    Attributes:
        exported_spans: spans written so far by this process.
        failed_spans: spans that could not be written (each failure is logged).
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self._directory = resolve_trace_dir(directory)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._path: str | None = None
        self._pid = os.getpid()
        self._shutdown = False
        self._warned_shutdown = False
        self._logged_traceback = False
        self.exported_spans = 0
        self.failed_spans = 0
        _LIVE_EXPORTERS.add(self)

    @property
    def directory(self) -> str:
        """The absolute directory this exporter writes to."""
        return self._directory

    @property
    def path(self) -> str | None:
        """The file this process writes to, or None before the first export."""
        return self._path

    # SpanExporter -------------------------------------------------------------------------------

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append ``spans`` as one line. Never raises: returns FAILURE and logs instead."""
        if self._shutdown:
            if not self._warned_shutdown:
                self._warned_shutdown = True
                _logger.warning("otel_verl: FileSpanExporter.export called after shutdown")
            return SpanExportResult.FAILURE
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            line = encode_line(spans)
            with self._lock:
                if self._pid != os.getpid():  # forked without the at-fork hook (defensive)
                    self._forget_parent_file()
                if self._fd is None:
                    self._open()
                assert self._fd is not None
                view = memoryview(line)
                while view:
                    written = os.write(self._fd, view)
                    view = view[written:]
            self.exported_spans += len(spans)
            return SpanExportResult.SUCCESS
        except Exception as error:  # never raise into the span processor
            self.failed_spans += len(spans)
            _logger.warning(
                "otel_verl: could not write %d span(s) to %s: %r",
                len(spans),
                self._path or self._directory,
                error,
                exc_info=not self._logged_traceback,
            )
            self._logged_traceback = True
            return SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Every export is already written; this also asks the OS to persist the file."""
        fd = self._fd
        if fd is None or self._pid != os.getpid():
            return True
        try:
            os.fsync(fd)
            return True
        except OSError as error:
            _logger.warning("otel_verl: could not sync %s: %r", self._path, error)
            return False

    def shutdown(self) -> None:
        """Close the file. Idempotent; later exports return FAILURE."""
        with self._lock:
            self._shutdown = True
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    # internals ----------------------------------------------------------------------------------

    def _open(self) -> None:
        os.makedirs(self._directory, exist_ok=True)
        host = _UNSAFE_NAME.sub("_", socket.gethostname()) or "host"
        now = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now % 1 * 1000):03d}Z"
        base = f"{FILE_PREFIX}{host}-{os.getpid()}-{stamp}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        for attempt in range(1000):
            path = os.path.join(self._directory, f"{base}{f'-{attempt}' if attempt else ''}{FILE_SUFFIX}")
            try:
                self._fd = os.open(path, flags, 0o644)
            except FileExistsError:
                continue
            self._path = path
            return
        raise FileExistsError(f"no free file name for {base} in {self._directory}")

    def _forget_parent_file(self) -> None:
        """In a forked child: drop the parent's file (and lock) so the child starts its own."""
        self._lock = threading.Lock()
        if self._fd is not None:
            try:
                os.close(self._fd)  # the child's copy only; the parent keeps writing
            except OSError:
                pass
        self._fd = None
        self._path = None
        self._pid = os.getpid()
        self.exported_spans = 0
        self.failed_spans = 0
