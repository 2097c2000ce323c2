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
import hashlib
import json
import logging
import math
import os
import re
import secrets
import socket
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_verl import _errors, _otlp_json
from otel_verl._fork import LiveInstances
from otel_verl.exporters._io import TornWrite, write_whole
from otel_verl.exporters._spans import (
    call_export,
    copy_span,
    suppressed_instrumentation,
    timeout_seconds,
)

_log = logging.getLogger("otel_verl")

#: the attribute set on a span that was cut to fit ``max_request_bytes``
TRUNCATED_ATTRIBUTE = "otel_verl.truncated"
DEFAULT_MAX_REQUEST_BYTES = 3 * 1024 * 1024  # below the Collector's 4 MiB gRPC default
DEFAULT_MAX_SPOOL_BYTES = 1024 * 1024 * 1024
_REQUEST_OVERHEAD = 1024  # what a request adds around its spans (grouping, framing)
_SEGMENT = re.compile(r"^(?P<stream>wal-.+)-(?P<seq>\d{8})\.jsonl$")
_STRIKES_TO_QUARANTINE = 3
# what one attempt to send from a log came to
_EMPTY, _SENT, _FAILED, _BLOCKED = "empty", "sent", "failed", "blocked"


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
        span = copy_span(span, attributes=attributes, events=events)
        line = _otlp_json.encode_span_line(span)
    return span, line, True


# --- the record format ------------------------------------------------------------------------------
#
# Format 1 (before checksums): a record is one OTLP/JSON line, ``{"resourceSpans":[...]}\n``.
# Format 2: the same line with a trailer inside its top-level object (so it stays a valid store
# line that `otel-verl traces` and JSON readers read), ``...,"otelVerlLog":"2 <crc32> <flag>"}\n``:
# the CRC-32 of the bytes before the trailer plus the flag; the flag is ``r`` (ready to send) or
# ``u`` (not yet redacted: the reader applies the transform before sending). A stream records
# its format and its backend in ``<stream>.meta``; in a format-2 stream a line without a valid
# trailer is damage. Format-1 lines are still read (JSON validity is their only check).

_TRAILER_HEAD = b',"otelVerlLog":"'
_TRAILER_LEN = len(_TRAILER_HEAD) + len(b'2 00000000 r"}\n')
_TRAILER = re.compile(rb'2 (?P<crc>[0-9a-f]{8}) (?P<flag>[ru])"\}\n')
RECORD_FORMAT = 2


def seal(line: bytes, raw: bool = False) -> bytes:
    """A format-2 record from one OTLP/JSON line (``{...}\\n``): checksummed, flagged."""
    body = line[:-2] if line.endswith(b"}\n") else line.rstrip(b"\n")[:-1]
    flag = b"u" if raw else b"r"
    return b"%s%s2 %08x %s\"}\n" % (body, _TRAILER_HEAD, zlib.crc32(body + flag), flag)


def unseal(record: bytes, sealed_stream: bool) -> tuple[bytes | None, bool]:
    """(the OTLP/JSON line, whether it still needs redaction), or (None, False) when damaged.

    A record without a trailer is a format-1 line: returned as it is, unless the stream is
    format 2 (then it is damage). A trailer whose checksum does not match is damage."""
    if len(record) > _TRAILER_LEN and record[-_TRAILER_LEN:-_TRAILER_LEN + len(_TRAILER_HEAD)] \
            == _TRAILER_HEAD:
        match = _TRAILER.fullmatch(record, len(record) - _TRAILER_LEN + len(_TRAILER_HEAD))
        body = record[:-_TRAILER_LEN]
        if match is None or zlib.crc32(body + match["flag"]) != int(match["crc"], 16):
            return None, False
        return body + b"}\n", match["flag"] == b"u"
    if sealed_stream or not record.endswith(b"\n"):
        return None, False
    return record, False


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


def _default_identity(inner: SpanExporter) -> str:
    """The backend of an exporter nobody named: its class and (OTLP exporters) endpoint."""
    endpoint = getattr(inner, "_endpoint", "")
    kind = f"{type(inner).__module__}.{type(inner).__qualname__}"
    return backend_identity(kind, endpoint if isinstance(endpoint, str) else "")


