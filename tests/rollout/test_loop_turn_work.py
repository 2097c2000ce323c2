"""Per turn, the agent loop and its token client allocate what the turn adds, not the context.

A fresh context-long list per turn (``prompt_ids + response_ids``, or a copy of it in the client)
stays young while the engine runs, and every young GC collection in that time scans it: the
cost that tracing's extra collections multiply (issue 18). The loop hands the engine one list
extended in place, as verl's ``agent_data.prompt_ids`` is, and the client does not copy it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import otel_verl
from otel_verl import RolloutTraceConfig, _content, semconv
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import AsyncTokenClient, TokenOutput
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool
from otel_verl.store import read_spans
from otel_verl.store._content import ContentIndex

from .conftest import CharTokenizer, ScriptedClient

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
ROW = {"raw_prompt": [{"role": "user", "content": "What is 2 + 3? " * 40}],
       "reward_model": {"ground_truth": "5"}, "extra_info": {"index": 1}}


class _Keeping(ScriptedClient):
    """Keeps the very list objects the engine was handed (and what they held then)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.lists: list[list[int]] = []

    async def _generate(self, request_id, prompt_ids, sp, headers) -> TokenOutput:
        self.lists.append(prompt_ids)
        return await super()._generate(request_id, prompt_ids, sp, headers)


async def test_the_engine_gets_one_context_list_extended_in_place(tokenizer, spans):
    client = _Keeping(tokenizer, [CALL, CALL, CALL, "#### 5"])
    loop = ToolAgentLoop(client, tokenizer, tools=[CalculatorTool()], reward_fn=Gsm8kReward(),
                         max_assistant_turns=4, max_user_turns=4, max_response_length=4096)
    out = await loop.run({"max_tokens": 64}, **ROW)
    assert out.extra_fields["assistant_turns"] == 4 and out.reward_score == 1.0
    first = client.lists[0]
    assert len(client.lists) == 4
    assert all(sent is first for sent in client.lists)  # no new context-long list per turn
    # what each turn received is still exactly the prompt plus the response so far
    sent = [r["prompt_ids"] for r in client.requests]  # the fake's snapshots at call time
    assert sent[0] == out.prompt_ids
    for turn in sent:
        assert turn == out.prompt_ids + out.response_ids[:len(turn) - len(out.prompt_ids)]
    assert [len(t) for t in sent] == sorted({len(t) for t in sent})  # each one longer
    assert out.prompt_ids is not first  # the output's prompt is not the extended list


class _Recording(AsyncTokenClient):
    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", "m")
        self.got: list[Any] = []

    async def _generate(self, request_id, prompt_ids, sp, headers) -> TokenOutput:
        self.got.append(prompt_ids)
        return TokenOutput(token_ids=[1], finish_reason="stop")


async def test_generate_hands_a_list_to_the_engine_uncopied(spans):
    client = _Recording()
    ids = list(range(1000, 5000))
    await client.generate("r", prompt_ids=ids, sampling_params={})
    assert client.got[0] is ids
    await client.generate("r", prompt_ids=tuple(ids), sampling_params={})  # not a list: one
    assert type(client.got[1]) is list and client.got[1] == ids


# the tracing side: what the loop's thread encodes per turn -----------------------------------

CONTEXT = 32 * 1024


def _long_row(i: int) -> dict[str, Any]:
    text = ("Consider the worked examples carefully. " * (CONTEXT // 40 + 1))[:CONTEXT]
    return {"raw_prompt": [{"role": "user", "content": f"{text}\nWhat is 2 + 3? ({i})"}],
            "reward_model": {"ground_truth": "5"}, "extra_info": {"index": i}}


class _Slow(ScriptedClient):
    """An engine that takes a while, as one does (the content-hash thread's time)."""

    async def _generate(self, request_id, prompt_ids, sp, headers) -> TokenOutput:
        await asyncio.sleep(0.1)
        turn = sum(r["request_id"] == request_id for r in self.requests)
        self.script = [[CALL, CALL, CALL, "#### 5"][min(turn, 3)]]  # per trajectory
        return await super()._generate(request_id, prompt_ids, sp, headers)


def _watch_message_bytes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the message encodings done on this (the event loop's) thread."""
    on_loop: list[int] = []
    encode = _content.message_bytes
    main = threading.current_thread()

    def watched(messages: Any) -> Any:
        data = encode(messages)
        if threading.current_thread() is main and data is not None:
            on_loop.append(len(data))
        return data

    monkeypatch.setattr(_content, "message_bytes", watched)
    return on_loop


def test_a_long_conversation_is_encoded_on_the_loop_once_not_per_turn(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Turn 1's ``gen_ai.input.messages`` (the whole 32k-character conversation) is encoded and
    hashed off the loop; the loop encodes the conversation once per trajectory at most (the
    dataset prompt's reference on the ``run`` span), then only what each turn appends. Every
    turn's messages still rebuild exactly, turn 1 included, with interleaved trajectories."""
    on_loop = _watch_message_bytes(monkeypatch)
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path))
    tokenizer = CharTokenizer()
    client = _Slow(tokenizer, [])
    loop = ToolAgentLoop(client, tokenizer, tools=[CalculatorTool()], reward_fn=Gsm8kReward(),
                         max_assistant_turns=4, max_user_turns=4, max_response_length=4096)

    async def one(i: int) -> Any:
        with otel_verl.rollout_trace_attr(step=1, sample_index=i, rollout_n=0):
            return await loop.run({"max_tokens": 64}, **_long_row(i))

    async def both() -> list[Any]:
        return list(await asyncio.gather(one(0), one(1)))

    outs = asyncio.run(both())
    RolloutTraceConfig.shutdown(10.0)
    assert all(o.extra_fields["assistant_turns"] == 4 for o in outs)
    # before: the run span's reference and turn 1's messages each encoded the whole of it
    assert sum(on_loop) < 2 * (CONTEXT * 1.3), sorted(on_loop)[-4:]
    assert max(on_loop) < CONTEXT * 1.3  # nothing bigger than the conversation, once
    spans = list(read_spans(str(tmp_path), warn=False))
    index = ContentIndex.load(tmp_path)
    calls = sorted((s for s in spans if s["name"] == "AsyncTokenClient.generate"),
                   key=lambda s: s["start_ns"])
    assert len(calls) == 8
    for span in calls:
        attrs = span["attributes"]
        out = outs[attrs[semconv.ROLLOUT_SAMPLE_INDEX]]  # gather keeps the order
        sent = out.extra_fields["messages"][: attrs[semconv.CONTENT_MESSAGES_LEN]]
        assert attrs[semconv.CONTENT_MESSAGES_STORED] == "stored"
        assert index.rebuild(attrs[semconv.CONTENT_MESSAGES_ID]) == sent
        assert attrs[semconv.CONTENT_MESSAGES_ID] == _content.message_content_id(sent)
        assert len(attrs[semconv.GEN_AI_INPUT_MESSAGES]) < 8192  # a head, never the 32k
