"""Content store bytes with tail sampling: what the store holds when ``tail_keep`` records every
trajectory provisionally and keeps a few, against the same rollouts all kept, in one run.

The rollout of ``bench_content.py`` (``ToolAgentLoop``, its traced token client, the calculator
tool, 4 assistant turns, one token per character, the engine's wait 0, ``backend=file``), in
GRPO groups: the rollouts of a group share their prompt (one row per group), interleaved on one
loop, and each answer starts with ``--think`` characters of the rollout's own words (sampled:
without them the rollouts of a group would be identical and dedup would hide everything). Modes:

- all:  every trajectory head-sampled (``trace=True``): the store holds every trajectory
- tail: every trajectory provisional (``trace=False``, ``tail_keep=errors``); the last rollout
  of each group fails (``error.type`` on its trajectory span), so one in ``--group`` is kept,
  and the rollout that put the group's shared prompt first is always dropped

Printed per context length and text (``zipf``: a real vocabulary's id spread; ``filler``: the
stub's repeated sentence, which gzip flatters): the content store's bytes (gzip and inflated)
per trajectory recorded, and per *kept* trajectory against the kept trajectories' unique content
(their final token list and message list, compact JSON); whether every kept LLM call's whole
prompt rebuilds from the store exactly as the engine received it ("complete"); and the store's
``content_discarded`` count. Without the tail-aware store, ``tail``'s store is ``all``'s.

Run: ``python bench/bench_content_tail.py [--groups 4] [--group 4] [--contexts 32768,131072]``
in a venv with the unit tier's requirements.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import dataclasses
import os
import random
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_content as bc  # noqa: E402
import bench_rollout_stub as stub  # noqa: E402

import otel_verl  # noqa: E402
from otel_verl import RolloutTraceConfig, rollout_trace_attr, semconv  # noqa: E402
from otel_verl.rollout.agent_loop import ToolAgentLoop  # noqa: E402
from otel_verl.rollout.reward import Gsm8kReward  # noqa: E402
from otel_verl.rollout.tools import CalculatorTool  # noqa: E402
from otel_verl.store import read_spans  # noqa: E402
from otel_verl.store._content import ContentIndex, turn_prompts  # noqa: E402

#: characters each rollout's answer starts with (its own sampled words, Zipf-distributed)
THINK = 1500
#: (group, rollout) of the rollout whose task runs now
_ROLLOUT: contextvars.ContextVar[tuple[int, int]] = contextvars.ContextVar("rollout")


class _TaggedClient(bc.RecordingClient):
    """The recording engine, keeping which rollout sent each prompt."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.by_rollout: dict[tuple[int, int], list[list[int]]] = {}

    async def _generate(self, request_id: str, prompt_ids: list[int], sp: Any,
                        headers: Any) -> Any:
        key = _ROLLOUT.get()
        sent = self.by_rollout.setdefault(key, [])
        sent.append(list(prompt_ids))
        out = await super()._generate(request_id, prompt_ids, sp, headers)
        # sampled: each rollout thinks its own words before the scripted text (its own content)
        rng = random.Random(hash((key, len(sent))))
        words = "".join(map(chr, rng.choices(bc._CODES, cum_weights=bc._CUM_WEIGHTS, k=THINK)))
        think = self.tokenizer.encode(f"Thinking: {words}\n")
        return dataclasses.replace(out, token_ids=think + out.token_ids,
                                   completion_tokens=len(think) + len(out.token_ids))


