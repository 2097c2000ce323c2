"""The durable log's storage: segments on disk, a delivery cursor, a byte budget, the logs that
dead processes left (orphans), and ``damaged/`` and ``quarantine/`` beside them.

Layout of a log directory (one per backend)::

    wal-<host>-<pid>-<time>-<rand>-<seq>.jsonl   segments: one record (OTLP/JSON line) per span
    wal-...-<rand>.cursor                        "<seq> <offset>": what the backend accepted
    wal-...-<rand>.lock                          flock held while the writing process lives
    wal-...-<rand>.meta                          {"format": 2, "backend": <identity>}
    damaged/<stream>.damaged                     records that failed their checksum or decoding
    quarantine/<stream>.jsonl                    spans the backend refused for good

:class:`SpanLog` is the storage (``append``, ``read``, ``commit``, ``enforce_budget``,
``adopt``/``retire`` for orphans, ``quarantine``); :class:`Stream` is one writer's log on disk.
Nothing here sends: the sender (``_sender``) decides what to send and when.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import hashlib
import logging
import os
import re
import secrets
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter

from otel_verl import _errors
from otel_verl.exporters._io import TornWrite, write_whole
from otel_verl.exporters._records import decode_line, fit_span, seal, unseal
from otel_verl.exporters._stream import (
    Cursor,
    LogReadError,
    Stream,
    adopt_streams,
    count_lines,
    keep_damaged,
    try_lock,
)

_logger = logging.getLogger("otel_verl")

DEFAULT_MAX_REQUEST_BYTES = 3 * 1024 * 1024  # below the Collector's 4 MiB gRPC default
DEFAULT_MAX_SPOOL_BYTES = 1024 * 1024 * 1024
REQUEST_OVERHEAD = 1024  # what a request adds around its spans (grouping, framing)


@dataclasses.dataclass(frozen=True)
class LogSettings:
    """The durable log's options (see :class:`otel_verl.exporters.DurableSpanExporter`)."""

    max_spool_bytes: int
    max_request_bytes: int
    max_batch_spans: int
    export_delay_s: float
    retry_initial_s: float
    retry_max_s: float
    shutdown_timeout_s: float
    max_overflow_bytes: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_request_bytes", max(4096, self.max_request_bytes))
        object.__setattr__(self, "max_batch_spans", max(1, self.max_batch_spans))

    @property
    def max_span_bytes(self) -> int:
        """A record's size bound: a request of one span fits ``max_request_bytes``."""
        return self.max_request_bytes - REQUEST_OVERHEAD

    @property
    def segment_bytes(self) -> int:
        """A segment is closed (and a new one begun) from this size on."""
        return max(64 * 1024, min(16 * 1024 * 1024, self.max_spool_bytes // 8))


class Counts:
    """The log's and the sender's counters (``stats()`` keys), shared by both, thread-safe."""

    KEYS = ("spooled", "spool_failed", "delivered", "requests", "request_bytes", "retries",
            "truncated", "quarantined", "dropped_spool_full", "recovered", "spooled_unredacted",
            "log_damaged", "log_read_errors", "log_cursor_resets")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(self.KEYS, 0)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for key, value in deltas.items():
                self._counts[key] = self._counts.get(key, 0) + value

    def __getitem__(self, key: str) -> int:
        return self._counts.get(key, 0)

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)

    def reset_after_fork(self) -> None:
        """Zero every counter (a child counts its own); a new lock (the parent's may be held)."""
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self._counts, 0)


