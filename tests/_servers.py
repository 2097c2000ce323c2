"""Stub HTTP servers for the tests, in one place: a quiet request handler and a local server.

Every tier's stubs (the engine stub, the OTLP/HTTP receivers, the Weave recorder and shim) are a
``ThreadingHTTPServer`` on 127.0.0.1 serving from a daemon thread, with a handler that answers
HTTP/1.1, logs nothing, reads a body of ``Content-Length`` bytes and writes a reply with its
length. Those parts live here; each stub keeps only what it answers.

Usage (a plain module: tests run with ``--import-mode=importlib``, so a stub puts ``tests/`` on
``sys.path`` first)::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
    from _servers import LocalServer, QuietHandler

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.reply(200, self.read_body(), "application/json")

    with LocalServer(Handler) as server:
        requests.post(server.url, json={})
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["LocalServer", "QuietHandler"]


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that speaks HTTP/1.1 (keep-alive), logs nothing and writes whole replies."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes

    def log_message(self, *args: Any) -> None:
        pass

    def read_body(self, *, decompress: bool = False) -> bytes:
        """The request body (``Content-Length`` bytes); with ``decompress``, gzip/deflate undone
        as ``Content-Encoding`` says."""
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if decompress:
            encoding = (self.headers.get("Content-Encoding") or "").lower()
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
        return body

    def reply(self, status: int, body: bytes = b"", content_type: str | None = None,
              headers: dict[str, str] | None = None) -> None:
        """Answer ``status`` with ``body`` (and its ``Content-Length``)."""
        self.send_response(status)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def hang_up(self) -> None:
        """Close the connection without an answer (a server that died mid-request)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class LocalServer:
    """``handler`` served on 127.0.0.1 (``port`` 0: any free port) from a daemon thread.

    A context manager (or ``start()``/``close()``); ``url`` and ``port`` are known from the
    start. ``poll_interval`` bounds how long ``close()`` waits for the serving loop.
    """

    def __init__(self, handler: type[BaseHTTPRequestHandler], port: int = 0, *,
                 poll_interval: float = 0.05) -> None:
        self.httpd = _Server(("127.0.0.1", port), handler)
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        kwargs={"poll_interval": poll_interval}, daemon=True)

    def start(self) -> LocalServer:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
