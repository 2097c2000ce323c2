"""Rollout throughput with tracing on vs off against an engine stub, side by side in one run.

The project's ``ToolAgentLoop`` (verl's state machine) with its traced token client
(``AsyncTokenClient.generate``: the op span, the GenAI ``chat`` span, traceparent headers), the
calculator tool and the GSM8K reward, against a scripted engine that answers every turn after
500 ms (``asyncio.sleep``: the engine's time, not CPU). Each trajectory has a ~32k-token
context (the prompt) and 4 assistant turns (3 tool calls, then the answer); 64 run
concurrently, each inside ``rollout_trace_attr``.

Modes, interleaved round by round (order rotates):
- off:  ``RolloutTraceConfig`` not initialised (every traced op calls straight through)
- on:   ``backend=file`` with the defaults (batch processor, redaction, 64 KiB field cap)
- cap8k (``--all-modes``): the same with ``max_field_bytes=8192``
- meta (``--all-modes``): the same with ``capture_payloads=False`` (no inputs/outputs)

Printed: trajectories/s per round, the median ratio on/off (target >= 0.98), and the event-loop
CPU that tracing adds per trajectory (``time.thread_time()`` on the loop's thread, on minus off,
divided by the trajectories). The export thread's CPU is not on the loop's thread; it is
printed too (process CPU minus loop CPU).

Run: ``python bench/bench_rollout_stub.py [--rounds 5] [--trajectories 64]`` in a venv with the
unit tier's requirements (httpx).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from otel_verl import RolloutTraceConfig, rollout_trace_attr
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import AsyncTokenClient, TokenOutput
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool

TURN_S = 0.5
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'
SCRIPT = [CALL, CALL, CALL, "The answer is #### 84"]
_SPECIALS = {"<|endoftext|>": 0x110000, "<|im_end|>": 0x110001, "<|im_start|>": 0x110002}
_BY_ID = {v: k for k, v in _SPECIALS.items()}


class FastCharTokenizer:
    """One token per character (its code point), ChatML specials as single ids beyond Unicode:
    C-speed encode/decode, so the tokenizer costs little next to what is measured."""

    eos_token_id = _SPECIALS["<|im_end|>"]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        pos = 0
        while True:
            found = [(text.find(s, pos), s) for s in _SPECIALS]
            found = [(i, s) for i, s in found if i != -1]
            if not found:
                ids.extend(map(ord, text[pos:]))
                return ids
            index, special = min(found)
            ids.extend(map(ord, text[pos:index]))
            ids.append(_SPECIALS[special])
            pos = index + len(special)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) if i < 0x110000 else ("" if skip_special_tokens else _BY_ID[i])
                       for i in ids)

    def apply_chat_template(self, messages: Any, tools: Any = None,
                            add_generation_prompt: bool = True, tokenize: bool = False,
                            **_: Any) -> str:
        parts = []
        if tools:
            parts.append("<|im_start|>system\n" + "\n".join(str(t) for t in tools) +
                         "<|im_end|>\n")
        for m in messages:
            if m["role"] == "tool":
                parts.append(f"<|im_start|>tool\n<tool_response>{m['content']}"
                             "</tool_response><|im_end|>\n")
            else:
                parts.append(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n")
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)


class SlowEngineClient(AsyncTokenClient):
    """The engine: each turn answers the next scripted text after ``TURN_S`` seconds."""

    provider = "stub"

    def __init__(self, tokenizer: FastCharTokenizer) -> None:
        super().__init__("http://127.0.0.1:9", "stub-model")
        self.tokenizer = tokenizer
        self.turns: dict[str, int] = {}

    async def _generate(self, request_id: str, prompt_ids: list[int], sp: Mapping[str, Any],
                        headers: Mapping[str, str]) -> TokenOutput:
        await asyncio.sleep(TURN_S)
        turn = self.turns.get(request_id, 0)
        self.turns[request_id] = turn + 1
        ids = self.tokenizer.encode(SCRIPT[min(turn, len(SCRIPT) - 1)])
        ids.append(self.tokenizer.eos_token_id)
        return TokenOutput(token_ids=ids, finish_reason="stop", prompt_tokens=len(prompt_ids),
                           completion_tokens=len(ids), response_id=f"{request_id}-{turn}")


def _row(index: int, context_tokens: int) -> dict[str, Any]:
    filler = ("Consider the following worked examples of arithmetic carefully. " *
              (context_tokens // 64 + 1))[: context_tokens - 40]
    return {"raw_prompt": [{"role": "user", "content": f"{filler}\nWhat is 12*7? ({index})"}],
            "reward_model": {"ground_truth": "84"}, "extra_info": {"index": index}}


async def _batch(n: int, step: int, context_tokens: int) -> tuple[float, float]:
    """Run ``n`` trajectories concurrently; returns (wall seconds, loop-thread CPU seconds)."""
    tokenizer = FastCharTokenizer()
    loop_obj = ToolAgentLoop(SlowEngineClient(tokenizer), tokenizer, tools=[CalculatorTool()],
                             reward_fn=Gsm8kReward(), max_assistant_turns=4, max_user_turns=4,
                             max_response_length=4096)
    rows = [_row(i, context_tokens) for i in range(n)]

    async def one(i: int) -> float | None:
        with rollout_trace_attr(step=step, sample_index=i, rollout_n=0, name="agent_loop"):
            out = await loop_obj.run({"temperature": 1.0, "max_tokens": 256}, **rows[i])
        assert out.extra_fields["assistant_turns"] == 4, out.extra_fields
        return out.reward_score

    cpu0, wall0 = time.thread_time(), time.perf_counter()
    scores = await asyncio.gather(*(one(i) for i in range(n)))
    wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
    assert all(s == 1.0 for s in scores)
    return wall, cpu


def _round(mode: str, n: int, step: int, context_tokens: int, trace_dir: str
           ) -> tuple[float, float, float]:
    RolloutTraceConfig.reset()
    if mode != "off":
        options = {"cap8k": {"max_field_bytes": 8192}, "meta": {"capture_payloads": False}}
        RolloutTraceConfig.init("bench", "stub", "file", trace_dir=trace_dir,
                                **options.get(mode, {}))
    proc0 = time.process_time()
    wall, loop_cpu = asyncio.run(_batch(n, step, context_tokens))
    RolloutTraceConfig.flush(30.0)  # the export of this round is charged to this round
    other_cpu = time.process_time() - proc0 - loop_cpu
    RolloutTraceConfig.reset()
    return n / wall, loop_cpu / n, other_cpu / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--context-tokens", type=int, default=32 * 1024)
    parser.add_argument("--all-modes", action="store_true",
                        help="also max_field_bytes=8192 and capture_payloads=False")
    args = parser.parse_args()
    modes = ["off", "on", "cap8k", "meta"] if args.all_modes else ["off", "on"]
    results: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as trace_dir:
        _round("off", 4, 0, args.context_tokens, trace_dir)  # warm-up
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            line = []
            for mode in order:
                res = _round(mode, args.trajectories, r + 1, args.context_tokens, trace_dir)
                results[mode].append(res)
                line.append(f"{mode}: {res[0]:6.2f} traj/s, loop CPU {res[1] * 1e3:6.2f} ms/traj,"
                            f" other threads {res[2] * 1e3:6.2f} ms/traj")
            print(f"round {r + 1}: " + " | ".join(line), flush=True)
    med = {m: [statistics.median(x[i] for x in results[m]) for i in range(3)] for m in modes}
    ratios = [on[0] / off[0] for on, off in zip(results["on"], results["off"], strict=True)]
    print(f"\n{args.trajectories} concurrent trajectories, 4 turns of {TURN_S * 1e3:.0f} ms, "
          f"{args.context_tokens}-token contexts, {args.rounds} rounds")
    for mode in modes[2:]:
        other = [m[0] / off[0] for m, off in zip(results[mode], results["off"], strict=True)]
        print(f"{mode}/off: {statistics.median(other):.3f}; event-loop CPU added "
              f"{(med[mode][1] - med['off'][1]) * 1e3:.2f} ms, export threads "
              f"{(med[mode][2] - med['off'][2]) * 1e3:.2f} ms per trajectory")
    print(f"throughput on/off: median of per-round ratios {statistics.median(ratios):.3f} "
          f"(rounds {min(ratios):.3f}-{max(ratios):.3f}); medians {med['on'][0]:.2f} / "
          f"{med['off'][0]:.2f} traj/s   (target >= 0.98)")
    print(f"event-loop CPU added by tracing: {(med['on'][1] - med['off'][1]) * 1e3:.2f} ms per "
          f"trajectory (on {med['on'][1] * 1e3:.2f}, off {med['off'][1] * 1e3:.2f})")
    print(f"other threads (export): {(med['on'][2] - med['off'][2]) * 1e3:.2f} ms per trajectory")


if __name__ == "__main__":
    main()