class Redactor:
    """Redaction for records written before it (flag ``u``): ``transform``, else the default
    scrubber. A span it raises on is dropped (``dropped_transform_failed``), never sent."""

    def __init__(self, transform: Callable[[ReadableSpan], ReadableSpan] | None,
                 counts: Counts) -> None:
        self.transform = transform
        self._counts = counts
        self._default: Callable[[ReadableSpan], ReadableSpan] | None = None

    def __call__(self, spans: Sequence[ReadableSpan],
                 transform: Callable[[ReadableSpan], ReadableSpan] | None = None
                 ) -> list[ReadableSpan]:
        if transform is None:
            transform = self.transform
        if transform is None:
            if self._default is None:
                from otel_verl.exporters._scrub import Scrubber

                self._default = Scrubber(())
            transform = self._default
        out = []
        for span in spans:
            try:
                out.append(transform(span))
            except Exception as exc:  # noqa: BLE001  # never send what could not be redacted
                self._counts.add(dropped_transform_failed=1)
                _errors.internal_error(exc, "span transform raised on a logged span; dropped")
        return out


# --- naming a log's folder --------------------------------------------------------------------------


def _readable_endpoint(endpoint: str) -> str:
    """Scheme, host and port of an endpoint: never its user info, path, query or fragment."""
    text = endpoint.strip()
    if "://" not in text:
        text = "//" + text
    try:
        parts = urllib.parse.urlsplit(text)
        host = parts.hostname or ""
        port = f"_{parts.port}" if parts.port else ""
    except ValueError:
        return ""
    return f"{parts.scheme}_{host}{port}" if parts.scheme else f"{host}{port}"


