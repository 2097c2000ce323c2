"""The exporter on its own: configuration, translation, size caps (no Weave needed)."""

from __future__ import annotations

import base64
import json
import sys
import types

import pytest
from _common import API_KEY
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from otel_weave_exporter import WeaveSpanExporter
from otel_weave_exporter._encode import encode_call, split_batches
from otel_weave_exporter._exporter import resolve_config
from otel_weave_exporter._translate import Translator, iso_time, shorten


def _spans(build):
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "unit"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    build(provider.get_tracer("unit"))
    return memory.get_finished_spans()


# --- configuration -------------------------------------------------------------------------------
def test_missing_api_key_is_a_clear_error_at_construction():
    with pytest.raises(ValueError, match="WANDB_API_KEY"):
        WeaveSpanExporter(project="ent/proj")


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        # (entity, project, base_url)
        ({"project": "e/p"}, {}, ("e", "p", "https://trace.wandb.ai")),
        ({"project": "p", "entity": "x"}, {"WANDB_ENTITY": "y"}, ("x", "p", "https://trace.wandb.ai")),
        ({"project": "p"}, {"WANDB_ENTITY": "y"}, ("y", "p", "https://trace.wandb.ai")),
        ({"project": "e/p", "entity": "x"}, {}, ("x", "p", "https://trace.wandb.ai")),
        ({}, {"OTEL_EXPORTER_WEAVE_PROJECT": "e/q", "WANDB_PROJECT": "e/r"}, ("e", "q", "https://trace.wandb.ai")),
        ({}, {"WANDB_PROJECT": "e/r"}, ("e", "r", "https://trace.wandb.ai")),
        ({"project": "e/p"}, {"WANDB_BASE_URL": "https://wandb.corp.example"},
         ("e", "p", "https://wandb.corp.example/traces")),
        ({"project": "e/p"}, {"WANDB_BASE_URL": "https://wandb.corp.example",
                              "WF_TRACE_SERVER_URL": "http://t:1"}, ("e", "p", "http://t:1")),
        ({"project": "e/p"}, {"WF_TRACE_SERVER_URL": "http://t:1",
                              "OTEL_EXPORTER_WEAVE_ENDPOINT": "http://o:2/"}, ("e", "p", "http://o:2")),
        ({"project": "e/p", "base_url": "http://a:3"}, {"OTEL_EXPORTER_WEAVE_ENDPOINT": "http://o:2"},
         ("e", "p", "http://a:3")),
    ],
)
def test_configuration_precedence(monkeypatch, args, env, expected):
    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = resolve_config(**args)
    assert (cfg.entity, cfg.project, cfg.base_url) == expected
    assert cfg.path == f"/v2/{expected[0]}/{expected[1]}/calls/complete"


def test_no_arg_construction_reads_env_like_the_entry_point(monkeypatch):
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="opentelemetry_traces_exporter") if e.name == "weave"]
    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    monkeypatch.setenv("OTEL_EXPORTER_WEAVE_PROJECT", "ent/proj")
    monkeypatch.setenv("OTEL_EXPORTER_WEAVE_TIMEOUT", "2.5")
    monkeypatch.setenv("OTEL_EXPORTER_WEAVE_KEEP_TRAJECTORY", "true")
    exporter = ep.load()()
    assert exporter.config.project_id == "ent/proj" and exporter.config.timeout_s == 2.5
    assert exporter.config.keep_trajectory_spans is True
    exporter.shutdown()


def test_default_entity_is_read_from_the_wandb_api_like_weave_init(monkeypatch, recorder):
    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", recorder.url)
    recorder.reply_body = json.dumps(
        {"data": {"viewer": {"username": "u", "defaultEntity": {"name": "team-x"}}}}).encode()
    cfg = resolve_config(project="proj")
    assert cfg.project_id == "team-x/proj"
    (req,) = recorder.requests
    assert req["path"] == "/graphql" and "defaultEntity" in json.loads(req["body"])["query"]
    assert base64.b64decode(req["headers"]["Authorization"].split()[1]) == f"api:{API_KEY}".encode()
    recorder.reply_body = b'{"data": {"viewer": null}}'
    with pytest.raises(ValueError, match="WANDB_ENTITY"):
        resolve_config(project="proj")


