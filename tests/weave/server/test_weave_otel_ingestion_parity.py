"""The same spans two ways into Weave's own server code: our exporter (complete calls) and
Weave's own OTel ingestion (``/otel/v1/traces``, its span -> call mapping, fed by
``WeaveOtlpSpanExporter``). Both trees are printed; the fields that agree and the differences
docs/weave.md lists are asserted one by one, so a change on either side shows up here."""

from __future__ import annotations

import json

import pytest
from _common import API_KEY
from _rollout import MODEL, TRAJECTORIES, TURNS, OtelDriver, calls_per_trajectory

CALLS = "ent/calls"
OTEL = "ent/otel"
RUN = "run7"
TRAJ_KEYS = ("step", "sample_index", "rollout_n", "validate", "experiment_name")


def _send_both(shim, shim_otel):
    """One TracerProvider, two processors: identical spans (same ids) reach both paths (two
    servers: the SQLite server keys calls by id across projects)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from otel_weave_exporter import WeaveOtlpSpanExporter, WeaveSpanExporter

    ours = WeaveSpanExporter(project=CALLS, api_key=API_KEY, base_url=shim.url, wandb_run_id=RUN)
    theirs = WeaveOtlpSpanExporter(project=OTEL, api_key=API_KEY, base_url=shim_otel.url,
                                   wandb_run_id=RUN)
    provider = TracerProvider(resource=Resource.create({"service.name": "parity"}))
    for exporter in (ours, theirs):
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    driver = OtelDriver(provider.get_tracer("parity"))
    for traj in TRAJECTORIES:
        driver.run(*traj)
    assert provider.force_flush(20_000)
    provider.shutdown()
    return ours


def _tree(calls) -> str:
    kids: dict = {}
    for c in calls:
        kids.setdefault(c.parent_id, []).append(c)
    lines: list[str] = []

    def walk(call, depth):
        usage = (call.summary or {}).get("usage") or {}
        tokens = {m: (u.get("prompt_tokens") or u.get("input_tokens"),
                      u.get("completion_tokens") or u.get("output_tokens")) for m, u in usage.items()}
        flags = [f"step={call.attributes.get('step', '-')}", f"thread={call.thread_id}"]
        if call.turn_id:
            flags.append("TURN")
        if tokens:
            flags.append(f"usage={tokens}")
        if call.exception:
            flags.append(f"exception={call.exception[:60]!r}")
        lines.append("  " * depth + f"{call.op_name}  " + " ".join(flags))
        for k in sorted(kids.get(call.id, []), key=lambda c: c.started_at):
            walk(k, depth + 1)

    roots = sorted(kids.get(None, []), key=lambda c: c.started_at)
    for r in roots[:1]:  # one trajectory is enough to read
        walk(r, 0)
    return "\n".join(lines)


@pytest.fixture
def otel_server(tmp_path):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http",
                        reason="needs opentelemetry-exporter-otlp-proto-http (requirements/weave.txt)")
    from _weave_server import WeaveShim, make_server

    with WeaveShim(make_server(str(tmp_path / "otel.sqlite")), API_KEY) as shim:
        yield shim


def test_our_exporter_and_weaves_own_otel_ingestion(weave_server, otel_server):
    ours = _send_both(weave_server, otel_server)
    assert ours.stats()["undelivered"] == 0
    otel_requests = [r for r in otel_server.requests if r["path"] == "/otel/v1/traces"]
    assert otel_requests and all(r["status"] == 200 and not r["partial_success"]
                                 for r in otel_requests), otel_requests
    a = {c.id: c for c in weave_server.calls(CALLS)}
    b = {c.id: c for c in otel_server.calls(OTEL)}
    print("\n--- our exporter (calls/complete) ---\n" + _tree(a.values()))
    print("--- Weave's own OTel ingestion (/otel/v1/traces) ---\n" + _tree(b.values()))
    n = len(TRAJECTORIES) * calls_per_trajectory()
    assert len(a) == len(b) == n and set(a) == set(b)  # call id = span id on both paths

    # --- the same on both paths ---
    for cid, x in a.items():
        y = b[cid]
        assert (x.trace_id, x.parent_id, x.op_name) == (y.trace_id, y.parent_id, y.op_name)
        assert x.thread_id == y.thread_id and x.turn_id == y.turn_id  # wandb.thread_id/is_turn
        assert x.wb_run_step == y.wb_run_step == x.attributes["step"]
        # ns -> µs: we truncate, Weave's mapping rounds (a float): at most 1 µs apart
        skew = x.started_at.replace(tzinfo=None) - y.started_at.replace(tzinfo=None)
        assert abs(skew.total_seconds()) <= 1e-6
        if x.parent_id is not None:  # every call but the trajectory root
            assert {k: x.attributes[k] for k in TRAJ_KEYS} == {k: y.attributes[k] for k in TRAJ_KEYS}
    roots_a = [c for c in a.values() if c.parent_id is None]
    roots_b = [c for c in b.values() if c.parent_id is None]
    assert len(roots_a) == len(roots_b) == len(TRAJECTORIES)  # one root per trajectory, both
    turns = sorted(c.op_name for c in a.values() if c.turn_id)
    assert turns == ["AsyncLLMServerManager.generate"] * (len(TRAJECTORIES) * TURNS)

    # --- the differences (docs/weave.md, "Two ways into Weave") ---
    # 1. the trajectory root: Weave's mapping finds no input/output/known attribute on it and
    #    dumps all its attributes nested by dots, so attributes.step / .reward are not top-level
    for x in roots_a:
        y = b[x.id]
        assert x.attributes["reward"] == 1.0 and "reward" not in y.attributes
        assert y.attributes["rollout"]["reward"] == 1.0
        assert "step" not in y.attributes and y.attributes["rollout"]["step"] == x.attributes["step"]
    # 2. inputs / outputs: ours are the op's bound arguments and return value, as verl's weave
    #    backend shows them; Weave's mapping keys them by the OpenInference attribute name, and a
    #    JSON scalar output stays text
    for cid, x in a.items():
        y = b[cid]
        if x.parent_id is None:
            continue
        assert y.inputs == {"input.value": x.inputs}, x.op_name
        if x.exception:
            assert x.output is None and y.output == {}
        elif isinstance(x.output, (dict, list)):
            assert y.output == {"output.value": x.output}, x.op_name
        else:
            assert y.output == {"output.value": json.dumps(x.output)}, x.op_name
    # 3. usage: ours prompt/completion/total tokens + requests on each LLM call, rolled up to its
    #    ancestors (as the weave client does); Weave's mapping: input/output tokens on the LLM
    #    call only, and an empty "usage" entry on every other call
    llm = [c for c in a.values() if c.op_name == "AsyncLLMServerManager.generate"]
    for x in llm:
        ux, uy = x.summary["usage"][MODEL], b[x.id].summary["usage"][MODEL]
        assert (ux["prompt_tokens"], ux["completion_tokens"]) == \
            (uy["input_tokens"], uy["output_tokens"])
        assert ux["requests"] == 1 and uy["requests"] is None
    for x in roots_a:
        assert x.summary["usage"][MODEL]["requests"] == TURNS
        assert MODEL not in b[x.id].summary["usage"]
    # 4. exceptions: ours {type, message, stacktrace} from the exception event; Weave's mapping
    #    keeps the status description as text
    (fx,) = [c for c in a.values() if c.exception]
    fy = b[fx.id]
    assert json.loads(fx.exception)["type"] == "ToolFailed" and "Traceback" in fx.exception
    assert fy.exception == "ToolFailed: calculator exploded on turn 1"
    # 5. status: ours rolls status counts up (the root shows "descendant error"); Weave's
    #    mapping does not
    failed_root = next(r for r in roots_a if r.summary["status_counts"]["error"])
    assert failed_root.summary["weave"]["status"] == "descendant_error"
    assert b[failed_root.id].summary["weave"]["status"] == "success"
    # 6. the rest of the span: ours under attributes.otel (kind, scope, attributes, resource);
    #    Weave's under attributes.otel_span (the whole span) plus its own kind/model/operation
    x = llm[0]
    assert x.attributes["otel"]["attributes"]["openinference.span.kind"] == "LLM"
    y = b[x.id].attributes
    assert y["kind"] == "LLM" and y["model"] == MODEL and y["operation_name"] == "chat"
    assert "otel_span" in y and "otel" not in y
    # 7. wb_run_id: ours entity/project/run as the weave client writes it; Weave's OTel mapping
    #    keys it by the internal project id (the hosted service turns it into the run's URL)
    assert {c.wb_run_id for c in a.values()} == {f"{CALLS}/{RUN}"}
    assert {c.wb_run_id.rsplit(":", 1)[-1] for c in b.values()} == {RUN}


def test_a_dotted_key_clash_costs_the_span_on_weaves_path_only(weave_server, otel_server):
    """``a`` and ``a.b`` on one span: Weave's mapping un-flattens keys on dots and rejects the
    span (partial success); our exporter keeps attribute keys as they are."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from otel_weave_exporter import WeaveOtlpSpanExporter, WeaveSpanExporter

    provider = TracerProvider()
    for exporter in (WeaveSpanExporter(project=CALLS, api_key=API_KEY, base_url=weave_server.url),
                     WeaveOtlpSpanExporter(project=OTEL, api_key=API_KEY,
                                           base_url=otel_server.url)):
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.get_tracer("t").start_span("clash", attributes={
        "rollout.reward": 1.0, "rollout.reward.accuracy": 0.5}).end()
    provider.shutdown()
    (ours,) = weave_server.calls(CALLS)
    assert ours.attributes["reward"] == 1.0 and ours.attributes["reward.accuracy"] == 0.5
    assert otel_server.calls(OTEL) == []
    (req,) = [r for r in otel_server.requests if r["path"] == "/otel/v1/traces"]
    assert req["partial_success"].rejected_spans == 1
