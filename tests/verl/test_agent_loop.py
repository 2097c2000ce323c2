"""verl's own AgentLoopWorker + ToolAgentLoop, configured by verl's Hydra config, traced by otel_verl.

verl builds everything here through its own code: the config (``ppo_trainer.yaml`` + command-line
overrides), ``AgentLoopWorker.__init__`` (which calls ``RolloutTraceConfig.init`` with the
``actor_rollout_ref.rollout.trace.*`` keys), the tool registry, ``ToolAgentLoop``, the hermes parser,
``LLMServerClient.generate``, ``_compute_score``. Only the LLM server actor and the reward worker
actor are local stand-ins (no Ray, no GPU).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import _harness as h
import numpy as np
import pytest

from otel_verl import TrajectorySampler, semconv
from otel_verl.store import read_spans

VERL_OPS = {"ToolAgentLoop.run", "LLMServerClient.generate", "HermesToolParser.extract_tool_calls",
            "CalculatorTool.execute"}
OUR_EXTRA = {"CalculatorTool.create", "CalculatorTool.release", "AgentLoopWorker._compute_score"}


def _run(tiny_model: Path, tmp_path: Path, trace: dict, batches: list) -> tuple[list, list]:
    """Build verl's worker from verl's config and run ``generate_sequences`` on each batch."""
    config = h.compose_config(h.base_overrides(tiny_model, h.write_tool_config(tmp_path), trace))
    worker, _, _ = h.make_worker(config)
    outputs = [asyncio.run(worker.generate_sequences(batch)) for batch in batches]
    from verl.utils.rollout_trace import RolloutTraceConfig

    RolloutTraceConfig.flush()
    trace_dir = tmp_path / "traces"
    spans = list(read_spans(trace_dir)) if trace_dir.exists() else []
    return spans, outputs


def _trajectories(spans: list) -> dict:
    """trajectory span id -> (trajectory span, [its descendants])."""
    by_id = {s["span_id"]: s for s in spans}
    out: dict = {}
    for s in spans:
        if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY):
            out.setdefault(s["span_id"], (s, []))
    for s in spans:
        node = s
        while node.get("parent_span_id") in by_id:
            node = by_id[node["parent_span_id"]]
            if node["span_id"] in out:
                out[node["span_id"]][1].append(s)
                break
    return out


def test_tool_agent_loop_to_local_store(tiny_model, tmp_path):
    spans, outputs = _run(tiny_model, tmp_path, {"backend": "file"},
                          [h.make_batch([0, 1], step=7, n=2)])
    # verl's rollout itself is unchanged: the tool was called and the reward computed
    scores = outputs[0].batch["rm_scores"].sum(-1).tolist()
    assert scores == [1.0, 1.0, 1.0, 1.0]

    names = {s["name"] for s in spans}
    assert VERL_OPS | OUR_EXTRA | {"agent_loop"} == names
    trajectories = _trajectories(spans)
    assert len(trajectories) == 4  # 2 samples x n=2, all traced (no sampling limit)
    keys = set()
    for traj, members in trajectories.values():
        attrs = traj["attributes"]
        assert traj["name"] == "agent_loop" and traj["parent_span_id"] in (None, "")
        assert attrs[semconv.ROLLOUT_STEP] == 7 and attrs[semconv.ROLLOUT_VALIDATE] is False
        assert attrs[semconv.ROLLOUT_EXPERIMENT_NAME] == "exp_it"
        assert attrs[semconv.ROLLOUT_REWARD] == 1.0  # verl's reward, on the trajectory
        assert attrs[semconv.ROLLOUT_NUM_TURNS] == 4
        # the root shows what went in and came out (Phoenix/Jaeger list rows, `traces list`)
        assert json.loads(attrs[semconv.INPUT_VALUE])[-1]["content"].startswith("What is 3+4?")
        outcome = json.loads(attrs[semconv.OUTPUT_VALUE])
        assert outcome["reward"] == 1.0 and outcome["num_turns"] == 4, outcome
        assert 0 < outcome["generated_tokens"] < outcome["response_length"], outcome
        assert "response" not in outcome  # token2text is off here
        keys.add((attrs[semconv.ROLLOUT_SAMPLE_INDEX], attrs[semconv.ROLLOUT_ROLLOUT_N]))
        by_name: dict = {}
        for s in members:
            by_name.setdefault(s["name"], []).append(s)
            assert s["trace_id"] == traj["trace_id"]
            for key in semconv.TRAJECTORY_KEYS:  # every span filterable on its own
                assert s["attributes"][key] == attrs[key], (s["name"], key)
        # the tree: agent_loop -> run -> {generate x2, parser x2, create, execute, release};
        #           agent_loop -> reward
        run, = by_name["ToolAgentLoop.run"]
        reward, = by_name["AgentLoopWorker._compute_score"]
        assert run["parent_span_id"] == traj["span_id"]
        assert reward["parent_span_id"] == traj["span_id"]
        assert reward["start_ns"] >= run["end_ns"]
        assert len(by_name["LLMServerClient.generate"]) == 2
        assert len(by_name["HermesToolParser.extract_tool_calls"]) == 2
        for name in ("LLMServerClient.generate", "HermesToolParser.extract_tool_calls",
                     "CalculatorTool.create", "CalculatorTool.execute", "CalculatorTool.release"):
            for s in by_name[name]:
                assert s["parent_span_id"] == run["span_id"], name
        create, = by_name["CalculatorTool.create"]
        execute, = by_name["CalculatorTool.execute"]
        release, = by_name["CalculatorTool.release"]
        assert create["end_ns"] <= execute["start_ns"] and execute["end_ns"] <= release["start_ns"]
        assert execute["attributes"][semconv.GEN_AI_TOOL_NAME] == "calculator"
        assert json.loads(execute["attributes"][semconv.INPUT_VALUE])["parameters"] == \
            {"expression": "3+4"}
        assert reward["attributes"][semconv.GEN_AI_EVALUATION_SCORE_VALUE] == 1.0
        assert reward["attributes"][semconv.OPENINFERENCE_SPAN_KIND] == "EVALUATOR"
        gen = by_name["LLMServerClient.generate"][0]
        assert gen["attributes"][semconv.OPENINFERENCE_SPAN_KIND] == "LLM"
        assert gen["attributes"][semconv.GEN_AI_USAGE_OUTPUT_TOKENS] > 0
        assert "prompt_ids" in json.loads(gen["attributes"][semconv.INPUT_VALUE])
    assert keys == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert spans[0]["resource"][semconv.ROLLOUT_PROJECT_NAME] == "verl_it"


@pytest.mark.parametrize("token2text", [True, False])
def test_token2text_key(tiny_model, tmp_path, token2text):
    spans, _ = _run(tiny_model, tmp_path, {"backend": "file", "token2text": token2text},
                    [h.make_batch([0], step=1)])
    run = next(s for s in spans if s["name"] == "ToolAgentLoop.run")
    output = json.loads(run["attributes"][semconv.OUTPUT_VALUE])
    gens = [json.loads(s["attributes"][semconv.OUTPUT_VALUE]) for s in spans
            if s["name"] == "LLMServerClient.generate"]
    root = next(s for s in spans if s["name"] == "agent_loop")
    outcome = json.loads(root["attributes"][semconv.OUTPUT_VALUE])
    if token2text:
        assert h.ANSWER in output["response_text"] and "What is 3+4?" in output["prompt_text"]
        # the trajectory's answer: the whole multi-turn response, tool result included
        assert h.ANSWER in outcome["response"] and "7" in outcome["response"], outcome
        assert {g["response_text"].replace("<|im_end|>", "") for g in gens} == \
            {h.TOOL_CALL, h.ANSWER}
    else:
        assert "response_text" not in output and all("response_text" not in g for g in gens)
        assert "response" not in outcome
    assert "response_ids" in output  # the real output is still there


def test_sampling_key_is_deterministic_and_replaces_verls_random_pick(tiny_model, tmp_path,
                                                                       monkeypatch):
    def no_random(*args, **kwargs):
        raise AssertionError("verl's np.random.choice sampling must not run")

    monkeypatch.setattr(np.random, "choice", no_random)
    samples = list(range(6))
    spans, _ = _run(tiny_model, tmp_path, {"backend": "file", "max_samples_per_step_per_worker": 2},
                    [h.make_batch(samples, step=1, n=2), h.make_batch(samples, step=2, n=2),
                     h.make_batch(samples[::-1], step=3, n=2, validate=True)])
    expected = TrajectorySampler(2, "exp_it").select(samples)
    assert len(expected) == 2
    traced: dict = {}
    for traj, members in _trajectories(spans).values():
        attrs = traj["attributes"]
        traced.setdefault(attrs[semconv.ROLLOUT_STEP], set()).add(
            (attrs[semconv.ROLLOUT_SAMPLE_INDEX], attrs[semconv.ROLLOUT_ROLLOUT_N]))
        assert members, "a traced trajectory has its op spans"
    both_rollouts = {(i, n) for i in expected for n in (0, 1)}
    assert traced == {1: both_rollouts, 2: both_rollouts, 3: both_rollouts}
    # unselected samples leave nothing at all (no op spans outside trajectories either)
    assert all(s["attributes"].get(semconv.ROLLOUT_SAMPLE_INDEX) in expected for s in spans)


def test_sampling_zero_traces_nothing(tiny_model, tmp_path):
    spans, outputs = _run(tiny_model, tmp_path,
                          {"backend": "file", "max_samples_per_step_per_worker": 0},
                          [h.make_batch([0, 1], step=1)])
    assert spans == []
    assert outputs[0].batch["rm_scores"].sum(-1).tolist() == [1.0, 1.0]


def test_backend_null_traces_nothing(tiny_model, tmp_path):
    spans, _ = _run(tiny_model, tmp_path, {"backend": None}, [h.make_batch([0], step=1)])
    from verl.utils.rollout_trace import RolloutTraceConfig

    assert RolloutTraceConfig.get_backend() is None
    assert spans == [] and not (tmp_path / "traces").exists()


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_trace_context_travels_with_the_request_to_vllm(tiny_model, tmp_path, engine):
    config = h.compose_config([*h.base_overrides(tiny_model, h.write_tool_config(tmp_path),
                                                 {"backend": "file"}),
                               f"actor_rollout_ref.rollout.name={engine}"])
    worker, server, _ = h.make_worker(config)
    asyncio.run(worker.generate_sequences(h.make_batch([0], step=1)))
    from verl.utils.rollout_trace import RolloutTraceConfig

    RolloutTraceConfig.flush()
    gens = {s["span_id"]: s for s in read_spans(tmp_path / "traces")
            if s["name"] == "LLMServerClient.generate"}
    assert len(server.calls) == 2 and len(gens) == 2
    from otel_verl.integrations.verl._vllm import VLLM_EXTRA_ARGS_KEY

    for call in server.calls:
        extra = call["sampling_params"].get("extra_args")
        if engine == "sglang":  # SGLang's sampling params reject unknown keys: nothing added
            assert extra is None
            continue
        _, trace_id, span_id, flags = extra[VLLM_EXTRA_ARGS_KEY]["traceparent"].split("-")
        assert span_id in gens and gens[span_id]["trace_id"] == trace_id
        assert int(flags, 16) & 1  # sampled
    # the traced input is the caller's, without the carrier
    for span in gens.values():
        assert "extra_args" not in json.loads(span["attributes"][semconv.INPUT_VALUE])[
            "sampling_params"]
