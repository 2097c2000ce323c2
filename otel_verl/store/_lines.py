"""Reading one store line again by its byte offset, and the last few lines read.

A trajectory page re-reads the lines that hold its trace's spans (the lake's
``source``/``source_offset``); the rollouts of a group share their
lines, so the last few lines are kept (as the caller holds them: parsed, decoded). Lines never
change once complete: the store only appends.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["LineCache", "line_at"]


def line_at(path: str, offset: int) -> bytes | None:
    """The line of ``path`` that starts at byte ``offset`` (its newline included when it has one;
    b"" at the end of the file). None when the file cannot be read or ``offset`` is not the start
    of a line (the offsets the caller holds are wrong)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, offset - 1))
            before = handle.read(1) if offset > 0 else b"\n"
            raw = handle.readline()
    except OSError:
        return None
    return raw if before == b"\n" else None


class LineCache:
    """What the caller made of the ``size`` lines used last (the viewer: each line parsed, and
    the spans of the traces asked of it), by (path, offset). Thread-safe."""

    def __init__(self, size: int = 16) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._lines: dict[tuple[str, int], Any] = {}

    def get(self, path: str, offset: int) -> Any | None:
        key = (path, offset)
        with self._lock:
            cached = self._lines.pop(key, None)
            if cached is not None:
                self._lines[key] = cached  # most recent last
            return cached

    def put(self, path: str, offset: int, decoded: Any) -> None:
        with self._lock:
            self._lines[(path, offset)] = decoded
            while len(self._lines) > self._size:
                self._lines.pop(next(iter(self._lines)))

    def clear(self) -> None:
        with self._lock:
            self._lines.clear()

    def __len__(self) -> int:
        return len(self._lines)