def test_sdk_configurator_builds_it_from_otel_traces_exporter(monkeypatch, recorder):
    """What `OTEL_TRACES_EXPORTER=weave` does under opentelemetry-instrument / the distro."""
    from opentelemetry.sdk._configuration import _import_exporters, _init_tracing

    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    monkeypatch.setenv("OTEL_EXPORTER_WEAVE_PROJECT", "ent/proj")
    monkeypatch.setenv("OTEL_EXPORTER_WEAVE_ENDPOINT", recorder.url)
    exporters, _, _ = _import_exporters(["weave"], [], [])
    assert exporters["weave"] is WeaveSpanExporter
    provider_holder = {}  # never install a global provider in tests
    monkeypatch.setattr("opentelemetry.sdk._configuration.set_tracer_provider",
                        lambda p: provider_holder.setdefault("p", p))
    _init_tracing(exporters=exporters, resource=Resource.create({"service.name": "configured"}))
    provider = provider_holder["p"]
    with provider.get_tracer("t").start_as_current_span("configured-op", attributes={"rollout.step": 9}):
        pass
    provider.shutdown()
    (call,) = recorder.calls()
    assert call["op_name"] == "configured-op" and call["attributes"]["step"] == 9
    assert call["attributes"]["otel"]["resource"]["service.name"] == "configured"


def test_bad_values(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens: no default entity
    with pytest.raises(ValueError, match="entity"):
        resolve_config(project="p")
    with pytest.raises(ValueError, match="project"):
        resolve_config()
    with pytest.raises(TypeError, match="unknown option"):
        resolve_config(project="e/p", timeout=3)
    with pytest.raises(ValueError, match="timeout_s"):
        resolve_config(project="e/p", timeout_s=0)
    monkeypatch.setenv("OTEL_EXPORTER_WEAVE_TIMEOUT", "soon")  # bad env: warn, fall back
    assert resolve_config(project="e/p").timeout_s == 10.0
    cfg = resolve_config(project="e/p")
    assert API_KEY not in repr(cfg)


# --- translation ---------------------------------------------------------------------------------
TRAJ = {"rollout.step": 3, "rollout.sample_index": 7, "rollout.rollout_n": 1,
        "rollout.validate": False, "rollout.experiment_name": "exp"}


def _trajectory(tracer):
    with tracer.start_as_current_span("rollout_trace", attributes={**TRAJ, "otel_verl.trajectory": True}) as t:
        t.set_attribute("rollout.reward", 0.5)
        with tracer.start_as_current_span("ToolAgentLoop.run", attributes={
            **TRAJ, "otel_verl.trajectory_child": True,
            "input.value": json.dumps({"sampling_params": {"t": 1}}), "input.mime_type": "application/json",
            "output.value": json.dumps([1, 2]), "openinference.span.kind": "AGENT",
        }):
            with tracer.start_as_current_span("chat m", attributes={
                **TRAJ, "gen_ai.request.model": "m-req", "gen_ai.response.model": "m",
                "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 4,
                "gen_ai.input.messages": json.dumps([{"role": "user", "content": "hi"}]),
                "output.value": "plain text",
            }):
                pass
            with tracer.start_as_current_span("CalcTool.execute", attributes=TRAJ) as span:
                try:
                    raise KeyError("nope")
                except KeyError as exc:
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, "tool failed"))


def test_translation_maps_ids_names_payloads_usage_and_errors():
    spans = _spans(_trajectory)
    tr = Translator("e", "p", keep_trajectory_spans=False)  # verl's own tree shape
    tr.begin_batch(spans)
    # children end (and are exported) first; compare the wire form (what the server parses)
    calls = [tr.translate(s) for s in spans]
    calls = [json.loads(encode_call(c, 10**7)[0]) if c is not None else None for c in calls]
    by_name = {c["op_name"]: c for c in calls if c is not None}
    assert set(by_name) == {"ToolAgentLoop.run", "chat m", "CalcTool.execute"}
    assert calls[-1] is None  # the trajectory span: no call
    run, chat, tool = by_name["ToolAgentLoop.run"], by_name["chat m"], by_name["CalcTool.execute"]
    span_by_name = {s.name: s for s in spans}
    assert run["id"] == format(span_by_name["ToolAgentLoop.run"].context.span_id, "016x")
    assert run["trace_id"] == format(span_by_name["ToolAgentLoop.run"].context.trace_id, "032x")
    assert len(run["id"]) == 16 and len(run["trace_id"]) == 32
    assert run["parent_id"] is None  # the trajectory's child is a root, as in verl
    assert chat["parent_id"] == run["id"] and tool["parent_id"] == run["id"]
    assert run["project_id"] == "e/p"
    assert {k: run["attributes"][k] for k in ("step", "sample_index", "rollout_n", "validate",
                                               "experiment_name")} == {
        "step": 3, "sample_index": 7, "rollout_n": 1, "validate": False, "experiment_name": "exp"}
    assert run["attributes"]["reward"] == 0.5  # from the dropped trajectory span, same batch
    assert "reward" not in chat["attributes"]  # only the trajectory's direct children get it
    assert run["wb_run_step"] == 3 and run["wb_run_id"] is None
    assert run["inputs"] == {"sampling_params": {"t": 1}} and run["output"] == [1, 2]
    assert run["attributes"]["otel"]["attributes"]["openinference.span.kind"] == "AGENT"
    assert "input.value" not in run["attributes"]["otel"]["attributes"]
    assert run["attributes"]["otel"]["resource"]["service.name"] == "unit"
    assert not any(k.startswith("telemetry.sdk") for k in run["attributes"]["otel"]["resource"])
    assert chat["inputs"] == {"messages": [{"role": "user", "content": "hi"}]}
    assert "gen_ai.input.messages" not in chat["attributes"]["otel"]["attributes"]  # not twice
    assert chat["output"] == "plain text"
    usage = {"m": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14, "requests": 1}}
    assert chat["summary"] == {"usage": usage, "status_counts": {"success": 1, "error": 0}}
    # rolled up from the children, as the weave client does
    assert run["summary"] == {"usage": usage, "status_counts": {"success": 2, "error": 1}}
    assert tool["summary"] == {"status_counts": {"success": 0, "error": 1}}
    exc = json.loads(tool["exception"])
    assert exc["type"] == "KeyError" and exc["message"] == "'nope'"
    assert chat["exception"] is None and run["exception"] is None
    assert run["started_at"] < run["ended_at"] and run["started_at"].endswith("Z")


