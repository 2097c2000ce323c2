"""The GenAI semantic-conventions profile of one traced trajectory, span by span.

One ToolAgentLoop rollout (tool call, then answer, then reward) against the scripted client; every
span's GenAI and OpenInference attributes are checked against the table in docs/rollout.md
("GenAI profile"). Content attributes (`gen_ai.input.messages`, ...) go through the payload rules:
present with capture on, absent with ``capture_payloads=False``, secrets redacted.
"""

from __future__ import annotations

import json

import pytest

import otel_verl
from otel_verl import semconv
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import genai_input_messages, genai_output_messages
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool
from otel_verl.testing import capture_spans

from .conftest import CharTokenizer, ScriptedClient

SECRET = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"
ROW = {
    "raw_prompt": [{"role": "user", "content": f"What is 2 + 3? (my key is {SECRET})"}],
    "reward_model": {"ground_truth": "5"},
}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
CONTENT_KEYS = (semconv.GEN_AI_INPUT_MESSAGES, semconv.GEN_AI_OUTPUT_MESSAGES,
                semconv.GEN_AI_TOOL_CALL_ARGUMENTS, semconv.GEN_AI_TOOL_CALL_RESULT,
                semconv.INPUT_VALUE, semconv.OUTPUT_VALUE)


async def _rollout(**init) -> list:
    tokenizer = CharTokenizer()
    with capture_spans(project_name="proj", experiment_name="exp", **init) as exporter:
        loop = ToolAgentLoop(ScriptedClient(tokenizer, [CALL, "The answer is 5."]), tokenizer,
                             tools=[CalculatorTool()], reward_fn=Gsm8kReward(),
                             agent_name="gsm8k-solver")
        with otel_verl.rollout_trace_attr(step=1, sample_index=3, rollout_n=0, name="agent_loop"):
            await loop.run({"max_tokens": 200, "temperature": 0.7}, **ROW)
        return list(exporter.get_finished_spans())


def _one(spans, name, **where):
    found = [s for s in spans if s.name == name
             and all(s.attributes.get(k) == v for k, v in where.items())]
    assert found, f"no span {name} {where}: {[s.name for s in spans]}"
    return found


async def test_profile_span_by_span():
    spans = await _rollout()
    (traj,) = _one(spans, "agent_loop")
    (run,) = _one(spans, "ToolAgentLoop.run")
    chats = _one(spans, "AsyncTokenClient.generate")  # one span per LLM call: op + GenAI
    (tool,) = _one(spans, "BaseTool.execute")
    (reward,) = _one(spans, "Gsm8kReward.compute_score")
    conversation = run.attributes[semconv.GEN_AI_CONVERSATION_ID]

    expected = [  # (span, attributes it must carry)
        (traj, {semconv.OPENINFERENCE_SPAN_KIND: "AGENT", semconv.OTEL_VERL_TRAJECTORY: True,
                semconv.GEN_AI_CONVERSATION_ID: conversation, semconv.ROLLOUT_REWARD: 1.0}),
        (run, {semconv.GEN_AI_OPERATION_NAME: "invoke_agent",
               semconv.GEN_AI_AGENT_NAME: "gsm8k-solver",
               semconv.GEN_AI_PROVIDER_NAME: "fake", semconv.GEN_AI_REQUEST_MODEL: "fake-model",
               semconv.OPENINFERENCE_SPAN_KIND: "CHAIN"}),
        *[(chat, {semconv.GEN_AI_OPERATION_NAME: "chat", semconv.GEN_AI_PROVIDER_NAME: "fake",
                  semconv.GEN_AI_REQUEST_MODEL: "fake-model",
                  semconv.GEN_AI_RESPONSE_MODEL: "fake-model",
                  semconv.GEN_AI_REQUEST_TEMPERATURE: 0.7,
                  semconv.GEN_AI_CONVERSATION_ID: conversation,
                  semconv.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
                  semconv.OPENINFERENCE_SPAN_KIND: "LLM"}) for chat in chats],
        (tool, {semconv.GEN_AI_OPERATION_NAME: "execute_tool",
                semconv.GEN_AI_TOOL_NAME: "calculator", semconv.GEN_AI_TOOL_TYPE: "function",
                semconv.GEN_AI_TOOL_CALL_ID: "call_0_0",
                semconv.GEN_AI_TOOL_CALL_ARGUMENTS: '{"expression":"2+3"}',
                semconv.GEN_AI_TOOL_CALL_RESULT: "5",
                semconv.OPENINFERENCE_SPAN_KIND: "TOOL"}),
        (reward, {semconv.GEN_AI_OPERATION_NAME: "evaluate",
                  semconv.GEN_AI_EVALUATION_NAME: "gsm8k",
                  semconv.GEN_AI_EVALUATION_SCORE_VALUE: 1.0,
                  semconv.GEN_AI_EVALUATION_SCORE_LABEL: "correct",
                  semconv.OPENINFERENCE_SPAN_KIND: "EVALUATOR"}),
    ]
    for span, attrs in expected:
        got = {k: span.attributes.get(k) for k in attrs}
        assert got == attrs, span.name
        for key in semconv.TRAJECTORY_KEYS:  # every span filterable on its own
            assert key in span.attributes, (span.name, key)
    assert len(chats) == 2
    assert all(c.kind.name == "CLIENT" for c in chats)
    assert not [s for s in spans if s.name.startswith("chat ")]  # no second span per call
    for chat in chats:  # the op's own payloads sit beside the GenAI ones
        assert json.loads(chat.attributes[semconv.INPUT_VALUE])["prompt_ids"]
        assert semconv.GEN_AI_INPUT_MESSAGES in chat.attributes
        assert chat.parent.span_id == run.context.span_id
    assert run.parent.span_id == traj.context.span_id
    assert all(s.context.trace_id == traj.context.trace_id for s in spans)  # one trace
    # usage on every chat span
    for chat in chats:
        assert chat.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] > 0
        assert chat.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] > 0
    # the reward as the GenAI evaluation event on the trajectory span
    (event,) = [e for e in traj.events if e.name == semconv.GEN_AI_EVALUATION_RESULT]
    assert dict(event.attributes) == {semconv.GEN_AI_EVALUATION_NAME: "gsm8k",
                                      semconv.GEN_AI_EVALUATION_SCORE_VALUE: 1.0,
                                      semconv.GEN_AI_EVALUATION_SCORE_LABEL: "correct"}


