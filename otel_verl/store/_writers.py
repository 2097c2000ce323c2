"""Which store files are still being written: the one rule compaction and its launchers share.

A store file is **closed** when its writer process is gone: the file name (``otel_verl-<host>-
<pid>-<UTC time>.jsonl``, :mod:`otel_verl.exporters._file_exporter`) names the writer, so on its
own host the pid answers; a file of another host (or of another name) counts as closed once it
has not changed for ``idle_s``. A live file is compacted only once :data:`LIVE_BYTES` of it are
not compacted yet.

Standard library only (no pyarrow, no DuckDB): a training process's exporter decides here
whether its compaction child has work, without loading the lake (``exporters/_compactor.py``).
"""

from __future__ import annotations

import os
import re
import socket
import time

__all__ = ["IDLE_S", "LIVE_BYTES", "is_closed", "writer_alive"]

#: a live file is compacted once this much of it is not compacted yet
LIVE_BYTES = 64 << 20
#: a foreign host's file counts as closed after this long without a change
IDLE_S = 600.0
WRITER_NAME = re.compile(r"otel_verl-(?P<host>.+)-(?P<pid>\d+)-\d{8}T\d{9}Z(?:-\d+)?\.jsonl$")


def writer_alive(host: str, pid: int) -> bool | None:
    """Whether the writer process is alive (None: another host's, cannot tell)."""
    if host != (re.sub(r"[^A-Za-z0-9._-]+", "_", socket.gethostname()) or "host"):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_closed(path: str, now: float | None = None, idle_s: float = IDLE_S) -> bool:
    """A store file no process writes any more (see the module docstring)."""
    match = WRITER_NAME.search(os.path.basename(path))
    if match is not None:
        alive = writer_alive(match["host"], int(match["pid"]))
        if alive is not None:
            return not alive
    try:
        return (now or time.time()) - os.stat(path).st_mtime > idle_s
    except OSError:
        return False