# --- one process's log ------------------------------------------------------------------------------


class LogReadError(OSError):
    """A segment of a log could not be read (the log is kept and retried, never removed)."""

    def __init__(self, path: Path, error: OSError) -> None:
        super().__init__(error.errno, f"cannot read {path}: {error.strerror or error}")
        self.path = path
        self.error = error


class _Stream:
    """One writer's log: segments ``<name>-<seq>.jsonl``, a cursor file, a lock file and a meta
    file (``{"format": 2, "backend": <identity>}``; absent in format-1 logs)."""

    def __init__(self, directory: Path, name: str, lock_fd: int | None) -> None:
        self.dir = directory
        self.name = name
        self.lock_fd = lock_fd
        self.limit = 1 << 30  # spans per request; halved while a refused span is looked for
        self.retry_at = 0.0  # after a read error: when to try again
        self.read_errors = 0
        self.cursor_damage: str | None = None  # why the saved cursor was not used
        meta = self._read_meta()
        self.sealed = meta.get("format", 1) >= RECORD_FORMAT
        backend = meta.get("backend")
        self.backend: str | None = backend if isinstance(backend, str) else None
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

    def _read_meta(self) -> dict[str, Any]:
        try:
            meta = json.loads((self.dir / f"{self.name}.meta").read_bytes())
        except (OSError, ValueError):
            return {}
        if not isinstance(meta, dict) or not isinstance(meta.get("format", 1), int):
            return {}
        return meta

    def write_meta(self, backend: str) -> None:
        self.backend = backend
        try:
            (self.dir / f"{self.name}.meta").write_text(
                json.dumps({"format": RECORD_FORMAT, "backend": backend}) + "\n")
        except OSError as error:  # a full disk: the records still carry their checksums
            _log.debug("otel_verl: could not write the log's meta file: %r", error)
            return
        self.sealed = True

    def _read_cursor(self) -> tuple[int, int]:
        """The saved cursor, checked against the segments; a damaged one falls back to the start
        of its segment (or of the first one): spans may be sent twice, none is skipped."""
        segments = self.segments()
        first = (segments[0] if segments else 0, 0)
        path = self.dir / f"{self.name}.cursor"
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            return first
        except OSError as error:
            self.cursor_damage = f"unreadable ({error.strerror or error})"
            return first
        try:
            seq, offset = (int(field) for field in text.split())
        except ValueError:
            self.cursor_damage = f"not a cursor ({text[:40]!r})"
            return first
        if not segments or seq < segments[0]:
            return first  # what it pointed into was delivered and removed
        if seq not in segments:
            self.cursor_damage = f"past the last segment ({seq} > {segments[-1]})"
            return first
        if offset < 0:
            self.cursor_damage = f"negative offset {offset}"
            return seq, 0
        try:
            with open(self.segment(seq), "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if offset > size:
                    self.cursor_damage = f"past the segment's size ({offset} > {size})"
                    return seq, 0
                if offset:
                    handle.seek(offset - 1)
                    if handle.read(1) != b"\n":
                        self.cursor_damage = f"not at a record's start (offset {offset})"
                        return seq, 0
        except OSError:
            return seq, 0  # the read tells (and retries)
        return seq, offset

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
        """Whole records from ``cursor`` (not past ``end``), within the limits (one at least).

        With ``end`` None (a dead writer's log) a last line without its newline is returned too
        (it is damage: the caller keeps it aside). Nothing is ever skipped: a segment that cannot
        be read raises :class:`LogReadError` (when no record was read before it).
        """
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
                        if not line:
                            break
                        if not line.endswith(b"\n") and end is not None:
                            break  # a line being written (this process's own log)
                        if lines and size + len(line) > max_bytes:
                            return lines, (seq, offset)
                        lines.append(line)
                        size += len(line)
                        offset += len(line)
            except OSError as error:
                if lines:
                    return lines, (seq, offset)
                raise LogReadError(self.segment(current), error) from error
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

    def fully_read(self) -> bool:
        """The cursor is at the end of the last segment (what ``remove`` may delete was read)."""
        segments = self.segments()
        if not segments:
            return True
        try:
            return self.cursor >= (segments[-1], self.segment(segments[-1]).stat().st_size)
        except OSError:
            return False

    def remove_lock_only(self) -> None:
        if self.lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)
            self.lock_fd = None

    def remove(self) -> None:
        for seq in self.segments():
            with contextlib.suppress(OSError):
                self.segment(seq).unlink()
        for suffix in (".cursor", ".meta", ".lock"):
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


