"""Weave's own trace server (weave 0.52.42 SqliteTraceServer behind its ExternalTraceServer
adapter, as the hosted service layers them) behind a small HTTP shim on 127.0.0.1.

The shim does what the hosted HTTP layer does for the routes the exporter uses: checks the Basic
auth header, validates the body with weave's own request model (``tsi.CallsUpsertCompleteReq``),
checks that every call's ``project_id`` matches the URL, and hands the request to the real server
method. Also the eager routes (``/v2/{entity}/{project}/call/start`` and ``.../call/end``:
``call_start_v2`` / ``call_end_v2``, a call started before it ends); a server error is answered
as weave's error registry says (a duplicate call id: 409). It can also inject faults (a list of statuses to answer before serving normally).
"""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pydantic
from weave.trace_server import trace_server_interface as tsi
from weave.trace_server.external_to_internal_trace_server_adapter import (
    ExternalTraceServer,
    IdConverter,
)
from weave.trace_server.sqlite_trace_server import SqliteTraceServer

_COMPLETE = re.compile(r"^/v2/([^/]+)/([^/]+)/calls/complete$")
#: the eager routes Weave's own client uses for a call started before it ends
_EAGER = re.compile(r"^/v2/([^/]+)/([^/]+)/call/(start|end)$")
_OTEL = "/otel/v1/traces"


class B64IdConverter(IdConverter):
    """External ids <-> internal ids, reversible (the hosted service maps names to ids)."""

    def ext_to_int_project_id(self, project_id: str) -> str:
        return base64.b64encode(project_id.encode()).decode()

    def int_to_ext_project_id(self, project_id: str) -> str | None:
        return base64.b64decode(project_id.encode()).decode()

    def ext_to_int_run_id(self, run_id: str) -> str:
        return "run:" + run_id

    def int_to_ext_run_id(self, run_id: str) -> str:
        return run_id.removeprefix("run:")

    def ext_to_int_user_id(self, user_id: str) -> str:
        return user_id

    def int_to_ext_user_id(self, user_id: str) -> str:
        return user_id


def make_server(db_path: str) -> ExternalTraceServer:
    internal = SqliteTraceServer(db_path)
    internal.drop_tables()
    internal.setup_tables()
    return ExternalTraceServer(internal, B64IdConverter())