def test_unmarked_child_of_a_trajectory_in_the_same_batch_becomes_a_root():
    def build(tracer):
        with tracer.start_as_current_span("rollout_trace", attributes={**TRAJ, "otel_verl.trajectory": True}):
            with tracer.start_as_current_span("hand-made", attributes=TRAJ):  # no child marker
                pass

    spans = _spans(build)
    tr = Translator("e", "p", keep_trajectory_spans=False)
    tr.begin_batch(spans)
    assert tr.translate(spans[0])["parent_id"] is None
    alone = Translator("e", "p", keep_trajectory_spans=False)  # trajectory span in another batch
    alone.begin_batch(spans[:1])
    assert alone.translate(spans[0])["parent_id"] == format(spans[1].context.span_id, "016x")


def test_the_trajectory_span_is_the_root_call_by_default():
    spans = _spans(_trajectory)
    tr = Translator("e", "p", include_otel_attributes=False)
    calls = {c["op_name"]: c for c in map(tr.translate, spans)}
    assert calls["rollout_trace"]["parent_id"] is None
    assert calls["ToolAgentLoop.run"]["parent_id"] == calls["rollout_trace"]["id"]
    assert "otel" not in calls["ToolAgentLoop.run"]["attributes"]
    assert calls["rollout_trace"]["summary"]["usage"]["m"]["requests"] == 1
    assert calls["rollout_trace"]["attributes"]["reward"] == 0.5


def test_error_status_without_event_and_long_names():
    def build(tracer):
        with tracer.start_as_current_span("x" * 300) as span:
            span.set_status(Status(StatusCode.ERROR, "bad"))
        with tracer.start_as_current_span("ok", attributes={"wandb.display_name": "Nice"}):
            pass

    long, ok = [Translator("e", "p").translate(s) for s in _spans(build)]
    assert json.loads(long["exception"]) == {"type": "Error", "message": "bad"}
    assert len(long["op_name"]) == 128 and long["display_name"] == "x" * 300
    assert shorten("x" * 300, 128) != shorten("x" * 299 + "y", 128)
    assert ok["display_name"] == "Nice" and ok["exception"] is None and ok["wb_run_step"] is None
    assert ok["inputs"] == {} and ok["output"] is None


def test_wandb_run_linked_only_when_wandb_is_loaded(monkeypatch):
    spans = _spans(lambda t: t.start_span("a", attributes=TRAJ).end())
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    tr = Translator("e", "p")
    tr.begin_batch()
    assert tr.translate(spans[0])["wb_run_id"] is None
    assert "wandb" not in sys.modules  # never imported by us
    fake = types.ModuleType("wandb")
    fake.run = types.SimpleNamespace(id="run42")
    monkeypatch.setitem(sys.modules, "wandb", fake)
    tr.begin_batch()
    assert tr.translate(spans[0])["wb_run_id"] == "e/p/run42"
    # a configured run (the trainer's, handed to every worker) wins, bare or in full
    for configured, expected in (("abc", "e/p/abc"), ("E/P/abc", "E/P/abc")):
        tr = Translator("e", "p", wandb_run_id=configured)
        tr.begin_batch()
        assert tr.translate(spans[0])["wb_run_id"] == expected


