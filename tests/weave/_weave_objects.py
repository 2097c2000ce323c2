"""Weave's object routes on the weave tier's HTTP shim: ``/obj/create`` (what the Weave client's
``RemoteHTTPTraceServer.obj_create`` posts), plus read-back helpers over the server's own API.

Like ``/v2/{entity}/{project}/calls/complete`` in ``_weave_server.WeaveShim``: Basic auth checked,
the body validated with weave's own request model (``tsi.ObjCreateReq``), handed to the real
server method (``ExternalTraceServer`` over ``SqliteTraceServer``: the hosted layering, so refs are
converted between external and internal project ids as the hosted service does).
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pydantic
from _weave_server import WeaveShim, make_server
from weave.trace_server import trace_server_interface as tsi

OBJ_CREATE = "/obj/create"


class WeaveObjectsShim(WeaveShim):
    """``WeaveShim`` that also serves ``/obj/create``; ``db_path`` is the server's sqlite file."""

    def __init__(self, db_path: str, api_key: str) -> None:
        super().__init__(make_server(db_path), api_key)
        self.db_path = db_path

    def _handle(self, path: str, auth: str | None, raw: bytes) -> tuple[int, Any]:
        if path != OBJ_CREATE:
            return super()._handle(path, auth, raw)
        record: dict[str, Any] = {"path": path, "auth_ok": auth == self.expected_auth,
                                  "bytes": len(raw)}
        with self._lock:
            self.requests.append(record)
            fault = self.faults.pop(0) if self.faults else None
        if fault is not None:
            record["status"] = fault
            return fault, {"reason": "injected fault"}
        if auth != self.expected_auth:
            record["status"] = 401
            return 401, {"reason": "bad auth"}
        try:
            req = tsi.ObjCreateReq.model_validate_json(raw)
        except pydantic.ValidationError as exc:
            record["status"] = 400
            return 400, {"reason": str(exc)[:2000]}
        try:
            with self._lock:
                res = self.server.obj_create(req)
        except Exception as exc:  # weave's own refusal (digest mismatch, bad name): a 400
            record["status"] = 400
            return 400, {"reason": f"{type(exc).__name__}: {exc}"[:2000]}
        record["status"] = 200
        return 200, res.model_dump()

    # -- read back through the server's API ------------------------------------------------------
    def read_refs(self, refs: list[str]) -> list[Any]:
        """The values behind ``weave:///`` object refs (``refs_read_batch``, as the UI reads)."""
        out: list[Any] = []
        for i in range(0, len(refs), 100):
            res = self.server.refs_read_batch(tsi.RefsReadBatchReq(refs=refs[i:i + 100]))
            out.extend(res.vals)
        return out

    def objects(self, project_id: str) -> list[tsi.ObjSchema]:
        """Every object version of the project (``objs_query``)."""
        return list(self.server.objs_query(tsi.ObjQueryReq(project_id=project_id)).objs)

    def object_rows(self) -> int:
        """Rows in the server's ``objects`` table (all projects): what is stored, counted."""
        with sqlite3.connect(self.db_path) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM objects").fetchone()[0])

    def prompt(self, field: Any) -> list[Any]:
        """A whole prompt (or a resolved reference) as the exporter shows it: the items
        themselves (a small prompt), or segments (inline items, refs, ``{"ref", "len"}`` heads)
        whose refs are read back through the server (``refs_read_batch``)."""
        if isinstance(field, list):
            return field
        assert field.get("complete", True), field
        segments = field["segments"]
        refs = [s if isinstance(s, str) else s["ref"] for s in segments if not isinstance(s, list)]
        values = iter(self.read_refs(refs))
        out: list[Any] = []
        for seg in segments:
            if isinstance(seg, list):
                out.extend(seg)
                continue
            items = next(values)["items"]
            first = 0 if isinstance(seg, str) else seg.get("start", 0)
            out.extend(items if isinstance(seg, str) else items[first:first + seg["len"]])
        assert len(out) == field["length"], (len(out), field["length"])
        return out
