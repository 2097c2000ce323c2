"""HTTP transport: one keep-alive connection, retries with backoff, every wait bounded.

Stdlib only (``http.client``). ``send`` retries 429 / 5xx / connection errors with exponential
backoff and jitter (honouring ``Retry-After``) until its deadline; ``abort`` (from another thread)
cuts a request in flight and any backoff wait, which is what keeps ``shutdown`` bounded even when
the server never answers.
"""

from __future__ import annotations

import base64
import http.client
import logging
import os
import random
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass

_log = logging.getLogger("otel_weave_exporter")

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
USER_AGENT = "otel-weave-exporter/0.1"


@dataclass(frozen=True)
class SendResult:
    ok: bool
    status: int | None  # last HTTP status, None when no answer came
    attempts: int
    error: str = ""
    too_large: bool = False  # 413: the caller may split and retry
    rejected: bool = False  # 400 / 422: the body was refused; one bad call may be the cause


def basic_auth(api_key: str) -> str:
    """Weave's auth header value: Basic base64("api:" + key)."""
    return "Basic " + base64.b64encode(f"api:{api_key}".encode()).decode("ascii")


class HttpSender:
    """POSTs JSON bodies to one base URL; not thread-safe (the exporter serialises calls)."""

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        *,
        request_timeout_s: float = 10.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 8.0,
    ) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"Weave trace server URL must be http(s)://host[:port][/path], got {base_url!r}")
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = parsed.port
        self._prefix = parsed.path.rstrip("/")
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
            **headers,
        }
        self.request_timeout_s = request_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._conn: http.client.HTTPConnection | None = None
        self._aborted = threading.Event()
        self._ssl: ssl.SSLContext | None = None

    # -- connection -------------------------------------------------------------------------------
    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._https:
                if self._ssl is None:
                    cafile = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE")
                    self._ssl = ssl.create_default_context(cafile=cafile or None)
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=timeout, context=self._ssl
                )
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            self._conn.connect()
            # headers and body go out in two writes: without TCP_NODELAY the body waits for the
            # server's delayed ACK (~40 ms per request on Linux), which caps the export rate
            sock = self._conn.sock
            if sock is not None:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
        else:
            self._conn.timeout = timeout
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout)
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def abort(self) -> None:
        """Cut any request in flight and any backoff wait; later sends fail at once."""
        self._aborted.set()
        conn = self._conn
        sock = getattr(conn, "sock", None) if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- requests ---------------------------------------------------------------------------------
    def _post_once(self, path: str, body: bytes, timeout: float) -> tuple[int, str, str | None]:
        conn = self._connect(timeout)
        try:
            conn.request("POST", self._prefix + path, body=body, headers=self._headers)
            resp = conn.getresponse()
            text = resp.read(4096).decode("utf-8", "replace")
            # drain the rest so the connection can be reused
            while resp.read(65536):
                pass
            retry_after = resp.getheader("Retry-After")
            if resp.will_close:
                self.close()
            return resp.status, text, retry_after
        except BaseException:
            self.close()
            raise

    def send(self, path: str, body: bytes, deadline: float) -> SendResult:
        """POST ``body`` until success, a non-retryable answer, abort, or ``deadline`` (monotonic)."""
        attempt = 0
        status: int | None = None
        error = ""
        stale_retried = False
        while True:
            if self._aborted.is_set():
                return SendResult(False, status, attempt, error or "aborted")
            remaining = deadline - time.monotonic()
            if remaining <= 0.001:
                return SendResult(False, status, attempt, error or "deadline passed")
            attempt += 1
            retry_after: str | None = None
            reused = self._conn is not None
            try:
                status, text, retry_after = self._post_once(
                    path, body, min(self.request_timeout_s, remaining)
                )
            except (OSError, http.client.HTTPException) as exc:
                status, error = None, f"{type(exc).__name__}: {exc}"
                if reused and not stale_retried and not self._aborted.is_set():
                    # the server closed an idle keep-alive connection: reconnect at once
                    stale_retried = True
                    continue
            else:
                if 200 <= status < 300:
                    return SendResult(True, status, attempt)
                error = f"HTTP {status}: {text[:300]}"
                if status == 413:
                    return SendResult(False, status, attempt, error, too_large=True)
                if status in (400, 422):
                    return SendResult(False, status, attempt, error, rejected=True)
                if status not in RETRYABLE_STATUS:
                    return SendResult(False, status, attempt, error)
            delay = min(self.backoff_max_s, self.backoff_initial_s * (2 ** (attempt - 1)))
            delay *= random.uniform(0.5, 1.0)
            if retry_after:
                try:
                    delay = max(delay, min(float(retry_after), self.backoff_max_s))
                except ValueError:
                    pass
            delay = min(delay, deadline - time.monotonic())
            _log.debug("weave export attempt %d failed (%s); retrying in %.2fs", attempt, error, delay)
            if delay > 0 and self._aborted.wait(delay):
                return SendResult(False, status, attempt, error or "aborted")
