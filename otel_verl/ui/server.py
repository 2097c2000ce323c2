"""``otel-verl ui``: the local web viewer (a JSON API over the index, one static page).

Why the standard library's ``http.server`` and not a web framework: the viewer is a dozen GET
routes answering JSON for one local user; a ``ThreadingHTTPServer`` does that with no dependency,
starts instantly and has nothing to configure. Rendering happens in the browser (``static/app.js``,
which builds the page with DOM calls only: text from the store is set as text, never parsed as
HTML). The server binds to 127.0.0.1 unless told otherwise, answers GET only, sends a strict
Content-Security-Policy, and reads nothing but the store and its own static files.

Serving (see docs/ui.md, "Serving and security"):

- **Host check** (against DNS rebinding: a page on ``evil.example`` whose name is made to resolve
  to 127.0.0.1 would otherwise read the traces as same-origin). A request is answered only when
  its ``Host`` names this viewer: ``localhost`` (or ``*.localhost``), any IP address (rebinding
  needs a name), the name given as the listening host, this machine's own names when listening
  beyond loopback, or a name allowed explicitly (``allowed_hosts``, ``--allow-host``; ``*``
  allows every name, for a trusted proxy). The port is not compared, so ``ssh -L 9000:...`` works.
  Anything else gets 403 with no data.
- **Connections**: a listen backlog of ``request_queue_size``; at most ``max_connections`` handler
  threads (more connections wait in the backlog); a connection idle for ``idle_timeout_s`` is
  closed; while three quarters of the threads are busy, each answer closes its connection, so idle
  keep-alive connections never starve new ones.
- **Query parameters** are checked: a number out of its range, or not a number, is answered 400
  with a short message naming the parameter. An internal error is answered 500 without its text
  (the text goes to the log).
"""

from __future__ import annotations

import inspect
import ipaddress
import json
import logging
import math
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from otel_verl.ui import assets, views
from otel_verl.ui.views import (
    Source,
    group_view,
    live_view,
    overview_view,
    prompt_view,
    trajectory_view,
)

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


_INT64 = (-(2**63), 2**63 - 1)
#: the range of each integer query parameter (page * page_size stays an int64 offset)
_INT_RANGES = {"step": _INT64, "sample_index": _INT64, "rollout_n": _INT64,
               "page": (0, 10**12), "page_size": (1, 10**6)}
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


class _BadParameter(ValueError):
    """A query parameter the viewer cannot use; answered 400 with this (short) message."""


def _view_errors() -> tuple[type[Exception], ...]:
    """The views' own "bad input" exception, when the views module defines one."""
    found = getattr(views, "BadRequest", None)
    return (found,) if isinstance(found, type) and issubclass(found, ValueError) else ()


def _int(query: dict[str, str], key: str) -> int | None:
    value = query.get(key, "").strip()
    if value == "":
        return None
    low, high = _INT_RANGES.get(key, _INT64)
    expected = f"{key}: an integer from {low} to {high}"
    if len(value) > 40:  # int() of a long string costs quadratic time; no valid value is this long
        raise _BadParameter(expected)
    try:
        number = int(value)
    except ValueError:
        raise _BadParameter(expected) from None
    if not low <= number <= high:
        raise _BadParameter(expected)
    return number


def _float(query: dict[str, str], key: str) -> float | None:
    value = query.get(key, "").strip()
    if value == "":
        return None
    try:
        number = float(value) if len(value) <= 64 else math.nan
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise _BadParameter(f"{key}: a finite number")
    return number


def _bool(query: dict[str, str], key: str) -> bool | None:
    value = query.get(key, "").strip().lower()
    if value == "":
        return None
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise _BadParameter(f"{key}: true or false")


