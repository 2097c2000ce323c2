"""Span processors: a batch processor bounded in bytes that counts what it drops, and the processor
that copies trajectory attributes onto every span started inside a trajectory.

The SDK's BatchSpanProcessor drops silently (one warning per 20 s) and exposes no counts; a user
asking "did I lose traces?" needs numbers, so this one keeps them (``stats()``) and its flush and
shutdown are bounded in time (any timeout, ``math.inf`` included). The rollout's thread only
appends to a deque; a span ended after shutdown is counted (``dropped_after_shutdown``).
With :class:`otel_verl.exporters.DurableSpanExporter` behind it, each batch goes to disk within
``schedule_delay_s``, so a SIGKILLed process loses at most the spans of its last schedule delay.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, Context, attach, set_value
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext

from otel_verl import _errors
from otel_verl._config import MIN_SCHEDULE_DELAY_S
from otel_verl._fork import LiveInstances
from otel_verl._hotpath import attribute_map, compact, merge_clean
from otel_verl.exporters._spans import (  # estimate_bytes: imported from here too
    estimate_bytes,
    shutdown_within,
    suppressed_instrumentation,
    timeout_seconds,
)
from otel_verl.semconv import OTEL_VERL_TRAJECTORY_CHILD

#: nudges (``BoundedBatchProcessor.nudge``) closer together than this are merged into one
MIN_NUDGE_INTERVAL_S = 0.25

_log = logging.getLogger("otel_verl")


class TrajectoryAttributesProcessor(SpanProcessor):
    """Adds the current trajectory's attributes to spans that were started without them.

    The one place every span inside a trajectory gets them (``rollout_trace_op``'s spans, those
    made with ``get_tracer()`` and by libraries using otel_verl's provider): the attributes come
    validated once per trajectory and go in with one insert (``otel_verl._hotpath``); direct
    children of the trajectory span are marked (``child_marker``).

    Args:
        current: returns (trajectory attributes, trajectory span id or None), or None outside a
            recorded trajectory; or a third item, the attributes for the direct children (the
            same plus ``child_marker``: True), made once per trajectory instead of per span.
        marker: an attribute every trajectory-tagged span has (to skip spans already tagged).
        child_marker: set to True on direct children of the trajectory span.
    """

    def __init__(self, current: Callable[[], tuple[Any, ...] | None], marker: str,
                 child_marker: str) -> None:
        self._current = current
        self._marker = marker
        self._child_marker = child_marker
        #: the third item of ``current()`` carries this processor's marker
        self._made_ok = child_marker == OTEL_VERL_TRAJECTORY_CHILD

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        current = self._current()
        if not current or attribute_map(span).get(self._marker) is not None:
            return
        attrs = current[0]
        trajectory_span_id = current[1]
        parent = span.parent
        if parent is not None and trajectory_span_id is not None and \
                parent.span_id == trajectory_span_id:
            attrs = current[2] if self._made_ok and len(current) > 2 else \
                {**attrs, self._child_marker: True}
        merge_clean(span, attrs)  # validated once per trajectory (``_hotpath``), one insert

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class BoundedBatchProcessor(SpanProcessor):
    """Batches finished spans to an exporter on a background thread, bounded in bytes.

    Args:
        exporter: where batches go; its ``export`` is called only from the worker thread, with
            OpenTelemetry instrumentation suppressed (no self-tracing of the export's own calls).
        max_queue_size: spans held at most.
        max_queue_bytes: estimated bytes held at most; from half of it on the worker is woken
            to hand the queue to the exporter (with :class:`DurableSpanExporter`: to disk), and
            beyond it new spans are dropped and counted (``dropped_queue_full``).
        max_export_batch_size: spans per ``export`` call.
        max_batch_bytes: estimated bytes per ``export`` call.
        schedule_delay_s: the longest a span waits before its batch is exported (at least
            ``MIN_SCHEDULE_DELAY_S``); a batch leaves earlier only when it is full.
        transform: applied to each span on the worker thread before the exporter sees it
            (redaction); a span it raises on is dropped (``dropped_transform_failed``), never
            exported unredacted.

    ``stats()`` keys: see :mod:`otel_verl.exporters`.
    """

    def __init__(self, exporter: SpanExporter, *, max_queue_size: int = 16384,
                 max_queue_bytes: int = 256 * 1024 * 1024, max_export_batch_size: int = 512,
                 max_batch_bytes: int = 3 * 1024 * 1024, schedule_delay_s: float = 1.0,
                 transform: Callable[[ReadableSpan], ReadableSpan] | None = None) -> None:
        self.exporter = exporter
        self._max_queue = max(1, max_queue_size)
        self._max_bytes = max(1, max_queue_bytes)
        self._batch = max(1, max_export_batch_size)
        self._batch_bytes = max(1, max_batch_bytes)
        self._delay = max(MIN_SCHEDULE_DELAY_S, float(schedule_delay_s))
        self._transform = transform
        self._counts: collections.Counter[str] = collections.Counter()
        #: spans queued (``stats()["queued"]``; an int: the one count every span moves)
        self._queued = 0
        self._last_drop_warning = 0.0
        self._start_worker()
        _AFTER_FORK.add(self)

    def _start_worker(self) -> None:
        # the spans and their estimated sizes side by side (no tuple per span for the young
        # GC to count): a size goes in before its span and comes out after it, so the worker
        # never finds a span without a size, whichever threads end spans
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._sizes: collections.deque[int] = collections.deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self._flush_requests: list[threading.Event] = []
        self._nudge_at: float | None = None  # when a requested nudge is due
        self._last_nudge = -math.inf
        self._in_flight = 0
        self._in_flight_batch: list[ReadableSpan] = []
        self._stopped = False
        self._worker = threading.Thread(target=self._run, name="otel_verl-export", daemon=True)
        self._worker.start()

    # -- the rollout's side: cheap, never blocks on export --------------------------------------
    # (no ``on_start``: the SDK's no-op, which the light span's dispatch skips)

    def on_end(self, span: ReadableSpan) -> None:
        context = span._context if type(span) is ReadableSpan else span.context
        if not (context[3] & 1 if type(context) is SpanContext else  # flags: sampled
                context is not None and context.trace_flags.sampled):
            return
        if self._stopped:
            self._counts["dropped_after_shutdown"] += 1
            if self._counts["dropped_after_shutdown"] == 1:
                _log.warning("otel_verl: a span ended after tracing was shut down (%r); it is not "
                             "exported (counted as dropped_after_shutdown)", span.name)
            return
        span = compact(span)  # fewer GC-tracked objects while it waits in the queue
        size = estimate_bytes(span)
        if len(self._queue) >= self._max_queue or self._bytes + size > self._max_bytes:
            self._counts["dropped_queue_full"] += 1
            now = time.monotonic()
            if now - self._last_drop_warning > 20.0:
                self._last_drop_warning = now
                _log.warning("otel_verl: export queue full (%d spans, ~%d bytes); %d spans "
                             "dropped so far", len(self._queue), self._bytes,
                             self._counts["dropped_queue_full"])
            return
        queue = self._queue
        self._sizes.append(size)
        queue.append(span)
        self._bytes += size
        self._queued += 1
        held = self._bytes
        if len(queue) >= self._batch or held >= self._batch_bytes or \
                held * 2 >= self._max_bytes or len(queue) * 2 >= self._max_queue:
            with self._cond:  # a full batch, or the queue half full (``_full``, ``_pressed``)
                self._cond.notify()

    # -- the worker ------------------------------------------------------------------------------
    def _full(self) -> bool:
        return len(self._queue) >= self._batch or self._bytes >= self._batch_bytes

    def _run(self) -> None:
        attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))  # this thread only exports
        deadline = time.monotonic() + self._delay
        while True:
            with self._cond:
                while (not self._stopped and not self._flush_requests and not self._full()
                       and not self._pressed()):
                    now = time.monotonic()
                    due = deadline if self._nudge_at is None else min(deadline, self._nudge_at)
                    if due <= now:
                        break
                    self._cond.wait(due - now)
                stopping = self._stopped
                waiters, self._flush_requests = self._flush_requests, []
                nudged = self._nudge_at is not None and self._nudge_at <= time.monotonic()
                if nudged:
                    self._nudge_at = None
                    self._last_nudge = time.monotonic()
                everything = (stopping or bool(waiters) or nudged or self._pressed()
                              or time.monotonic() >= deadline)
            self._drain(everything)
            if nudged:
                nudge_exporter = getattr(self.exporter, "nudge", None)
                if nudge_exporter is not None:
                    with contextlib.suppress(Exception):
                        nudge_exporter()
            if everything:
                deadline = time.monotonic() + self._delay
            for event in waiters:
                event.set()
            if stopping:
                return

    def _pressed(self) -> bool:
        """Half the queue's budget used: hand it over now (to disk, with the durable log)."""
        return self._bytes * 2 >= self._max_bytes or len(self._queue) * 2 >= self._max_queue

    def _drain(self, everything: bool) -> None:
        """Export the queue in batches: all of it, or only full batches (the rest waits for
        the schedule delay)."""
        while self._queue and (everything or self._full()):
            batch: list[ReadableSpan] = []
            self._in_flight_batch = batch  # shutdown hands it to the log if time runs out
            size = 0
            while self._queue and len(batch) < self._batch and (
                    not batch or size < self._batch_bytes):
                span = self._queue.popleft()
                span_bytes = self._sizes.popleft()
                self._bytes -= span_bytes
                size += span_bytes
                batch.append(span)
            self._in_flight = len(batch)
            self._export(self._transformed(batch))
            self._in_flight = 0

    def _transformed(self, batch: list[ReadableSpan]) -> list[ReadableSpan]:
        if self._transform is None:
            return batch
        out = []
        for span in batch:
            _yield_gil()  # between spans: a rollout's loop waking up does not wait for the batch
            try:
                out.append(self._transform(span))
            except Exception as exc:  # noqa: BLE001  # never export what could not be redacted
                self._counts["dropped_transform_failed"] += 1
                _errors.internal_error(exc, "span transform raised; span dropped")
        return out

    def _export(self, batch: list[ReadableSpan]) -> None:
        if not batch:
            return
        try:
            result = self.exporter.export(batch)
        except Exception as exc:  # noqa: BLE001  # exporters must not raise; one that does costs only its batch
            _errors.internal_error(exc, "exporter.export raised")
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self._counts["exported"] += len(batch)
        else:
            self._counts["export_failed"] += len(batch)

    # -- lifecycle -------------------------------------------------------------------------------
    def force_flush(self, timeout_millis: float = 30000) -> bool:
        if self._stopped:
            return not self._queue
        timeout_s = timeout_seconds(timeout_millis)
        deadline = time.monotonic() + timeout_s
        done = self.force_flush_to_exporter(timeout_s)
        if done:
            exporter_flush = getattr(self.exporter, "force_flush", None)
            if exporter_flush is not None:
                left_ms = max(1.0, (deadline - time.monotonic()) * 1000)
                try:
                    done = bool(exporter_flush(left_ms if math.isinf(left_ms) else int(left_ms)))
                except Exception as exc:  # noqa: BLE001
                    _errors.internal_error(exc, "exporter.force_flush raised")
                    done = False
        return done

    def nudge(self) -> None:
        """Export what is queued now, and ask the exporter to deliver it now (the durable log's
        ``nudge``), without waiting for either: called when this process has no trajectory in
        flight any more (the end of a step's rollouts), so a worker that is ended right after
        (Ray kills actors at a run's end) has already delivered them."""
        if self._stopped:
            return
        with self._cond:
            if self._nudge_at is None:  # at most one per MIN_NUDGE_INTERVAL_S: no request storm
                self._nudge_at = max(time.monotonic(), self._last_nudge + MIN_NUDGE_INTERVAL_S)
                self._cond.notify()

    def force_flush_to_exporter(self, timeout_s: float) -> bool:
        """Hand the queue to the exporter (not waiting for the exporter's own delivery)."""
        event = threading.Event()
        with self._cond:
            self._flush_requests.append(event)
            self._cond.notify()
        return event.wait(timeout_s)

    def shutdown(self, timeout_millis: float = 10000) -> None:
        if self._stopped:
            return
        timeout_s = timeout_seconds(timeout_millis)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._worker.join(max(0.0, min(deadline - time.monotonic(), threading.TIMEOUT_MAX)))
        if self._worker.is_alive():
            left = _hand_to_log(self)
            if left:
                self._counts["abandoned_at_shutdown"] += left
                _log.warning("otel_verl: export did not finish within %.1fs at shutdown; %d spans "
                             "abandoned", timeout_s, left)
        _shut_down_exporter(self.exporter, max(0.1, min(deadline - time.monotonic(), 3600.0)))

    def stats(self) -> dict[str, int]:
        """Counts since start (see :mod:`otel_verl.exporters` for every key)."""
        counts = dict(self._counts)
        if self._queued:
            counts["queued"] = self._queued
        counts["pending"] = len(self._queue) + self._in_flight
        counts["queue_bytes"] = max(0, self._bytes)
        return counts

    def _after_fork_in_child(self) -> None:
        # the parent's worker thread does not exist here; spans queued before the fork belong to
        # the parent (which exports them), so the child starts empty
        self._counts = collections.Counter()
        self._queued = 0
        self._start_worker()


def _yield_gil() -> None:
    """Let a thread waiting for the GIL (the rollout's event loop) take it now, not at the end
    of the interpreter's switch interval (5 ms): ``time.sleep(0)`` releases it."""
    time.sleep(0)


def _shut_down_exporter(exporter: SpanExporter, timeout_s: float) -> None:
    """Exporter shutdown may hang (Weave's own client does for minutes): bound it (a thread of
    its own, waited for ``timeout_s``)."""
    thread = threading.Thread(target=_exporter_shutdown, args=(exporter, timeout_s), daemon=True,
                              name="otel_verl-exporter-shutdown")
    thread.start()
    thread.join(timeout_s + 1.0)
    if thread.is_alive():
        _log.warning("otel_verl: exporter shutdown still running after %.1fs; not waiting",
                     timeout_s)


def _exporter_shutdown(exporter: SpanExporter, timeout_s: float) -> None:
    try:
        with suppressed_instrumentation():
            shutdown_within(exporter, timeout_s * 1000)
    except Exception as exc:  # noqa: BLE001
        _errors.internal_error(exc, "exporter.shutdown raised")


def _hand_to_log(processor: BoundedBatchProcessor) -> int:
    """Shutdown ran out of time with spans still queued (or in the worker's batch): where the
    exporter is the durable log, hand them to it as they are (encode and append, no redaction:
    the log redacts them when it reads them back, before sending). Returns how many are lost:
    all of them with any other exporter."""
    append = getattr(processor.exporter, "append_unredacted", None)
    if append is None:
        return len(processor._queue) + processor._in_flight
    taken: list[ReadableSpan] = []
    with contextlib.suppress(IndexError):
        while True:  # the worker may pop concurrently: each span goes to one side only
            span = processor._queue.popleft()
            processor._bytes -= processor._sizes.popleft()
            taken.append(span)
    batch = list(processor._in_flight_batch) if processor._in_flight else []
    spans = batch + taken  # the worker's batch may reach the log twice: backends key by span id
    if not spans:
        return 0
    try:
        kept = int(append(spans, processor._transform))
    except Exception as exc:  # noqa: BLE001
        _errors.internal_error(exc, "handing the queue to the durable log at shutdown")
        kept = 0
    processor._counts["kept_in_log_at_shutdown"] += kept
    _log.warning("otel_verl: export did not finish at shutdown; %d span(s) went to the durable "
                 "log in %s (redacted when they are read back, before sending)", kept,
                 getattr(processor.exporter, "directory", "?"))
    return max(0, len(spans) - kept)


def _reset_in_child(processor: BoundedBatchProcessor) -> None:
    if not processor._stopped:
        processor._after_fork_in_child()


_AFTER_FORK: LiveInstances[BoundedBatchProcessor] = LiveInstances("the batch processor",
                                                                  _reset_in_child)


def hand_queues_to_exporters(timeout_s: float) -> None:
    """Hand every live processor's queue to its exporter (the durable log: a disk write), within
    ``timeout_s`` in all; never raises. The body of the SIGTERM hook (``_state``)."""
    deadline = time.monotonic() + timeout_s
    for processor in _AFTER_FORK:
        if not processor._stopped:
            with contextlib.suppress(Exception):
                processor.force_flush_to_exporter(max(0.0, deadline - time.monotonic()))
