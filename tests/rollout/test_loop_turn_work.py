"""Per turn, the agent loop and its token client allocate what the turn adds, not the context.

A fresh context-long list per turn (``prompt_ids + response_ids``, or a copy of it in the client)
stays young while the engine runs, and every young GC collection in that time scans it: the
cost that tracing's extra collections multiply (issue 18). The loop hands the engine one list
extended in place, as verl's ``agent_data.prompt_ids`` is, and the client does not copy it.
"""

from __future__ import annotations

from typing import Any

from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import AsyncTokenClient, TokenOutput
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool

from .conftest import ScriptedClient

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
