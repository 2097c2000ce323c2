"""ToolAgentLoop's state machine with scripted (and bad) model output, plus its spans."""

from __future__ import annotations

import pytest

import otel_verl
from otel_verl import semconv
from otel_verl.rollout.agent_loop import AgentLoopOutput, ToolAgentLoop, truncate_tool_text
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import BaseTool, CalculatorTool, ToolResponse

from .conftest import ScriptedClient

ROW = {
    "raw_prompt": [{"role": "user", "content": "What is 2 + 3?"}],
    "reward_model": {"ground_truth": "5"},
    "extra_info": {"index": 7},
}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'


def make_loop(tokenizer, script, **kwargs):
    client = ScriptedClient(tokenizer, script)
    kwargs.setdefault("tools", [CalculatorTool()])
    kwargs.setdefault("reward_fn", Gsm8kReward())
    return ToolAgentLoop(client, tokenizer, **kwargs), client


def segments(out: AgentLoopOutput, tokenizer) -> list[tuple[int, str]]:
    """The response as (mask, text) runs."""
    runs: list[tuple[int, list[int]]] = []
    for tid, m in zip(out.response_ids, out.response_mask, strict=True):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(tid)
        else:
            runs.append((m, [tid]))
    return [(m, tokenizer.decode(ids)) for m, ids in runs]


async def test_tool_call_then_answer(tokenizer):
    loop, client = make_loop(tokenizer, [CALL, "The answer is 5."])
    out = await loop.run({"temperature": 1.0, "max_tokens": 200, "logprobs": True}, **ROW)
    assert out.reward_score == 1.0
    assert out.num_turns == 4  # prompt + 2 assistant + 1 tool turn, as verl counts
    assert out.extra_fields["termination"] == "no_tool_call"
    assert out.extra_fields["num_tool_calls"] == 1 and out.extra_fields["num_tool_errors"] == 0
    assert segments(out, tokenizer) == [
        (1, CALL + "<|im_end|>"),
        (0, "\n<|im_start|>tool\n<tool_response>5</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n"),
        (1, "The answer is 5.<|im_end|>"),
    ]
    assert len(out.response_logprobs) == len(out.response_ids)
    assert all(lp == 0.0 for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m == 0)
    assert all(lp == -0.5 for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m == 1)
    # turn 2 continues exactly where turn 1 + the tool turn ended (prefix caching relies on it)
    first, second = client.requests
    assert second["prompt_ids"] == out.prompt_ids + out.response_ids[: len(second["prompt_ids"])
                                                                     - len(out.prompt_ids)]
    assert second["prompt_ids"][len(out.prompt_ids):] == out.response_ids[:-len(
        tokenizer.encode("The answer is 5.")) - 1]
    assert first["request_id"] == second["request_id"]  # sticky per trajectory
    assert tokenizer.decode(out.prompt_ids).endswith("<|im_start|>assistant\n")
    assert '"calculator"' in tokenizer.decode(out.prompt_ids)  # tool schema in the prompt


async def test_bad_json_becomes_error_tool_response_and_loop_continues(tokenizer):
    bad = '<tool_call>{"name": "calculator", "arguments": {"expression": 2+</tool_call>'
    loop, _ = make_loop(tokenizer, [bad, CALL, "#### 5"])
    out = await loop.run({"max_tokens": 200}, **ROW)
    assert out.extra_fields["num_tool_calls"] == 2
    assert out.extra_fields["num_tool_errors"] == 1
    tool_texts = [text for m, text in segments(out, tokenizer) if m == 0]
    assert "Error: invalid tool call (invalid JSON" in tool_texts[0]
    assert "<tool_response>5</tool_response>" in tool_texts[1]
    assert out.reward_score == 1.0
    assert out.response_logprobs is None  # not asked for


async def test_unknown_tool_is_an_error_response(tokenizer):
    call = '<tool_call>{"name": "web_search", "arguments": {"q": "x"}}</tool_call>'
    loop, _ = make_loop(tokenizer, [call, "The answer is 6."])
    out = await loop.run({"max_tokens": 200}, **ROW)
    messages = out.extra_fields["messages"]
    assert messages[2]["role"] == "tool"
    assert "unknown tool 'web_search'" in messages[2]["content"]
    assert "calculator" in messages[2]["content"]
    assert out.reward_score == 0.0 and out.extra_fields["num_tool_errors"] == 1


