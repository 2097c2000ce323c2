"""A recording HTTP endpoint on 127.0.0.1 (stdlib): stores every request, answers from a script.

``statuses``: answers to give in order (then 200); ``hang``: while set, requests are held until
``release`` is set (or the client gives up) — the "server never answers" case.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


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

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
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
                self.send_response(status)
                if rec.retry_after and status in (429, 503):
                    self.send_header("Retry-After", rec.retry_after)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                if rec.drop_keepalive:
                    self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # a short poll: shutdown() waits for it (0.5 s by default, per test)
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r["body"]) for r in self.requests]

    def calls(self) -> list[dict[str, Any]]:
        return [c for b in self.bodies() for c in b["batch"]]

    def __enter__(self) -> Recorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