async def test_chat_messages_follow_the_genai_message_schema():
    spans = await _rollout()
    first, second = sorted(_one(spans, "AsyncTokenClient.generate"), key=lambda s: s.start_time)
    msgs_in = json.loads(second.attributes[semconv.GEN_AI_INPUT_MESSAGES])
    # per-turn content (docs/content.md): the second turn shows the messages it appended and
    # refers to the first turn's list for the rest
    assert [m["role"] for m in msgs_in] == ["assistant", "tool"]
    assert second.attributes[semconv.CONTENT_MESSAGES_BASE_ID] == \
        first.attributes[semconv.CONTENT_MESSAGES_ID]
    assert second.attributes[semconv.CONTENT_MESSAGES_BASE_LEN] == 1
    assert msgs_in[0]["parts"] == [{"type": "tool_call", "id": "call_0_0", "name": "calculator",
                                    "arguments": {"expression": "2+3"}}]
    assert msgs_in[1]["parts"] == [{"type": "tool_call_response", "id": "call_0_0",
                                    "response": "5"}]
    out = json.loads(second.attributes[semconv.GEN_AI_OUTPUT_MESSAGES])
    assert out == [{"role": "assistant", "finish_reason": "stop",
                    "parts": [{"type": "text", "content": "The answer is 5."}]}]
    # the first turn saw only the user's message; the secret in it never leaves the process
    first_in = first.attributes[semconv.GEN_AI_INPUT_MESSAGES]
    assert SECRET not in first_in and "[REDACTED]" in first_in
    assert json.loads(first_in)[0]["parts"][0]["type"] == "text"


async def test_no_content_attributes_without_payload_capture():
    spans = await _rollout(capture_payloads=False)
    for span in spans:
        leaked = [k for k in CONTENT_KEYS if k in span.attributes]
        assert not leaked, (span.name, leaked)
    # the metadata profile stays
    (run,) = _one(spans, "ToolAgentLoop.run")
    assert run.attributes[semconv.GEN_AI_OPERATION_NAME] == "invoke_agent"
    assert all(c.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] > 0
               for c in _one(spans, "AsyncTokenClient.generate"))


