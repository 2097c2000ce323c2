"""The local store's writer side compacts it too: one child process at idle priority.

``backend=file`` appends OTLP/JSON lines; readers want the lake (Parquet segments,
:mod:`otel_verl.store._compact`). Compaction costs about twice the CPU of parsing the lines and,
while it runs, switches Arrow's memory pool process-wide, so a training process never compacts
in itself: its :class:`StoreCompactor` starts ``compact(trace_dir)`` in a **child process** that
first lowers its own priority to ``SCHED_IDLE`` (else ``nice 19``). An idle-class process runs
only on CPU time nothing else wants, and with no I/O priority of its own the kernel gives it the
idle I/O class as well; it shares no GIL and no Arrow pool with the rollout.

When (all on the export thread, after an export; never on the rollout's thread):

- at most one child at a time, at most one start per ``interval_s`` (doubled after each failed
  child, up to an hour), and the store looked at no more than once per ``check_s``;
- a child is started when this process appended ``live_bytes`` (compaction's own live
  threshold) since the last one started, or when a closed store file (its writer gone, the same
  rule as compaction's, :mod:`otel_verl.store._writers`) appeared or grew since a child last took
  the closed files; the child compacts what ``compact`` takes then (closed files whole, live
  files past ``live_bytes``), every writer's;
- not at all without the ``lake`` extra (pyarrow and DuckDB; said once in the log).

Failures never reach the rollout: a child that cannot start, fails (a full disk), or finds the
lake locked by another compaction is logged (rate-limited) and tried again later; a child
running longer than ``hang_s`` is killed (it also arms ``SIGALRM`` on itself, so it ends even if
this process is SIGKILLed). Compaction is crash-safe (the manifest is replaced atomically, per
chunk), so killing it loses at most the chunk in progress, which the next compaction does again.

Shutdown does not wait for a running compaction: the child gets SIGTERM, then SIGKILL after
``stop_s``, so an exporter's shutdown takes at most about ``2 * stop_s`` more. What it had
committed stays; the rest (this process's file is closed from now on) is taken by the next
compaction (the next run's exporter, the viewer, ``traces list``/``sql``, ``otel-verl
compact``). A forked child process starts with no compaction of its own in flight and owes none
of the parent's bytes: it compacts only for what it writes itself.

Usage (``build_exporter`` wires it for ``backend=file`` with the batch processor)::

    exporter = FileSpanExporter(trace_dir, compactor=StoreCompactor(trace_dir))

Configuration: ``compact``, ``compact_interval_s``, ``compact_live_bytes`` (docs/configuration.md).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from otel_verl import _errors
from otel_verl._errors import RateLimitedWarning
from otel_verl._fork import LiveInstances
from otel_verl.store._writers import LIVE_BYTES, is_closed

__all__ = ["BUSY", "DONE", "NO_LAKE", "StoreCompactor", "child_main"]

_logger = logging.getLogger(__name__)

#: the child's exit codes: compacted (or nothing to do); another compaction held the lake's
#: lock; the lake extra is not installed. Anything else is a failure.
DONE, BUSY, NO_LAKE = 0, 3, 4
#: the child neither traces nor compacts from an exporter of its own, whatever the training
#: process's environment (``opentelemetry-instrument``'s sitecustomize, ``OTEL_VERL_*``) starts
CHILD_ENV = {"OTEL_SDK_DISABLED": "true", "OTEL_VERL_BACKEND": "none", "OTEL_VERL_COMPACT": "false"}
#: the longest back-off after failed children
MAX_BACKOFF_S = 3600.0

#: the child's program: lower its priority before anything else is imported, then compact
_BOOT = """\
import os, sys
try:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
except (AttributeError, OSError):
    try:
        os.nice(19)
    except (AttributeError, OSError):
        pass
