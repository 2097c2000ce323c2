"""Wire level against the newest weave (0.54.x): the exporter's ``/obj/create`` requests (per-turn
content as Weave objects, docs/weave.md) are what that weave's own client would send.

* the body validates against the generated SDK's request type (``ObjectCreateParams``);
* the digest the exporter names in its refs (and sends as ``expected_digest``) is that weave's own
  ``compute_object_digest`` of the value;
* weave's own client (``RemoteHTTPTraceServer.obj_create``) sending the same object produces the
  same path, auth header and (JSON-equal) body.
"""

from __future__ import annotations

import json

import pytest
from _common import API_KEY

from otel_weave_exporter._content_objects import ContentObjects

pytestmark = pytest.mark.weave_latest


@pytest.fixture(autouse=True)
def _latest_weave():
    pytest.importorskip("weave.vendor.weave_server_sdk", reason="needs weave>=0.54")


def _send(recorder, objects: ContentObjects) -> None:
    """The exporter's own sending of the queued objects (``publish``, as ``export`` does)."""
    import time

    from otel_weave_exporter._content_objects import publish
    from otel_weave_exporter._transport import HttpSender, basic_auth

    queued = len(objects.pending())
    sender = HttpSender(recorder.url, {"Authorization": basic_auth(API_KEY)})
    try:
        assert publish(objects, sender, time.monotonic() + 10).sent == queued
    finally:
        sender.close()


VALUES = [
    {"content_id": "tok:blake2b-128:aa", "kind": "tokens", "items": list(range(3000))},
    {"content_id": "msg:blake2b-128:bb", "kind": "messages",
     "items": [{"role": "system", "content": "You are a calculator. \u00e9\u2603"},
               {"role": "user", "content": "2+3?", "tool_calls": None}]},
]


def test_object_requests_validate_and_name_weaves_own_digest(recorder):
    import pydantic
    from weave.trace.serialization.digest import compute_object_digest
    from weave.vendor.weave_server_sdk.types.object_create_params import ObjectCreateParams

    objects = ContentObjects("wire-ent", "wire-proj")
    refs = [objects.ref(v["content_id"], v) for v in VALUES]
    _send(recorder, objects)
    assert [r["path"] for r in recorder.requests] == ["/obj/create"] * len(VALUES)
    adapter = pydantic.TypeAdapter(ObjectCreateParams)
    for ref, req, value in zip(refs, recorder.requests, VALUES, strict=True):
        body = json.loads(req["body"])
        adapter.validate_python(body)
        obj = body["obj"]
        assert obj["project_id"] == "wire-ent/wire-proj" and obj["val"] == value
        assert obj["expected_digest"] == compute_object_digest(value)
        assert ref == f"weave:///wire-ent/wire-proj/object/{obj['object_id']}:{obj['expected_digest']}"
    with pytest.raises(pydantic.ValidationError):  # the check can fail
        adapter.validate_python({"obj": {"project_id": "p", "val": 1}})


def test_latest_weave_client_sends_the_same_object_request(recorder):
    from weave.trace_server_bindings.remote_http_trace_server import RemoteHTTPTraceServer

    objects = ContentObjects("wire-ent", "wire-proj")
    objects.ref(VALUES[1]["content_id"], VALUES[1])
    _send(recorder, objects)
    ours = recorder.requests[0]
    body = json.loads(ours["body"])
    recorder.reply_body = json.dumps({"digest": body["obj"]["expected_digest"]}).encode()
    client = RemoteHTTPTraceServer(recorder.url, password=API_KEY)
    client.obj_create({"obj": body["obj"]})
    theirs = recorder.requests[-1]
    assert theirs["path"] == ours["path"] == "/obj/create"
    assert theirs["headers"]["Authorization"] == ours["headers"]["Authorization"]

    def without_nulls(obj):
        return {k: v for k, v in obj.items() if v is not None}

    assert without_nulls(json.loads(theirs["body"])["obj"]) == without_nulls(body["obj"])