def _has_credentials(endpoint: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(endpoint if "://" in endpoint else "//" + endpoint)
    except ValueError:
        return True
    return bool("@" in parts.netloc or parts.query or parts.fragment or "sk-" in endpoint
                or "key" in endpoint.lower() or "token" in endpoint.lower())


def backend_identity(kind: str, endpoint: str = "") -> str:
    """A hash of the whole backend key (credentials included: two keys differing only there are
    two backends), safe to write down: 16 hex digits; where the endpoint holds user info, a
    query or a fragment, a slow hash (PBKDF2), so the name is no cheap test of a guessed
    password."""
    whole = f"{kind}\0{endpoint}".encode("utf-8", "surrogatepass")
    if endpoint and _has_credentials(endpoint):
        return hashlib.pbkdf2_hmac("sha256", whole, b"otel_verl-log-dir", 50_000).hex()[:16]
    return hashlib.sha256(whole).hexdigest()[:16]


def log_dir_name(kind: str, endpoint: str = "") -> str:
    """The folder name of one backend's log: a readable prefix (the kind and the endpoint's
    scheme, host and port; no credentials) beside the backend's identity (a hash of all of it),
    so two backends never share a folder however long their keys."""
    readable = f"{kind}-{_readable_endpoint(endpoint)}" if endpoint else kind
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", readable).strip("_.-")[:80] or "backend"
    return f"{readable}-{backend_identity(kind, endpoint)}"


def default_identity(inner: SpanExporter) -> str:
    """The backend of an exporter nobody named: its class and (OTLP exporters) endpoint."""
    endpoint = getattr(inner, "_endpoint", "")
    kind = f"{type(inner).__module__}.{type(inner).__qualname__}"
    return backend_identity(kind, endpoint if isinstance(endpoint, str) else "")


# --- the storage ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Batch:
    """What one ``read`` took from a stream: its spans and where the cursor goes once they are
    accepted. ``lines`` are the records as stored (empty where the spans came from memory)."""

    stream: Stream
    spans: list[ReadableSpan]
    lines: list[bytes]
    after: Cursor
    count: int  # records covered (a damaged one is covered but has no span)
    size: int  # their bytes
    end: Cursor | None  # the read's bound (this process's log: where the writer is)
    #: with ``read(stored=True)``: the records' OTLP/JSON lines, to send as they are (``spans``
    #: empty); None where a record is damaged or not yet redacted (then ``spans`` are decoded)
    bodies: list[bytes] | None = None


class _Recent:
    """The spans just appended to this process's log, by position, bounded in bytes: the sender
    sends them from memory instead of reading and decoding them back (guarded by the log's
    write lock)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: collections.deque[tuple[int, int, int, ReadableSpan]] = \
            collections.deque()
        self._bytes = 0

    def remember(self, seq: int, offset: int, lines: list[bytes],
                 spans: list[ReadableSpan]) -> None:
        for line, span in zip(lines, spans, strict=True):
            self._entries.append((seq, offset, len(line), span))
            offset += len(line)
            self._bytes += len(line)
        while self._bytes > self.max_bytes and self._entries:
            self._bytes -= self._entries.popleft()[2]

    def take(self, cursor: Cursor, end: Cursor | None, max_bytes: int, max_spans: int
             ) -> tuple[list[ReadableSpan], Cursor, int] | None:
        """The spans from ``cursor`` on (contiguous, within the limits), or None when the cursor
        is not where the remembered spans start."""
        entries = self._entries
        while entries and (entries[0][0], entries[0][1]) < cursor:
            self._bytes -= entries.popleft()[2]
        if not entries or (entries[0][0], entries[0][1]) != cursor:
            return None
        spans: list[ReadableSpan] = []
        size = 0
        seq, offset = cursor
        for entry_seq, entry_offset, nbytes, span in entries:
            if len(spans) >= max_spans or (spans and size + nbytes > max_bytes):
                break
            if (entry_seq, entry_offset) != (seq, offset) or (
                    end is not None and (entry_seq, entry_offset + nbytes) > end):
                break
            spans.append(span)
            size += nbytes
            seq, offset = entry_seq, entry_offset + nbytes
        return (spans, (seq, offset), size) if spans else None


class _Writer:
    """This process's own stream, written (appended to whole) under one lock; created on the
    first append. Remembers what it wrote (``recent``) for the sender."""

    def __init__(self, directory: Path, backend_id: str, settings: LogSettings) -> None:
        self.directory = directory
        self.backend_id = backend_id
        self.settings = settings
        self.stream: Stream | None = None
        self.lock = threading.Lock()  # the fields below
        self.recent = _Recent(4 * settings.max_request_bytes)
        self._fd: int | None = None
        self._seq = 0
        self._seg_size = 0

    def append(self, lines: list[bytes], spans: list[ReadableSpan] | None) -> None:
        data = b"".join(lines)
        with self.lock:
            if self.stream is None:
                self.stream = self._open_stream()
                self._seq = max(self.stream.segments(), default=0)
                self.stream.cursor = (self._seq + 1, 0)  # where its first record goes
            if self._fd is None or self._seg_size >= self.settings.segment_bytes:
                self._open_segment(self.stream)
            assert self._fd is not None
            try:
                write_whole(self._fd, data, self._seg_size)
            except TornWrite:  # the torn line stays; the next segment starts clean
                self._seg_size = self.settings.segment_bytes
                raise
            if spans is not None:
                self.recent.remember(self._seq, self._seg_size, lines, spans)
            self._seg_size += len(data)

    def _open_stream(self) -> Stream:
        self.directory.mkdir(parents=True, exist_ok=True)
        host = re.sub(r"[^A-Za-z0-9._]+", "_", socket.gethostname()) or "host"
        name = f"wal-{host}-{os.getpid()}-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        fd = try_lock(self.directory / f"{name}.lock")
        if fd is None:
            raise OSError(errno.EAGAIN, f"cannot lock {name}.lock")
        stream = Stream(self.directory, name, fd)
        stream.limit = self.settings.max_batch_spans
        stream.write_meta(self.backend_id)
        return stream

    def _open_segment(self, stream: Stream) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._seq += 1
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        self._fd = os.open(stream.segment(self._seq), flags, 0o644)
        self._seg_size = os.fstat(self._fd).st_size

    def end(self) -> Cursor | None:
        with self.lock:
            return (self._seq, self._seg_size) if self.stream is not None else None

    def close(self, in_child: bool = False) -> None:
        """Close the segment (``in_child``: a forked child's copy; also the parent's lock fd)."""
        fds = [self._fd, self.stream.lock_fd if in_child and self.stream else None]
        self._fd = None
        for fd in fds:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)


class Orphans:
    """The streams dead processes left in the directory for this backend, while they are
    delivered (their flocks are held here); ``streams`` in the order they were found."""

    def __init__(self, directory: Path, backend_id: str, settings: LogSettings,
                 counts: Counts) -> None:
        self.directory = directory
        self.backend_id = backend_id
        self.settings = settings
        self.counts = counts
        self.streams: list[Stream] = []
        self._warned_foreign: set[str] = set()

    def adopt(self, own: Stream | None) -> None:
        """Take the streams whose writer is gone (not ``own``, not another backend's)."""
        if not self.directory.is_dir():
            return
        known = {s.name for s in self.streams}
        foreign: list[str] = []
        for stream in adopt_streams(self.directory, exclude=own.name if own else None,
                                    backend=self.backend_id, foreign=foreign):
            if stream.name in known:
                stream.remove_lock_only()
                continue
            stream.limit = self.settings.max_batch_spans
            if stream.cursor_damage:
                self.counts.add(log_cursor_resets=1)
                _logger.warning("otel_verl: the delivery cursor of %s in %s is damaged (%s); its "
                                "log is delivered from the start of the segment (spans may "
                                "arrive twice)", stream.name, self.directory,
                                stream.cursor_damage)
            pending = stream.pending_lines()
            if pending:
                _logger.warning("otel_verl: delivering %d span(s) left in %s by an earlier "
                                "process", pending, self.directory)
            self.streams.append(stream)
        new = sorted(set(foreign) - self._warned_foreign)
        if new:
            self._warned_foreign.update(new)
            _logger.warning("otel_verl: %d log(s) in %s were written for another backend; they "
                            "are left for it (or `otel-verl traces replay %s`)", len(new),
                            self.directory, self.directory)

    def retire(self, stream: Stream) -> None:
        """``stream`` has nothing left to read: delete it (all of it was read), or keep it on
        disk and let it go (it could not be read to its end)."""
        self.streams.remove(stream)
        if stream.fully_read():
            stream.remove()
            return
        stream.remove_lock_only()
        _logger.warning("otel_verl: the log %s in %s could not be read to its end; it is kept",
                        stream.name, self.directory)

    def release(self) -> None:
        """Let every stream go (their locks; in a forked child: the parent's fds)."""
        for stream in self.streams:
            stream.remove_lock_only()


class SpanLog:
    """A directory's durable log: this process's own stream (written here) and the streams that
    dead processes left for the same backend (``orphans``). Thread-safe: the processor's thread
    appends, the sender reads, commits and adopts.

    Args:
        directory: the log's directory (one per backend).
        backend_id: recorded beside this process's stream; only streams of this backend (or of
            none recorded) are adopted.
        settings: sizes and bounds.
        counts: where ``spooled``, ``truncated``, ``log_*``, ``quarantined``, ... are counted.
        redact: applied to records written before redaction, when they are read back.
    """

    def __init__(self, directory: Path, backend_id: str, settings: LogSettings, counts: Counts,
                 redact: Redactor) -> None:
        self.directory = directory
        self.settings = settings
        self.counts = counts
        self.redact = redact
        self.orphans = Orphans(directory, backend_id, settings, counts)
        self._writer = _Writer(directory, backend_id, settings)
        self._cursor_lock = threading.Lock()  # cursor moves: commits and the budget
        self._last_warning = {"damage": 0.0, "budget": 0.0}

    @property
    def stream(self) -> Stream | None:
        """This process's own stream (None until the first append)."""
        return self._writer.stream

    # -- writing ----------------------------------------------------------------------------------
    def records(self, spans: Sequence[ReadableSpan], *, raw: bool
                ) -> tuple[list[bytes], list[ReadableSpan]]:
        """Each span fitted to ``max_span_bytes`` and sealed as a record (``raw``: flagged as not
        yet redacted); a span that cannot be encoded is counted (``spool_failed``)."""
        lines, fitted = [], []
        truncated = 0
        for span in spans:
            try:
                span, line, cut = fit_span(span, self.settings.max_span_bytes)
            except Exception as exc:  # noqa: BLE001
                _errors.internal_error(exc, "encoding a span for the log")
                self.counts.add(spool_failed=1)
                continue
            truncated += cut
            lines.append(seal(line, raw=raw))
            fitted.append(span)
        self.counts.add(truncated=truncated)
        return lines, fitted

    def append(self, lines: list[bytes], spans: list[ReadableSpan] | None = None) -> None:
        """Append records to this process's stream, whole (``spans``: remember them, so the
        sender need not read them back).

        Raises:
            OSError: they could not be written (a full disk); none of them is in the log.
        """
        self._writer.append(lines, spans)

    def enforce_budget(self) -> int:
        """Drop the oldest segments while the log is over ``max_spool_bytes`` (counted,
        ``dropped_spool_full``). Returns how many undelivered records went."""
        stream = self.stream
        if stream is None:
            return 0
        segments = stream.segments()
        total = stream.size()
        dropped = 0
        while total > self.settings.max_spool_bytes and len(segments) > 1:
            oldest = segments.pop(0)
            with contextlib.suppress(OSError):
                total -= stream.segment(oldest).stat().st_size
            with self._cursor_lock:
                if stream.cursor[0] > oldest:
                    continue
                lost = count_lines(stream.segment(oldest),
                                   stream.cursor[1] if stream.cursor[0] == oldest else 0)
                stream.save_cursor((segments[0], 0))
            dropped += lost
            self.counts.add(dropped_spool_full=lost)
            if self._due("budget"):
                _logger.warning("otel_verl: the log in %s is over its %d-byte budget; dropping "
                                "the oldest spans (%d so far)", self.directory,
                                self.settings.max_spool_bytes, self.counts["dropped_spool_full"])
        return dropped

    # -- reading ----------------------------------------------------------------------------------
    def read(self, stream: Stream, stored: bool = False) -> Batch | None:
        """The next request's worth of ``stream`` from its cursor (``count`` 0: nothing left),
        or None when it cannot be read now (counted, ``log_read_errors``; tried again later).

        With ``stored``, the records are read from disk (not from memory) and, when each is
        intact and redacted, handed over as ``bodies`` undecoded (to send as stored bytes)."""
        end = self._writer.end() if stream is self.stream else None
        if stream is self.stream and not stored:
            with self._writer.lock:
                recent = self._writer.recent.take(stream.cursor, end,
                                                  self.settings.max_span_bytes, stream.limit)
            if recent is not None:
                spans, after, size = recent
                return Batch(stream, spans, [], after, len(spans), size, end)
        try:
            lines, after = stream.read(stream.cursor, end, self.settings.max_span_bytes,
                                       stream.limit)
            bodies = self._bodies(stream, lines) if stored and lines else None
            spans = self.decode(stream, lines) if lines and bodies is None else []
        except LogReadError as error:
            stream.read_errors += 1
            self.counts.add(log_read_errors=1)
            delay = min(60.0, max(0.05, self.settings.retry_initial_s)
                        * 2 ** min(stream.read_errors - 1, 10))
            stream.retry_at = time.monotonic() + delay
            if stream.read_errors in (1, 10) or stream.read_errors % 100 == 0:
                _logger.warning("otel_verl: %s (attempt %d); the log is kept and read again in "
                                "%.1f s, the other logs are delivered meanwhile", error,
                                stream.read_errors, delay)
            return None
        if stream.read_errors and lines:
            _logger.warning("otel_verl: the log %s reads again after %d failed attempt(s)",
                            stream.name, stream.read_errors)
            stream.read_errors = 0
        return Batch(stream, spans, lines, after, len(lines), sum(map(len, lines)), end, bodies)

    @staticmethod
    def _bodies(stream: Stream, lines: list[bytes]) -> list[bytes] | None:
        """The OTLP/JSON lines of ``lines`` when every record is intact and redacted."""
        bodies = []
        for line in lines:
            body, raw = unseal(line, stream.sealed)
            if body is None or raw:
                return None
            bodies.append(body)
        return bodies

    def stored_lines(self, batch: Batch) -> list[bytes]:
        """The records of ``batch`` as stored (read back where it came from memory)."""
        if batch.lines or not batch.spans:
            return batch.lines
        stream = batch.stream
        try:
            return stream.read(stream.cursor, batch.end, self.settings.max_span_bytes,
                               len(batch.spans))[0]
        except LogReadError:
            return []

    def peek(self, batch: Batch) -> list[ReadableSpan]:
        """The spans of the record after ``batch`` (damage is not kept aside here)."""
        stream = batch.stream
        try:
            lines, _ = stream.read(batch.after, batch.end, self.settings.max_span_bytes, 1)
            return self.decode(stream, lines, keep=False) if lines else []
        except LogReadError:
            return []

    def decode(self, stream: Stream, lines: list[bytes], keep: bool = True
               ) -> list[ReadableSpan]:
        """The spans of ``lines`` (records not yet redacted are redacted here); a damaged record
        is kept aside in ``damaged/`` (with ``keep``), counted and reported, never sent.

        Raises:
            LogReadError: a damaged record could not be kept aside (the log stays as it is).
        """
        spans: list[ReadableSpan] = []
        for line in lines:
            body, raw = unseal(line, stream.sealed)
            decoded = decode_line(body) if body is not None else None
            if decoded is None:
                if keep:
                    path = keep_damaged(self.directory, stream.name, line)
                    self.counts.add(log_damaged=1)
                    if self._due("damage"):
                        _logger.warning(
                            "otel_verl: a damaged record in the log %s (a checksum that does "
                            "not match, or not OTLP/JSON) is kept in %s and not sent (%d so far)",
                            stream.name, path, self.counts["log_damaged"])
                continue
            spans.extend(self.redact(decoded) if raw else decoded)
        return spans

    # -- moving the cursor ------------------------------------------------------------------------
    def commit(self, stream: Stream, cursor: Cursor) -> None:
        """The backend took what lies before ``cursor``: save it (never moving back), and
        delete the segments wholly before it."""
        with self._cursor_lock:
            stream.save_cursor(max(cursor, stream.cursor))

    def quarantine(self, stream: Stream, line: bytes, after: Cursor) -> bool:
        """Move a record the backend refuses for good to ``quarantine/`` (kept, not retried) and
        the cursor past it; False (nothing moves) when it cannot be written there."""
        where = self.directory / "quarantine"
        try:
            where.mkdir(exist_ok=True)
            with open(where / f"{stream.name}.jsonl", "ab") as handle:
                handle.write(line if line.endswith(b"\n") else line + b"\n")
        except OSError as error:
            _logger.warning("otel_verl: cannot quarantine a refused span in %s (%r); it stays in "
                            "the log and is retried", where, error)
            return False
        self.counts.add(quarantined=1)
        _logger.warning("otel_verl: the backend refuses one span while accepting others; it is "
                        "kept in %s and not retried", where)
        self.commit(stream, after)
        return True

    # -- lifecycle --------------------------------------------------------------------------------
    def size(self) -> int:
        """Bytes of this process's stream on disk."""
        stream = self.stream
        return stream.size() if stream is not None else 0

    def close(self, keep: bool) -> None:
        """Stop writing; delete this process's stream (all of it delivered) or, with ``keep``,
        leave it on disk for the next process; let the adopted streams go."""
        with self._writer.lock:
            self._writer.close()
        if self.stream is not None and not keep:
            self.stream.remove()
        elif self.stream is not None:  # no longer served here: let others adopt it
            self.stream.remove_lock_only()
        self.orphans.release()

    def forget_parent(self) -> None:
        """In a forked child: close the parent's descriptors (its flocks stay the parent's)."""
        self._writer.close(in_child=True)
        for stream in self.orphans.streams:
            if stream.lock_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(stream.lock_fd)

    def _due(self, what: str) -> bool:
        """A rate-limited warning about ``what`` may be logged now (one per 20 s)."""
        now = time.monotonic()
        if now - self._last_warning[what] <= 20.0:
            return False
        self._last_warning[what] = now
        return True
