"""Tracing a rollout leaves no reference cycles behind (issue 18: the cyclic GC).

A cycle is garbage that only the cyclic GC frees: until a collection it counts towards the next
young collection, and at 32k-128k-token contexts each young collection scans the token lists in
flight, and every tenth one the whole middle generation with them. Recursive closures were such
cycles, one per call: the content store's scrub walk (per messages node) and the calculator's
``safe_eval``. Checked with ``gc.DEBUG_SAVEALL`` over traced trajectories written to a real file
store (payloads with redaction, metadata only, tail sampling) and untraced ones.
"""

from __future__ import annotations

import asyncio
import gc
import tempfile
import types
from collections import Counter
from typing import Any

import pytest

from otel_verl import RolloutTraceConfig, rollout_trace_attr
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool

from .conftest import CharTokenizer, ScriptedClient

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "(2+3)*4-1"}}</tool_call>'
MODES: dict[str, dict[str, Any] | None] = {
    "untraced": None,
    "payloads": {},
    "metadata": {"capture_payloads": False},
    "tail": {"tail_keep": "errors,truncated"},
}


def _batch(n: int, trace: bool) -> None:
    tokenizer = CharTokenizer()
    rows = [{"raw_prompt": [{"role": "system", "content": "Use the calculator. " * 200},
                            {"role": "user", "content": f"What is (2+3)*4-1? ({i})"}],
             "reward_model": {"ground_truth": "19"}, "extra_info": {"index": i}}
            for i in range(n)]

    async def one(i: int) -> float | None:
        loop = ToolAgentLoop(ScriptedClient(tokenizer, [CALL, CALL, "#### 19"]), tokenizer,
                             tools=[CalculatorTool()], reward_fn=Gsm8kReward(),
                             max_assistant_turns=4, max_user_turns=4, max_response_length=4096)
        with rollout_trace_attr(step=1, sample_index=i, rollout_n=0, trace=trace):
            out = await loop.run({"max_tokens": 256}, **rows[i])
        return out.reward_score

    async def main() -> list[float | None]:
        return await asyncio.gather(*(one(i) for i in range(n)))

    assert asyncio.run(main()) == [1.0] * n


def _describe(obj: Any) -> str:
    if type(obj) is types.FunctionType:
        return f"function {obj.__qualname__}"
    if type(obj) is types.FrameType:
        return f"frame {obj.f_code.co_qualname}"
    return type(obj).__qualname__


@pytest.mark.parametrize("mode", list(MODES))
def test_a_traced_rollout_leaves_no_reference_cycles(mode: str) -> None:
    options = MODES[mode]
    with tempfile.TemporaryDirectory() as trace_dir:
        if options is not None:
            RolloutTraceConfig.init("proj", "exp", "file", trace_dir=trace_dir, compact=False,
                                    **options)
        _batch(2, trace=mode != "tail")  # warm: imports, caches, the threads started
        RolloutTraceConfig.flush(10.0)
        gc.collect()
        garbage_before = len(gc.garbage)
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            _batch(8, trace=mode != "tail")
            RolloutTraceConfig.flush(10.0)
            gc.collect()
        finally:
            gc.set_debug(0)
            found = gc.garbage[garbage_before:]
            del gc.garbage[garbage_before:]
        RolloutTraceConfig.reset()
    kinds = Counter(_describe(obj) for obj in found)
    assert not found, kinds.most_common(10)
