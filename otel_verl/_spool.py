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
``otel_verl.truncated = true``. A span the backend keeps refusing while it accepts others is moved
to ``quarantine/`` (counted, ``quarantined``) so it cannot block the log. A log write that fails
(a full disk) is tried as a direct delivery instead, and while the backend is down too the spans
wait in memory (``max_overflow_bytes``) until the disk or the backend takes them; only beyond
that bound are spans lost (``spool_failed``).

The exporter's own calls run with OpenTelemetry instrumentation suppressed, so an
``opentelemetry-instrument``-ed process does not trace its exporter's HTTP/gRPC requests.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import logging
import math
import os
import re
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_verl import _errors, _otlp_json

_log = logging.getLogger("otel_verl")

#: the attribute set on a span that was cut to fit ``max_request_bytes``
TRUNCATED_ATTRIBUTE = "otel_verl.truncated"
DEFAULT_MAX_REQUEST_BYTES = 3 * 1024 * 1024  # below the Collector's 4 MiB gRPC default
DEFAULT_MAX_SPOOL_BYTES = 1024 * 1024 * 1024
_REQUEST_OVERHEAD = 1024  # what a request adds around its spans (grouping, framing)
_SEGMENT = re.compile(r"^(?P<stream>wal-.+)-(?P<seq>\d{8})\.jsonl$")
_STRIKES_TO_QUARANTINE = 3


@contextlib.contextmanager
def suppressed_instrumentation() -> Iterator[None]:
    """Instrumentation (requests, urllib3, grpc, ...) records nothing inside (the SDK's key)."""
    token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
    try:
        yield
    finally:
        detach(token)


def call_export(exporter: SpanExporter, spans: Sequence[ReadableSpan]) -> bool:
    """``exporter.export(spans)`` with instrumentation suppressed; True on SUCCESS, never raises."""
    try:
        with suppressed_instrumentation():
            return exporter.export(spans) is SpanExportResult.SUCCESS
    except Exception as exc:  # noqa: BLE001  # an exporter must not raise; one that does fails this request
        _errors.internal_error(exc, "exporter.export raised")
        return False


# --- cutting a span to fit ------------------------------------------------------------------------


