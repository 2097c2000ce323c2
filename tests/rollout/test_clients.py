"""Engine clients against a protocol-faithful stub: request shapes and trace context placement.

The real vLLM is exercised in tests/engine; SGLang cannot run on a CPU machine, so its client is
verified here only against SGLang's documented protocol (see docs/rollout.md).
"""

from __future__ import annotations

import json

import pytest

import otel_verl
from otel_verl import semconv
from otel_verl.rollout.clients import (
    EngineError,
    OpenAIChatClient,
    SGLangClient,
    VLLMCompletionsClient,
    VLLMGenerateClient,
)

from ._engine_stub import EngineStub


@pytest.fixture
def stub():
    with EngineStub() as s:
        yield s


def _chat_span(spans):
    """The one span of the LLM call: the traced ``generate``/``chat`` with the GenAI attributes
    (no separate ``chat {model}`` child)."""
    (chat,) = [s for s in spans.get_finished_spans()
               if s.attributes.get(semconv.GEN_AI_OPERATION_NAME) == "chat"]
    assert chat.name.endswith((".generate", ".chat")) and chat.kind.name == "CLIENT"
    assert chat.attributes[semconv.OPENINFERENCE_SPAN_KIND] == "LLM"
    assert not [s for s in spans.get_finished_spans() if s.name.startswith("chat ")]
    return chat


def _expected_parent(span) -> str:
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-"


async def test_sglang_native_generate_carries_trace_in_body_and_headers(stub, spans):
    sp = {"temperature": 0.5, "top_k": 20, "max_tokens": 8, "seed": 3, "logprobs": True,
          "structured_outputs": {"regex": "a+"}}
    async with SGLangClient(stub.url, "qwen") as client:
        with otel_verl.rollout_trace_attr(step=1, sample_index=4, rollout_n=0):
            out = await client.generate("traj-1", prompt_ids=[1, 2, 3], sampling_params=sp)
    (req,) = stub.requests
    body = req["body"]
    assert body["input_ids"] == [1, 2, 3] and body["stream"] is False
    assert body["rid"].startswith("traj-1-")
    assert body["sampling_params"] == {"temperature": 0.5, "top_k": 20, "max_new_tokens": 8,
                                       "sampling_seed": 3, "regex": "a+",
                                       "skip_special_tokens": False}
    assert body["return_logprob"] is True
    chat = _chat_span(spans)
    # where SGLang reads it: the body field first, the HTTP header otherwise — both point at the
    # chat span, so either code path of the server continues the trajectory's trace
    assert body["external_trace_header"]["traceparent"] == req["headers"]["traceparent"]
    assert req["engine_traceparent"].startswith(_expected_parent(chat))
    assert out.token_ids == [40, 41, 42] and out.log_probs == [-0.25] * 3
    assert out.finish_reason == "stop" and out.prompt_tokens == 3
    assert chat.attributes[semconv.GEN_AI_PROVIDER_NAME] == "sglang"
    assert chat.attributes[semconv.GEN_AI_REQUEST_TOP_K] == 20
    assert chat.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert chat.attributes[semconv.GEN_AI_RESPONSE_ID] == body["rid"]


async def test_sglang_json_and_grammar_constraints(stub):
    async with SGLangClient(stub.url, "qwen") as client:
        await client.generate("t", prompt_ids=[1], sampling_params={
            "structured_outputs": {"json": {"type": "object"}}})
        await client.generate("t", prompt_ids=[1], sampling_params={
            "structured_outputs": {"grammar": "root ::= \"a\""}})
    assert stub.requests[0]["body"]["sampling_params"]["json_schema"] == '{"type": "object"}'
    assert stub.requests[1]["body"]["sampling_params"]["ebnf"] == 'root ::= "a"'
    assert stub.requests[0]["body"]["rid"] != stub.requests[1]["body"]["rid"]


async def test_sglang_untraced_sends_no_context(stub, spans):
    async with SGLangClient(stub.url, "qwen") as client:
        with otel_verl.rollout_trace_attr(step=1, sample_index=4, rollout_n=0, trace=False):
            await client.generate("t", prompt_ids=[1], sampling_params={})
    (req,) = stub.requests
    assert "external_trace_header" not in req["body"]
    assert "traceparent" not in req["headers"]
    assert spans.get_finished_spans() == ()