from otel_verl.exporters._compactor import child_main
sys.exit(child_main(sys.argv[1:]))
"""


def child_main(argv: Sequence[str]) -> int:
    """The compaction child: ``TRACE_DIR LIVE_BYTES HANG_S``. Returns its exit code."""
    import signal

    trace_dir, live_bytes, hang_s = argv[0], int(argv[1]), float(argv[2])
    if hasattr(signal, "alarm"):
        signal.alarm(max(1, math.ceil(hang_s)))  # ends a hung child even if its parent is gone
    try:
        from otel_verl.store._compact import compact
        from otel_verl.store._query import Lake  # noqa: F401 - the cache is written with DuckDB
    except ImportError:
        return NO_LAKE
    try:
        stats = compact(trace_dir, live_bytes=live_bytes)
    except Exception as exc:  # noqa: BLE001 - one line for the parent's log, not a traceback
        sys.stderr.write(f"otel_verl: compaction of {trace_dir} failed: {exc!r}\n")
        return 1
    return BUSY if stats.busy else DONE


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    if module in sys.modules:
        return sys.modules[module] is not None  # None: imports of it are blocked
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _after_fork_in_child(compactor: StoreCompactor) -> None:
    compactor._after_fork_in_child()


_LIVE: LiveInstances[StoreCompactor] = LiveInstances("the store compactor", _after_fork_in_child)


class StoreCompactor:
    """Starts the store's compaction in a low-priority child process when there is work.

    Args:
        trace_dir: the store directory.
        interval_s: the shortest time between two children.
        live_bytes: a live file's bytes not compacted before it is (this process's own bytes
            since the last child started count toward it).
        command: the child's argv (tests); default this interpreter running ``_BOOT``.

    Attributes:
        counts: ``started``, ``done``, ``busy``, ``failed`` (could not start, or exited with an
            error), ``killed`` (ran past ``hang_s``, or stopped at shutdown; not in ``failed``).
    """

    #: how often the export thread looks at the store at most
    check_s = 5.0
    #: a child running longer than this is killed (and arms SIGALRM on itself)
    hang_s = 3600.0
    #: at shutdown, how long SIGTERM and then SIGKILL are each given
    stop_s = 2.0

    def __init__(self, trace_dir: str | os.PathLike[str], *, interval_s: float = 60.0,
                 live_bytes: int = LIVE_BYTES, command: Sequence[str] | None = None) -> None:
        self.trace_dir = os.path.abspath(os.fspath(trace_dir))
        self.interval_s = interval_s
        self.live_bytes = live_bytes
        self.command = list(command) if command is not None else None
        self._lock = threading.Lock()
        self._reset()
        self._no_lake_said = False
        self._warning = RateLimitedWarning(_logger, 600.0)
        _LIVE.add(self)

    def _reset(self) -> None:
        self.counts = {"started": 0, "done": 0, "busy": 0, "failed": 0, "killed": 0}
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        self._last_start = -math.inf
        self._next_check = 0.0
        self._failures = 0
        self._stopped = False
        self._own_bytes = 0  # appended by this process since the last child started
        self._running_own = 0  # what the running child was started for
        self._taken: dict[str, int] = {}  # closed file -> its size when a child took it
        self._running_closed: dict[str, int] = {}

    @property
    def running(self) -> subprocess.Popen[bytes] | None:
        """The child now running, if any."""
        return self._proc

    # called by the exporter --------------------------------------------------------------------

    def wrote(self, nbytes: int) -> None:
        """This process appended ``nbytes`` to its store file."""
        self._own_bytes += nbytes

    def maybe_run(self, now: float | None = None) -> None:
        """Reap a finished child, or start one when there is work and the rate allows. Cheap
        when nothing is due (a clock read); never raises."""
        now = time.monotonic() if now is None else now
        if now < self._next_check or self._stopped:
            return
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._next_check = now + self.check_s
            if self._proc is not None and not self._reap(now):
                return
            if self._stopped or now - self._last_start < self._interval():
                return
            closed = self._new_closed_files()
            if self._own_bytes < self.live_bytes and not closed:
                return
            if not self._lake_installed():
                return
            self._start(now, closed)
        except Exception as exc:  # noqa: BLE001 - never into the export thread
            _errors.internal_error(exc, "starting the store's compaction")
        finally:
            self._lock.release()

    def shutdown(self) -> None:
        """Stop a running child (SIGTERM, then SIGKILL; at most ~2 x ``stop_s``). Idempotent."""
        with self._lock:
            self._stopped = True
            proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        self.counts["killed"] += 1
        _logger.info("otel_verl: stopping the store's compaction (pid %d) at shutdown; what it "
                     "committed stays, the next compaction does the rest", proc.pid)
        for stop in (proc.terminate, proc.kill):
            try:
                stop()
                proc.wait(self.stop_s)
                return
            except subprocess.TimeoutExpired:
                continue
            except OSError:
                return

    def stats(self) -> dict[str, int]:
        """``compact_started`` / ``_done`` / ``_busy`` / ``_failed`` / ``_killed``: children."""
        return {f"compact_{name}": value for name, value in self.counts.items()}

    # internals ---------------------------------------------------------------------------------

    def _interval(self) -> float:
        return min(MAX_BACKOFF_S, self.interval_s * 2 ** min(self._failures, 20)) \
            if self._failures else self.interval_s

    def _new_closed_files(self) -> dict[str, int]:
        """Closed store files of the store's top level not taken by a child at this size."""
        from otel_verl.exporters._file_exporter import FILE_PREFIX, FILE_SUFFIX

        found: dict[str, int] = {}
        wall = time.time()
        try:
            entries = list(os.scandir(self.trace_dir))
        except OSError:
            return found
        for entry in entries:
            name = entry.name
            if not (name.startswith(FILE_PREFIX) and name.endswith(FILE_SUFFIX)):
                continue
            try:
                size = entry.stat().st_size
            except OSError:
                continue
            if size and self._taken.get(name) != size and is_closed(entry.path, wall):
                found[name] = size
        return found

    def _lake_installed(self) -> bool:
        if self.command is None and not all(_installed(m) for m in ("pyarrow", "duckdb")):
            self._no_lake()
            return False
        return True

    def _no_lake(self) -> None:
        self._stopped = True
        if not self._no_lake_said:
            self._no_lake_said = True
            _logger.info("otel_verl: this process does not compact its store into the lake: the "
                         "lake extra is not installed (pip install 'otel-verl[lake]'); readers "
                         "and `otel-verl compact` still can")

    def _start(self, now: float, closed: dict[str, int]) -> None:
        argv = self.command or [sys.executable, "-c", _BOOT, self.trace_dir,
                                str(self.live_bytes), str(self.hang_s)]
        self._last_start = now
        try:
            # its own session: a terminal's Ctrl-C is the training process's to handle
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, close_fds=True,
                                          start_new_session=True, env={**os.environ, **CHILD_ENV})
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            self.counts["failed"] += 1
            self._failures += 1
            self._warning.warn("otel_verl: could not start the store's compaction: %r (next try "
                               "in %.0f s)", exc, self._interval())
            return
        self.counts["started"] += 1
        self._started_at = now
        self._running_own, self._own_bytes = self._own_bytes, 0
        self._running_closed = closed

    def _reap(self, now: float) -> bool:
        """True when no child runs any more (it ended, or was killed for hanging)."""
        assert self._proc is not None
        code = self._proc.poll()
        if code is None:
            if now - self._started_at <= self.hang_s:
                return False
            self.counts["killed"] += 1
            self._warning.warn("otel_verl: the store's compaction (pid %d) ran over %.0f s; "
                               "killed (the next one resumes it)", self._proc.pid, self.hang_s)
            try:
                self._proc.kill()
                self._proc.wait(self.stop_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._proc = None
            self._own_bytes += self._running_own
            self._failures += 1
            return True
        self._proc = None
        if code == DONE:
            self.counts["done"] += 1
            self._failures = 0
            self._taken.update(self._running_closed)
            return True
        self._own_bytes += self._running_own  # not compacted: still owed
        if code == BUSY:  # another compaction runs: it takes the closed files
            self.counts["busy"] += 1
            self._taken.update(self._running_closed)
        elif code == NO_LAKE:
            self._no_lake()
        else:
            self.counts["failed"] += 1
            self._failures += 1
            self._warning.warn("otel_verl: the store's compaction exited with %s (next try in "
                               "%.0f s)", code, self._interval())
        return True

    def _after_fork_in_child(self) -> None:
        """A forked child owes none of the parent's compaction: its own bytes start at 0, the
        parent's running child is not its own, and the closed files it or the parent took
        stay taken."""
        taken = {**self._taken, **self._running_closed}
        stopped = self._stopped
        self._lock = threading.Lock()
        self._reset()
        self._taken = taken
        self._stopped = stopped

    def __repr__(self) -> str:
        return f"StoreCompactor({self.trace_dir!r}, running={self._proc is not None})"


def from_config(config: Any) -> StoreCompactor:
    """The compactor ``config`` asks for (``compact_interval_s``, ``compact_live_bytes``)."""
    return StoreCompactor(config.trace_dir, interval_s=config.compact_interval_s,
                          live_bytes=config.compact_live_bytes)
