"""One writer's log on disk (a stream): its segments, cursor, lock and meta files; finding the
streams whose writer is gone (adoption, by ``flock``); keeping damaged records aside.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from otel_verl.exporters._records import RECORD_FORMAT

_logger = logging.getLogger("otel_verl")

SEGMENT = re.compile(r"^(?P<stream>wal-.+)-(?P<seq>\d{8})\.jsonl$")

Cursor = tuple[int, int]  # (segment number, byte offset): the next record to send


# --- one writer's log on disk -----------------------------------------------------------------------


class LogReadError(OSError):
    """A segment of a log could not be read (the log is kept and retried, never removed)."""

    def __init__(self, path: Path, error: OSError) -> None:
        super().__init__(error.errno, f"cannot read {path}: {error.strerror or error}")
        self.path = path
        self.error = error


class Stream:
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
            match = SEGMENT.match(path.name)
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
            _logger.debug("otel_verl: could not write the log's meta file: %r", error)
            return
        self.sealed = True

    def _read_cursor(self) -> Cursor:
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

    def save_cursor(self, cursor: Cursor) -> None:
        self.cursor = cursor
        path = self.dir / f"{self.name}.cursor"
        tmp = self.dir / f"{self.name}.cursor.tmp"
        try:
            tmp.write_text(f"{cursor[0]} {cursor[1]}\n")
            os.replace(tmp, path)
        except OSError as error:  # a full disk: the cursor lags, spans are sent again later
            _logger.debug("otel_verl: could not save the delivery cursor: %r", error)
        for seq in self.segments():
            if seq < cursor[0]:
                with contextlib.suppress(OSError):
                    self.segment(seq).unlink()

    def read(self, cursor: Cursor, end: Cursor | None, max_bytes: int,
             max_lines: int) -> tuple[list[bytes], Cursor]:
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
            if seq >= self.cursor[0]:
                count += count_lines(self.segment(seq),
                                     self.cursor[1] if seq == self.cursor[0] else 0)
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
        self.remove_lock_only()


def try_lock(path: Path) -> int | None:
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
                  foreign: list[str] | None = None) -> list[Stream]:
    """The logs under ``directory`` whose writer is gone (their locks are now held by the caller).

    With ``backend``, only logs written for that backend (or for an unrecorded one: format 1);
    the names of the others go to ``foreign`` and their locks are let go."""
    names = set()
    for path in directory.glob("wal-*"):
        match = SEGMENT.match(path.name)
        if match:
            names.add(match["stream"])
        elif path.suffix in (".lock", ".cursor", ".meta"):
            names.add(path.name[: -len(path.suffix)])
    streams = []
    for name in sorted(names - {exclude}):
        fd = try_lock(directory / f"{name}.lock")
        if fd is None:
            continue
        stream = Stream(directory, name, fd)
        if backend is not None and stream.backend is not None and stream.backend != backend:
            stream.remove_lock_only()
            if foreign is not None:
                foreign.append(name)
            continue
        streams.append(stream)
    return streams


def count_lines(path: Path, offset: int) -> int:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
    except OSError:
        return 0


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
