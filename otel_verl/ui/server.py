"""``otel-verl ui``: the local web viewer (a JSON API over the index, one static page).

Why the standard library's ``http.server`` and not a web framework: the viewer is a dozen GET
routes answering JSON for one local user; a ``ThreadingHTTPServer`` does that with no dependency,
starts instantly and has nothing to configure. Rendering happens in the browser (``static/app.js``,
which builds the page with DOM calls only: text from the store is set as text, never parsed as
HTML). The server binds to 127.0.0.1 unless told otherwise, answers GET only, sends a strict
Content-Security-Policy, and reads nothing but the store and its own static files.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from otel_verl._index import StoreIndex
from otel_verl.ui import assets
from otel_verl.ui.views import group_view, overview_view, prompt_view, trajectory_view

__all__ = ["UIServer", "api", "serve"]

_logger = logging.getLogger(__name__)

_CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; font-src 'self' data:; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'")


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """JSON for the browser: no NaN/Infinity, and safe inside an HTML ``<script>`` element."""
    text = json.dumps(_json_safe(value), ensure_ascii=False, default=str, allow_nan=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _int(query: dict[str, str], key: str) -> int | None:
    value = query.get(key, "")
    try:
        return int(value) if value != "" else None
    except ValueError:
        return None


def _float(query: dict[str, str], key: str) -> float | None:
    value = query.get(key, "")
    try:
        number = float(value) if value != "" else None
    except ValueError:
        return None
    return number if number is None or math.isfinite(number) else None


def _bool(query: dict[str, str], key: str) -> bool | None:
    value = query.get(key, "").lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    return None


def api(index: StoreIndex, route: str, query: dict[str, str]) -> Any:
    """Answer one API route (the same answers the report embeds). None = not found."""
    experiment = query.get("experiment") or None
    if route == "meta":
        return {"generation": index.generation, "problems": index.problems(),
                "experiments": index.experiments(), "store": os.path.abspath(index.trace_dir),
                "mode": "server"}
    if route == "overview":
        return overview_view(index, experiment)
    if route == "trajectories":
        return index.trajectories(
            experiment=experiment, step=_int(query, "step"),
            sample_index=_int(query, "sample_index"), rollout_n=_int(query, "rollout_n"),
            validate=_bool(query, "validate"), reward_min=_float(query, "reward_min"),
            reward_max=_float(query, "reward_max"), errors_only=_bool(query, "errors") or False,
            text=query.get("text") or None, trace_id=query.get("trace") or None,
            order=query.get("order", "start_ns"), descending=_bool(query, "desc") or False,
            page=_int(query, "page") or 0, page_size=_int(query, "page_size") or 50)
    if route == "trajectory":
        return trajectory_view(index, query.get("key", ""))
    if route == "group":
        return group_view(index, experiment, _int(query, "step"), _int(query, "sample_index"),
                          _bool(query, "validate"))
    if route == "prompt":
        sample = _int(query, "sample_index")
        return None if sample is None else prompt_view(index, experiment, sample,
                                                        _bool(query, "validate"))
    return None


class _Handler(BaseHTTPRequestHandler):
    server: UIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        _logger.debug("ui: " + format, *args)

    def _send(self, status: int, body: bytes, content_type: str,
              cache: str = "no-store") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", cache)
        self.send_header("Content-Security-Policy", _CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        path = url.path
        try:
            if path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, assets.page(report_data=None).encode(),
                           "text/html; charset=utf-8")
            elif path.startswith("/static/"):
                found = assets.static(path.removeprefix("/static/"))
                if found is None:
                    self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain")
                else:
                    body, content_type = found
                    self._send(HTTPStatus.OK, body, content_type, cache="max-age=3600")
            elif path.startswith("/api/"):
                query = dict(urllib.parse.parse_qsl(url.query))
                self.server.refresh()
                answer = api(self.server.index, path.removeprefix("/api/"), query)
                if answer is None:
                    self._send(HTTPStatus.NOT_FOUND, b'{"error": "not found"}',
                               "application/json")
                else:
                    self._send(HTTPStatus.OK, dumps(answer).encode(),
                               "application/json; charset=utf-8")
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain")
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as error:  # one bad request must not stop the viewer
            _logger.exception("ui: %s failed", self.path)
            try:
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR,
                           dumps({"error": f"{type(error).__name__}: {error}"}).encode(),
                           "application/json")
            except OSError:
                pass

    def _refuse(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, b"read-only viewer", "text/plain")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse


class UIServer(ThreadingHTTPServer):
    """The viewer's HTTP server; re-reads the store's new lines at most every ``poll_s``."""

    daemon_threads = True

    def __init__(self, index: StoreIndex, host: str = "127.0.0.1", port: int = 8686,
                 poll_s: float = 2.0) -> None:
        super().__init__((host, port), _Handler)
        self.index = index
        self.poll_s = poll_s
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Index what the store gained since the last look (at most once per ``poll_s``)."""
        if time.monotonic() - self._last < self.poll_s:
            return
        if not self._lock.acquire(blocking=False):
            return  # another request is already updating
        try:
            self.index.update()
        except Exception:
            _logger.exception("ui: updating the index failed")
        finally:
            self._last = time.monotonic()
            self._lock.release()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        if isinstance(host, bytes):
            host = host.decode()
        return f"http://{host}:{port}/"


def serve(index: StoreIndex, host: str = "127.0.0.1", port: int = 8686,
          poll_s: float = 2.0, ready: Any = None) -> None:
    """Run the viewer until interrupted (``ready(url)`` is called once it listens)."""
    server = UIServer(index, host, port, poll_s)
    if ready is not None:
        ready(server.url)
    try:
        server.serve_forever(poll_interval=0.25)
    finally:
        server.server_close()
