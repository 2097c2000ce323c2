"""One whole-write: append bytes to a file whole, or leave the file as it was.

Shared by the local store's writer (``_file_exporter``) and the durable log (``_log``): on a full
disk ``os.write`` may write part of a record and fail; a reader must never see half a line, so
the part is cut back off (``ftruncate``). Where even that fails the file ends in a torn line
(:class:`TornWrite`) and the writer starts the next record on a line (or a file) of its own.
"""

from __future__ import annotations

import os


class TornWrite(OSError):
    """A write failed and what it wrote could not be cut back: the file ends in a torn line."""


def write(fd: int, data: memoryview) -> int:
    """``os.write`` (the seam the full-disk tests replace)."""
    return os.write(fd, data)


def _size(fd: int, default: int) -> int:
    try:
        return os.fstat(fd).st_size
    except OSError:
        return default + 1  # unknown: assume a partial write


def write_whole(fd: int, data: bytes, start: int) -> None:
    """Write ``data`` to ``fd`` (opened for appending; ``start`` is its size now), whole.

    Raises:
        TornWrite: the write failed and part of ``data`` is in the file (it could not be cut
            back); its ``__cause__`` is the write's error.
        OSError: the write failed; the file is as it was (``start`` bytes).
    """
    view = memoryview(data)
    try:
        while view:
            view = view[write(fd, view):]
    except OSError as error:
        if _size(fd, start) > start:  # part of it is in the file: take it back
            try:
                os.ftruncate(fd, start)
            except OSError as cut:
                raise TornWrite(cut.errno, f"{error}; the part written could not be cut back "
                                f"({cut.strerror or cut})") from error
        raise
