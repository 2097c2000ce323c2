"""A tiny OTLP/HTTP trace receiver on 127.0.0.1 (for engine spans in the demo and the tests).

Usage::

    with OTLPReceiver() as receiver:                       # or OTLPReceiver(store_dir="traces")
        receiver.traces_url  # "http://127.0.0.1:<port>/v1/traces" -> give it to vLLM
        ...
        spans = receiver.wait_for(lambda spans: any(s["name"] == "llm_request" for s in spans))

Accepts ``POST /v1/traces`` with an ``ExportTraceServiceRequest`` in protobuf
(``application/x-protobuf``, optionally gzip) or OTLP/JSON (``application/json``), answers an empty
``ExportTraceServiceResponse``. Received spans are kept in memory as plain dicts (the same shape
``otel_verl.store.read_spans`` yields: ``name, trace_id, span_id, parent_span_id, kind, start_ns,
end_ns, attributes, status, events, resource, scope``) and, with ``store_dir``, appended to a file
of the local store as OTLP/JSON lines (``otel_verl-engine-<host>-<pid>.jsonl``), so engine spans
sit next to the rollout's own spans and ``otel-verl traces`` shows them in the same trace.

Standard library HTTP server in a daemon thread; only ``opentelemetry-proto`` is needed.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_verl._otlp_json import otlp_json_to_request, request_to_otlp_json, spans_of_request

__all__ = ["OTLPReceiver", "joined_spans_only", "request_to_otlp_json"]


def _plain_spans(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    """The request's spans as the local store's span dicts (the one codec)."""
    return spans_of_request(request)


def joined_spans_only(span: dict[str, Any]) -> bool:
    """A ``span_filter`` keeping the request spans an engine made as a child of a caller's span.

    That is: kind SERVER with a remote parent (the OTLP flags say so; senders that do not set
    the flags: SERVER with any parent). It drops what an engine traces on its own — vLLM's
    start-up spans (INTERNAL, even when parented across its own processes) and the requests of
    untraced trajectories (no parent) — so the store holds only engine spans of trajectories.
    """
    if span.get("kind") != "SERVER" or span.get("parent_span_id") is None:
        return False
    return span.get("parent_is_remote") is not False


def _filtered(
    request: ExportTraceServiceRequest, keep: Callable[[dict[str, Any]], bool]
) -> tuple[ExportTraceServiceRequest, list[dict[str, Any]]]:
    """``request`` reduced to the spans ``keep`` accepts (empty containers removed)."""
    out = ExportTraceServiceRequest()
    kept_all: list[dict[str, Any]] = []
    for rs in request.resource_spans:
        new_rs = None
        for ss in rs.scope_spans:
            new_ss = None
            for span in ss.spans:
                one = ExportTraceServiceRequest()
                one_rs = one.resource_spans.add()
                one_rs.resource.CopyFrom(rs.resource)
                one_ss = one_rs.scope_spans.add()
                one_ss.scope.CopyFrom(ss.scope)
                one_ss.spans.add().CopyFrom(span)
                (plain,) = _plain_spans(one)
                if not keep(plain):
                    continue
                kept_all.append(plain)
                if new_rs is None:
                    new_rs = out.resource_spans.add()
                    new_rs.resource.CopyFrom(rs.resource)
                    new_rs.schema_url = rs.schema_url
                if new_ss is None:
                    new_ss = new_rs.scope_spans.add()
                    new_ss.scope.CopyFrom(ss.scope)
                    new_ss.schema_url = ss.schema_url
                new_ss.spans.add().CopyFrom(span)
    return out, kept_all


class OTLPReceiver:
    """See the module docstring.

    Args:
        port: TCP port on 127.0.0.1 (0 = any free one).
        store_dir: also append the spans to the local store there.
        span_filter: keep only the spans (plain dicts) it accepts, e.g. ``joined_spans_only``.
    """

    def __init__(
        self,
        port: int = 0,
        *,
        store_dir: str | os.PathLike[str] | None = None,
        span_filter: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.span_filter = span_filter
        self._lock = threading.Condition()
        self._spans: list[dict[str, Any]] = []
        self.requests = 0
        self.errors: list[str] = []
        self.store_dir = Path(store_dir) if store_dir is not None else None
        self.store_file: Path | None = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                try:
                    if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                        body = gzip.decompress(body)
                    if self.path.rstrip("/") != "/v1/traces":
                        self._answer(404, b"", "text/plain")
                        return
                    ctype = (self.headers.get("Content-Type") or "").lower()
                    request = ExportTraceServiceRequest()
                    if "json" in ctype:
                        otlp_json_to_request(json.loads(body), request)
                    else:
                        request.ParseFromString(body)
                    receiver._accept(request)
                except Exception as exc:  # a bad request must not kill the receiver
                    receiver.errors.append(repr(exc))
                    self._answer(400, str(exc).encode(), "text/plain")
                    return
                if "json" in ctype:
                    self._answer(200, b"{}", "application/json")
                else:
                    payload = ExportTraceServiceResponse().SerializeToString()
                    self._answer(200, payload, "application/x-protobuf")

            def _answer(self, code: int, payload: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:  # quiet
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def traces_url(self) -> str:
        return f"{self.endpoint}/v1/traces"

    def start(self) -> OTLPReceiver:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever, args=(0.05,), name="otlp-receiver",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- data ----------------------------------------------------------------------------------
    def _accept(self, request: ExportTraceServiceRequest) -> None:
        if self.span_filter is not None:
            request, spans = _filtered(request, self.span_filter)
        else:
            spans = _plain_spans(request)
        if self.store_dir is not None and spans:
            line = json.dumps(request_to_otlp_json(request), separators=(",", ":"))
            with self._lock:
                if self.store_file is None:
                    self.store_dir.mkdir(parents=True, exist_ok=True)
                    name = f"otel_verl-engine-{socket.gethostname()}-{os.getpid()}.jsonl"
                    self.store_file = self.store_dir / name
                with open(self.store_file, "a", encoding="utf-8") as fh:
                    fh.write(line + "\n")
        with self._lock:
            self.requests += 1
            self._spans.extend(spans)
            self._lock.notify_all()

    def spans(self) -> list[dict[str, Any]]:
        """A copy of every span received so far."""
        with self._lock:
            return list(self._spans)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 30.0
    ) -> list[dict[str, Any]]:
        """Wait until ``predicate(spans)`` holds; returns the spans (raises TimeoutError)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not predicate(list(self._spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"OTLP receiver: condition not met after {timeout_s}s "
                        f"({len(self._spans)} spans, {self.requests} requests)"
                    )
                self._lock.wait(timeout=min(left, 0.5))
            return list(self._spans)
