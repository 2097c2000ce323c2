"""otel_verl's own API with backend="weave" -> this exporter -> Weave's own server code.

The rollout is written the verl way (``rollout_trace_attr`` around an agent loop whose methods
carry ``@rollout_trace_op``), plus a GenAI ``chat`` span from ``get_tracer()`` inside the LLM call
and ``record_reward`` after the run returns.
"""

from __future__ import annotations

import json

import pytest
from _common import API_KEY

otel_verl = pytest.importorskip("otel_verl", reason="needs the otel_verl core (pip install -e .)")

MODEL = "tiny-model"
STEPS = [(5, 0, 0), (5, 0, 1), (5, 3, 0), (6, 3, 0)]  # (step, sample_index, rollout_n)


class ToolFailed(RuntimeError):
    pass


from otel_verl import SpanKindName, get_tracer, rollout_trace_op  # noqa: E402 -- after importorskip


class CalcTool:
    @rollout_trace_op(kind=SpanKindName.TOOL)
    def execute(self, instance_id: str, parameters: dict) -> dict:
        if parameters["b"] < 0:
            raise ToolFailed("negative b")
        return {"text": str(parameters["a"] + parameters["b"])}


class Server:
    @rollout_trace_op(kind=SpanKindName.LLM)
    def generate(self, request_id: str, *, prompt_ids: list) -> dict:
        with get_tracer().start_as_current_span(f"chat {MODEL}", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": MODEL,
            "gen_ai.usage.input_tokens": len(prompt_ids), "gen_ai.usage.output_tokens": 2,
        }):
            return {"token_ids": [7, 8], "stop_reason": "stop"}


class ToolAgentLoop:
    def __init__(self) -> None:
        self.server, self.tool = Server(), CalcTool()

    @rollout_trace_op(kind=SpanKindName.AGENT)
    def run(self, sampling_params: dict, **kwargs) -> dict:
        for turn in range(2):
            self.server.generate(f"r{kwargs['index']}", prompt_ids=list(range(3 + turn)))
            b = -1 if (kwargs["index"] == 3 and turn == 1) else 2
            try:
                self.tool.execute(f"i{turn}", {"a": kwargs["index"], "b": b})
            except ToolFailed:
                pass
        return {"num_turns": 4}


@pytest.fixture
def traced(weave_server, monkeypatch, tmp_path):
    from otel_verl import RolloutTraceConfig, record_reward, rollout_trace_attr

    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("proj", "exp-ov", backend="weave", weave_entity="ent",
                            weave_base_url=weave_server.url, trace_dir=str(tmp_path / "traces"))
    try:
        assert type(RolloutTraceConfig.get_client()).__name__ != "InMemorySpanExporter"
        loop = ToolAgentLoop()
        for step, sample_index, rollout_n in STEPS:
            with rollout_trace_attr(sample_index=sample_index, step=step, rollout_n=rollout_n):
                loop.run({"temperature": 1.0}, index=sample_index)
                record_reward(0.25)
        assert RolloutTraceConfig.shutdown(timeout_s=10)
    finally:
        RolloutTraceConfig.reset()
    return weave_server


def test_otel_verl_rollouts_arrive_as_verl_shaped_calls(traced):
    calls = traced.calls("ent/proj")
    per_traj = 1 + 1 + 2 * (1 + 1) + 2  # trajectory, run, 2x (generate + chat), 2x execute
    assert len(calls) == len(STEPS) * per_traj
    roots = traced.calls("ent/proj", trace_roots_only=True)
    # nothing but the ops described each trajectory: its root call is named after the agent
    # loop (a roots-only filter on ToolAgentLoop.run finds it, as with verl's backend) and shows
    # the loop's input and output plus the reward; the span's own name is kept
    assert len(roots) == len(STEPS) and {r.op_name for r in roots} == {"ToolAgentLoop.run"}
    assert {r.attributes["otel"]["span_name"] for r in roots} == {"rollout_trace"}
    for r in roots:
        assert r.inputs["sampling_params"] == {"temperature": 1.0}
        assert r.output == {"num_turns": 4, "reward": 0.25}
    by_id = {c.id: c for c in calls}
    for c in calls:
        assert c.attributes["experiment_name"] == "exp-ov"
        assert (c.attributes["step"], c.attributes["sample_index"], c.attributes["rollout_n"]) in STEPS
        assert c.wb_run_step == c.attributes["step"]
        if c.op_name == f"chat {MODEL}":
            assert by_id[c.parent_id].op_name.endswith("generate")
    (run,) = traced.calls("ent/proj", op_names=["ToolAgentLoop.run"], parent_ids=[roots[0].id])
    assert run.inputs["sampling_params"] == {"temperature": 1.0}
    assert run.output["num_turns"] == 4
    assert run.summary["usage"][MODEL]["prompt_tokens"] == 3 + 4
    assert run.summary["usage"][MODEL]["requests"] == 2
    assert all(r.attributes["reward"] == 0.25 for r in roots)


def test_otel_verl_filters_and_failures(traced):
    q = {"$eq": [{"$convert": {"input": {"$getField": "attributes.sample_index"}, "to": "int"}},
                 {"$literal": 3}]}
    hits = traced.calls("ent/proj", query=q)
    assert len(hits) == 2 * 8 and {c.attributes["sample_index"] for c in hits} == {3}
    failed = [c for c in traced.calls("ent/proj") if c.exception]
    assert len(failed) == 2  # one per trajectory of sample 3
    assert all(json.loads(c.exception)["type"] == "ToolFailed" for c in failed)
    assert all(c.op_name.endswith("execute") for c in failed)


def test_backend_weave_through_weaves_own_otel_ingestion(weave_server, monkeypatch, tmp_path):
    """``weave_ingest="otel"``: the same otel_verl rollout reaches Weave through its own
    ``/otel/v1/traces`` mapping (one root per trajectory, threads, step attributes)."""
    from otel_verl import RolloutTraceConfig, record_reward, rollout_trace_attr

    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    RolloutTraceConfig.init("proj", "exp-otel", backend="weave", weave_entity="ent",
                            weave_base_url=weave_server.url, weave_ingest="otel",
                            trace_dir=str(tmp_path / "traces"))
    try:
        assert type(RolloutTraceConfig.get_client()).__name__ == "DurableSpanExporter"
        loop = ToolAgentLoop()
        for step, sample_index, rollout_n in STEPS:
            with rollout_trace_attr(sample_index=sample_index, step=step, rollout_n=rollout_n):
                loop.run({"temperature": 1.0}, index=sample_index)
                record_reward(0.25)
        assert RolloutTraceConfig.flush(timeout_s=20)
        from otel_verl.exporters import LOSS_KEYS

        stats = RolloutTraceConfig.stats()
        assert stats["exported"] == len(STEPS) * 8
        assert not any(stats.get(k) for k in LOSS_KEYS), stats
    finally:
        RolloutTraceConfig.reset()
    assert {r["path"] for r in weave_server.requests} == {"/otel/v1/traces"}
    calls = weave_server.calls("ent/proj")
    assert len(calls) == len(STEPS) * (1 + 1 + 2 * 2 + 2)
    roots = weave_server.calls("ent/proj", trace_roots_only=True)
    assert len(roots) == len(STEPS) and {r.op_name for r in roots} == {"rollout_trace"}
    assert len({c.thread_id for c in calls}) == len(STEPS)
    assert all(c.attributes["step"] == c.wb_run_step for c in calls if c.parent_id)
