"""One trajectory against a real vLLM: our spans and the engine's ``llm_request`` spans form one
trace with the right parents (trajectory -> run -> generate -> chat -> llm_request; tools, parser
and reward under run)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import otel_verl
from otel_verl import RolloutTraceConfig, semconv
from otel_verl.demo.run import ForcedToolPolicy, make_rows
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import OpenAIChatClient, VLLMCompletionsClient, VLLMGenerateClient
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool

from .conftest import MODEL

pytestmark = pytest.mark.timeout(420)


def _init(receiver) -> str:
    experiment = f"engine-{uuid.uuid4().hex[:8]}"
    RolloutTraceConfig.init("engine-tests", experiment, backend="otlp",
                            otlp_endpoint=receiver.endpoint, otlp_protocol="http/protobuf")
    return experiment


def _ours(spans, experiment):
    return [s for s in spans if s["attributes"].get(semconv.ROLLOUT_EXPERIMENT_NAME) == experiment]


def _wait_trace(receiver, experiment, engine_spans: int):
    """Spans of our (single) trajectory's trace, once the engine's spans have arrived too."""

    def ready(spans):
        ours = _ours(spans, experiment)
        trajectories = [s for s in ours if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY)]
        if len(trajectories) != 1:
            return False
        trace_id = trajectories[0]["trace_id"]
        engine = [s for s in spans if s["trace_id"] == trace_id and s["name"] == "llm_request"]
        return len(engine) >= engine_spans

    spans = receiver.wait_for(ready, timeout_s=60)
    (trajectory,) = [s for s in _ours(spans, experiment)
                     if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY)]
    return trajectory, [s for s in spans if s["trace_id"] == trajectory["trace_id"]]


async def test_one_trajectory_is_one_trace_with_engine_spans(vllm_server, receiver, tokenizer):
    experiment = _init(receiver)
    client = VLLMCompletionsClient(vllm_server.base_url, MODEL, tokenizer=tokenizer)
    loop = ToolAgentLoop(client, tokenizer, tools=[CalculatorTool()], reward_fn=Gsm8kReward(),
                         turn_sampling=ForcedToolPolicy(p_exact=1.0), max_response_length=256)
    row = make_rows(1)[0]
    try:
        with otel_verl.rollout_trace_attr(step=1, sample_index=0, rollout_n=0, name="agent_loop"):
            out = await asyncio.wait_for(
                loop.run({"temperature": 1.0, "max_tokens": 96, "logprobs": True}, **row), 180)
    finally:
        await client.aclose()
    assert RolloutTraceConfig.flush(timeout_s=10)

    # the rollout itself: a real hermes tool call, executed, then the right answer
    assert out.extra_fields["num_tool_calls"] == 1 and out.extra_fields["num_tool_errors"] == 0
    assert out.extra_fields["termination"] == "no_tool_call"
    assert out.reward_score == 1.0 and out.num_turns == 4
    assert len(out.response_logprobs) == len(out.response_ids) == len(out.response_mask)
    assert out.response_mask[0] == 1 and 0 in out.response_mask and out.response_mask[-1] == 1

    trajectory, spans = _wait_trace(receiver, experiment, engine_spans=2)
    by_id = {s["span_id"]: s for s in spans}
    assert len(by_id) == len(spans)

    def children(parent, name):
        return [s for s in spans if s["parent_span_id"] == parent["span_id"] and s["name"] == name]

    assert trajectory["parent_span_id"] is None and trajectory["name"] == "agent_loop"
    assert trajectory["attributes"][semconv.ROLLOUT_REWARD] == 1.0
    (run,) = children(trajectory, "ToolAgentLoop.run")
    generates = children(run, "AsyncTokenClient.generate")
    assert len(generates) == 2
    for chat in generates:  # one span per LLM call: the op carries the GenAI attributes
        assert not children(chat, f"chat {MODEL}")
        assert chat["kind"] == "CLIENT"
        assert chat["attributes"][semconv.GEN_AI_PROVIDER_NAME] == "vllm"
        (engine,) = children(chat, "llm_request")  # the engine's span, child of the chat turn
        assert engine["kind"] == "SERVER"
        assert engine["resource"]["service.name"] == "vllm-engine-test"
        assert engine["attributes"]["gen_ai.usage.completion_tokens"] == \
            chat["attributes"][semconv.GEN_AI_USAGE_OUTPUT_TOKENS]
        assert engine["attributes"]["gen_ai.usage.prompt_tokens"] == \
            chat["attributes"][semconv.GEN_AI_USAGE_INPUT_TOKENS]
        assert engine["attributes"]["gen_ai.request.max_tokens"] == \
            chat["attributes"][semconv.GEN_AI_REQUEST_MAX_TOKENS]
        assert chat["start_ns"] <= engine["start_ns"] and engine["end_ns"] <= chat["end_ns"]
    (tool,) = children(run, "BaseTool.execute")
    assert tool["attributes"][semconv.GEN_AI_TOOL_NAME] == "calculator"
    assert tool["attributes"][semconv.GEN_AI_TOOL_CALL_RESULT] == row["reward_model"]["ground_truth"]
    assert len(children(run, "HermesToolParser.extract_tool_calls")) == 2
    (reward,) = children(run, "Gsm8kReward.compute_score")
    assert reward["attributes"][semconv.GEN_AI_EVALUATION_SCORE_VALUE] == 1.0
    # order: turn 1, tool, turn 2, reward
    first, second = sorted(generates, key=lambda s: s["start_ns"])
    assert first["end_ns"] <= tool["start_ns"] <= tool["end_ns"] <= second["start_ns"]
    assert second["end_ns"] <= reward["start_ns"]
    # every span of ours carries the trajectory identity
    for s in spans:
        if s["name"] != "llm_request":
            assert s["attributes"][semconv.ROLLOUT_STEP] == 1, s["name"]


async def test_chat_and_token_generate_endpoints_join_the_trace(vllm_server, receiver):
    experiment = _init(receiver)
    regex = (r'<tool_call>\{"name": "calculator", "arguments": \{"expression": '
             r'"[1-9][+*-][1-9]"\}\}</tool_call>')
    chat_client = OpenAIChatClient(vllm_server.base_url, MODEL)
    gen_client = VLLMGenerateClient(vllm_server.base_url, MODEL)
    try:
        with otel_verl.rollout_trace_attr(step=5, sample_index=1, rollout_n=0):
            chat = await asyncio.wait_for(chat_client.chat(
                "conv", messages=[{"role": "user", "content": "What is 2 + 3?"}],
                tools=[CalculatorTool().schema()],
                sampling_params={"max_tokens": 80, "structured_outputs": {"regex": regex}}), 120)
            gen = await asyncio.wait_for(gen_client.generate(
                "conv", prompt_ids=[1, 85, 91, 263], sampling_params={
                    "max_tokens": 8, "logprobs": True,
                    "structured_outputs": {"regex": "The answer is [0-9]{1,3}\\."}}), 120)
    finally:
        await chat_client.aclose()
        await gen_client.aclose()
    assert RolloutTraceConfig.flush(timeout_s=10)
    # structured outputs really constrain the CPU engine (guided_* fields would be ignored)
    # ... and the server's hermes parser turns the constrained text into a real tool call
    assert chat.finish_reason == "tool_calls", chat
    assert chat.tool_calls[0]["function"]["name"] == "calculator"
    assert gen.token_ids and gen.log_probs is not None and len(gen.log_probs) == len(gen.token_ids)

    _, spans = _wait_trace(receiver, experiment, engine_spans=2)
    chats = [s for s in spans if s["name"] in ("OpenAIChatClient.chat",
                                                 "VLLMGenerateClient.generate",
                                                 "AsyncTokenClient.generate")]
    assert len(chats) == 2, [s["name"] for s in spans]
    for chat_span in chats:
        assert [s["name"] for s in spans if s["parent_span_id"] == chat_span["span_id"]] == [
            "llm_request"]


async def test_untraced_trajectory_sends_no_trace_context(vllm_server, receiver, tokenizer):
    _init(receiver)
    client = VLLMCompletionsClient(vllm_server.base_url, MODEL)
    try:
        with otel_verl.rollout_trace_attr(step=1, sample_index=9, rollout_n=0, trace=False):
            out = await asyncio.wait_for(client.generate(
                "r", prompt_ids=[1, 85, 91], sampling_params={"max_tokens": 4}), 120)
    finally:
        await client.aclose()
    request_id = f"{out.response_id}-0"  # vLLM's internal id of a completions request

    spans = receiver.wait_for(
        lambda ss: any(s["attributes"].get("gen_ai.request.id") == request_id for s in ss), 60)
    (engine,) = [s for s in spans if s["attributes"].get("gen_ai.request.id") == request_id]
    assert engine["parent_span_id"] is None  # vLLM started its own trace: nothing was sent


def test_tiny_model_build_is_deterministic(tmp_path, tiny_model_dir):
    from otel_verl.demo.tiny_model import build_tiny_model

    other = build_tiny_model(tmp_path / "again")
    for name in ("tokenizer.json", "model.safetensors", "config.json", "chat_template.jinja"):
        assert (other / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name
