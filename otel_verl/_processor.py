"""Span processors: a bounded batch processor that counts what it drops, and the processor that
copies trajectory attributes onto every span started inside a trajectory.

The SDK's BatchSpanProcessor drops silently (one warning per 20 s) and exposes no counts; a user
asking "did I lose traces?" needs numbers, so this one keeps them (``stats()``) and its flush and
shutdown are bounded in time. The rollout's thread only appends to a deque.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_verl import _errors

_log = logging.getLogger("otel_verl")


class TrajectoryAttributesProcessor(SpanProcessor):
    """Adds the current trajectory's attributes to spans that were started without them.

    Spans made by ``rollout_trace_op`` already carry them (passed at start, which is cheaper);
    this covers spans made with ``get_tracer()`` and by libraries using otel_verl's provider, and
    marks those whose parent is the trajectory span (``child_marker``), as ops are marked.

    Args:
        current: returns (trajectory attributes, trajectory span id or None), or None outside a
            recorded trajectory.
        marker: an attribute every trajectory-tagged span has (to skip spans already tagged).
        child_marker: set to True on direct children of the trajectory span.
    """

    def __init__(self, current: Callable[[], tuple[Mapping[str, Any], int | None] | None],
                 marker: str, child_marker: str) -> None:
        self._current = current
        self._marker = marker
        self._child_marker = child_marker

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        current = self._current()
        if not current or span.attributes.get(self._marker) is not None:
            return
        attrs, trajectory_span_id = current
        span.set_attributes(attrs)
        parent = span.parent
        if parent is not None and trajectory_span_id is not None and \
                parent.span_id == trajectory_span_id:
            span.set_attribute(self._child_marker, True)

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class BoundedBatchProcessor(SpanProcessor):
    """Batches finished spans to an exporter on a background thread.

    Args:
        exporter: where batches go; its ``export`` is called only from the worker thread.
        max_queue_size: spans held at most; beyond it new spans are dropped and counted.
        max_export_batch_size: spans per ``export`` call.
        schedule_delay_s: the longest a span waits before its batch is exported.
    """

    def __init__(self, exporter: SpanExporter, *, max_queue_size: int = 16384,
                 max_export_batch_size: int = 512, schedule_delay_s: float = 1.0) -> None:
        self.exporter = exporter
        self._max_queue = max_queue_size
        self._batch = max_export_batch_size
        self._delay = schedule_delay_s
        self._counts = collections.Counter()
        self._last_drop_warning = 0.0
        self._start_worker()
        _AFTER_FORK.add(self)

    def _start_worker(self) -> None:
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._cond = threading.Condition()
        self._flush_requests: list[threading.Event] = []
        self._in_flight = 0
        self._stopped = False
        self._worker = threading.Thread(target=self._run, name="otel_verl-export", daemon=True)
        self._worker.start()

    # -- the rollout's side: cheap, never blocks on export --------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self._stopped or not span.context.trace_flags.sampled:
            return
        if len(self._queue) >= self._max_queue:
            self._counts["dropped_queue_full"] += 1
            now = time.monotonic()
            if now - self._last_drop_warning > 20.0:
                self._last_drop_warning = now
                _log.warning("otel_verl: export queue full (%d spans); %d spans dropped so far",
                             self._max_queue, self._counts["dropped_queue_full"])
            return
        self._queue.append(span)
        self._counts["queued"] += 1
        if len(self._queue) >= self._batch:
            with self._cond:
                self._cond.notify()

    # -- the worker ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._stopped and not self._flush_requests and len(self._queue) < self._batch:
                    self._cond.wait(self._delay)
                stopping = self._stopped
                waiters, self._flush_requests = self._flush_requests, []
            self._drain()
            for event in waiters:
                event.set()
            if stopping:
                return

    def _drain(self) -> None:
        while self._queue:
            batch = []
            while self._queue and len(batch) < self._batch:
                batch.append(self._queue.popleft())
            self._in_flight = len(batch)
            self._export(batch)
            self._in_flight = 0

    def _export(self, batch: list[ReadableSpan]) -> None:
        try:
            result = self.exporter.export(batch)
        except Exception as exc:  # exporters must not raise; one that does costs only its batch
            _errors.internal_error(exc, "exporter.export raised")
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self._counts["exported"] += len(batch)
        else:
            self._counts["export_failed"] += len(batch)

    # -- lifecycle -------------------------------------------------------------------------------
    def force_flush(self, timeout_millis: int = 30000) -> bool:
        if self._stopped:
            return not self._queue
        deadline = time.monotonic() + timeout_millis / 1000.0
        event = threading.Event()
        with self._cond:
            self._flush_requests.append(event)
            self._cond.notify()
        done = event.wait(timeout_millis / 1000.0)
        if done:
            exporter_flush = getattr(self.exporter, "force_flush", None)
            if exporter_flush is not None:
                left_ms = max(1, int((deadline - time.monotonic()) * 1000))
                try:
                    done = bool(exporter_flush(left_ms))
                except Exception as exc:
                    _errors.internal_error(exc, "exporter.force_flush raised")
                    done = False
        return done

    def shutdown(self, timeout_millis: int = 10000) -> None:
        if self._stopped:
            return
        deadline = time.monotonic() + timeout_millis / 1000.0
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._worker.join(max(0.0, deadline - time.monotonic()))
        if self._worker.is_alive():
            self._counts["abandoned_at_shutdown"] += len(self._queue) + self._in_flight
            _log.warning("otel_verl: export did not finish within %.1fs at shutdown; %d spans "
                         "abandoned", timeout_millis / 1000.0, len(self._queue) + self._in_flight)
        self._call_exporter_shutdown(max(0.1, deadline - time.monotonic()))

    def _call_exporter_shutdown(self, timeout_s: float) -> None:
        """Exporter shutdown may hang (Weave's own client does for minutes): bound it."""
        thread = threading.Thread(target=self._exporter_shutdown, daemon=True,
                                  name="otel_verl-exporter-shutdown")
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            _log.warning("otel_verl: exporter shutdown still running after %.1fs; not waiting",
                         timeout_s)

    def _exporter_shutdown(self) -> None:
        try:
            self.exporter.shutdown()
        except Exception as exc:
            _errors.internal_error(exc, "exporter.shutdown raised")

    def stats(self) -> dict[str, int]:
        """Counts since start: queued, exported, export_failed, dropped_queue_full, pending, ..."""
        counts = dict(self._counts)
        counts["pending"] = len(self._queue) + self._in_flight
        return counts

    def _after_fork_in_child(self) -> None:
        # the parent's worker thread does not exist here; spans queued before the fork belong to
        # the parent (which exports them), so the child starts empty
        self._counts = collections.Counter()
        self._start_worker()


_AFTER_FORK: weakref.WeakSet[BoundedBatchProcessor] = weakref.WeakSet()


def _reinit_after_fork() -> None:
    for processor in list(_AFTER_FORK):
        if not processor._stopped:
            processor._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_after_fork)