async def test_max_assistant_turns_terminates(tokenizer):
    loop, client = make_loop(tokenizer, [CALL] * 10, max_assistant_turns=3)
    out = await loop.run({"max_tokens": 200}, **ROW)
    assert len(client.requests) == 3
    assert out.extra_fields["termination"] == "max_assistant_turns"
    assert out.extra_fields["num_tool_calls"] == 2
    assert out.response_mask[-1] == 1  # ends with the model's (unanswered) call


async def test_max_user_turns_terminates(tokenizer):
    loop, client = make_loop(tokenizer, [CALL] * 10, max_user_turns=1, max_assistant_turns=9)
    out = await loop.run({"max_tokens": 200}, **ROW)
    assert out.extra_fields["termination"] == "max_user_turns"
    assert len(client.requests) == 2


async def test_response_length_budget(tokenizer):
    loop, client = make_loop(tokenizer, [CALL, "x" * 500], max_response_length=150)
    out = await loop.run({"max_tokens": 1000}, **ROW)
    assert out.extra_fields["termination"] == "response_length"
    assert len(out.response_ids) == 150 == len(out.response_mask)
    # each turn asked only for what was left of the budget
    assert client.requests[0]["sampling_params"]["max_tokens"] == 150
    assert client.requests[1]["sampling_params"]["max_tokens"] == 150 - len(
        client.requests[1]["prompt_ids"]) + len(out.prompt_ids)
    assert out.reward_score == 0.0


async def test_tool_turn_that_does_not_fit_terminates(tokenizer):
    loop, client = make_loop(tokenizer, [CALL], max_response_length=len(CALL) + 5)
    out = await loop.run({"max_tokens": 1000}, **ROW)
    assert out.extra_fields["termination"] == "response_length"
    assert set(out.response_mask) == {1} and len(client.requests) == 1


async def test_cut_turn_is_closed_with_eos(tokenizer):
    cut = (CALL, False)  # finished by length: no eos from the engine
    loop, _ = make_loop(tokenizer, [cut, "#### 5"])
    out = await loop.run({"max_tokens": 200}, **ROW)
    runs = segments(out, tokenizer)
    assert runs[0] == (1, CALL)
    assert runs[1][0] == 0 and runs[1][1].startswith("<|im_end|>\n<|im_start|>tool")


class LongTool(BaseTool):
    name = "long"

    async def _run(self, arguments):
        return ToolResponse(text="A" * 100 + "B" * 100)


async def test_tool_output_is_truncated(tokenizer):
    call = '<tool_call>{"name": "long", "arguments": {}}</tool_call>'
    loop, _ = make_loop(tokenizer, [call, "done"], tools=[LongTool()],
                        max_tool_response_length=20)
    out = await loop.run({"max_tokens": 400}, **ROW)
    content = out.extra_fields["messages"][2]["content"]
    assert content == "A" * 10 + "\n...(truncated)...\n" + "B" * 10


def test_truncate_sides():
    assert truncate_tool_text("abcdef", 10) == "abcdef"
    assert truncate_tool_text("abcdef", 2, "left") == "ab...(truncated)"
    assert truncate_tool_text("abcdef", 2, "right") == "(truncated)...ef"
    assert truncate_tool_text("abcdef", 3, "middle") == "a\n...(truncated)...\nef"


async def test_no_ground_truth_no_reward(tokenizer):
    loop, _ = make_loop(tokenizer, ["#### 5"])
    out = await loop.run({}, raw_prompt=ROW["raw_prompt"])
    assert out.reward_score is None and out.num_turns == 2


async def test_turn_sampling_is_merged_per_turn(tokenizer):
    seen = []

    def policy(turn, messages, row):
        seen.append((turn, messages[-1]["role"], row["extra_info"]["index"]))
        return {"structured_outputs": {"regex": f"turn{turn}"}}

    loop, client = make_loop(tokenizer, [CALL, "#### 5"], turn_sampling=policy)
    await loop.run({"max_tokens": 99}, **ROW)
    assert seen == [(0, "user", 7), (1, "tool", 7)]
    assert [r["sampling_params"]["structured_outputs"]["regex"] for r in client.requests] == [
        "turn0", "turn1"]