def adopt_streams(directory: Path, exclude: str | None = None, backend: str | None = None,
                  foreign: list[str] | None = None) -> list[_Stream]:
    """The logs under ``directory`` whose writer is gone (their locks are now held by the caller).

    With ``backend``, only logs written for that backend (or for an unrecorded one: format 1);
    the names of the others go to ``foreign`` and their locks are let go."""
    names = set()
    for path in directory.glob("wal-*"):
        match = _SEGMENT.match(path.name)
        if match:
            names.add(match["stream"])
        elif path.suffix in (".lock", ".cursor", ".meta"):
            names.add(path.name[: -len(path.suffix)])
    streams = []
    for name in sorted(names - {exclude}):
        fd = _try_lock(directory / f"{name}.lock")
        if fd is None:
            continue
        stream = _Stream(directory, name, fd)
        if backend is not None and stream.backend is not None and stream.backend != backend:
            stream.remove_lock_only()
            if foreign is not None:
                foreign.append(name)
            continue
        streams.append(stream)
    return streams


# --- the exporter ---------------------------------------------------------------------------------

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
                 transform: Callable[[ReadableSpan], ReadableSpan] | None = None) -> None:
        self.inner = inner
        self.backend_id = backend_id or _default_identity(inner)
        self.transform = transform
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
             "truncated", "quarantined", "dropped_spool_full", "recovered", "spooled_unredacted",
             "log_damaged", "log_read_errors", "log_cursor_resets"), 0)
        self._default_transform: Callable[[ReadableSpan], ReadableSpan] | None = None
        self._last_damage_warning = 0.0
        self._warned_foreign: set[str] = set()
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
        self._last_failure = 0.0
        self._accepted = 0  # requests the backend accepted (the evidence that it is up)
        self._canary: ReadableSpan | None = None  # the last span it accepted: a probe
        self._turn = 0  # round robin over the logs served (adopted ones and this process's own)
        self._strikes: dict[tuple[str, tuple[int, int]], int] = {}
        self._strike_marks: dict[tuple[str, tuple[int, int]], int] = {}
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
        for stream in self._adopted:
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
        stream = _Stream(self.directory, name, fd)
        stream.limit = self.max_batch_spans
        stream.write_meta(self.backend_id)
        return stream

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
        lines, fitted = self._sealed(spans, raw=False)
        if not lines:
            return SpanExportResult.FAILURE
        try:
            self._append(lines, fitted)
        except OSError as error:
            return self._log_full(lines, fitted, error)
        self._count(spooled=len(lines))
        self._enforce_budget()
        self._appended(len(lines), urgent=False)
        return SpanExportResult.SUCCESS

    def _sealed(self, spans: Sequence[ReadableSpan], *, raw: bool
                ) -> tuple[list[bytes], list[ReadableSpan]]:
        """Each span fitted to ``max_span_bytes`` and sealed as a log record (``raw``: flagged
        as not yet redacted); a span that cannot be encoded is counted (``spool_failed``)."""
        lines, fitted = [], []
        truncated = 0
        for span in spans:
            try:
                span, line, cut = fit_span(span, self._max_span_bytes)
            except Exception as exc:  # noqa: BLE001
                _errors.internal_error(exc, "encoding a span for the log")
                self._count(spool_failed=1)
                continue
            truncated += cut
            lines.append(seal(line, raw=raw))
            fitted.append(span)
        self._count(truncated=truncated)
        return lines, fitted

    def _appended(self, count: int, *, urgent: bool) -> None:
        """``count`` records are on disk: wake the sender (at once when ``urgent``)."""
        with self._cond:
            self._pending += count
            if self._oldest_unsent is None:
                self._oldest_unsent = time.monotonic()
            if urgent:
                self._urgent = True
            self._cond.notify_all()

    def append_unredacted(self, spans: Sequence[ReadableSpan],
                          transform: Callable[[ReadableSpan], ReadableSpan] | None) -> int:
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
            self.transform = transform
        if not spans:
            return 0
        raw = transform is not None
        if self._closed:
            return len(spans) if self.export(self._maybe_redacted(spans, transform)) \
                is SpanExportResult.SUCCESS else 0
        lines, _ = self._sealed(spans, raw=raw)
        if not lines:
            return 0
        try:
            self._append(lines)  # not remembered as spans: the sender reads and redacts them
        except OSError:  # the log cannot grow: redact now (slow) and go the way of export
            return len(spans) if self.export(self._maybe_redacted(spans, transform)) \
                is SpanExportResult.SUCCESS else 0
        self._count(spooled=len(lines), spooled_unredacted=len(lines) if raw else 0)
        self._appended(len(lines), urgent=True)
        return len(lines)

    def _maybe_redacted(self, spans: Sequence[ReadableSpan],
                        transform: Callable[[ReadableSpan], ReadableSpan] | None
                        ) -> list[ReadableSpan]:
        return list(spans) if transform is None else self._redacted(list(spans), transform)

    def _redacted(self, spans: list[ReadableSpan],
                  transform: Callable[[ReadableSpan], ReadableSpan] | None) -> list[ReadableSpan]:
        """``spans`` through ``transform`` (default: the log's); one it raises on is dropped
        (``dropped_transform_failed``), never sent unredacted."""
        if transform is None:
            transform = self.transform
        if transform is None:
            if self._default_transform is None:
                from otel_verl.exporters._scrub import Scrubber

                self._default_transform = Scrubber(())
            transform = self._default_transform
        out = []
        for span in spans:
            try:
                out.append(transform(span))
            except Exception as exc:  # noqa: BLE001  # never send what could not be redacted
                self._count(dropped_transform_failed=1)
                _errors.internal_error(exc, "span transform raised on a logged span; dropped")
        return out

    def _append(self, lines: list[bytes], spans: list[ReadableSpan] | None = None) -> None:
        data = b"".join(lines)
        with self._write_lock:
            if self._stream is None:
                self._stream = self._open_stream()
                self._seq = max(self._stream.segments(), default=0)
                self._stream.cursor = (self._seq + 1, 0)  # where its first record goes
            if self._fd is None or self._seg_size >= self._segment_bytes:
                self._open_segment()
            assert self._fd is not None
            try:
                write_whole(self._fd, data, self._seg_size)
            except TornWrite:  # the torn line stays; the next segment starts clean
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
                                           or not self._busy(self._deadline)):
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

    def _busy(self, until: float = 0.0) -> bool:
        """Something is left to deliver: this process's spans, or an adopted log that reads (or
        that is to be read again before ``until``)."""
        return self._pending > 0 or any(not s.read_errors or s.retry_at < until
                                        for s in self._adopted)

    def _own_wait(self, now: float) -> float:
        """Seconds until this process's own log should be sent from (inf: nothing to send)."""
        if self._pending <= 0:
            return math.inf
        stream = self._stream
        limit = stream.limit if stream is not None else self.max_batch_spans
        blocked = stream.retry_at - now if stream is not None else 0.0
        if self._pending >= limit or self._flush_waiters or self._stopping or self._urgent:
            return max(0.0, blocked)
        oldest = self._oldest_unsent or now
        return max(oldest + self.export_delay_s - now, blocked)

    def _due(self, now: float, backoff: float) -> float:
        """Seconds until the sender should try (<= 0: now)."""
        if backoff:
            left = self._last_failure + backoff - now
            if left > 0:
                return left
        if now >= self._next_adopt:
            return 0.0
        waits = [self._own_wait(now), self._next_adopt - now]
        waits.extend(s.retry_at - now for s in self._adopted)
        wait = min(waits)
        return wait if wait <= 0 or not self._stopping else min(wait, 0.05)

    def _release_waiters(self, all_: bool = False) -> None:
        if self._pending <= 0:
            self._urgent = False
        if all_ or not self._busy():
            for event in self._flush_waiters:
                event.set()
            self._flush_waiters = []

    def _adopt(self) -> None:
        """Take the logs that dead processes left for this backend (every 30 s)."""
        if not self.directory.is_dir():
            return
        own = self._stream.name if self._stream is not None else None
        known = {s.name for s in self._adopted}
        foreign: list[str] = []
        for stream in adopt_streams(self.directory, exclude=own, backend=self.backend_id,
                                    foreign=foreign):
            if stream.name in known:
                stream.remove_lock_only()
                continue
            stream.limit = self.max_batch_spans
            if stream.cursor_damage:
                self._count(log_cursor_resets=1)
                _log.warning("otel_verl: the delivery cursor of %s in %s is damaged (%s); its "
                             "log is delivered from the start of the segment (spans may arrive "
                             "twice)", stream.name, self.directory, stream.cursor_damage)
            pending = stream.pending_lines()
            if pending:
                _log.warning("otel_verl: delivering %d span(s) left in %s by an earlier "
                             "process", pending, self.directory)
            self._adopted.append(stream)
        new = sorted(set(foreign) - self._warned_foreign)
        if new:
            self._warned_foreign.update(new)
            _log.warning("otel_verl: %d log(s) in %s were written for another backend; they are "
                         "left for it (or `otel-verl traces replay %s`)", len(new),
                         self.directory, self.directory)

    def _send_once(self) -> tuple[bool, bool]:
        """One request, taking turns between the adopted logs and this process's own (so that no
        log, however stuck, holds back the others); (delivered, failed)."""
        if self._overflow:
            return self._send_overflow()
        now = time.monotonic()
        if now >= self._next_adopt:
            self._next_adopt = now + 30.0
            self._adopt()
        mine = self._stream
        ready: list[_Stream] = [s for s in self._adopted if s.retry_at <= now]
        if mine is not None and self._own_wait(now) <= 0:
            ready.append(mine)
        if not ready:
            return False, False
        stream = ready[self._turn % len(ready)]
        self._turn += 1
        if stream is mine:
            end = self._write_end()
            if end is None:
                return False, False
            result = self._send_from(mine, end, recovered=False)
            if result == _EMPTY:
                with self._cond:
                    self._pending = sum(len(lines) for lines, _ in self._overflow)
                    self._oldest_unsent = None if not self._pending else self._oldest_unsent
        else:
            result = self._send_from(stream, None, recovered=True)
            if result == _EMPTY:  # that log is delivered (what it held was read, every line)
                self._adopted.remove(stream)
                if stream.fully_read():
                    stream.remove()
                else:
                    stream.remove_lock_only()
                    _log.warning("otel_verl: the log %s in %s could not be read to its end; it "
                                 "is kept", stream.name, self.directory)
        return result == _SENT, result == _FAILED

    def _spans_of(self, stream: _Stream, lines: list[bytes], keep: bool = True
                  ) -> list[ReadableSpan]:
        """The spans of ``lines`` (records not yet redacted are redacted here); a damaged record
        is kept aside in ``damaged/`` (with ``keep``), counted and reported, never sent.

        Raises:
            LogReadError: a damaged record could not be kept aside (the log stays as it is).
        """
        spans: list[ReadableSpan] = []
        for line in lines:
            body, raw = unseal(line, stream.sealed)
            decoded = _decode_line(body) if body is not None else None
            if decoded is None:
                if keep:
                    self._keep_damaged(stream, line)
                continue
            spans.extend(self._redacted(decoded, None) if raw else decoded)
        return spans

    def _keep_damaged(self, stream: _Stream, line: bytes) -> None:
        path = keep_damaged(self.directory, stream.name, line)
        self._count(log_damaged=1)
        now = time.monotonic()
        if now - self._last_damage_warning > 20.0:
            self._last_damage_warning = now
            _log.warning("otel_verl: a damaged record in the log %s (a checksum that does not "
                         "match, or not OTLP/JSON) is kept in %s and not sent (%d so far)",
                         stream.name, path, self._counts["log_damaged"])

    def _read_failed(self, stream: _Stream, error: LogReadError) -> None:
        stream.read_errors += 1
        self._count(log_read_errors=1)
        delay = min(60.0, max(0.05, self.retry_initial_s) * 2 ** min(stream.read_errors - 1, 10))
        stream.retry_at = time.monotonic() + delay
        if stream.read_errors in (1, 10) or stream.read_errors % 100 == 0:
            _log.warning("otel_verl: %s (attempt %d); the log is kept and read again in %.1f s, "
                         "the other logs are delivered meanwhile", error, stream.read_errors,
                         delay)

    def _send_from(self, stream: _Stream, end: tuple[int, int] | None,
                   recovered: bool) -> str:
        """Send one request from ``stream``: ``_EMPTY`` (nothing left), ``_SENT``, ``_FAILED``
        (the backend did not accept it) or ``_BLOCKED`` (the log cannot be read now)."""
        hot = None if recovered else self._take_hot(stream, end)
        if hot is not None:
            spans, after, size = hot
            count = len(spans)
            lines: list[bytes] = []
        else:
            try:
                lines, after = stream.read(stream.cursor, end, self._max_span_bytes,
                                           stream.limit)
                if not lines:
                    return _EMPTY
                spans = self._spans_of(stream, lines)
            except LogReadError as error:
                self._read_failed(stream, error)
                return _BLOCKED
            if stream.read_errors:
                _log.warning("otel_verl: the log %s reads again after %d failed attempt(s)",
                             stream.name, stream.read_errors)
                stream.read_errors = 0
            count = len(lines)
            size = sum(len(line) for line in lines)
        ok = True
        if spans:
            with self._send_lock:
                ok = call_export(self.inner, spans)
            self._backend_up = ok
        if ok:
            if spans:
                self._accepted += 1
                self._canary = spans[-1]
                self._count(delivered=len(spans), requests=1, request_bytes=size)
                if recovered:
                    self._count(recovered=len(spans))
            with self._cond:
                stream.save_cursor(max(after, stream.cursor))
                if not recovered:
                    self._pending -= count
                    self._oldest_unsent = time.monotonic() if self._pending > 0 else None
            stream.limit = min(self.max_batch_spans, stream.limit * 2)
            if self._warned_outage and spans:
                self._warned_outage = False
                _log.warning("otel_verl: the backend accepts spans again; delivering the log")
            return _SENT
        self._count(retries=1)
        if hot is not None:
            try:
                lines, _ = stream.read(stream.cursor, end, self._max_span_bytes, len(spans))
            except LogReadError:
                lines = []
        if not self._warned_outage:
            self._warned_outage = True
            _log.warning("otel_verl: the backend did not accept %d span(s); they wait in %s and "
                         "are retried (replay by hand: `otel-verl traces replay %s`)",
                         len(spans), self.directory, self.directory)
        if len(lines) > 1:
            stream.limit = max(1, len(lines) // 2)  # find a span the backend refuses, if any
            return _FAILED
        if lines:
            self._probe(stream, end, lines[0], after, recovered)
        return _FAILED

    def _take_hot(self, stream: _Stream, end: tuple[int, int] | None
                  ) -> tuple[list[ReadableSpan], tuple[int, int], int] | None:
        """The next request from memory when the cursor is where the remembered spans start."""
        limit = self._max_span_bytes
        cursor = stream.cursor
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
                if len(spans) >= stream.limit or (spans and size + nbytes > limit):
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
        """One span fails alone. If the backend accepted another request since this span last
        failed (from any log: they take turns), or accepts the next span now (where there is
        none, as for the last span of a dead process's log: the last span it accepted, sent
        again), it is up and refuses this one; after a few such strikes the span is quarantined
        (kept on disk, not retried)."""
        key = (stream.name, stream.cursor)
        mark = self._strike_marks.get(key)
        evidence = mark is not None and self._accepted > mark
        if not evidence:
            try:
                nxt, _ = stream.read(after, end, self._max_span_bytes, 1)
                spans = self._spans_of(stream, nxt, keep=False) if nxt else []
            except LogReadError:
                spans = []
            if not spans and self._canary is not None:
                spans = [self._canary]  # no next span: one the backend accepted before (again)
            if spans:
                with self._send_lock:
                    evidence = call_export(self.inner, spans)
                if evidence:
                    self._accepted += 1
        self._strike_marks[key] = self._accepted
        if not evidence:
            return  # an outage, not a bad span (as far as anything shows)
        self._strikes[key] = strikes = self._strikes.get(key, 0) + 1
        if strikes < _STRIKES_TO_QUARANTINE:
            return
        del self._strikes[key]
        self._strike_marks.pop(key, None)
        quarantine = self.directory / "quarantine"
        try:
            quarantine.mkdir(exist_ok=True)
            with open(quarantine / f"{stream.name}.jsonl", "ab") as handle:
                handle.write(line if line.endswith(b"\n") else line + b"\n")
        except OSError as error:
            _log.warning("otel_verl: cannot quarantine a refused span in %s (%r); it stays in "
                         "the log and is retried", quarantine, error)
            return
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
            if not self._busy():
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


def _count_lines(path: Path, offset: int) -> int:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
    except OSError:
        return 0


def _decode_line(line: bytes) -> list[ReadableSpan] | None:
    """The spans of one OTLP/JSON line, or None when it is not one (damage)."""
    try:
        return [_otlp_json.readable_span(span)
                for span in _otlp_json.iter_spans(_otlp_json.decode_line(line))]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def keep_damaged(directory: Path, stream: str, line: bytes) -> Path:
    """Append a damaged record to ``<directory>/damaged/<stream>.damaged`` (kept as it was read;
    not a store file, so no reader takes it for spans).

    Raises:
        LogReadError: it could not be written (then the log must keep it where it is).
    """
    path = directory / "damaged" / f"{stream}.damaged"
    try:
        path.parent.mkdir(exist_ok=True)
        with open(path, "ab") as handle:
            handle.write(line if line.endswith(b"\n") else line + b"\n")
    except OSError as error:
        raise LogReadError(path, error) from error
    return path


# --- replay by hand ---------------------------------------------------------------------------------


def replay(spool_dir: str | os.PathLike[str], exporter: SpanExporter, *, batch_size: int = 512,
           max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, remove: bool = False,
           progress: Callable[[int], None] | None = None,
           transform: Callable[[ReadableSpan], ReadableSpan] | None = None) -> tuple[int, int]:
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
        transform: applied to records written before redaction (default: the default
            scrubber); they are never sent as they are.

    A damaged record is kept in ``damaged/`` and counted as failed; a log that cannot be read
    is kept (its spans counted as failed) and never removed.

    Returns:
        (spans sent, spans that failed).
    """
    path = Path(spool_dir)
    sent = failed = 0
    limit = max(4096, max_request_bytes) - _REQUEST_OVERHEAD
    if path.is_dir():
        redact = transform
        for stream in adopt_streams(path):
            if stream.cursor_damage:
                _log.warning("otel_verl: the delivery cursor of %s is damaged (%s); replaying "
                             "from the start of its segment", stream.name, stream.cursor_damage)
            ok = True
            while ok:
                try:
                    lines, after = stream.read(stream.cursor, None, limit, batch_size)
                    spans: list[ReadableSpan] = []
                    for line in lines:
                        body, raw = unseal(line, stream.sealed)
                        decoded = _decode_line(body) if body is not None else None
                        if decoded is None:
                            keep_damaged(path, stream.name, line)
                            failed += 1
                            _log.warning("otel_verl: a damaged record in %s is kept in %s",
                                         stream.name, path / "damaged")
                            continue
                        if raw:
                            if redact is None:
                                from otel_verl.exporters._scrub import Scrubber

                                redact = Scrubber(())
                            try:
                                decoded = [redact(span) for span in decoded]
                            except Exception as exc:  # noqa: BLE001  # never sent unredacted
                                _errors.internal_error(exc, "replay: a span could not be redacted")
                                failed += len(decoded)
                                continue
                        spans.extend(decoded)
                except LogReadError as error:
                    _log.warning("otel_verl: %s; the log is kept", error)
                    failed += stream.pending_lines()
                    ok = False
                    break
                if not lines:
                    break
                ok = call_export(exporter, spans) if spans else True
                if ok:
                    sent += len(spans)
                    stream.save_cursor(after)
                    if progress is not None:
                        progress(len(spans))
                else:
                    failed += stream.pending_lines()
            if ok and remove and stream.fully_read():
                stream.remove()
            else:
                stream.remove_lock_only()
        files = [p for p in sorted(path.rglob("*.jsonl")) + sorted(path.rglob("*.json"))
                 if not _SEGMENT.match(p.name) and "quarantine" not in p.parts
                 and "damaged" not in p.parts]
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
