"""Calls that could not be delivered, kept on disk as JSON lines, and their replay.

One file per exporter instance: ``weave-spool-<pid>-<unix time>-<n>.jsonl`` under the spool
directory, one complete call (the exact wire JSON, ``project_id`` included) per line. Replay
(``otel-weave-replay DIR`` or ``python -m otel_weave_exporter DIR``) sends every file's calls
with the same transport and renames a delivered file to ``*.jsonl.sent``. Re-sending a call that
did arrive is harmless: the call id is its span id, and the server upserts by id.

A call the server refuses on its own as invalid (400/422, or 413 for a single call) is never
retried: it goes to ``weave-rejected-<pid>-<time>-<n>.jsonl`` beside the spool, one
``{"error": <the server's answer>, "call": <the call>}`` per line, for a person to look at; the
spool keeps draining.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

_counter = itertools.count()


class Spool:
    """Appends encoded calls to a JSON-lines file, up to ``max_bytes`` in all."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        stem = f"{os.getpid()}-{int(time.time())}-{next(_counter)}.jsonl"
        self.path = self.directory / f"weave-spool-{stem}"
        self.rejected_path = self.directory / f"weave-rejected-{stem}"
        self._written = 0
        self._lock = threading.Lock()

    def write(self, parts: list[bytes]) -> int:
        """Append what fits; returns how many calls were written (the rest is dropped)."""
        return self._append(self.path, parts)

    def quarantine(self, rejected: list[tuple[bytes, str]]) -> int:
        """Keep calls the server refused as invalid, with its answer; never replayed."""
        return self._append(self.rejected_path, [rejected_line(p, e) for p, e in rejected])

    def _append(self, path: Path, parts: list[bytes]) -> int:
        with self._lock:
            room = self.max_bytes - self._written
            take: list[bytes] = []
            for part in parts:
                if len(part) + 1 > room:
                    break
                take.append(part)
                room -= len(part) + 1
            if not take:
                return 0
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                with open(path, "ab") as fh:
                    fh.write(b"\n".join(take) + b"\n")
            except OSError:
                return 0
            self._written = self.max_bytes - room
            return len(take)


def rejected_line(part: bytes, error: str) -> bytes:
    """One quarantine line: the server's answer and the call as it was sent."""
    return b'{"error":' + json.dumps(error[:2000]).encode() + b',"call":' + part + b"}"


def rejected_path_for(spool_file: Path) -> Path:
    """Where replay quarantines the refused calls of ``spool_file``."""
    return spool_file.with_name(spool_file.name.replace("weave-spool-", "weave-rejected-", 1))


def spool_files(directory: str | os.PathLike[str]) -> list[Path]:
    return sorted(Path(directory).glob("weave-spool-*.jsonl"))


def read_spool(path: str | os.PathLike[str]) -> Iterator[tuple[str, bytes]]:
    """(project_id, call bytes) for each readable line; a torn last line is skipped."""
    with open(path, "rb") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                project_id = json.loads(line)["project_id"]
            except (ValueError, KeyError, TypeError):
                continue
            yield str(project_id), line