async def test_engine_error_propagates_and_is_recorded(tokenizer, spans):
    class Broken(ScriptedClient):
        async def _generate(self, *args):
            raise ConnectionError("engine down")

    loop = ToolAgentLoop(Broken(tokenizer, []), tokenizer, tools=[CalculatorTool()])
    with otel_verl.rollout_trace_attr(step=1, sample_index=0, rollout_n=0):
        with pytest.raises(ConnectionError, match="engine down"):
            await loop.run({}, **ROW)
    by_name = {s.name: s for s in spans.get_finished_spans()}
    for name in ("ToolAgentLoop.run", "AsyncTokenClient.generate"):
        assert not by_name[name].status.is_ok, name


async def test_trajectory_span_tree(tokenizer, spans):
    loop, client = make_loop(tokenizer, [CALL, "The answer is 5."])
    with otel_verl.rollout_trace_attr(step=2, sample_index=7, rollout_n=1, name="agent_loop"):
        out = await loop.run({"temperature": 0.7, "top_p": 0.9, "max_tokens": 300}, **ROW)
    finished = spans.get_finished_spans()
    assert len({s.context.trace_id for s in finished}) == 1
    by_id = {s.context.span_id: s for s in finished}

    def parent_name(span):
        return by_id[span.parent.span_id].name if span.parent else None

    tree = sorted((s.name, parent_name(s)) for s in finished)
    assert tree == sorted([
        ("agent_loop", None),
        ("ToolAgentLoop.run", "agent_loop"),
        ("AsyncTokenClient.generate", "ToolAgentLoop.run"),  # one span per LLM call: the op
        ("AsyncTokenClient.generate", "ToolAgentLoop.run"),  # with the GenAI attributes
        ("HermesToolParser.extract_tool_calls", "ToolAgentLoop.run"),
        ("HermesToolParser.extract_tool_calls", "ToolAgentLoop.run"),
        ("BaseTool.execute", "ToolAgentLoop.run"),
        ("Gsm8kReward.compute_score", "ToolAgentLoop.run"),
    ])
    for s in finished:
        assert s.attributes[semconv.ROLLOUT_STEP] == 2
        assert s.attributes[semconv.ROLLOUT_SAMPLE_INDEX] == 7
    trajectory = next(s for s in finished if s.name == "agent_loop")
    assert trajectory.attributes[semconv.ROLLOUT_REWARD] == 1.0
    assert trajectory.attributes[semconv.ROLLOUT_NUM_TURNS] == out.num_turns == 4
    chat = next(s for s in finished if s.name == "AsyncTokenClient.generate")
    assert chat.kind.name == "CLIENT"
    assert chat.attributes[semconv.GEN_AI_OPERATION_NAME] == "chat"
    assert chat.attributes[semconv.GEN_AI_PROVIDER_NAME] == "fake"
    assert chat.attributes[semconv.GEN_AI_REQUEST_MODEL] == "fake-model"
    assert chat.attributes[semconv.GEN_AI_REQUEST_TEMPERATURE] == 0.7
    assert chat.attributes[semconv.GEN_AI_REQUEST_TOP_P] == 0.9
    assert chat.attributes[semconv.GEN_AI_REQUEST_MAX_TOKENS] == 300
    assert chat.attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert chat.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == len(tokenizer.encode(CALL)) + 1
    assert chat.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == len(out.prompt_ids)
    assert chat.attributes[semconv.OPENINFERENCE_SPAN_KIND] == "LLM"
    # the engine got the LLM call's own span context in its headers
    tp = client.requests[0]["headers"]["traceparent"]
    first_chat = min((s for s in finished if s.name == "AsyncTokenClient.generate"),
                     key=lambda s: s.start_time)
    assert tp.startswith(f"00-{first_chat.context.trace_id:032x}-{first_chat.context.span_id:016x}-")
    assert int(tp[-2:], 16) & 1  # sampled


async def test_untraced_trajectory_makes_no_spans_and_sends_no_headers(tokenizer, spans):
    loop, client = make_loop(tokenizer, [CALL, "#### 5"])
    with otel_verl.rollout_trace_attr(step=1, sample_index=7, rollout_n=0, trace=False):
        out = await loop.run({"max_tokens": 200}, **ROW)
    assert out.reward_score == 1.0
    assert spans.get_finished_spans() == ()
    assert all(r["headers"] == {} for r in client.requests)