async def test_sglang_error_is_raised_and_recorded(stub, spans):
    async with SGLangClient(stub.url, "qwen") as client:
        with pytest.raises(EngineError, match="400"):
            await client.generate("t", prompt_ids=[], sampling_params={})
    chat = _chat_span(spans)
    assert not chat.status.is_ok
    assert any(e.name == "exception" for e in chat.events)


@pytest.mark.parametrize("provider", ["vllm", "sglang"])
async def test_openai_chat_client(stub, spans, provider):
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
    async with OpenAIChatClient(stub.url, "qwen", provider=provider) as client:
        out = await client.chat(
            "conv-1", messages=[{"role": "user", "content": "2+3?"}], tools=tools,
            sampling_params={"max_tokens": 9, "temperature": 0.0, "seed": 1,
                             "structured_outputs": {"regex": "x"}})
    (req,) = stub.requests
    body = req["body"]
    assert body["tools"] == tools and body["tool_choice"] == "auto"
    assert body["max_tokens"] == 9 and body["seed"] == 1
    if provider == "vllm":
        assert body["structured_outputs"] == {"regex": "x"} and body["return_token_ids"] is True
    else:
        assert body["regex"] == "x" and "structured_outputs" not in body
    chat = _chat_span(spans)
    assert req["engine_traceparent"].startswith(_expected_parent(chat))
    assert out.tool_calls[0]["function"]["name"] == "calculator"
    assert out.finish_reason == "tool_calls"
    assert chat.attributes[semconv.GEN_AI_CONVERSATION_ID] == "conv-1"
    assert chat.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == 11
    assert chat.attributes[semconv.GEN_AI_RESPONSE_MODEL] == "qwen"
    assert chat.name == "OpenAIChatClient.chat"  # the op's span is the GenAI span
    assert json.loads(chat.attributes[semconv.INPUT_VALUE])["request_id"] == "conv-1"
    # the GenAI content attributes: the messages sent, the parsed tool call received
    assert json.loads(chat.attributes[semconv.GEN_AI_INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "2+3?"}]}]
    assert json.loads(chat.attributes[semconv.GEN_AI_OUTPUT_MESSAGES]) == [
        {"role": "assistant", "finish_reason": "tool_calls", "parts": [
            {"type": "tool_call", "id": "call_a", "name": "calculator",
             "arguments": {"expression": "2+3"}}]}]


async def test_vllm_completions_token_in_token_out(stub, spans):
    async with VLLMCompletionsClient(stub.url, "tiny") as client:
        out = await client.generate("r", prompt_ids=[1, 2], sampling_params={
            "max_new_tokens": 4, "logprobs": True, "structured_outputs": {"regex": "a"}})
    body = stub.requests[0]["body"]
    assert body["prompt"] == [1, 2] and body["max_tokens"] == 4 and body["logprobs"] == 0
    assert body["structured_outputs"] == {"regex": "a"}
    assert "guided_regex" not in body  # removed in vLLM 0.32: silently ignored there
    assert out.token_ids == [5, 6, 2] and out.log_probs == [-0.1, -0.2, 0.0]
    assert stub.requests[0]["engine_traceparent"].startswith(_expected_parent(_chat_span(spans)))
    # no chat_messages() around the call: no input messages; the output is the engine's text
    assert semconv.GEN_AI_INPUT_MESSAGES not in _chat_span(spans).attributes
    assert json.loads(_chat_span(spans).attributes[semconv.GEN_AI_OUTPUT_MESSAGES]) == [
        {"role": "assistant", "finish_reason": "stop", "parts": [{"type": "text",
                                                                  "content": "hi"}]}]


async def test_vllm_generate_endpoint(stub):
    async with VLLMGenerateClient(stub.url, "tiny") as client:
        out = await client.generate("r", prompt_ids=[1, 2, 3], sampling_params={
            "max_tokens": 2, "logprobs": True})
    body = stub.requests[0]["body"]
    assert body["token_ids"] == [1, 2, 3]
    assert body["sampling_params"] == {"max_tokens": 2, "logprobs": 0}
    assert out.token_ids == [7, 8] and out.log_probs == [-1.0, -2.0]
    assert out.finish_reason == "length" and out.response_id == "generate-tokens-1"


async def test_connection_pool_is_reused_and_closed(stub):
    client = VLLMCompletionsClient(stub.url, "tiny")
    await client.generate("r", prompt_ids=[1], sampling_params={})
    first = client.http
    await client.generate("r", prompt_ids=[1], sampling_params={})
    assert client.http is first
    await client.aclose()
    assert first.is_closed