class WeaveShim:
    """HTTP front for a trace server object. Use as a context manager."""

    def __init__(self, server: Any, api_key: str) -> None:
        self.server = server
        self.api_key = api_key
        self.expected_auth = "Basic " + base64.b64encode(f"api:{api_key}".encode()).decode()
        self.faults: list[int] = []  # statuses to answer (in order) before serving normally
        self.requests: list[dict[str, Any]] = []  # path, auth, n calls, status
        self._lock = threading.Lock()
        shim = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                if self.path == _OTEL:
                    try:
                        status, body = shim._handle_otel(self.headers, raw)
                    except Exception as exc:  # the server's own error: a 500, as hosted
                        shim.requests.append({"path": _OTEL, "status": 500, "error": repr(exc)})
                        status, body = 500, b""
                    self.send_response(status)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                status, doc = shim._handle(self.path, self.headers.get("Authorization"), raw)
                self._answer(status, doc)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # a short poll: shutdown() waits for it (0.5 s by default, per test)
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def _handle(self, path: str, auth: str | None, raw: bytes) -> tuple[int, Any]:
        record: dict[str, Any] = {"path": path, "auth_ok": auth == self.expected_auth, "bytes": len(raw)}
        with self._lock:
            self.requests.append(record)
            fault = self.faults.pop(0) if self.faults else None
        if fault is not None:
            record["status"] = fault
            return fault, {"reason": "injected fault"}
        if auth != self.expected_auth:
            record["status"] = 401
            return 401, {"reason": "bad auth"}
        eager = _EAGER.match(path)
        if eager:
            return self._handle_eager(record, eager, raw)
        m = _COMPLETE.match(path)
        if not m:
            record["status"] = 404
            return 404, {"reason": f"no route {path}"}
        try:
            req = tsi.CallsUpsertCompleteReq.model_validate_json(raw)
        except pydantic.ValidationError as exc:
            record["status"] = 400
            return 400, {"reason": str(exc)[:2000]}
        project_id = f"{m.group(1)}/{m.group(2)}"
        record["calls"] = len(req.batch)
        if any(item.project_id != project_id for item in req.batch):
            record["status"] = 400
            return 400, {"reason": "project_id does not match the URL"}
        with self._lock:  # sqlite server: one writer at a time
            failed = self._serve(record, self.server.calls_complete, req)
        if failed is not None:
            return failed
        record["status"] = 200
        return 200, {}

    def _serve(self, record: dict[str, Any], method: Any, req: Any) -> tuple[int, Any] | None:
        """Call the server; an error answered as weave's own error registry says, except a
        duplicate call id (SQLite's UNIQUE constraint on ``calls.id``, which weave does not
        register: 500 there), answered 409 Conflict here. The failed transaction is rolled
        back (the connection is this thread's; a keep-alive connection's next request would
        otherwise commit what the failed one had inserted)."""
        import sqlite3

        from weave.trace_server.errors import ErrorRegistry
        from weave.trace_server.sqlite_trace_server import get_conn_cursor

        try:
            method(req)
            return None
        except Exception as exc:
            internal = getattr(self.server, "_internal_trace_server", None)
            if internal is not None and hasattr(internal, "db_path"):
                get_conn_cursor(internal.db_path)[0].rollback()
            if isinstance(exc, sqlite3.IntegrityError) and "calls.id" in str(exc):
                status, doc = 409, {"reason": f"call already exists: {exc}"}
            else:
                answer = ErrorRegistry().handle_exception(exc)
                status, doc = answer.status_code, answer.message
            record["status"] = status
            record["error"] = repr(exc)
            return status, doc

    def _handle_eager(self, record: dict[str, Any], m: re.Match[str], raw: bytes
                      ) -> tuple[int, Any]:
        """``/v2/{entity}/{project}/call/start`` and ``.../call/end`` (weave's
        ``call_start_v2`` / ``call_end_v2``), validated with weave's own request models."""
        kind = m.group(3)
        model = tsi.CallStartV2Req if kind == "start" else tsi.CallEndV2Req
        try:
            req = model.model_validate_json(raw)
        except pydantic.ValidationError as exc:
            record["status"] = 400
            return 400, {"reason": str(exc)[:2000]}
        item = req.start if kind == "start" else req.end
        record["calls"] = 1
        record["kind"] = kind
        record["id"] = item.id
        if item.project_id != f"{m.group(1)}/{m.group(2)}":
            record["status"] = 400
            return 400, {"reason": "project_id does not match the URL"}
        method = self.server.call_start_v2 if kind == "start" else self.server.call_end_v2
        with self._lock:
            failed = self._serve(record, method, req)
        if failed is not None:
            return failed
        record["status"] = 200
        if kind == "start":
            return 200, {"id": item.id, "trace_id": getattr(item, "trace_id", None)}
        return 200, {}

    def _handle_otel(self, headers: Any, raw: bytes) -> tuple[int, bytes]:
        """Weave's OTel ingestion route as the hosted service fronts it: auth by the
        ``wandb-api-key`` header (or Basic), project from the ``project_id`` header (or the
        ``wandb.entity`` / ``wandb.project`` resource attributes), protobuf body handed to the
        server's own ``otel_export`` (its span -> call mapping)."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        record: dict[str, Any] = {"path": _OTEL, "bytes": len(raw)}
        with self._lock:
            self.requests.append(record)
        key_ok = headers.get("wandb-api-key") == self.api_key
        if not (key_ok or headers.get("Authorization") == self.expected_auth):
            record["status"] = 401
            return 401, b""
        req = ExportTraceServiceRequest()
        req.ParseFromString(raw)
        project_id = headers.get("project_id")
        processed = []
        for rs in req.resource_spans:
            res = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
            pid = project_id or f"{res.get('wandb.entity')}/{res.get('wandb.project')}"
            entity, _, project = pid.partition("/")
            processed.append(tsi.ProcessedResourceSpans(
                entity=entity, project=project, run_id=None, resource_spans=rs))
        if not processed:
            return 200, ExportTraceServiceResponse().SerializeToString()
        with self._lock:
            res_doc = self.server.otel_export(tsi.OTelExportReq(
                project_id=project_id or f"{processed[0].entity}/{processed[0].project}",
                processed_spans=processed))
        record["status"] = 200
        record["partial_success"] = res_doc.partial_success
        return 200, ExportTraceServiceResponse().SerializeToString()

    def __enter__(self) -> WeaveShim:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- query helpers (Weave's own query API) ----------------------------------------------------
    def calls(self, project_id: str, **filter_and_query: Any) -> list[tsi.CallSchema]:
        flt = {k: v for k, v in filter_and_query.items() if k != "query"}
        req = tsi.CallsQueryReq(
            project_id=project_id,
            filter=tsi.CallsFilter(**flt) if flt else None,
            query=tsi.Query(**{"$expr": filter_and_query["query"]})
            if "query" in filter_and_query
            else None,
        )
        return list(self.server.calls_query(req).calls)
