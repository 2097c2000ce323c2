"""Durable delivery: a write-ahead log on disk between the span processor and any exporter.

Usage::

    from otel_verl.exporters import DurableSpanExporter, BoundedBatchProcessor

    exporter = DurableSpanExporter(OTLPSpanExporter(...), "./otel_verl_traces/spool/otlp")
    provider.add_span_processor(BoundedBatchProcessor(exporter))
    ...
    replay("./otel_verl_traces/spool/otlp", OTLPSpanExporter(...))  # or `otel-verl traces replay`

``export`` only appends the spans to this process's log (one OTLP/JSON line per span, the local
store's format, so ``otel-verl traces`` reads it) and returns; a sender thread delivers the log to
the inner exporter in requests of at most ``max_request_bytes`` and ``max_batch_spans`` and moves a
delivery cursor (``<stream>.cursor``) past what the backend accepted. While the backend is down
(refusing, 429/503, hanging, closing), the sender retries with capped exponential backoff and the
spans wait on disk; once it answers again they are delivered by the same process. The log is
bounded by ``max_spool_bytes``: beyond it the oldest segment is dropped, counted
(``dropped_spool_full``) and logged.

What a process leaves behind (it ended, crashed or was SIGKILLed) is delivered by the next
:class:`DurableSpanExporter` on the same directory (each process holds an ``flock`` on its
stream's ``.lock`` file; a lock that can be taken belongs to a dead process, whose stream is then
adopted), or by :func:`replay` by hand. Delivery is at least once: a request the backend accepted
just before a crash is sent again (backends that key by span id, like Weave, show no duplicate).

A span larger than ``max_request_bytes`` is cut to fit (its longest strings first) and marked
``otel_verl.request_truncated = true``. A span the backend keeps refusing while it accepts
others is moved to ``quarantine/`` (counted, ``quarantined``) so it cannot block the log. A log
write that fails (a full disk) is tried as a direct delivery instead, and while the backend is
down too the spans wait in memory (``max_overflow_bytes``) until the disk or the backend takes
them; only beyond that bound are spans lost (``spool_failed``).

The exporter's own calls run with OpenTelemetry instrumentation suppressed, so an
``opentelemetry-instrument``-ed process does not trace its exporter's HTTP/gRPC requests.

The parts: the storage (``_log.SpanLog``: segments, cursor, budget, orphans, damage,
quarantine), the sender (``_sender.Sender``: thread, backoff, flush waiters, overflow, poison
probing), replay (``_replay``); this module wires them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_verl import _errors
from otel_verl._fork import LiveInstances
from otel_verl.exporters._log import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_SPOOL_BYTES,
    Counts,
    LogSettings,
    Redactor,
    SpanLog,
    default_identity,
)
from otel_verl.exporters._sender import Sender
from otel_verl.exporters._spans import suppressed_instrumentation, timeout_seconds

_logger = logging.getLogger("otel_verl")

Transform = Callable[[ReadableSpan], ReadableSpan]


def _result(ok: bool) -> SpanExportResult:
    return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE


def _reset_in_child(exporter: DurableSpanExporter) -> None:
    if not exporter._closed:
        exporter._after_fork_in_child()


_LIVE: LiveInstances[DurableSpanExporter] = LiveInstances("the durable log", _reset_in_child)


class DurableSpanExporter(SpanExporter):
    """Writes spans to a log on disk; a sender thread delivers the log to ``inner``.

    Args:
        inner: the real exporter (OTLP, Weave, any ``SpanExporter``); called from one thread.
        directory: the log's directory; one per backend (a process adopts the logs it finds
            there that dead processes left).
        max_spool_bytes: the log's size bound; beyond it the oldest segment is dropped (counted).
        max_request_bytes: an export request's size bound (OTLP/JSON bytes of its spans).
        max_batch_spans: spans per request at most.
        export_delay_s: a request that is not full leaves once its oldest span waited this long.
        retry_initial_s, retry_max_s: the backoff between attempts while the backend fails.
        shutdown_timeout_s: how long ``shutdown`` tries to deliver what is left.
        max_overflow_bytes: while the log cannot be written (a full disk) and the backend does
            not answer, spans wait in memory up to this many bytes; beyond, they are lost
            (``spool_failed``).
        backend_id: the backend's identity (:func:`backend_identity`), recorded beside this
            process's log: a later process adopts only the logs written for its own backend.
            Default: from the exporter's class and endpoint.
        transform: applied to records written before redaction (:meth:`append_unredacted`,
            also those an earlier process left) before they are sent; default: the last
            transform given to ``append_unredacted``, else the default scrubber.

    Damage: a record that fails its checksum or cannot be decoded is kept in ``damaged/``
    (counted, ``log_damaged``, and reported); a segment that cannot be read (EIO, EMFILE, ...)
    keeps its log on disk and is tried again (``log_read_errors``); a damaged cursor falls back to
    the start of its segment (``log_cursor_resets``: spans may be sent twice, never skipped).

    ``stats()`` keys: see :mod:`otel_verl.exporters`.
    """

    def __init__(self, inner: SpanExporter, directory: str | os.PathLike[str], *,
                 max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 max_batch_spans: int = 512, export_delay_s: float = 1.0,
                 retry_initial_s: float = 0.5, retry_max_s: float = 5.0,
                 shutdown_timeout_s: float = 5.0,
                 max_overflow_bytes: int = 64 * 1024 * 1024, backend_id: str | None = None,
                 transform: Transform | None = None) -> None:
        self.inner = inner
        self.backend_id = backend_id or default_identity(inner)
        self.directory = Path(directory).absolute()
        self.settings = LogSettings(
            max_spool_bytes=max_spool_bytes, max_request_bytes=max_request_bytes,
            max_batch_spans=max_batch_spans, export_delay_s=export_delay_s,
            retry_initial_s=retry_initial_s, retry_max_s=retry_max_s,
            shutdown_timeout_s=shutdown_timeout_s, max_overflow_bytes=max_overflow_bytes)
        self._counts = Counts()
        self._redact = Redactor(transform, self._counts)
        self._closed = False
        self._start()
        _LIVE.add(self)

    def _start(self) -> None:
        """A log (written from the first export on) and its sender thread (also after fork)."""
        self._log = SpanLog(self.directory, self.backend_id, self.settings, self._counts,
                            self._redact)
        self._sender = Sender(self._log, self.inner, self.settings, self._counts)

    def _after_fork_in_child(self) -> None:
        self._log.forget_parent()
        self._counts.reset_after_fork()
        self._start()

    # -- SpanExporter: the processor's side (disk only) -----------------------------------------
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        if self._closed:
            return _result(self._sender.backend.send_direct(spans))
        lines, fitted = self._log.records(spans, raw=False)
        if not lines:
            return SpanExportResult.FAILURE
        try:
            self._log.append(lines, fitted)
        except OSError as error:
            return _result(self._sender.hold(lines, fitted, error))
        self._counts.add(spooled=len(lines))
        self._sender.forget(self._log.enforce_budget())
        self._sender.appended(len(lines), urgent=False)
        return SpanExportResult.SUCCESS

    def append_unredacted(self, spans: Sequence[ReadableSpan], transform: Transform | None) -> int:
        """Write spans that ``transform`` (redaction) has not seen yet, fast (encode and append):
        for a processor's shutdown that ran out of time. The records are flagged, and whoever
        reads them back (this process's sender, the next process, a replay) applies the
        transform before anything is sent; they are never sent as they are. With ``transform``
        None there is nothing to redact and they are written as ready.

        Returns:
            how many spans are now in the log (or, where the log cannot be written, were
            redacted here and handed to :meth:`export`).
        """
        if transform is not None:
            self._redact.transform = transform
        if not spans:
            return 0
        raw = transform is not None
        if not self._closed:
            lines, _ = self._log.records(spans, raw=raw)
            if not lines:
                return 0
            try:
                self._log.append(lines)  # not remembered as spans: the sender reads and redacts
            except OSError:  # the log cannot grow: redact now (slow) and go the way of export
                pass
            else:
                self._counts.add(spooled=len(lines), spooled_unredacted=len(lines) if raw else 0)
                self._sender.appended(len(lines), urgent=True)
                return len(lines)
        redacted = list(spans) if transform is None else self._redact(spans, transform)
        return len(spans) if self.export(redacted) is SpanExportResult.SUCCESS else 0

    # -- lifecycle --------------------------------------------------------------------------------
    def nudge(self) -> None:
        """Deliver what this process wrote now instead of after ``export_delay_s`` (no waiting)."""
        self._sender.nudge()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait until what was written so far is delivered (False on timeout or an outage)."""
        if self._closed:
            return self._sender.pending <= 0
        return self._sender.flush(timeout_seconds(timeout_millis))

    def shutdown(self, timeout_millis: float | None = None) -> None:
        """Try to deliver what is left (bounded), then stop; what is left stays in the log."""
        if self._closed:
            return
        timeout_s = self.settings.shutdown_timeout_s if timeout_millis is None else min(
            self.settings.shutdown_timeout_s, timeout_seconds(timeout_millis))
        still_sending = self._sender.stop(timeout_s)
        self._closed = True
        left = max(0, self._sender.pending)
        self._log.close(keep=left > 0 or still_sending)
        if left:
            _logger.warning("otel_verl: %d span(s) not yet delivered are kept in %s; the next "
                            "process with this trace dir and backend delivers them, or run "
                            "`otel-verl traces replay %s`", left, self.directory, self.directory)
        try:
            with suppressed_instrumentation():
                self.inner.shutdown()
        except Exception as exc:  # noqa: BLE001
            _errors.internal_error(exc, "exporter.shutdown raised")

    def stats(self) -> dict[str, int]:
        counts = self._counts.snapshot()
        counts["spool_pending"] = max(0, self._sender.pending)
        counts["spool_held_bytes"] = self._sender.held_bytes
        counts["spool_bytes"] = self._log.size()
        # the backend exporter's own counters (e.g. the Weave exporter's calls), under "backend."
        inner_stats = getattr(self.inner, "stats", None)
        if callable(inner_stats):
            try:
                inner = inner_stats()
            except Exception as exc:  # noqa: BLE001  # a broken stats() costs only its keys
                _errors.internal_error(exc, "exporter.stats raised")
            else:
                if isinstance(inner, dict):
                    counts.update({f"backend.{key}": value for key, value in inner.items()
                                   if isinstance(value, int) and not isinstance(value, bool)})
        return counts