def fit_span(span: ReadableSpan, max_bytes: int) -> tuple[ReadableSpan, bytes, bool]:
    """``span`` and its log line, cut (longest strings first, then events) to ``max_bytes``.

    Returns:
        (the span, its OTLP/JSON line, whether it was cut).
    """
    line = _otlp_json.encode_span_line(span)
    if len(line) <= max_bytes:
        return span, line, False
    attributes = dict(span.attributes or {})
    events = list(span.events)
    for _ in range(64):
        excess = len(line) - max_bytes
        if excess <= 0:
            break
        longest = max(((k, v) for k, v in attributes.items() if isinstance(v, str)),
                      key=lambda kv: len(kv[1]), default=None)
        if longest is not None and len(longest[1]) > 64:
            key, value = longest
            keep = max(0, len(value) - excess - 64)
            attributes[key] = value[:keep] + "…[truncated]"
        elif events:
            events = events[: len(events) // 2]
        elif attributes:
            attributes.pop(next(iter(attributes)))
        else:
            break
        attributes[TRUNCATED_ATTRIBUTE] = True
        span = _replace(span, attributes, events)
        line = _otlp_json.encode_span_line(span)
    return span, line, True


def _replace(span: ReadableSpan, attributes: dict[str, Any], events: list[Any]) -> ReadableSpan:
    return ReadableSpan(
        name=span.name, context=span.context, parent=span.parent, resource=span.resource,
        attributes=attributes, events=events, links=span.links, kind=span.kind,
        status=span.status, start_time=span.start_time, end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope)


# --- one process's log ------------------------------------------------------------------------------


class _Stream:
    """One writer's log: segments ``<name>-<seq>.jsonl``, a cursor file and a lock file."""

    def __init__(self, directory: Path, name: str, lock_fd: int | None) -> None:
        self.dir = directory
        self.name = name
        self.lock_fd = lock_fd
        self.cursor = self._read_cursor()

    def segment(self, seq: int) -> Path:
        return self.dir / f"{self.name}-{seq:08d}.jsonl"

    def segments(self) -> list[int]:
        found = []
        for path in self.dir.glob(f"{self.name}-*.jsonl"):
            match = _SEGMENT.match(path.name)
            if match and match["stream"] == self.name:
                found.append(int(match["seq"]))
        return sorted(found)

    def _read_cursor(self) -> tuple[int, int]:
        try:
            seq, offset = (self.dir / f"{self.name}.cursor").read_text().split()
            return int(seq), int(offset)
        except (OSError, ValueError):
            segments = self.segments()
            return (segments[0] if segments else 0), 0

    def save_cursor(self, cursor: tuple[int, int]) -> None:
        self.cursor = cursor
        path = self.dir / f"{self.name}.cursor"
        tmp = self.dir / f"{self.name}.cursor.tmp"
        try:
            tmp.write_text(f"{cursor[0]} {cursor[1]}\n")
            os.replace(tmp, path)
        except OSError as error:  # a full disk: the cursor lags, spans are sent again later
            _log.debug("otel_verl: could not save the delivery cursor: %r", error)
        for seq in self.segments():
            if seq < cursor[0]:
                with contextlib.suppress(OSError):
                    self.segment(seq).unlink()

    def read(self, cursor: tuple[int, int], end: tuple[int, int] | None, max_bytes: int,
             max_lines: int) -> tuple[list[bytes], tuple[int, int]]:
        """Whole lines from ``cursor`` (not past ``end``), within the limits (one line at least)."""
        lines: list[bytes] = []
        size = 0
        seq, offset = cursor
        segments = [s for s in self.segments() if s >= seq]
        for current in segments:
            if end is not None and current > end[0]:
                break
            if current != seq:
                seq, offset = current, 0
            limit = end[1] if end is not None and current == end[0] else None
            try:
                with open(self.segment(current), "rb") as handle:
                    handle.seek(offset)
                    while len(lines) < max_lines:
                        if limit is not None and offset >= limit:
                            break
                        line = handle.readline()
                        if not line.endswith(b"\n"):
                            break  # the end, or a torn last line of a dead writer
                        if lines and size + len(line) > max_bytes:
                            return lines, (seq, offset)
                        lines.append(line)
                        size += len(line)
                        offset += len(line)
            except OSError:
                continue
            if len(lines) >= max_lines:
                return lines, (seq, offset)
            if limit is not None:
                break
        return lines, (seq, offset)

    def pending_lines(self) -> int:
        count = 0
        for seq in self.segments():
            if seq < self.cursor[0]:
                continue
            try:
                with open(self.segment(seq), "rb") as handle:
                    if seq == self.cursor[0]:
                        handle.seek(self.cursor[1])
                    count += sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20),
                                                                       b""))
            except OSError:
                pass
        return count

    def size(self) -> int:
        total = 0
        for seq in self.segments():
            with contextlib.suppress(OSError):
                total += self.segment(seq).stat().st_size
        return total

    def remove_lock_only(self) -> None:
        if self.lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)
            self.lock_fd = None

    def remove(self) -> None:
        for seq in self.segments():
            with contextlib.suppress(OSError):
                self.segment(seq).unlink()
        for suffix in (".cursor", ".lock"):
            with contextlib.suppress(OSError):
                (self.dir / f"{self.name}{suffix}").unlink()
        if self.lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)
            self.lock_fd = None


def _try_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path``, or None when a live process holds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def adopt_streams(directory: Path, exclude: str | None = None) -> list[_Stream]:
    """The logs under ``directory`` whose writer is gone (their locks are now held by the caller)."""
    names = set()
    for path in directory.glob("wal-*"):
        match = _SEGMENT.match(path.name)
        if match:
            names.add(match["stream"])
        elif path.suffix in (".lock", ".cursor"):
            names.add(path.name[: -len(path.suffix)])
    streams = []
    for name in sorted(names - {exclude}):
        fd = _try_lock(directory / f"{name}.lock")
        if fd is not None:
            streams.append(_Stream(directory, name, fd))
    return streams


