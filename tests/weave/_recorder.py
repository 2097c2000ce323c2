"""A recording HTTP endpoint on 127.0.0.1 (stdlib): stores every request, answers from a script.

``statuses``: answers to give in order (then 200); ``hang``: while set, requests are held until
``release`` is set (or the client gives up) — the "server never answers" case.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared stub servers
from _servers import LocalServer, QuietHandler  # noqa: E402


class Recorder:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        self.retry_after: str | None = None
        self.validate_json = False  # answer 400 to a body that is not JSON
        self.reject_marker: bytes | None = None  # answer 400 to a body that contains it
        self.reply_body: bytes = b"{}"  # what a 200 carries
        self.drop_keepalive = False  # close the connection after answering, without saying so
        self.hang = threading.Event()
        self.release = threading.Event()
        rec = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                raw = self.read_body()
                rec.requests.append(
                    {"path": self.path, "headers": dict(self.headers.items()), "body": raw}
                )
                if rec.hang.is_set():
                    rec.release.wait(30)
                    return
                status = rec.statuses.pop(0) if rec.statuses else 200
                if rec.validate_json:
                    try:
                        json.loads(raw)
                    except ValueError:
                        status = 400
                if rec.reject_marker is not None and rec.reject_marker in raw:
                    status = 400
                body = rec.reply_body if status == 200 else json.dumps({"reason": "scripted"}).encode()
                retry = rec.retry_after if status in (429, 503) else None
                self.reply(status, body, "application/json",
                           {"Retry-After": retry} if retry else None)
                if rec.drop_keepalive:
                    self.close_connection = True

        # a short poll: close() waits for it (0.5 s by default, per test)
        self._server = LocalServer(Handler, poll_interval=0.02)
        self.httpd = self._server.httpd
        self.url = self._server.url

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r["body"]) for r in self.requests]

    def calls(self) -> list[dict[str, Any]]:
        return [c for b in self.bodies() for c in b["batch"]]

    def __enter__(self) -> Recorder:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._server.close()
