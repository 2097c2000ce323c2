"""Turn 1's ``gen_ai.input.messages`` (a head of a whole long conversation) is rendered off the
event loop, with the conversation's hash (``PendingStep.after``), and goes on the span when the
call ends: the same text as rendered on the loop, the ids unchanged, every turn rebuilt."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import otel_verl
from otel_verl import RolloutTraceConfig, _capture, _content, _payload, semconv
from otel_verl._state import TRAJECTORY
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import TokenOutput, genai_input_messages
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool
from otel_verl.store import read_spans
from otel_verl.store._content import ContentIndex

from .conftest import CharTokenizer, ScriptedClient

CONTEXT = 32_000
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'


def _row(i: int) -> dict[str, Any]:
    text = ("Consider the worked examples carefully. " * (CONTEXT // 40 + 1))[:CONTEXT]
    return {"raw_prompt": [{"role": "user", "content": f"{text}\nWhat is 2 + 3? ({i})"}],
            "reward_model": {"ground_truth": "5"}, "extra_info": {"index": i}}


def _longest(value: Any) -> int:
    if type(value) is str:
        return len(value)
    if type(value) is dict:
        return max((_longest(v) for v in value.values()), default=0)
    if type(value) in (list, tuple):
        return max((_longest(v) for v in value), default=0)
    return 0


class _Waiting(ScriptedClient):
    """An engine that answers once the content thread has hashed (and rendered) turn 1's
    conversation (bounded: the span's text is checked either way)."""

    async def _generate(self, request_id, prompt_ids, sp, headers) -> TokenOutput:
        traj = TRAJECTORY.get()
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(
                type(v) is _content.PendingStep and not v._done for v in traj.content.values()):
            await asyncio.sleep(0.01)
        turn = sum(r["request_id"] == request_id for r in self.requests)
        self.script = [[CALL, CALL, "#### 5"][min(turn, 2)]]
        return await super()._generate(request_id, prompt_ids, sp, headers)


def test_turn_one_messages_head_is_rendered_off_the_loop(tmp_path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    on_loop: list[int] = []
    render = _capture.to_payload
    main = threading.current_thread()

    def watched(value: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is main:
            on_loop.append(_longest(value))
        return render(value, **kwargs)

    monkeypatch.setattr(_capture, "to_payload", watched)
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path))
    tokenizer = CharTokenizer()
    loop = ToolAgentLoop(_Waiting(tokenizer, []), tokenizer, tools=[CalculatorTool()],
                         reward_fn=Gsm8kReward(), max_assistant_turns=3, max_user_turns=3,
                         max_response_length=4096)

    async def one(i: int) -> Any:
        with otel_verl.rollout_trace_attr(step=1, sample_index=i, rollout_n=0):
            return await loop.run({"max_tokens": 64}, **_row(i))

    async def both() -> list[Any]:
        return list(await asyncio.gather(one(0), one(1)))

    outs = asyncio.run(both())
    RolloutTraceConfig.shutdown(10.0)
    # before: turn 1's head was rendered on the loop, walking the 32k-character conversation
    assert on_loop and max(on_loop) < CONTEXT // 2, sorted(on_loop)[-3:]
    index = ContentIndex.load(tmp_path)
    calls = sorted((s for s in read_spans(str(tmp_path), warn=False)
                    if s["name"] == "AsyncTokenClient.generate"), key=lambda s: s["start_ns"])
    assert len(calls) == 6
    firsts = 0
    for span in calls:
        attrs = span["attributes"]
        sent = outs[attrs[semconv.ROLLOUT_SAMPLE_INDEX]].extra_fields["messages"][
            : attrs[semconv.CONTENT_MESSAGES_LEN]]
        assert attrs[semconv.CONTENT_MESSAGES_ID] == _content.message_content_id(sent)
        assert index.rebuild(attrs[semconv.CONTENT_MESSAGES_ID]) == sent
        if semconv.CONTENT_MESSAGES_BASE_ID not in attrs:  # turn 1: the whole conversation
            firsts += 1
            # the text the loop rendered before: a head of it, capped at content_inline_bytes
            assert attrs[semconv.GEN_AI_INPUT_MESSAGES] == _payload.to_payload(
                genai_input_messages(sent), max_bytes=4096, redact=True).json
    assert firsts == 2
