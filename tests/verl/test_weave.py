"""backend=weave from verl's config: verl's ToolAgentLoop -> otel_verl -> Weave exporter -> Weave's
own trace-server code (weave 0.52.42 SqliteTraceServer behind the weave tier's HTTP shim)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytest.importorskip("otel_weave_exporter", reason="needs exporters/weave (requirements/verl.txt)")
pytest.importorskip("weave.trace_server.sqlite_trace_server",
                    reason="needs weave[trace-server]==0.52.42 (requirements/verl.txt)")

sys.path.insert(0, str(Path(__file__).parents[1] / "weave"))  # the weave tier's server harness

import _harness as h
from _common import API_KEY
from _weave_server import WeaveShim, make_server

PROJECT = "ent/verl_it"
VERL_OPS = {"ToolAgentLoop.run", "LLMServerClient.generate", "HermesToolParser.extract_tool_calls",
            "CalculatorTool.execute"}
OUR_EXTRA = {"CalculatorTool.create", "CalculatorTool.release", "AgentLoopWorker._compute_score"}


def _expr(op, field, value):
    return {op: [{"$getField": field}, {"$literal": value}]}


def _run_verl_rollout(tiny_model, tmp_path) -> None:
    """verl's AgentLoopWorker with backend=weave: one step, samples 0-2, n=2, one traced sample."""
    overrides = h.base_overrides(tiny_model, h.write_tool_config(tmp_path),
                                 {"backend": "weave", "max_samples_per_step_per_worker": 1})
    overrides = [o for o in overrides if not o.startswith("trainer.project_name=")]
    config = h.compose_config([*overrides, f"trainer.project_name={PROJECT}"])
    worker, _, _ = h.make_worker(config)
    asyncio.run(worker.generate_sequences(h.make_batch([0, 1, 2], step=3, n=2)))


def test_verl_rollout_lands_in_weave_with_verls_op_names_and_filters(tiny_model, tmp_path,
                                                                     monkeypatch):
    server = make_server(str(tmp_path / "weave.sqlite"))
    with WeaveShim(server, API_KEY) as shim:
        # the tree verl's own weave backend draws (otel_verl's default keeps the trajectory span
        # as the one root call: tested below)
        monkeypatch.setenv("OTEL_EXPORTER_WEAVE_KEEP_TRAJECTORY", "false")
        monkeypatch.setenv("WANDB_API_KEY", API_KEY)
        monkeypatch.setenv("OTEL_VERL_WEAVE_BASE_URL", shim.url)
        _run_verl_rollout(tiny_model, tmp_path)
        from verl.utils.rollout_trace import RolloutTraceConfig

        assert RolloutTraceConfig.get_backend() == "weave"
        assert RolloutTraceConfig.flush(10.0)
        calls = shim.calls(PROJECT)

        assert {c.op_name for c in calls} == VERL_OPS | OUR_EXTRA  # no call for agent_loop
        chosen = {c.attributes["sample_index"] for c in calls}
        assert len(chosen) == 1  # max_samples_per_step_per_worker=1
        from otel_verl import TrajectorySampler

        assert chosen == set(TrajectorySampler(1, "exp_it").select([0, 1, 2]))
        (index,) = chosen
        # verl's weave attributes, so verl users' filters work unchanged
        for c in calls:
            assert c.attributes["step"] == 3 and c.attributes["experiment_name"] == "exp_it"
            assert c.attributes["validate"] is False and c.attributes["rollout_n"] in (0, 1)
        got = shim.calls(PROJECT, query={"$and": [
            _expr("$eq", "attributes.sample_index", str(index)),
            {"$eq": [{"$convert": {"input": {"$getField": "attributes.rollout_n"}, "to": "int"}},
                     {"$literal": 1}]}]})
        assert len(got) == len(calls) // 2 and all(c.attributes["rollout_n"] == 1 for c in got)
        # the tree verl's weave backend draws: run is the root, its ops are its children (the
        # reward computed beside it is a second root in verl's shape)
        by_id = {c.id: c for c in calls}
        roots = shim.calls(PROJECT, trace_roots_only=True)
        assert sorted(r.op_name for r in roots) == sorted(
            ["ToolAgentLoop.run", "AgentLoopWorker._compute_score"] * 2)
        for c in calls:
            if c.op_name in VERL_OPS - {"ToolAgentLoop.run"} or c.op_name in OUR_EXTRA - {
                    "AgentLoopWorker._compute_score"}:
                assert by_id[c.parent_id].op_name == "ToolAgentLoop.run", c.op_name
                assert c.trace_id == by_id[c.parent_id].trace_id
        run = next(c for c in calls if c.op_name == "ToolAgentLoop.run")
        assert "raw_prompt" in run.inputs["kwargs"]
        assert run.output["num_turns"] == 4


def test_default_weave_tree_has_one_root_call_per_trajectory(tiny_model, tmp_path, monkeypatch):
    """otel_verl's default: the trajectory span (``agent_loop``) is each trajectory's root call,
    verl's ``ToolAgentLoop.run`` and the reward under it."""
    server = make_server(str(tmp_path / "weave.sqlite"))
    with WeaveShim(server, API_KEY) as shim:
        monkeypatch.setenv("WANDB_API_KEY", API_KEY)
        monkeypatch.setenv("OTEL_VERL_WEAVE_BASE_URL", shim.url)
        _run_verl_rollout(tiny_model, tmp_path)
        from verl.utils.rollout_trace import RolloutTraceConfig

        assert RolloutTraceConfig.flush(10.0)
        calls = shim.calls(PROJECT)
        roots = shim.calls(PROJECT, trace_roots_only=True)
    assert {c.op_name for c in calls} == VERL_OPS | OUR_EXTRA | {"agent_loop"}
    assert [r.op_name for r in roots] == ["agent_loop"] * 2
    assert all(r.attributes["reward"] is not None for r in roots)  # the root carries the reward
    by_id = {c.id: c for c in calls}
    for c in calls:
        if c.op_name in ("ToolAgentLoop.run", "AgentLoopWorker._compute_score"):
            assert by_id[c.parent_id].op_name == "agent_loop", c.op_name