def api(index: Source, route: str, query: dict[str, str]) -> Any:
    """Answer one API route (the same answers the report embeds). None = not found."""
    experiment = query.get("experiment") or None
    if route == "meta":
        return {"generation": index.generation, "problems": index.problems(),
                "experiments": index.experiments(), "store": os.path.abspath(index.trace_dir),
                "mode": "server"}
    if route == "overview":
        return overview_view(index, experiment)
    if route == "trajectories":
        flag: dict[str, Any] = {"flag": query["flag"]} if query.get("flag") else {}
        if flag and "flag" not in inspect.signature(index.trajectories).parameters:
            raise _BadParameter("the flag filter reads the lake (pip install 'otel-verl[lake]')")
        trajectories: Any = index.trajectories  # the lake's takes ``flag`` (docs/signals.md)
        return trajectories(
            experiment=experiment, step=_int(query, "step"),
            sample_index=_int(query, "sample_index"), rollout_n=_int(query, "rollout_n"),
            validate=_bool(query, "validate"), reward_min=_float(query, "reward_min"),
            reward_max=_float(query, "reward_max"), errors_only=_bool(query, "errors") or False,
            text=query.get("text") or None, trace_id=query.get("trace") or None,
            order=query.get("order", "start_ns"), descending=_bool(query, "desc") or False,
            page=_int(query, "page") or 0, page_size=_int(query, "page_size") or 50, **flag)
    if route == "trajectory":
        return trajectory_view(index, query.get("key", ""))
    if route == "group":
        return group_view(index, experiment, _int(query, "step"), _int(query, "sample_index"),
                          _bool(query, "validate"))
    if route == "live":  # the workers' live files (docs/live.md), not the index
        from otel_verl.store import live_board

        return live_view(live_board(index.trace_dir))
    if route == "prompt":
        sample = _int(query, "sample_index")
        return None if sample is None else prompt_view(index, experiment, sample,
                                                        _bool(query, "validate"))
    return None


def _host_name(header: str) -> str | None:
    """The host name of a ``Host`` header (lower case, no port, no trailing dot); None if bad."""
    value = header.strip().lower()
    if value.startswith("["):  # [v6]:port
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1:]
        port = rest.removeprefix(":") if rest.startswith(":") or not rest else None
    else:
        name, _, port = value.partition(":")
        if ":" in port:
            return None  # a bare IPv6 address is not a valid Host
    if port is None or (port and not port.isdigit()) or not name:
        return None
    return name.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _allowed_names(host: str, extra: Iterable[str]) -> frozenset[str]:
    """The host names a request may use to reach a viewer listening on ``host``."""
    names = {"localhost", *(name.strip().lower().rstrip(".") for name in extra)}
    if not _is_ip(host) and host:
        names.add(host.lower().rstrip("."))
    loopback = host == "localhost" or (_is_ip(host) and ipaddress.ip_address(host).is_loopback)
    if not loopback:  # reachable from elsewhere: this machine's own names too
        for name in (socket.gethostname(), socket.getfqdn()):
            if name:
                names.add(name.lower().rstrip("."))
                names.add(name.lower().split(".")[0])
    return frozenset(names)


