"""The local store's writer: spans as OTLP/JSON lines, one file per process.

Each ``export`` call appends ONE line holding one ``ExportTraceServiceRequest`` in the OTLP/JSON
encoding — exactly what the OpenTelemetry Collector's ``file`` exporter writes, so the files can be
replayed into a collector, loaded with ``google.protobuf.json_format`` (ids aside, see below) and
read back with :func:`otel_verl.store.read_spans`. The encoding is :mod:`otel_verl._otlp_json`'s
(the one codec).

Usage::

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from otel_verl.exporters import FileSpanExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(FileSpanExporter("/tmp/traces")))

Configuration: the directory is the ``directory`` argument, else ``$OTEL_VERL_TRACE_DIR``, else
``./otel_verl_traces`` (resolved to an absolute path when the exporter is made). The file is
``otel_verl-<host>-<pid>-<UTC start time>.jsonl``, created on the first export; a forked child
starts its own file, so processes never interleave lines.

A write that fails half-way (a full disk) is cut back to the end of the last whole line, so the
next line starts clean; when even that fails, the next write starts with a newline, so only the
torn line is unreadable (the reader skips and counts it).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_verl import _config, _env
from otel_verl._errors import RateLimitedWarning
from otel_verl._fork import LiveInstances
from otel_verl._otlp_json import encode_line, encode_request
from otel_verl.exporters._io import TornWrite, write_whole

if TYPE_CHECKING:
    from otel_verl.exporters._compactor import StoreCompactor

__all__ = [
    "DEFAULT_TRACE_DIR",
    "ENV_TRACE_DIR",
    "FileSpanExporter",
    "encode_line",
    "encode_request",
    "resolve_trace_dir",
]

_logger = logging.getLogger(__name__)

#: environment variable naming the local store's directory
ENV_TRACE_DIR = _env.OTEL_VERL_TRACE_DIR
#: the local store's directory when neither an argument nor the environment names one
DEFAULT_TRACE_DIR = _config.DEFAULT_TRACE_DIR
#: file name prefix and suffix of the files this exporter writes
FILE_PREFIX = "otel_verl-"
FILE_SUFFIX = ".jsonl"


def resolve_trace_dir(directory: str | os.PathLike[str] | None = None) -> str:
    """The local store's directory as an absolute path.

    Args:
        directory: an explicit directory; wins over the environment.

    Returns:
        ``directory``, else ``$OTEL_VERL_TRACE_DIR`` (when set and not empty), else
        ``./otel_verl_traces``, made absolute against the current working directory.
    """
    if directory is None:
        directory = _config.trace_dir_from_env()  # the one place default and variable are read
    return os.path.abspath(os.fspath(directory))


# --- the exporter -------------------------------------------------------------------------------

def _forget_parent_file(exporter: FileSpanExporter) -> None:
    exporter._forget_parent_file()


_LIVE_EXPORTERS: LiveInstances[FileSpanExporter] = LiveInstances("the file exporter",
                                                                 _forget_parent_file)


_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


class FileSpanExporter(SpanExporter):
    """Appends each batch of spans as one OTLP/JSON line to this process's own file.

    Args:
        directory: where to write; default ``$OTEL_VERL_TRACE_DIR`` or ``./otel_verl_traces``.
            Created on the first export.
        compactor: told of every line written, and given the chance to start the store's
            compaction (in a child process) after each export; stopped at shutdown
            (:mod:`otel_verl.exporters._compactor`).

    Attributes:
        exported_spans: spans written so far by this process.
        failed_spans: spans that could not be written (logged: the first failure, then at most
            one line per ``warning_interval_s``).
    """

    #: the shortest time between two warnings about failed writes (or syncs)
    warning_interval_s = 60.0

    def __init__(self, directory: str | os.PathLike[str] | None = None, *,
                 compactor: StoreCompactor | None = None) -> None:
        self._directory = resolve_trace_dir(directory)
        self._compactor = compactor
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._path: str | None = None
        self._pid = os.getpid()
        self._shutdown = False
        self._warned_shutdown = False
        self._torn = False
        self.exported_spans = 0
        self.failed_spans = 0
        self._new_warnings()
        _LIVE_EXPORTERS.add(self)

    def _new_warnings(self) -> None:
        self._write_warning = RateLimitedWarning(_logger, self.warning_interval_s)
        self._sync_warning = RateLimitedWarning(_logger, self.warning_interval_s)

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
                self._append(self._fd, line)
            self.exported_spans += len(spans)
            if self._compactor is not None:  # on the export thread, after the write
                self._compactor.wrote(len(line))
                self._compactor.maybe_run()
            return SpanExportResult.SUCCESS
        except Exception as error:  # never raise into the span processor
            self.failed_spans += len(spans)
            self._write_warning.warn(
                "otel_verl: could not write %d span(s) to %s: %r (%d span(s) not written so "
                "far)", len(spans), self._path or self._directory, error, self.failed_spans,
                exc_info=self._write_warning.logged == 0)
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
            self._sync_warning.warn("otel_verl: could not sync %s: %r", self._path, error)
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
        if self._compactor is not None:
            self._compactor.shutdown()
        self._write_warning.summary(f"{self.failed_spans} span(s) in all could not be written "
                                    f"to {self._path or self._directory}")
        self._sync_warning.summary(f"syncs of {self._path} failed")

    def stats(self) -> dict[str, int]:
        """``file_written`` / ``file_write_failed``: spans written / not written by this process;
        ``file_warnings``: warning lines logged about failed writes and syncs;
        ``file_warnings_suppressed``: those held back by the rate limit; with a compactor,
        its ``compact_*`` counts."""
        warnings = (self._write_warning, self._sync_warning)
        counts = {"file_written": self.exported_spans, "file_write_failed": self.failed_spans,
                  "file_warnings": sum(w.logged for w in warnings),
                  "file_warnings_suppressed": sum(w.suppressed for w in warnings)}
        if self._compactor is not None:
            counts.update(self._compactor.stats())
        return counts

    # internals ----------------------------------------------------------------------------------

    def _append(self, fd: int, line: bytes) -> None:
        """Write ``line`` whole, or leave the file ending in a whole line (see the docstring)."""
        if self._torn:
            line = b"\n" + line
        try:
            write_whole(fd, line, os.lseek(fd, 0, os.SEEK_END))
        except TornWrite:  # part of the line stays in the file: the next one starts a line
            self._torn = True
            raise
        self._torn = False

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
        self._new_warnings()
