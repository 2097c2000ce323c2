"""Process state: the one object that knows whether tracing is on, and what it was built from.

Everything the API needs at call time hangs off ``STATE`` (one object, not module globals): the
configuration of the installed ``RolloutTraceConfig``, the ``Runtime`` built from it while tracing
is on (provider, tracer, processor chain, exporter, sampler), and the process hooks (shut down at
exit, queued spans handed to the exporters on SIGTERM; a fork waits for nothing). The current
trajectory lives in a ContextVar (``TRAJECTORY``, in ``otel_verl._current`` and re-exported here)
so it follows asyncio tasks; ``TrajectoryAttributesProcessor`` reads it through
``current_trajectory_attrs``.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import signal
import threading
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from otel_verl import _content, _errors
from otel_verl._config import TraceConfig
from otel_verl._current import TRAJECTORY, Trajectory, current_trajectory_attrs
from otel_verl._payload import Payload, to_payload
from otel_verl._provider import SCOPE_NAME, build_provider
from otel_verl._sampling import TrajectorySampler
from otel_verl.exporters._delivery import LOSS_KEYS
from otel_verl.exporters._processor import hand_queues_to_exporters
from otel_verl.exporters._spans import shutdown_within

_log = logging.getLogger("otel_verl")

#: the content store's counters that mean content was not stored (``content_discarded`` is not one:
#: that is a tail-dropped trajectory's content, given back by design)
CONTENT_LOSS_KEYS = ("content_dropped", "content_dropped_bytes", "content_errors")

__all__ = ["LOSS_KEYS", "STATE", "TRAJECTORY", "ProcessState", "Runtime", "Trajectory",
           "current_trajectory_attrs"]


class Runtime:
    """Everything built from one TraceConfig; exists only while tracing is on."""

    def __init__(self, config: TraceConfig, exporter: SpanExporter | None) -> None:
        self.config = config
        self.provider, self.exporter, self.processor = build_provider(
            config, current_trajectory_attrs, exporter)
        self.tracer = self.provider.get_tracer(SCOPE_NAME)
        self.sampler = TrajectorySampler(config.max_samples_per_step_per_worker,
                                         config.experiment_name)
        self._open_lock = threading.Lock()
        self._open_trajectories = 0
        #: in-flight records (``otel_verl._live``), None with ``live=false``
        self.live = _start_live(self) if config.live else None

    def trajectory_started(self) -> None:
        with self._open_lock:
            self._open_trajectories += 1

    def trajectory_ended(self) -> None:
        """When the last recorded trajectory in flight here ends (a step's rollouts are done),
        export and deliver now rather than after the schedule delay: Ray ends workers at a run's
        end without running exit hooks, and the last step's spans would wait in the log."""
        with self._open_lock:
            self._open_trajectories = max(0, self._open_trajectories - 1)
            if self._open_trajectories:
                return
        nudge = getattr(self.processor, "nudge", None)
        if nudge is not None:
            try:
                nudge()
            except Exception as exc:  # noqa: BLE001
                _errors.internal_error(exc, "processor.nudge raised")

    def payload(self, value: Any, max_bytes: int | None = None) -> Payload:
        return to_payload(value, max_bytes=max_bytes or self.config.max_field_bytes,
                          redact=self.config.redact)

    def stats(self) -> dict[str, int]:
        """The delivery counters of the processor chain and the exporter, merged."""
        counts: dict[str, int] = {}
        for part in (self.processor, self.exporter):
            stats = getattr(part, "stats", None)
            if callable(stats):
                counts.update(stats())
        # the content store (docs/content.md): live, or as it was when this runtime shut down
        final = getattr(self, "content_counts", None)
        counts.update(final if final is not None else _content.stats_all())
        return counts

    def shutdown(self, timeout_s: float) -> bool:
        """Flush, then stop the processor chain; both bounded by ``timeout_s`` in all."""
        if self.live is not None:  # its last straggler reports go out with the flush
            self.live.close()
        half_ms = _half_millis(timeout_s)
        done = self.provider.force_flush(half_ms)  # type: ignore[arg-type]  # inf works
        try:
            shutdown_within(self.processor, half_ms)
        except Exception as exc:
            _errors.internal_error(exc, "shutdown")
            done = False
        self.content_counts = _content.close_all(
            half_ms / 1000.0 if half_ms != float("inf") else 30.0)
        self.report_losses()
        return done

    def report_losses(self) -> None:
        counts = self.stats()
        lost = {k: v for k, v in counts.items() if k in LOSS_KEYS and v}
        if lost:
            _log.warning("otel_verl: not every span was delivered: %s", lost)
        content = {k: counts[k] for k in CONTENT_LOSS_KEYS if counts.get(k)}
        if content:  # the content store's own first warning came when it happened; this is the sum
            _log.warning("otel_verl: not all payload content reached the content store: %s (those "
                         "spans say otel_verl.content.stored=missing; raise content_store_bytes)",
                         content)
        if counts.get("spool_pending"):
            _log.warning("otel_verl: %d span(s) wait in the durable log for delivery (the next "
                         "process with this trace dir and backend delivers them, or `otel-verl "
                         "traces replay`)", counts["spool_pending"])


def _half_millis(timeout_s: float) -> float:
    """Half of ``timeout_s`` in ms for the SDK's timeouts; inf stays inf, nan/negative are 0."""
    try:
        ms = float(timeout_s) * 500.0
    except (TypeError, ValueError):
        return 2500.0
    if ms != ms or ms < 0:  # noqa: PLR0124 - nan
        return 0.0
    return ms


def _start_live(runtime: Runtime) -> Any:
    """The live tracker on the runtime's provider (never raises: no tracker then)."""
    try:
        from otel_verl._live import LiveTracker

        tracker = LiveTracker(runtime.config.trace_dir, runtime.tracer,
                              runtime.config.stuck_after_s, runtime.config.experiment_name)
        runtime.provider.add_span_processor(tracker)
        return tracker
    except Exception as exc:
        _errors.internal_error(exc, "starting live tracking")
        return None


class ProcessState:
    """The process's tracing state: the active configuration and, while tracing is on, its
    ``Runtime``. ``lock`` serialises install and shutdown."""

    def __init__(self) -> None:
        self.config: TraceConfig = dataclasses.replace(TraceConfig(), backend=None)
        self.runtime: Runtime | None = None
        #: the last Runtime shut down (its counters stay readable, spans ended late included)
        self.last_runtime: Runtime | None = None
        self.lock = threading.RLock()
        self._hooks_registered = False
        self._sigterm_installed = False

    def start(self, config: TraceConfig, exporter: SpanExporter | None) -> Runtime | None:
        """Make ``config`` the active configuration; build a Runtime when it records spans."""
        self.config = config
        if not config.enabled:
            return None
        self.runtime = Runtime(config, exporter)
        self._register_process_hooks()
        if config.processor != "simple":  # the simple processor holds no queue
            self._install_sigterm_hook()
        return self.runtime

    def stop(self, timeout_s: float) -> bool:
        """Shut the Runtime down (bounded); tracing is off afterwards. True when all was flushed."""
        with self.lock:
            runtime, self.runtime = self.runtime, None
        if runtime is None:
            return True
        self.last_runtime = runtime
        return runtime.shutdown(timeout_s)

    def forget(self) -> None:
        """Back to the un-initialised configuration (tests)."""
        self.config = dataclasses.replace(TraceConfig(), backend=None)
        self.last_runtime = None

    def _register_process_hooks(self) -> None:
        """Shut down at exit: registered once per process, whatever the number of init/reset
        cycles.

        Nothing runs before a fork: ``os.fork()`` never waits on export (it used to flush for up
        to 1 s, a second per task in fork-per-task pools while the backend was slow). Nothing
        needs it: the parent keeps exporting what it had queued, and each stage's
        ``after_in_child`` callback (``otel_verl._fork``: ``_processor``, ``_tail``, ``_spool``,
        ``_file_exporter``, ``_provider``'s id generator) starts the child empty, with its own
        worker threads, locks and log stream, so the parent's spans are neither lost nor sent
        twice.
        """
        if self._hooks_registered:
            return
        self._hooks_registered = True
        atexit.register(self._shutdown_at_exit)

    def _shutdown_at_exit(self) -> None:
        try:
            self.stop(timeout_s=5.0)
        except Exception:  # interpreter teardown: never raise from atexit
            pass

    def _install_sigterm_hook(self) -> None:
        """On SIGTERM (Python's default: die without atexit), hand queued spans to the exporters
        (the durable log: a disk write) before dying as SIGTERM would. Installed once per
        process, only when SIGTERM has its default action and only from the main thread (a
        later init from the main thread installs it); an application's handler is kept."""
        if self._sigterm_installed or threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return
            signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):  # not the main interpreter, or no signals here
            return
        self._sigterm_installed = True


def _on_sigterm(signum: int, frame: Any) -> None:
    hand_queues_to_exporters(timeout_s=2.0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


STATE = ProcessState()
