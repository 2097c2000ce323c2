"""Wire level against the newest weave (0.54.x, requirements/weave_latest.txt): what the exporter
puts on the wire, recorded on 127.0.0.1, checked against that weave's own client and schemas.

* path ``/v2/{entity}/{project}/calls/complete``, header ``Authorization`` exactly as weave's own
  credentials build it, every call's ``project_id`` = ``entity/project``;
* the body validates against the generated SDK's request type (``V2CallCompleteParams.batch``);
* weave's own client (``RemoteHTTPTraceServer.calls_complete``) sending the same calls produces
  the same path, auth header and (JSON-equal) body.
"""

from __future__ import annotations

import json

import pytest
from _common import API_KEY
from _rollout import TRAJECTORIES, OtelDriver, calls_per_trajectory, otel_sdk_provider

from otel_weave_exporter import WeaveSpanExporter

pytestmark = pytest.mark.weave_latest

ENTITY, PROJECT = "wire-ent", "wire-proj"


@pytest.fixture(autouse=True)
def _latest_weave():
    pytest.importorskip("weave.vendor.weave_server_sdk", reason="needs weave>=0.54 (requirements/weave_latest.txt)")


def _record(recorder, **options):
    exporter = WeaveSpanExporter(project=PROJECT, entity=ENTITY, api_key=API_KEY,
                                 base_url=recorder.url, **options)
    with otel_sdk_provider(exporter) as tracer:
        driver = OtelDriver(tracer)
        for traj in TRAJECTORIES:
            driver.run(*traj)
    return exporter


def test_path_auth_project_and_body_shape(recorder):
    from weave.wandb_interface.auth import ApiKeyCredentials

    exporter = _record(recorder)
    assert exporter.stats()["delivered"] == len(TRAJECTORIES) * calls_per_trajectory()
    assert recorder.requests
    for req in recorder.requests:
        assert req["path"] == f"/v2/{ENTITY}/{PROJECT}/calls/complete"
        assert req["headers"]["Authorization"] == ApiKeyCredentials(API_KEY).authorization_header()
        assert req["headers"]["Content-Type"] == "application/json"
        body = json.loads(req["body"])
        assert list(body) == ["batch"]
        assert all(call["project_id"] == f"{ENTITY}/{PROJECT}" for call in body["batch"])
    calls = recorder.calls()
    assert len(calls) == len(TRAJECTORIES) * calls_per_trajectory()
    assert len({c["id"] for c in calls}) == len(calls)


def test_body_validates_against_the_latest_sdk_request_type(recorder):
    import pydantic
    from weave.vendor.weave_server_sdk.types.v2_call_complete_params import Batch

    _record(recorder)
    adapter = pydantic.TypeAdapter(list[Batch])
    for body in recorder.bodies():
        adapter.validate_python(body["batch"])  # raises on a wrong or missing field
    # the check can fail: a call without its summary is rejected by the same type
    broken = dict(recorder.calls()[0])
    del broken["summary"]
    with pytest.raises(pydantic.ValidationError):
        adapter.validate_python([broken])


def test_latest_weave_client_sends_the_same_request(recorder):
    from weave.trace_server_bindings.remote_http_trace_server import RemoteHTTPTraceServer

    _record(recorder)
    ours = recorder.requests[0]
    ours_batch = json.loads(ours["body"])["batch"]

    client = RemoteHTTPTraceServer(recorder.url, password=API_KEY)
    client.calls_complete({"batch": ours_batch})
    theirs = recorder.requests[-1]
    assert theirs is not ours
    assert theirs["path"] == ours["path"]
    assert theirs["headers"]["Authorization"] == ours["headers"]["Authorization"]
    theirs_batch = json.loads(theirs["body"])["batch"]

    def without_nulls(call):  # the SDK drops keys that are None; the server treats them alike
        return {k: v for k, v in call.items() if v is not None}

    assert [without_nulls(c) for c in theirs_batch] == [without_nulls(c) for c in ours_batch]