def test_wandb_run_id_from_the_environment(monkeypatch):
    monkeypatch.setenv("WANDB_RUN_ID", "fromenv")
    assert resolve_config(project="e/p", api_key="k").wandb_run_id == "fromenv"
    assert resolve_config(project="e/p", api_key="k", wandb_run_id="x").wandb_run_id == "x"


def test_iso_time_is_exact():
    assert iso_time(1_700_000_000_123_456_789) == "2023-11-14T22:13:20.123456Z"


# --- size caps -----------------------------------------------------------------------------------
def test_encode_shrinks_oversized_calls_with_markers():
    call = {"id": "a" * 16, "attributes": {"step": 1}, "inputs": {"p": "x" * 50_000, "ids": list(range(20_000))},
            "output": {"t": "y" * 30_000}, "exception": None, "summary": {}}
    data, cut = encode_call(call, 10_000)
    assert cut and len(data) <= 10_000
    doc = json.loads(data)
    assert doc["id"] == "a" * 16 and doc["attributes"]["step"] == 1
    assert set(doc["attributes"]["weave_exporter_truncated"]) == {"inputs", "output"}
    assert doc["inputs"]["p"].startswith("xxx") and "truncated" in doc["inputs"]["p"]
    small, cut2 = encode_call({"id": "b", "inputs": {"x": float("nan")}}, 10_000)
    assert not cut2 and json.loads(small)["inputs"] == {"x": None}
    tiny, _ = encode_call(call, 250)  # last resort: markers only
    assert len(tiny) <= 250 and json.loads(tiny)["inputs"]["_truncated"] is True


def test_json_payloads_are_spliced_raw_and_non_json_is_handled():
    def build(tracer):
        for i, (text, mime) in enumerate([
            ('{"a": [1, 2], "t": "é"}', "application/json"),  # spliced as it is
            ('{"x": NaN, "y": -Infinity}', "application/json"),  # not JSON: parsed, nulls
            ("[not json", "application/json"),  # declared JSON but is not: kept as text
            ("[1, 2]", "application/json"),  # inputs must be an object: wrapped
            ("hello", "text/plain"),
        ]):
            tracer.start_span(f"s{i}", attributes={"input.value": text, "input.mime_type": mime,
                                                  "output.value": text, "output.mime_type": mime}).end()

    tr = Translator("e", "p")
    raw = [tr.translate(s) for s in _spans(build)]
    assert type(raw[0]["inputs"]).__name__ == "RawJSON"
    wire = [json.loads(encode_call(c, 10**6)[0]) for c in raw[:2] + raw[3:]]
    wire.insert(2, json.loads(encode_call(dict(raw[2], output=None), 10**6)[0]))
    assert wire[0]["inputs"] == {"a": [1, 2], "t": "é"} and wire[0]["output"] == {"a": [1, 2], "t": "é"}
    assert b'{"a": [1, 2], "t": "\xc3\xa9"}' in encode_call(raw[0], 10**6)[0]  # byte for byte
    assert wire[1]["inputs"] == {"x": None, "y": None} and wire[1]["output"] == {"x": None, "y": None}
    # inputs need an object, so a non-object is parsed (and, not JSON, kept as text); the output
    # is trusted as declared and spliced: invalid JSON there makes the server answer 400, and the
    # exporter bisects the batch to deliver the rest (test_weave_exporter_faults)
    assert wire[2]["inputs"] == {"input": "[not json"}
    assert wire[3]["inputs"] == {"input": [1, 2]} and wire[3]["output"] == [1, 2]
    assert wire[4]["inputs"] == {"input": "hello"} and wire[4]["output"] == "hello"
    # a raw payload over the cap is parsed and shrunk like any other
    big = dict(raw[0], inputs=type(raw[0]["inputs"])(json.dumps({"p": "z" * 5000})))
    data, cut = encode_call(big, 2000)
    assert cut and len(data) <= 2000 and "truncated" in json.loads(data)["inputs"]["p"]


def test_split_batches_respects_the_request_cap():
    parts = [b'{"i":%d,"pad":"%s"}' % (i, b"z" * 90) for i in range(100)]
    batches = list(split_batches(parts, 1_000))
    assert sum(len(b) for b in batches) == 100
    assert all(len(b'{"batch":[' + b",".join(b) + b"]}") <= 1_000 for b in batches)
    assert [p for b in batches for p in b] == parts


def test_auth_header_is_basic_api_key():
    from otel_weave_exporter._transport import basic_auth

    assert base64.b64decode(basic_auth("k").split()[1]) == b"api:k"
