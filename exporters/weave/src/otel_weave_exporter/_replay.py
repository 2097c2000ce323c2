"""Send spooled calls again (see ``_spool``).

A spool file always drains: calls the server accepts are delivered, a call it refuses on its own
as invalid is moved to the file's quarantine (``weave-rejected-*.jsonl``), and when the server
cannot be reached the calls not yet delivered stay in the file (rewritten to hold only them) for
the next replay.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from otel_weave_exporter._deliver import deliver
from otel_weave_exporter._exporter import resolve_config
from otel_weave_exporter._spool import read_spool, rejected_line, rejected_path_for, spool_files
from otel_weave_exporter._transport import HttpSender, basic_auth

_log = logging.getLogger("otel_weave_exporter")


def replay(
    directory: str | os.PathLike[str],
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    timeout_s: float = 60.0,
    **options: Any,
) -> dict[str, int]:
    """Deliver every spool file under ``directory``; a drained file becomes ``*.jsonl.sent``.

    Calls go to the project named in each call (``project_id``), with the key and server
    resolved like the exporter's (``WANDB_API_KEY``, ``OTEL_EXPORTER_WEAVE_ENDPOINT``, ...).
    Returns counts: files, files_sent, delivered, undelivered (left in the spool), quarantined.
    """
    counts = {"files": 0, "files_sent": 0, "delivered": 0, "undelivered": 0, "quarantined": 0}
    for path in spool_files(directory):
        counts["files"] += 1
        by_project: dict[str, list[bytes]] = defaultdict(list)
        for project_id, line in read_spool(path):
            by_project[project_id].append(line)
        left: list[bytes] = []
        rejected: list[bytes] = []
        for project_id, parts in by_project.items():
            cfg = resolve_config(project_id, None, api_key, base_url, timeout_s=timeout_s, **options)
            sender = HttpSender(
                cfg.base_url,
                {"Authorization": basic_auth(cfg.api_key), **cfg.headers},
                request_timeout_s=cfg.request_timeout_s,
            )
            try:
                done = deliver(
                    sender, cfg.path, parts, cfg.max_request_bytes, time.monotonic() + cfg.timeout_s
                )
            finally:
                sender.close()
            counts["delivered"] += done.sent
            rejected.extend(rejected_line(p, e) for p, e in done.rejected)
            left.extend(done.failed)
            if done.failed:
                _log.warning("replay of %s to %s: %d call(s) left for later (%s)",
                             path, project_id, len(done.failed), done.error)
        if rejected:
            _log.warning("replay of %s: %d call(s) refused as invalid, quarantined in %s",
                         path, len(rejected), rejected_path_for(path))
            with open(rejected_path_for(path), "ab") as fh:
                fh.write(b"\n".join(rejected) + b"\n")
            counts["quarantined"] += len(rejected)
        counts["undelivered"] += len(left)
        if left:
            _rewrite(path, left)
        else:
            os.replace(path, str(path) + ".sent")
            counts["files_sent"] += 1
    return counts


def _rewrite(path: Path, lines: list[bytes]) -> None:
    """Keep only ``lines`` in the spool file (atomically: a crash leaves the old or the new)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(b"\n".join(lines) + b"\n")
    os.replace(tmp, path)
