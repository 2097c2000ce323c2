"""Parity: the same rollout traced the way verl's weave backend does it (weave 0.52.42 client
``create_call``/``finish_call`` inside ``weave.attributes``) and through OTel + this exporter,
each into Weave's own server code, queried back and compared: tree shape, op names, attribute
sets and values, inputs/outputs, exceptions, usage. Known differences (docs/weave.md) are the
only ones allowed, and each is asserted explicitly here."""

from __future__ import annotations

import json

# every test here uses the weave_server fixture, which needs weave==0.52.42 + trace-server extras
from _common import API_KEY
from _rollout import TRAJECTORIES, OtelDriver, VerlWeaveDriver, otel_sdk_provider

from otel_weave_exporter import WeaveSpanExporter

VERL_PROJECT = "ent/verl"
OTEL_PROJECT = "ent/otel"
TRAJ_KEYS = ("step", "sample_index", "rollout_n", "validate", "experiment_name")


def _op_short_name(op_name: str) -> str:
    """``weave:///ent/proj/op/NAME:DIGEST`` -> NAME; a plain name stays as it is."""
    if op_name.startswith("weave:///"):
        return op_name.split("/op/", 1)[1].rsplit(":", 1)[0]
    return op_name


def _trace_verl_style(server) -> None:
    from weave.trace import weave_client
    from weave.trace.context import weave_client_context

    entity, project = VERL_PROJECT.split("/")
    client = weave_client.WeaveClient(entity, project, server, ensure_project_exists=False)
    weave_client_context.set_weave_client_global(client)
    try:
        driver = VerlWeaveDriver(client)
        for traj in TRAJECTORIES:
            driver.run(*traj)
        client.flush()
    finally:
        weave_client_context.set_weave_client_global(None)


def _canon(call, children_of, *, user_keys_only=True):
    attrs = call.attributes
    exc = json.loads(call.exception) if call.exception else None
    usage = (call.summary or {}).get("usage") or {}
    usage = {m: {k: v for k, v in u.items() if k in ("prompt_tokens", "completion_tokens", "requests")}
             for m, u in usage.items()}
    kids = sorted((_canon(k, children_of) for k in children_of.get(call.id, [])), key=repr)
    return (
        _op_short_name(call.op_name),
        tuple((k, attrs.get(k)) for k in TRAJ_KEYS),
        json.dumps(call.inputs, sort_keys=True),
        json.dumps(call.output, sort_keys=True),
        (exc["type"], exc["message"]) if exc else None,
        json.dumps(usage, sort_keys=True),
        tuple(kids),
    )


def _forest(shim, project_id):
    calls = shim.calls(project_id)
    children_of: dict[str, list] = {}
    for c in calls:
        if c.parent_id is not None:
            children_of.setdefault(c.parent_id, []).append(c)
    roots = [c for c in calls if c.parent_id is None]
    return calls, sorted((_canon(r, children_of) for r in roots), key=repr)


def test_verl_weave_backend_and_otel_exporter_produce_the_same_calls(weave_server, monkeypatch):
    monkeypatch.setenv("WEAVE_DISABLED", "false")  # the tier env disables weave.init; we need the client
    # the weave client sends call_start / call_end from a thread pool; against the sqlite server
    # an end that overtakes its start is lost (the call stays "running"); serialise the client
    monkeypatch.setenv("WEAVE_CLIENT_PARALLELISM", "0")
    _trace_verl_style(weave_server.server)

    # verl's tree shape: no call for the trajectory (by default it is the root call; see below)
    exporter = WeaveSpanExporter(project=OTEL_PROJECT, api_key=API_KEY, base_url=weave_server.url,
                                 keep_trajectory_spans=False)
    with otel_sdk_provider(exporter) as tracer:
        driver = OtelDriver(tracer)
        for traj in TRAJECTORIES:
            driver.run(*traj)

    verl_calls, verl_forest = _forest(weave_server, VERL_PROJECT)
    otel_calls, otel_forest = _forest(weave_server, OTEL_PROJECT)
    assert len(verl_calls) == len(otel_calls) > 0
    assert len(verl_forest) == len(TRAJECTORIES)
    # same tree shape, op names, trajectory attributes, payloads, errors, usage (rolled up too)
    assert otel_forest == verl_forest

    # --- the documented differences, asserted so that a change shows up here ---
    verl_keys = {k for c in verl_calls for k in c.attributes}
    otel_keys = {k for c in otel_calls for k in c.attributes}
    assert verl_keys - otel_keys == {"weave"}  # weave client metadata (client version, OS)
    # the rest of the span (kind, scope, attrs, resource), and the reward that otel_verl puts on
    # the (dropped) trajectory span, carried onto the root call; verl traces no reward
    assert otel_keys - verl_keys == {"otel", "reward"}
    assert all(r.attributes["reward"] == 1.0 for r in otel_calls if r.parent_id is None)
    # op refs (published op objects) vs plain op names
    assert all(c.op_name.startswith("weave:///ent/verl/op/") for c in verl_calls)
    assert all(not c.op_name.startswith("weave:") for c in otel_calls)
    # ids: verl's are UUIDv7, ours are the OTel span/trace ids
    assert all(len(c.id) == 36 for c in verl_calls)
    assert all(len(c.id) == 16 and len(c.trace_id) == 32 for c in otel_calls)
    # wb_run_step: verl sets it only from an active wandb run; we set it from the step
    assert all(c.wb_run_step is None for c in verl_calls)
    assert all(c.wb_run_step == c.attributes["step"] for c in otel_calls)
    # threads: a verl client sets none; we name the trajectory and mark each LLM turn
    assert all(c.thread_id is None and c.turn_id is None for c in verl_calls)
    assert all(c.thread_id for c in otel_calls)
    assert {c.op_name for c in otel_calls if c.turn_id} == {"AsyncLLMServerManager.generate"}
    # the server derives the same status for both

    def status(calls):
        return sorted(c.summary["weave"]["status"] for c in calls)

    assert status(verl_calls) == status(otel_calls)