def run_mode(mode: str, groups: int, size: int, context: int, text: str) -> dict[str, Any]:
    trace_dir = tempfile.mkdtemp(prefix=f"bench_content_tail_{mode}_")
    RolloutTraceConfig.reset()
    options: dict[str, Any] = {"tail_keep": "errors"} if mode == "tail" else {}
    RolloutTraceConfig.init("bench", "content", "file", trace_dir=trace_dir, **options)
    tokenizer = stub.FastCharTokenizer()
    client = _TaggedClient(tokenizer)
    loop = ToolAgentLoop(client, tokenizer, tools=[CalculatorTool()], reward_fn=Gsm8kReward(),
                         max_assistant_turns=4, max_user_turns=4, max_response_length=4096)
    make_row = stub._row if text == "filler" else bc._zipf_row
    rows = [make_row(g, context) for g in range(groups)]
    kept_keys = {(g, size - 1) for g in range(groups)} if mode == "tail" else \
        {(g, n) for g in range(groups) for n in range(size)}

    async def one(g: int, n: int) -> Any:
        _ROLLOUT.set((g, n))
        with rollout_trace_attr(step=1, sample_index=g, rollout_n=n, name="agent_loop",
                                trace=mode != "tail"):
            await asyncio.sleep(0.001 * n)  # rollout 0 of a group puts its prompt first
            out = await loop.run({"temperature": 1.0, "max_tokens": 256}, **rows[g])
            if mode == "tail" and (g, n) in kept_keys:
                otel_verl.set_trajectory_attribute(semconv.ERROR_TYPE, "bench_keep")
            return (g, n), out

    async def batch() -> list[Any]:
        return await asyncio.gather(*(one(g, n) for g in range(groups) for n in range(size)))

    outs = asyncio.run(batch())
    stats = RolloutTraceConfig.stats()
    RolloutTraceConfig.shutdown(60.0)
    kept_outs = [o for key, o in outs if key in kept_keys]
    unique = sum(bc._compact(o.prompt_ids + o.response_ids) + bc._compact(o.extra_fields["messages"])
                 for o in kept_outs)
    _spans, content_bytes, inflated = bc._sizes(trace_dir)
    spans = list(read_spans(trace_dir, warn=False))
    roots = [s for s in spans if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY)]
    rebuilt = sorted(map(tuple, (p.get("prompt") or [] for p in
                                 turn_prompts(spans, ContentIndex.load(trace_dir)))))
    wanted = sorted(tuple(p) for key in kept_keys for p in client.by_rollout.get(key, []))
    return {"recorded": groups * size, "kept": len(roots), "content": content_bytes,
            "inflated": inflated, "unique": unique, "complete": rebuilt == wanted,
            "discarded": stats.get("content_discarded")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group", type=int, default=4, help="rollouts per group (GRPO n)")
    parser.add_argument("--contexts", default="32768,131072")
    parser.add_argument("--texts", default="zipf,filler")
    parser.add_argument("--think", type=int, default=THINK,
                        help="characters of a rollout's own words per answer")
    args = parser.parse_args()
    globals()["THINK"] = args.think
    print(f"content store bytes, {args.groups} groups x {args.group} rollouts x 4 turns; 'tail' "
          "keeps the last rollout of each group ('inflated': before the store's gzip)")
    print(f"{'context':>8} {'text':>6} {'mode':>5} {'kept':>6} {'store/recorded':>15} "
          f"{'store/kept':>11} {'inflated/kept':>14} {'unique/kept':>12} "
          f"{'store/unique':>13} {'inflated/unique':>16} complete discarded")
    for context in [int(c) for c in args.contexts.split(",")]:
        for text in args.texts.split(","):
            for mode in ("all", "tail"):
                r = run_mode(mode, args.groups, args.group, context, text)
                kept = max(r["kept"], 1)
                print(f"{context:>8} {text:>6} {mode:>5} {r['kept']:>3}/{r['recorded']:<2} "
                      f"{r['content'] / r['recorded'] / 1024:>13.1f}Ki "
                      f"{r['content'] / kept / 1024:>9.1f}Ki "
                      f"{r['inflated'] / kept / 1024:>12.1f}Ki "
                      f"{r['unique'] / kept / 1024:>10.1f}Ki "
                      f"{r['content'] / r['unique']:>13.2f} {r['inflated'] / r['unique']:>16.2f} "
                      f"{'yes' if r['complete'] else 'NO':>8} {r['discarded']}", flush=True)


if __name__ == "__main__":
    main()
