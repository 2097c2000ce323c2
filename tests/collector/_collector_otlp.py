"""Test-side OTLP plumbing: a trace receiver (gRPC and HTTP/protobuf) and a real rotel collector.

Both listen on 127.0.0.1 only, on free ports, and stop when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from otel_verl import _otlp_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared stub servers
from _servers import LocalServer, QuietHandler  # noqa: E402


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout_s}s")


# --- decoding -------------------------------------------------------------------------------------


@dataclass
class Span:
    """A received span as plain values (ids as lowercase hex; parent '' for a root)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int
    events: list[tuple[str, dict[str, Any]]]
    resource: dict[str, Any]
    scope: str


def spans_of(request: trace_service_pb2.ExportTraceServiceRequest) -> list[Span]:
    """The request's spans, decoded by otel_verl's one OTLP/JSON codec."""
    out = []
    for s in _otlp_json.spans_of_request(request):
        out.append(Span(
            name=s["name"],
            trace_id=s["trace_id"],
            span_id=s["span_id"],
            parent_span_id=s["parent_span_id"] or "",
            kind=_otlp_json._KINDS.index(s["kind"]),
            start_ns=s["start_ns"] or 0,
            end_ns=s["end_ns"] or 0,
            attributes=s["attributes"],
            status_code=_otlp_json._STATUS_CODES.index(s["status"]["code"]),
            events=[(e["name"], e["attributes"]) for e in s["events"]],
            resource=s["resource"],
            scope=s["scope"]["name"],
        ))
    return out


# --- receiver -------------------------------------------------------------------------------------


@dataclass
class OtlpReceiver:
    """Collects every ExportTraceServiceRequest it is sent, over gRPC and over HTTP/protobuf."""

    grpc_port: int = 0
    http_port: int = 0
    requests: list[tuple[str, trace_service_pb2.ExportTraceServiceRequest]] = field(
        default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, transport: str, req: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self._lock:
            self.requests.append((transport, req))

    def spans(self) -> list[Span]:
        with self._lock:
            reqs = [r for _, r in self.requests]
        return [s for r in reqs for s in spans_of(r)]

    def transports(self) -> set[str]:
        with self._lock:
            return {t for t, _ in self.requests}

    def wait_for(self, n_spans: int, timeout_s: float = 20.0) -> list[Span]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.spans()
            if len(got) >= n_spans:
                time.sleep(0.3)  # let stragglers (duplicates would be a bug) arrive
                return self.spans()
            time.sleep(0.05)
        return self.spans()


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: OtlpReceiver) -> None:
        self._sink = sink

    def Export(self, request, context):
        self._sink.add("grpc", request)
        return trace_service_pb2.ExportTraceServiceResponse()


def _http_handler(sink: OtlpReceiver) -> type[QuietHandler]:
    class Handler(QuietHandler):
        protocol_version = "HTTP/1.0"  # one request per connection, as before the shared stub

        def do_POST(self) -> None:
            body = self.read_body(decompress=True)
            if self.path.rstrip("/") != "/v1/traces":
                self.send_error(404)
                return
            if "json" in (self.headers.get("Content-Type") or ""):
                self.send_error(415, "test receiver takes protobuf only")
                return
            req = trace_service_pb2.ExportTraceServiceRequest()
            req.ParseFromString(body)
            sink.add("http", req)
            self.reply(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                       "application/x-protobuf")

    return Handler


@contextlib.contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    sink = OtlpReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(sink), server)
    sink.grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    httpd = LocalServer(_http_handler(sink)).start()
    sink.http_port = httpd.port
    try:
        yield sink
    finally:
        httpd.close()
        server.stop(grace=None)


# --- rotel ----------------------------------------------------------------------------------------


def rotel_binary() -> str:
    """Path of the rotel collector binary shipped in the `rotel` wheel."""
    import rotel

    path = Path(rotel.__file__).parent / "rotel-agent"
    if not path.exists():
        found = shutil.which("rotel-agent")
        if not found:
            raise FileNotFoundError("rotel-agent binary not found (pip install rotel==0.0.1a15)")
        return found
    return str(path)


@dataclass
class Rotel:
    grpc_port: int
    http_port: int
    log_file: Path
    proc: subprocess.Popen[bytes]

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


@contextlib.contextmanager
def rotel_collector(tmp: Path, *, forward_to: str, forward_protocol: str) -> Iterator[Rotel]:
    """Start rotel on 127.0.0.1 (free gRPC and HTTP ports) forwarding traces over OTLP.

    Args:
        tmp: directory for its pid and log files.
        forward_to: the next hop, e.g. ``http://127.0.0.1:PORT``.
        forward_protocol: ``grpc`` or ``http``.
    """
    grpc_port, http_port = free_port(), free_port()
    log_file = tmp / "rotel.log"
    cmd = [
        rotel_binary(), "start",
        "--otlp-grpc-endpoint", f"127.0.0.1:{grpc_port}",
        "--otlp-http-endpoint", f"127.0.0.1:{http_port}",
        # the default (4 MiB) would refuse batches with chat-sized payloads
        "--otlp-grpc-max-recv-msg-size-mib", "64",
        "--exporter", "otlp",
        "--otlp-exporter-endpoint", forward_to,
        "--otlp-exporter-protocol", forward_protocol,
        "--batch-timeout", "50ms",
        "--pid-file", str(tmp / "rotel.pid"),
        "--log-file", str(log_file),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTEL_")}
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    rotel = Rotel(grpc_port, http_port, log_file, proc)
    try:
        try:
            wait_port(grpc_port)
            wait_port(http_port)
        except TimeoutError:
            raise RuntimeError(f"rotel did not start: {rotel.log()}") from None
        yield rotel
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
