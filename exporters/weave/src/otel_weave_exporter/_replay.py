"""Send spooled calls again (see ``_spool``)."""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from typing import Any

from otel_weave_exporter._encode import batch_body, split_batches
from otel_weave_exporter._exporter import resolve_config
from otel_weave_exporter._spool import read_spool, spool_files
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
    """Deliver every spool file under ``directory``; a delivered file becomes ``*.jsonl.sent``.

    Calls go to the project named in each call (``project_id``), with the key and server
    resolved like the exporter's (``WANDB_API_KEY``, ``OTEL_EXPORTER_WEAVE_ENDPOINT``, ...).
    Returns counts: files, files_sent, calls_sent, calls_failed.
    """
    counts = {"files": 0, "files_sent": 0, "calls_sent": 0, "calls_failed": 0}
    for path in spool_files(directory):
        counts["files"] += 1
        by_project: dict[str, list[bytes]] = defaultdict(list)
        for project_id, line in read_spool(path):
            by_project[project_id].append(line)
        file_ok = True
        for project_id, parts in by_project.items():
            cfg = resolve_config(project_id, None, api_key, base_url, timeout_s=timeout_s, **options)
            sender = HttpSender(
                cfg.base_url,
                {"Authorization": basic_auth(cfg.api_key), **cfg.headers},
                request_timeout_s=cfg.request_timeout_s,
            )
            deadline = time.monotonic() + cfg.timeout_s
            try:
                for batch in split_batches(parts, cfg.max_request_bytes):
                    result = sender.send(cfg.path, batch_body(batch), deadline)
                    if result.ok:
                        counts["calls_sent"] += len(batch)
                    else:
                        counts["calls_failed"] += len(batch)
                        file_ok = False
                        _log.warning("replay of %s to %s failed: %s", path, project_id, result.error)
            finally:
                sender.close()
        if file_ok:
            os.replace(path, str(path) + ".sent")
            counts["files_sent"] += 1
    return counts
