"""Keep what cannot be delivered: a wrapper exporter that spools failed batches to disk.

Usage::

    exporter = SpoolingSpanExporter(OTLPSpanExporter(...), "./otel_verl_traces/spool")
    ...
    replay("./otel_verl_traces/spool", OTLPSpanExporter(...))   # later, or `otel-verl traces replay`

A failed batch is written as OTLP/JSON lines (the local-store format), so it can be read with
``otel-verl traces`` right away and replayed through any exporter once the backend is back.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_verl import _errors

_log = logging.getLogger("otel_verl")


class SpoolingSpanExporter(SpanExporter):
    """Delegates to ``inner``; batches it fails to deliver are written under ``spool_dir``.

    Args:
        inner: the real exporter.
        spool_dir: where failed batches go (created on first failure).
    """

    def __init__(self, inner: SpanExporter, spool_dir: str | os.PathLike[str]) -> None:
        self.inner = inner
        self.spool_dir = Path(spool_dir)
        self._spool: SpanExporter | None = None
        self.spooled = 0
        self.spool_failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:
            _errors.internal_error(exc, "inner exporter raised")
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            return result
        return self._keep(spans)

    def _keep(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            if self._spool is None:
                from otel_verl._file_exporter import FileSpanExporter

                self._spool = FileSpanExporter(self.spool_dir)
            kept = self._spool.export(spans)
        except Exception as exc:
            _errors.internal_error(exc, "spooling failed")
            kept = SpanExportResult.FAILURE
        if kept is SpanExportResult.SUCCESS:
            if self.spooled == 0:
                _log.warning("otel_verl: the backend did not accept a batch; spans are kept in %s "
                             "(replay with `otel-verl traces replay %s`)", self.spool_dir,
                             self.spool_dir)
            self.spooled += len(spans)
        else:
            self.spool_failed += len(spans)
        # delivery failed either way: report it, so counts stay honest
        return SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        flush = getattr(self.inner, "force_flush", None)
        ok = bool(flush(timeout_millis)) if flush is not None else True
        if self._spool is not None:
            ok = self._spool.force_flush(timeout_millis) and ok
        return ok

    def shutdown(self) -> None:
        try:
            self.inner.shutdown()
        finally:
            if self._spool is not None:
                self._spool.shutdown()

    def stats(self) -> dict[str, int]:
        return {"spooled": self.spooled, "spool_failed": self.spool_failed}


def replay(spool_dir: str | os.PathLike[str], exporter: SpanExporter, *, batch_size: int = 512,
           remove: bool = False) -> tuple[int, int]:
    """Send spooled spans through ``exporter``.

    Args:
        spool_dir: a spool directory (or any local-store directory/file).
        exporter: where to send them (e.g. an OTLP exporter or the Weave exporter).
        batch_size: spans per export call.
        remove: delete each spool file once all of its spans were accepted.

    Returns:
        (spans sent, spans that failed again).
    """
    from otel_verl.store import read_spans

    sent = failed = 0
    files = sorted(Path(spool_dir).glob("*.jsonl")) if Path(spool_dir).is_dir() else [
        Path(spool_dir)]
    for path in files:
        spans = [readable_span(s) for s in read_spans(path)]
        file_failed = 0
        for start in range(0, len(spans), batch_size):
            batch = spans[start:start + batch_size]
            if exporter.export(batch) is SpanExportResult.SUCCESS:
                sent += len(batch)
            else:
                file_failed += len(batch)
        failed += file_failed
        if remove and file_failed == 0:
            path.unlink()
    return sent, failed


def readable_span(span: dict[str, Any]) -> ReadableSpan:
    """Rebuild an SDK ``ReadableSpan`` from a store dict (see ``otel_verl.store.read_spans``)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    def ctx(span_id: str | None) -> SpanContext | None:
        if not span_id:
            return None
        return SpanContext(int(span["trace_id"], 16), int(span_id, 16), is_remote=span_id !=
                           span["span_id"], trace_flags=TraceFlags(TraceFlags.SAMPLED))

    status = span.get("status") or {}
    code = status.get("code", "UNSET")
    code = StatusCode[code] if isinstance(code, str) else StatusCode(code)
    kind = span.get("kind", "INTERNAL")
    if isinstance(kind, str):
        kind = SpanKind.__members__.get(kind.replace("SPAN_KIND_", ""), SpanKind.INTERNAL)
    else:
        kind = SpanKind(max(0, int(kind) - 1))  # OTLP numbers kinds from 1 (INTERNAL)
    scope = span.get("scope") or {}
    return ReadableSpan(
        name=span["name"],
        context=ctx(span["span_id"]),
        parent=ctx(span.get("parent_span_id")),
        resource=Resource(span.get("resource") or {}),
        attributes=span.get("attributes") or {},
        events=[Event(e["name"], e.get("attributes") or {}, e.get("time_ns"))
                for e in span.get("events") or ()],
        kind=kind,
        status=Status(code, status.get("message") or None) if code is not StatusCode.UNSET
        else Status(code),
        start_time=span.get("start_ns"),
        end_time=span.get("end_ns"),
        instrumentation_scope=InstrumentationScope(scope.get("name", "otel_verl"),
                                                   scope.get("version")),
    )