class _Handler(BaseHTTPRequestHandler):
    server: UIServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # per socket operation: a connection idle this long (before or between requests) ends
        self.connection.settimeout(self.server.idle_timeout_s)

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
        if self.server.busy():  # free this thread for the connections waiting in the backlog
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, dumps({"error": message}).encode(), "application/json; charset=utf-8")

    def _host_ok(self) -> bool:
        """Whether the request names this viewer (else it is answered 403 here)."""
        hosts = self.headers.get_all("Host") or []
        name = _host_name(hosts[0]) if len(hosts) == 1 else None
        if name is not None and self.path.startswith("/") and self.server.host_allowed(name):
            return True
        self._error(HTTPStatus.FORBIDDEN, "this viewer does not answer to that Host; open it at "
                    "its own address, or start it with --allow-host NAME")
        self.close_connection = True
        return False

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        try:
            if self._host_ok():
                self._route()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception:  # one bad request must not stop the viewer
            _logger.exception("ui: %s failed", self.path)
            try:
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR,
                            "internal error (the viewer's log has the details)")
            except OSError:
                self.close_connection = True

    def _route(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        path = url.path
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
        elif path in ("/export.jsonl", "/export.parquet"):  # the table's rows as a dataset
            from otel_verl.store import export_file

            try:
                body, _ = export_file(self.server.index.trace_dir,
                                      dict(urllib.parse.parse_qsl(url.query)),
                                      path.rsplit(".", 1)[1])
            except (ValueError, ImportError) as error:
                self._error(HTTPStatus.BAD_REQUEST, str(error)[:200] or "bad request")
                return
            self._send(HTTPStatus.OK, body, "application/x-ndjson" if path.endswith(".jsonl")
                       else "application/vnd.apache.parquet")
        elif path.startswith("/api/"):
            query = dict(urllib.parse.parse_qsl(url.query))
            self.server.refresh()
            try:
                answer = api(self.server.index, path.removeprefix("/api/"), query)
            except _BadParameter as error:
                self._error(HTTPStatus.BAD_REQUEST, str(error))
                return
            except _view_errors() as error:
                self._error(HTTPStatus.BAD_REQUEST, str(error)[:200] or "bad request")
                return
            if answer is None:
                self._error(HTTPStatus.NOT_FOUND, "not found")
            else:
                self._send(HTTPStatus.OK, dumps(answer).encode(),
                           "application/json; charset=utf-8")
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain")

    def _refuse(self) -> None:
        if self._host_ok():
            self._send(HTTPStatus.METHOD_NOT_ALLOWED, b"read-only viewer", "text/plain")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse


class UIServer(ThreadingHTTPServer):
    """The viewer's HTTP server; re-reads the store's new lines at most every ``poll_s``.

    Args:
        index: the store's index.
        host: the address to listen on (127.0.0.1: this machine only).
        port: the port (0: any free one).
        poll_s: seconds between looks for new spans.
        idle_timeout_s: a connection that sends or accepts nothing for this long is closed.
        max_connections: handler threads at most; further connections wait in the backlog.
        allowed_hosts: ``Host`` names accepted beside the viewer's own (``*``: any name).
    """

    daemon_threads = True
    request_queue_size = 1024  # the listen backlog (the kernel caps it at net.core.somaxconn)

    def __init__(self, index: Source, host: str = "127.0.0.1", port: int = 8686,
                 poll_s: float = 2.0, *, idle_timeout_s: float = 30.0,
                 max_connections: int = 64, allowed_hosts: Iterable[str] = ()) -> None:
        super().__init__((host, port), _Handler)
        self.index = index
        self.poll_s = poll_s
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max(1, max_connections)
        extra = list(allowed_hosts)
        self._any_host = "*" in extra
        self._names = _allowed_names(host, [name for name in extra if name != "*"])
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._in_use = 0
        self._count_lock = threading.Lock()
        self._stopping = False
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def host_allowed(self, name: str) -> bool:
        """Whether a request whose ``Host`` names ``name`` (lower case, no port) is answered."""
        return (self._any_host or name in self._names or name.endswith(".localhost")
                or _is_ip(name))

    def busy(self) -> bool:
        """Three quarters of the handler threads or more are taken."""
        return self._in_use * 4 >= self.max_connections * 3

    def process_request(self, request: Any, client_address: Any) -> None:
        while not self._slots.acquire(timeout=0.25):  # wait for a free thread; the backlog holds
            if self._stopping:                        # the connections meanwhile
                self.shutdown_request(request)
                return
        with self._count_lock:
            self._in_use += 1
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def _release(self) -> None:
        with self._count_lock:
            self._in_use -= 1
        self._slots.release()

    def shutdown(self) -> None:
        self._stopping = True
        super().shutdown()

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
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}/"


def serve(index: Source, host: str = "127.0.0.1", port: int = 8686,
          poll_s: float = 2.0, ready: Any = None, *, idle_timeout_s: float = 30.0,
          max_connections: int = 64, allowed_hosts: Iterable[str] = ()) -> None:
    """Run the viewer until interrupted (``ready(url)`` is called once it listens).

    The keyword arguments are :class:`UIServer`'s.
    """
    server = UIServer(index, host, port, poll_s, idle_timeout_s=idle_timeout_s,
                      max_connections=max_connections, allowed_hosts=allowed_hosts)
    if ready is not None:
        ready(server.url)
    try:
        server.serve_forever(poll_interval=0.25)
    finally:
        server.server_close()
