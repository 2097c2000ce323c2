"""An OTLP trace receiver for fault injection: gRPC (grpcio) and HTTP/protobuf (http.server) on
fixed 127.0.0.1 ports, whose behaviour a test switches at any moment.

Modes: ``ok`` (accept), ``refuse`` (nothing listens: the server is stopped, the port closed),
``429`` / ``503`` (HTTP statuses; over gRPC ``RESOURCE_EXHAUSTED`` / ``UNAVAILABLE``), ``hang``
(the request is held until the mode changes), ``close`` (the connection is closed without an
answer; over gRPC the call is aborted with ``UNAVAILABLE`` after the body was read, the closest
gRPC has).
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections import Counter
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared stub servers
from _servers import LocalServer, QuietHandler  # noqa: E402

MODES = ("ok", "refuse", "429", "503", "hang", "close")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class FaultyReceiver:
    """One protocol's receiver. ``received`` counts every span id accepted (duplicates too)."""

    def __init__(self, protocol: str) -> None:
        assert protocol in ("grpc", "http")
        self.protocol = protocol
        self.port = free_port()
        self.received: Counter[str] = Counter()
        self.requests = 0
        self.request_bytes: list[int] = []
        #: spans whose name is here make their request refused for good (HTTP 400, gRPC
        #: INVALID_ARGUMENT) while the others are accepted: a poison span
        self.refuse_names: set[str] = set()
        #: span ids accepted per HTTP request path (two endpoints on one server)
        self.by_path: dict[str, Counter[str]] = {}
        #: with keep_bodies, the bytes of every accepted request (to look for secrets)
        self.keep_bodies = False
        self.bodies: list[bytes] = []
        self._mode = "ok"
        self._changed = threading.Condition()
        self._server: Any = None
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- control ----------------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return self._mode

    def set_mode(self, mode: str) -> None:
        assert mode in MODES, mode
        with self._changed:
            old, self._mode = self._mode, mode
            self._changed.notify_all()
        if mode == "refuse" and old != "refuse":
            self._stop()
        elif mode != "refuse" and (old == "refuse" or self._server is None):
            self._start()

    def __enter__(self) -> FaultyReceiver:
        self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._changed:
            self._mode = "ok"
            self._changed.notify_all()
        self._stop()

    def ids(self) -> set[str]:
        with self._lock:
            return set(self.received)

    def duplicates(self) -> int:
        with self._lock:
            return sum(n - 1 for n in self.received.values())

    # -- behaviour --------------------------------------------------------------------------------
    def _hold_while_hanging(self) -> None:
        with self._changed:
            while self._mode == "hang":
                self._changed.wait(0.5)

    def _poisoned(self, request: trace_service_pb2.ExportTraceServiceRequest) -> bool:
        names = self.refuse_names
        return bool(names) and any(span.name in names for rs in request.resource_spans
                                   for ss in rs.scope_spans for span in ss.spans)

    def _accept(self, request: trace_service_pb2.ExportTraceServiceRequest, size: int,
                path: str = "") -> None:
        with self._lock:
            if self.keep_bodies:
                self.bodies.append(request.SerializeToString())
            if path:
                counter = self.by_path.setdefault(path, Counter())
                for rs in request.resource_spans:
                    for ss in rs.scope_spans:
                        for span in ss.spans:
                            counter[span.span_id.hex()] += 1
            self.requests += 1
            self.request_bytes.append(size)
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        self.received[span.span_id.hex()] += 1

    # -- servers ----------------------------------------------------------------------------------
    def _start(self) -> None:
        if self._server is not None:
            return
        for _ in range(50):  # the port was just closed: it may take a moment to bind again
            try:
                self._server = self._start_grpc() if self.protocol == "grpc" else self._start_http()
                return
            except (OSError, RuntimeError):
                time.sleep(0.1)
        raise RuntimeError(f"cannot listen on 127.0.0.1:{self.port} again")

    def _stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        if self.protocol == "grpc":
            server.stop(grace=None).wait(5)
        else:
            server.close()

    def _start_grpc(self) -> Any:
        receiver = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                mode = receiver.mode
                if mode == "hang":
                    receiver._hold_while_hanging()
                    mode = receiver.mode
                if mode == "429":
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down")
                if mode in ("503", "close", "refuse"):
                    context.abort(grpc.StatusCode.UNAVAILABLE, "unavailable")
                if receiver._poisoned(request):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused span")
                receiver._accept(request, request.ByteSize())
                return trace_service_pb2.ExportTraceServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                             options=[("grpc.so_reuseport", 0)])
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
        if server.add_insecure_port(f"127.0.0.1:{self.port}") == 0:
            raise OSError("port busy")
        server.start()
        return server

    def _start_http(self) -> Any:
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.read_body()
                mode = receiver.mode
                if mode == "hang":
                    receiver._hold_while_hanging()
                    mode = receiver.mode
                if mode in ("close", "refuse"):
                    self.hang_up()
                    return
                if mode in ("429", "503"):
                    self.reply(int(mode))
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                if receiver._poisoned(request):
                    self.reply(400)
                    return
                receiver._accept(request, len(body), self.path)
                self.reply(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                           "application/x-protobuf")

        return LocalServer(Handler, self.port).start()
