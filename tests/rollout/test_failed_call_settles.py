"""A first LLM call that fails, whose long prompt ids and long messages were both hashed off the
loop: its span still gets both ids (``_capture.record_failure`` settles the prompt and the
messages in one step), and both rebuild exactly from the content store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import otel_verl
from otel_verl import RolloutTraceConfig, _content, semconv
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import TokenOutput
from otel_verl.rollout.tools import CalculatorTool
from otel_verl.store import read_spans
from otel_verl.store._content import ContentIndex

from .conftest import CharTokenizer, ScriptedClient

CONTEXT = 24_000  # both lists long enough to be hashed off the loop (tokens and characters)


def test_a_failed_first_call_gets_its_prompt_id_and_its_messages_id(tmp_path) -> None:
    sent: list[list[int]] = []

    class Broken(ScriptedClient):
        async def _generate(self, request_id: str, prompt_ids: list[int], *args: Any
                            ) -> TokenOutput:
            sent.append(list(prompt_ids))
            await asyncio.sleep(0.05)
            raise ConnectionError("engine down")

    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path))
    tokenizer = CharTokenizer()
    loop = ToolAgentLoop(Broken(tokenizer, []), tokenizer, tools=[CalculatorTool()])
    text = ("Consider the worked examples carefully. " * (CONTEXT // 40 + 1))[:CONTEXT]
    row = {"raw_prompt": [{"role": "user", "content": f"{text}\nWhat is 2 + 3?"}],
           "reward_model": {"ground_truth": "5"}, "extra_info": {"index": 0}}

    async def go() -> None:
        with otel_verl.rollout_trace_attr(step=1, sample_index=0, rollout_n=0):
            with pytest.raises(ConnectionError):
                await loop.run({}, **row)

    asyncio.run(go())
    RolloutTraceConfig.shutdown(10.0)
    [call] = [s for s in read_spans(str(tmp_path), warn=False)
              if s["name"] == "AsyncTokenClient.generate"]
    attrs = call["attributes"]
    [prompt] = sent
    assert len(prompt) > _content.DEFER_MIN_ITEMS  # (hashed off the loop: pending at the call)
    assert attrs[semconv.CONTENT_ID] == _content.token_content_id(prompt)
    assert attrs[semconv.CONTENT_STORED] == "stored"
    assert attrs[semconv.CONTENT_MESSAGES_STORED] == "stored"
    assert attrs[semconv.CONTENT_MESSAGES_ID] == _content.message_content_id(row["raw_prompt"])
    index = ContentIndex.load(tmp_path)
    assert index.rebuild(attrs[semconv.CONTENT_ID]) == prompt
    assert index.rebuild(attrs[semconv.CONTENT_MESSAGES_ID]) == [dict(m) for m in
                                                                  row["raw_prompt"]]