# --- the exporter ---------------------------------------------------------------------------------

_LIVE: weakref.WeakSet[DurableSpanExporter] = weakref.WeakSet()


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

    ``stats()`` keys: see :mod:`otel_verl.exporters`.
    """

    def __init__(self, inner: SpanExporter, directory: str | os.PathLike[str], *,
                 max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 max_batch_spans: int = 512, export_delay_s: float = 1.0,
                 retry_initial_s: float = 0.5, retry_max_s: float = 5.0,
                 shutdown_timeout_s: float = 5.0,
                 max_overflow_bytes: int = 64 * 1024 * 1024) -> None:
        self.inner = inner
        self.directory = Path(directory).absolute()
        self.max_spool_bytes = max_spool_bytes
        self.max_request_bytes = max(4096, max_request_bytes)
        self._max_span_bytes = self.max_request_bytes - _REQUEST_OVERHEAD
        self.max_batch_spans = max(1, max_batch_spans)
        self.export_delay_s = export_delay_s
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.max_overflow_bytes = max_overflow_bytes
        self._segment_bytes = max(64 * 1024, min(16 * 1024 * 1024, max_spool_bytes // 8))
        self._max_hot_bytes = 4 * self.max_request_bytes
        self._counts: dict[str, int] = dict.fromkeys(
            ("spooled", "spool_failed", "delivered", "requests", "request_bytes", "retries",
             "truncated", "quarantined", "dropped_spool_full", "recovered"), 0)
        self._warned_outage = False
        self._warned_disk = False
        self._last_budget_warning = 0.0
        self._backend_up = True
        self._closed = False
        self._start()
        _LIVE.add(self)

    # -- set-up (also after fork) ---------------------------------------------------------------
    def _start(self) -> None:
        # new locks (also after fork: a lock held by a thread of the parent stays held)
        self._stats_lock = threading.Lock()
        self._send_lock = threading.Lock()  # inner.export is called by one thread at a time
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._stream: _Stream | None = None
        self._fd: int | None = None
        self._seq = 0
        self._seg_size = 0
        self._pending = 0  # spans in this process's log, not yet delivered
        self._oldest_unsent: float | None = None
        self._flush_waiters: list[threading.Event] = []
        self._urgent = False  # nudge(): send what is pending now, not after export_delay_s
        self._stopping = False
        self._deadline: float | None = None
        self._limit = self.max_batch_spans
        self._strikes: dict[tuple[str, tuple[int, int]], int] = {}
        self._adopted: list[_Stream] = []
        self._next_adopt = 0.0
        self._overflow: collections.deque[tuple[list[bytes], list[ReadableSpan]]] = \
            collections.deque()
        self._overflow_bytes = 0
        # what was just written, as spans: (segment, offset, bytes, span), bounded in bytes
        self._hot: collections.deque[tuple[int, int, int, ReadableSpan]] = collections.deque()
        self._hot_bytes = 0
        self._thread = threading.Thread(target=self._run, name="otel_verl-deliver", daemon=True)
        self._thread.start()

    def _after_fork_in_child(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        if self._stream is not None and self._stream.lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._stream.lock_fd)  # the parent keeps its lock
        for stream in getattr(self, "_adopted", ()):
            if stream.lock_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(stream.lock_fd)
        self._counts = dict.fromkeys(self._counts, 0)
        self._start()

    def _open_stream(self) -> _Stream:
        self.directory.mkdir(parents=True, exist_ok=True)
        host = re.sub(r"[^A-Za-z0-9._]+", "_", socket.gethostname()) or "host"
        name = f"wal-{host}-{os.getpid()}-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        fd = _try_lock(self.directory / f"{name}.lock")
        if fd is None:
            raise OSError(errno.EAGAIN, f"cannot lock {name}.lock")
        return _Stream(self.directory, name, fd)

    def _open_segment(self) -> None:
        assert self._stream is not None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._seq += 1
        path = self._stream.segment(self._seq)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        self._fd = os.open(path, flags, 0o644)
        self._seg_size = os.fstat(self._fd).st_size

    # -- SpanExporter: the processor's side (disk only) -----------------------------------------
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        if self._closed:
            return self._direct(spans)
        lines = []
        fitted = []
        truncated = 0
        for span in spans:
            try:
                span, line, cut = fit_span(span, self._max_span_bytes)
            except Exception as exc:  # noqa: BLE001
                _errors.internal_error(exc, "encoding a span for the log")
                self._count(spool_failed=1)
                continue
            truncated += cut
            lines.append(line)
            fitted.append(span)
        self._count(truncated=truncated)
        if not lines:
            return SpanExportResult.FAILURE
        try:
            self._append(lines, fitted)
        except OSError as error:
            return self._log_full(lines, fitted, error)
        self._count(spooled=len(lines))
        self._enforce_budget()
        with self._cond:
            self._pending += len(lines)
            if self._oldest_unsent is None:
                self._oldest_unsent = time.monotonic()
            self._cond.notify_all()
        return SpanExportResult.SUCCESS

    def _append(self, lines: list[bytes], spans: list[ReadableSpan] | None = None) -> None:
        data = b"".join(lines)
        with self._write_lock:
            if self._stream is None:
                self._stream = self._open_stream()
                self._seq = max(self._stream.segments(), default=0)
            if self._fd is None or self._seg_size >= self._segment_bytes:
                self._open_segment()
            assert self._fd is not None
            start = self._seg_size
            view = memoryview(data)
            try:
                while view:
                    view = view[_write(self._fd, view):]
            except OSError:
                if _size(self._fd, start) > start:
                    try:
                        os.ftruncate(self._fd, start)
                    except OSError:  # leave the torn line; the next segment starts clean
                        self._seg_size = self._segment_bytes
                raise
            if spans is not None:  # remember them: the sender need not read them back
                offset = self._seg_size
                for line, span in zip(lines, spans, strict=True):
                    self._hot.append((self._seq, offset, len(line), span))
                    offset += len(line)
                self._hot_bytes += len(data)
                while self._hot_bytes > self._max_hot_bytes and self._hot:
                    self._hot_bytes -= self._hot.popleft()[2]
            self._seg_size += len(data)

    def _direct(self, spans: Sequence[ReadableSpan], count_loss: bool = True) -> SpanExportResult:
        with self._send_lock:
            ok = call_export(self.inner, spans)
        self._backend_up = ok
        if ok:
            self._count(delivered=len(spans), requests=1)
            return SpanExportResult.SUCCESS
        if count_loss:
            self._count(spool_failed=len(spans))
        return SpanExportResult.FAILURE

    def _log_full(self, lines: list[bytes], spans: list[ReadableSpan],
                  error: OSError) -> SpanExportResult:
        """The log cannot grow (a full disk): send directly while the backend answers, else hold
        the spans in memory (bounded) until the disk or the backend takes them."""
        if not self._warned_disk:
            self._warned_disk = True
            _log.warning("otel_verl: cannot write to the log in %s (%r); sending directly, or "
                         "holding up to %d bytes in memory", self.directory, error,
                         self.max_overflow_bytes)
        if self._backend_up and not self._overflow and \
                self._direct(spans, count_loss=False) is SpanExportResult.SUCCESS:
            return SpanExportResult.SUCCESS
        size = sum(len(line) for line in lines)
        with self._cond:
            if self._overflow_bytes + size > self.max_overflow_bytes:
                self._count(spool_failed=len(lines))
                return SpanExportResult.FAILURE
            self._overflow.append((lines, spans))
            self._overflow_bytes += size
            self._pending += len(lines)
            if self._oldest_unsent is None:
                self._oldest_unsent = time.monotonic()
            self._cond.notify_all()
        return SpanExportResult.SUCCESS

    def _send_overflow(self) -> tuple[bool, bool]:
        """The sender's side of ``_log_full``: into the log if the disk has room, else directly."""
        lines, spans = self._overflow[0]
        size = sum(len(line) for line in lines)
        try:
            self._append(lines)
        except OSError:
            with self._send_lock:
                ok = call_export(self.inner, spans)
            self._backend_up = ok
            if not ok:
                self._count(retries=1)
                return False, True
            with self._cond:
                self._overflow.popleft()
                self._overflow_bytes -= size
                self._pending -= len(lines)
            self._count(delivered=len(spans), requests=1, request_bytes=size)
            return True, False
        with self._cond:
            self._overflow.popleft()
            self._overflow_bytes -= size
        self._count(spooled=len(lines))
        return False, False

    def _write_end(self) -> tuple[int, int] | None:
        with self._write_lock:
            return (self._seq, self._seg_size) if self._stream is not None else None

    def _enforce_budget(self) -> None:
        stream = self._stream
        if stream is None:
            return
        segments = stream.segments()
        total = stream.size()
        while total > self.max_spool_bytes and len(segments) > 1:
            oldest = segments.pop(0)
            lost = _count_lines(stream.segment(oldest),
                                stream.cursor[1] if stream.cursor[0] == oldest else 0)
            with contextlib.suppress(OSError):
                total -= stream.segment(oldest).stat().st_size
            with self._cond:
                if stream.cursor[0] <= oldest:
                    stream.save_cursor((segments[0], 0))
                    self._pending -= lost
                    self._count(dropped_spool_full=lost)
                    now = time.monotonic()
                    if now - self._last_budget_warning > 20.0:
                        self._last_budget_warning = now
                        _log.warning("otel_verl: the log in %s is over its %d-byte budget; "
                                     "dropping the oldest spans (%d so far)", self.directory,
                                     self.max_spool_bytes, self._counts["dropped_spool_full"])

    # -- the sender -----------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = 0.0
        while True:
            with self._cond:
                while True:
                    if self._stopping and (self._deadline is None
                                           or time.monotonic() >= self._deadline
                                           or (self._pending <= 0 and not self._adopted)):
                        self._release_waiters(all_=True)
                        return
                    now = time.monotonic()
                    wait = self._due(now, backoff)
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                backoff_was = backoff
            _, failed = self._send_once()
            if failed:
                backoff = min(self.retry_max_s, max(self.retry_initial_s, backoff_was * 2))
                self._last_failure = time.monotonic()
            else:
                backoff = 0.0
            with self._cond:
                self._release_waiters()

    def _due(self, now: float, backoff: float) -> float:
        """Seconds until the sender should try (<= 0: now)."""
        if backoff:
            last = getattr(self, "_last_failure", 0.0)
            left = last + backoff - now
            if left > 0:
                return left
        if self._adopted or now >= self._next_adopt:
            return 0.0
        if self._pending <= 0:
            return max(0.05, self._next_adopt - now) if not self._stopping else 0.05
        if self._pending >= self._limit or self._flush_waiters or self._stopping or self._urgent:
            return 0.0
        oldest = self._oldest_unsent or now
        return oldest + self.export_delay_s - now

    def _release_waiters(self, all_: bool = False) -> None:
        if self._pending <= 0:
            self._urgent = False
        if all_ or (self._pending <= 0 and not self._adopted):
            for event in self._flush_waiters:
                event.set()
            self._flush_waiters = []

    def _send_once(self) -> tuple[bool, bool]:
        """One request from an adopted log or this process's own; (delivered, failed)."""
        if self._overflow:
            return self._send_overflow()
        now = time.monotonic()
        if now >= self._next_adopt:
            self._next_adopt = now + 30.0
            if self.directory.is_dir():
                own = self._stream.name if self._stream is not None else None
                known = {s.name for s in self._adopted}
                for stream in adopt_streams(self.directory, exclude=own):
                    if stream.name in known:
                        stream.remove_lock_only()
                        continue
                    pending = stream.pending_lines()
                    if pending:
                        _log.warning("otel_verl: delivering %d span(s) left in %s by an earlier "
                                     "process", pending, self.directory)
                    self._adopted.append(stream)
        if self._adopted:
            stream = self._adopted[0]
            result = self._send_from(stream, None, recovered=True)
            if result is None:  # that log is delivered
                stream.remove()
                self._adopted.pop(0)
                return False, False
            return result, not result
        mine = self._stream
        end = self._write_end()
        if mine is None or end is None or self._pending <= 0:
            return False, False
        result = self._send_from(mine, end, recovered=False)
        if result is None:
            with self._cond:
                self._pending = sum(len(lines) for lines, _ in self._overflow)
                self._oldest_unsent = None if not self._pending else self._oldest_unsent
            return False, False
        return result, not result

    def _send_from(self, stream: _Stream, end: tuple[int, int] | None,
                   recovered: bool) -> bool | None:
        """Send one request from ``stream``; None when it has nothing left, else success."""
        hot = None if recovered else self._take_hot(stream.cursor, end)
        if hot is not None:
            spans, after, size = hot
            lines = [b""] * len(spans)  # only their number counts below
        else:
            lines, after = stream.read(stream.cursor, end,
                                       self.max_request_bytes - _REQUEST_OVERHEAD, self._limit)
            if not lines:
                return None
            spans = _decode(lines)
            size = sum(len(line) for line in lines)
        ok = True
        if spans:
            with self._send_lock:
                ok = call_export(self.inner, spans)
        self._backend_up = ok
        if ok:
            self._count(delivered=len(spans), requests=1, request_bytes=size)
            if recovered:
                self._count(recovered=len(spans))
            with self._cond:
                stream.save_cursor(max(after, stream.cursor))
                if not recovered:
                    self._pending -= len(lines)
                    self._oldest_unsent = time.monotonic() if self._pending > 0 else None
            self._limit = min(self.max_batch_spans, self._limit * 2)
            if self._warned_outage:
                self._warned_outage = False
                _log.warning("otel_verl: the backend accepts spans again; delivering the log")
            return True
        self._count(retries=1)
        if hot is not None:
            lines, _ = stream.read(stream.cursor, end, self.max_request_bytes - _REQUEST_OVERHEAD,
                                   len(spans))
        if not self._warned_outage:
            self._warned_outage = True
            _log.warning("otel_verl: the backend did not accept %d span(s); they wait in %s and "
                         "are retried (replay by hand: `otel-verl traces replay %s`)",
                         len(spans), self.directory, self.directory)
        if len(lines) > 1:
            self._limit = max(1, len(lines) // 2)  # find a span the backend refuses, if any
            return False
        if lines:
            self._probe(stream, end, lines[0], after, recovered)
        return False

    def _take_hot(self, cursor: tuple[int, int], end: tuple[int, int] | None
                  ) -> tuple[list[ReadableSpan], tuple[int, int], int] | None:
        """The next request from memory when the cursor is where the remembered spans start."""
        limit = self.max_request_bytes - _REQUEST_OVERHEAD
        with self._write_lock:
            hot = self._hot
            while hot and (hot[0][0], hot[0][1]) < cursor:
                self._hot_bytes -= hot.popleft()[2]
            if not hot or (hot[0][0], hot[0][1]) != cursor:
                return None
            spans: list[ReadableSpan] = []
            size = 0
            seq, offset = cursor
            for entry_seq, entry_offset, nbytes, span in hot:
                if len(spans) >= self._limit or (spans and size + nbytes > limit):
                    break
                if (entry_seq, entry_offset) != (seq, offset) or (
                        end is not None and (entry_seq, entry_offset + nbytes) > end):
                    break
                spans.append(span)
                size += nbytes
                seq, offset = entry_seq, entry_offset + nbytes
            if not spans:
                return None
        return spans, (seq, offset), size

    def _probe(self, stream: _Stream, end: tuple[int, int] | None, line: bytes,
               after: tuple[int, int], recovered: bool) -> None:
        """One span fails alone: if the next one goes through, the backend is up and refuses
        this one; after a few such strikes it is quarantined (kept on disk, not retried)."""
        nxt, _ = stream.read(after, end, self.max_request_bytes, 1)
        if not nxt:
            return
        spans = _decode(nxt)
        with self._send_lock:
            if not spans or not call_export(self.inner, spans):
                return  # an outage, not a bad span
        key = (stream.name, stream.cursor)
        self._strikes[key] = strikes = self._strikes.get(key, 0) + 1
        if strikes < _STRIKES_TO_QUARANTINE:
            return
        del self._strikes[key]
        quarantine = self.directory / "quarantine"
        try:
            quarantine.mkdir(exist_ok=True)
            with open(quarantine / f"{stream.name}.jsonl", "ab") as handle:
                handle.write(line)
        except OSError:
            pass
        self._count(quarantined=1)
        _log.warning("otel_verl: the backend refuses one span while accepting others; it is "
                     "kept in %s and not retried", quarantine)
        with self._cond:
            stream.save_cursor(after)
            if not recovered:
                self._pending -= 1

    # -- lifecycle --------------------------------------------------------------------------------
    def nudge(self) -> None:
        """Deliver what this process wrote now instead of after ``export_delay_s`` (no waiting)."""
        with self._cond:
            if self._pending > 0:
                self._urgent = True
                self._cond.notify_all()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait until what was written so far is delivered (False on timeout or an outage)."""
        if self._closed:
            return self._pending <= 0
        event = threading.Event()
        with self._cond:
            if self._pending <= 0 and not self._adopted:
                return True
            self._flush_waiters.append(event)
            self._cond.notify_all()
        return event.wait(timeout_seconds(timeout_millis)) and self._pending <= 0

    def shutdown(self, timeout_millis: float | None = None) -> None:
        """Try to deliver what is left (bounded), then stop; what is left stays in the log."""
        if self._closed:
            return
        timeout_s = self.shutdown_timeout_s if timeout_millis is None else min(
            self.shutdown_timeout_s, timeout_seconds(timeout_millis))
        with self._cond:
            self._stopping = True
            self._deadline = time.monotonic() + timeout_s
            self._cond.notify_all()
        self._thread.join(timeout_s + 0.5)
        with self._cond:
            self._deadline = 0.0  # a sender still inside a hung export stops after it
            self._cond.notify_all()
        self._closed = True
        with self._write_lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
        left = max(0, self._pending)
        if self._stream is not None and left == 0 and not self._thread.is_alive():
            self._stream.remove()
        elif self._stream is not None:  # the log is no longer served here: let others adopt it
            self._stream.remove_lock_only()
        for stream in self._adopted:
            stream.remove_lock_only()
        if left:
            _log.warning("otel_verl: %d span(s) not yet delivered are kept in %s; the next process "
                         "with this trace dir and backend delivers them, or run `otel-verl traces "
                         "replay %s`", left, self.directory, self.directory)
        try:
            with suppressed_instrumentation():
                self.inner.shutdown()
        except Exception as exc:  # noqa: BLE001
            _errors.internal_error(exc, "exporter.shutdown raised")

    def stats(self) -> dict[str, int]:
        counts = dict(self._counts)
        counts["spool_pending"] = max(0, self._pending)
        counts["spool_held_bytes"] = self._overflow_bytes
        stream = self._stream
        counts["spool_bytes"] = stream.size() if stream is not None else 0
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

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for key, value in deltas.items():
                self._counts[key] = self._counts.get(key, 0) + value


def timeout_seconds(timeout_millis: float) -> float:
    """A timeout in seconds that threading accepts (inf, nan and negatives included)."""
    try:
        seconds = float(timeout_millis) / 1000.0
    except (TypeError, ValueError):
        return 30.0
    if math.isnan(seconds) or seconds < 0:
        return 0.0
    return min(seconds, threading.TIMEOUT_MAX)


def _size(fd: int, default: int) -> int:
    try:
        return os.fstat(fd).st_size
    except OSError:
        return default + 1  # unknown: assume a partial write


def _write(fd: int, data: memoryview) -> int:
    """``os.write`` (a seam for the full-disk tests)."""
    return os.write(fd, data)


def _count_lines(path: Path, offset: int) -> int:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
    except OSError:
        return 0


def _decode(lines: list[bytes]) -> list[ReadableSpan]:
    spans = []
    for line in lines:
        try:
            for span in _otlp_json.iter_spans(_otlp_json.decode_line(line)):
                spans.append(_otlp_json.readable_span(span))
        except (ValueError, TypeError, KeyError) as error:
            _log.debug("otel_verl: skipped a bad log line: %r", error)
    return spans


def _reinit_after_fork() -> None:
    for exporter in list(_LIVE):
        if not exporter._closed:
            exporter._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_after_fork)


# --- replay by hand ---------------------------------------------------------------------------------


def replay(spool_dir: str | os.PathLike[str], exporter: SpanExporter, *, batch_size: int = 512,
           max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, remove: bool = False,
           progress: Callable[[int], None] | None = None) -> tuple[int, int]:
    """Send what a log (or any local-store directory/file) holds through ``exporter``.

    Logs of live processes are left alone (their process delivers them). A log is replayed from
    its delivery cursor, in requests of at most ``batch_size`` spans and ``max_request_bytes``,
    and the cursor moves as requests are accepted, so a replay that stops half-way resumes where
    it stopped. Other store files are replayed whole, split the same way.

    Args:
        spool_dir: a log directory, a local-store directory, or one file.
        exporter: where to send (an OTLP exporter, the Weave exporter, ...).
        batch_size: spans per request at most.
        max_request_bytes: request size bound (OTLP/JSON bytes of its spans).
        remove: delete a log (or file) once all of it was accepted.
        progress: called with the number of spans sent after each request.

    Returns:
        (spans sent, spans that failed).
    """
    path = Path(spool_dir)
    sent = failed = 0
    limit = max(4096, max_request_bytes) - _REQUEST_OVERHEAD
    if path.is_dir():
        for stream in adopt_streams(path):
            ok = True
            while ok:
                lines, after = stream.read(stream.cursor, None, limit, batch_size)
                if not lines:
                    break
                spans = _decode(lines)
                ok = call_export(exporter, spans) if spans else True
                if ok:
                    sent += len(spans)
                    stream.save_cursor(after)
                    if progress is not None:
                        progress(len(spans))
                else:
                    failed += stream.pending_lines()
            if ok and remove:
                stream.remove()
            elif stream.lock_fd is not None:
                os.close(stream.lock_fd)
                stream.lock_fd = None
        files = [p for p in sorted(path.rglob("*.jsonl")) + sorted(path.rglob("*.json"))
                 if not _SEGMENT.match(p.name) and "quarantine" not in p.parts]
    else:
        files = [path]
    for file in files:
        file_sent, file_failed = _replay_file(file, exporter, batch_size, limit, progress)
        sent += file_sent
        failed += file_failed
        if remove and file_failed == 0:
            with contextlib.suppress(OSError):
                file.unlink()
    return sent, failed


def _replay_file(path: Path, exporter: SpanExporter, batch_size: int, limit: int,
                 progress: Callable[[int], None] | None) -> tuple[int, int]:
    from otel_verl.store import read_spans

    sent = failed = 0
    batch: list[ReadableSpan] = []
    size = 0

    def send() -> None:
        nonlocal sent, failed, batch, size
        if batch:
            if call_export(exporter, batch):
                sent += len(batch)
                if progress is not None:
                    progress(len(batch))
            else:
                failed += len(batch)
        batch, size = [], 0

    for record in read_spans(path):
        try:
            span, line, _ = fit_span(_otlp_json.readable_span(record), limit)
        except Exception as exc:  # noqa: BLE001
            _errors.internal_error(exc, "replay: a span could not be rebuilt")
            failed += 1
            continue
        if batch and (size + len(line) > limit or len(batch) >= batch_size):
            send()
        batch.append(span)
        size += len(line)
    send()
    return sent, failed


#: the exporter before durable delivery, kept for code that imports it by name
SpoolingSpanExporter = DurableSpanExporter