@pytest.mark.parametrize(("message", "parts"), [
    ({"role": "system", "content": "be brief"}, [{"type": "text", "content": "be brief"}]),
    ({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
     [{"type": "text", "content": "ab"}]),
    ({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]},
     [{"type": "tool_call", "id": "c1", "name": "f", "arguments": "{not json"}]),
    ({"role": "tool", "tool_call_id": "c1", "content": "42"},
     [{"type": "tool_call_response", "id": "c1", "response": "42"}]),
])
def test_message_conversion(message, parts):
    assert genai_input_messages([message]) == [{"role": message["role"], "parts": parts}]


def test_output_message_with_parsed_tool_calls():
    calls = [{"id": "a", "function": {"name": "calculator", "arguments": '{"expression": "1"}'}}]
    assert genai_output_messages("", "tool_calls", calls) == [{
        "role": "assistant", "finish_reason": "tool_calls",
        "parts": [{"type": "tool_call", "id": "a", "name": "calculator",
                   "arguments": {"expression": "1"}}]}]


async def test_trajectory_root_reads_at_a_glance():
    spans = await _rollout()
    (traj,) = _one(spans, "agent_loop")
    # the question as plain text, the planted key scrubbed
    assert traj.attributes[semconv.INPUT_VALUE] == "What is 2 + 3? (my key is [REDACTED])"
    assert traj.attributes[semconv.INPUT_MIME_TYPE] == "text/plain"
    assert json.loads(traj.attributes[semconv.OUTPUT_VALUE]) == {
        "answer": "The answer is 5.", "reward": 1.0, "reward_label": "correct"}
    for span in spans:  # the GRPO group and verl's names, on every span
        assert span.attributes[semconv.SESSION_ID] == "exp/step-1/sample-3"
        assert json.loads(span.attributes[semconv.METADATA]) == {
            "step": 1, "sample_index": 3, "rollout_n": 0, "validate": False,
            "experiment_name": "exp"}


async def test_root_without_payload_capture_keeps_session_and_reward():
    spans = await _rollout(capture_payloads=False)
    (traj,) = _one(spans, "agent_loop")
    assert semconv.INPUT_VALUE not in traj.attributes
    assert semconv.OUTPUT_VALUE not in traj.attributes
    assert traj.attributes[semconv.ROLLOUT_REWARD] == 1.0
    assert traj.attributes[semconv.SESSION_ID] == "exp/step-1/sample-3"


@pytest.mark.parametrize(("kwargs", "session"), [
    ({"step": 2, "sample_index": 7, "rollout_n": 1}, "e/step-2/sample-7"),
    ({"step": 2, "sample_index": 7, "validate": True}, "e/step-2/sample-7/validate"),
    ({"sample_index": 7}, None),  # no step: no group
])
def test_reward_outside_an_agent_loop_and_session_ids(kwargs, session):
    with capture_spans(experiment_name="e") as exporter:
        with otel_verl.rollout_trace_attr(**kwargs):
            otel_verl.set_trajectory_output(answer="42")
            otel_verl.record_reward(0.5, name="judge")
        otel_verl.record_reward(1.0)  # outside a trajectory: nothing, no error
        otel_verl.set_trajectory_output(answer="ignored")
        otel_verl.set_trajectory_input("ignored")
    (traj,) = exporter.get_finished_spans()
    assert traj.attributes.get(semconv.SESSION_ID) == session
    assert json.loads(traj.attributes[semconv.OUTPUT_VALUE]) == {"answer": "42", "reward": 0.5}
    assert semconv.INPUT_VALUE not in traj.attributes


def test_structured_trajectory_input_is_json():
    with capture_spans() as exporter:
        with otel_verl.rollout_trace_attr(step=1, sample_index=0):
            otel_verl.set_trajectory_input([{"role": "system", "content": [{"text": "x"}]}])
    (traj,) = exporter.get_finished_spans()
    assert json.loads(traj.attributes[semconv.INPUT_VALUE]) == [
        {"role": "system", "content": [{"text": "x"}]}]
    assert traj.attributes[semconv.INPUT_MIME_TYPE] == "application/json"


@pytest.mark.parametrize(("key", "sensitive"), [
    ("session.id", False),  # OpenInference's grouping key, written by otel_verl: kept
    ("session_id", True), ("http.session.id", True), ("SessionId", True),  # secrets elsewhere
])
def test_only_the_openinference_session_id_escapes_redaction(key, sensitive):
    from otel_verl.exporters._scrub import is_sensitive_key

    assert is_sensitive_key(key) is sensitive
