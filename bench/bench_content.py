"""Store bytes per trajectory, whole-prompt capture (before) against per-turn content (after),
measured in one run; and the capture CPU of one LLM turn, interleaved.

The rollout of ``bench_rollout_stub.py`` (``ToolAgentLoop``, its traced token client, the
calculator tool, 4 assistant turns, one token per character) with the engine's wait set to 0,
``backend=file``. Modes, interleaved per context length:

- before: ``content_dedup=False`` (every LLM call records its whole prompt up to the 64 KiB cap,
  the way capture worked before per-turn content)
- after:  the defaults (each call records what it appends; unique content once in
  ``<trace_dir>/content/``)

Printed per context length: bytes per trajectory in the trace files and in the content store,
the trajectory's unique content (its final token list and its message list, compact JSON: what
a store holding each piece once would hold), the ratio stored / unique (all bytes, and the
content-carrying bytes: payload attributes plus the store, span metadata left out), the same
with the content store counted inflated (what it holds before its gzip members: the ratio
compression does not flatter), and whether every LLM call's whole prompt rebuilds from the store
exactly as the engine received it ("complete").

Two prompt texts (``--texts``): ``filler``, the rollout stub's repeated sentence (one token per
character: its ids are a few dozen distinct code points, so gzip gains ~30x: it flatters), and
``zipf``, words of characters drawn Zipf-distributed (s=1.07) from 151,646 code points, the
size of Qwen2's vocabulary (ids with a real vocabulary's spread: gzip gains ~2.4x on them).

Then the capture CPU of one turn (the op's input capture, ``payload_attrs``) at turn 1 (the whole
prompt is new: encoded and hashed once) and turn 4 (200 tokens appended) of a trajectory, before
and after, medians of interleaved repeats (the prefix check is a C-level list comparison: it
grows with the context at memcmp-like speed; the rest grows with what the turn added).

Run: ``python bench/bench_content.py [--trajectories 8] [--contexts 32768,131072]`` in a venv
with the unit tier's requirements.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_rollout_stub as stub  # noqa: E402

from otel_verl import RolloutTraceConfig, rollout_trace_attr  # noqa: E402
from otel_verl._capture import UNSET, payload_attrs  # noqa: E402
from otel_verl._content_store import iter_members  # noqa: E402
from otel_verl._state import STATE, TRAJECTORY, Trajectory  # noqa: E402
from otel_verl.rollout.agent_loop import ToolAgentLoop  # noqa: E402
from otel_verl.rollout.reward import Gsm8kReward  # noqa: E402
from otel_verl.rollout.tools import CalculatorTool  # noqa: E402
from otel_verl.store import read_spans  # noqa: E402
from otel_verl.store._content import ContentIndex, turn_prompts  # noqa: E402

stub.TURN_S = 0.0
#: the span attributes that carry content (the rest of a span file is metadata)
_CONTENT_ATTRS = ("input.value", "output.value", "gen_ai.input.messages",
                  "gen_ai.output.messages")


class RecordingClient(stub.SlowEngineClient):
    """The scripted engine, keeping every prompt it received (to check the rebuild)."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.received: list[list[int]] = []

    async def _generate(self, request_id: str, prompt_ids: list[int], sp: Any,
                        headers: Any) -> Any:
        self.received.append(list(prompt_ids))
        return await super()._generate(request_id, prompt_ids, sp, headers)


def _compact(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _sizes(trace_dir: str) -> tuple[int, int, int]:
    """(bytes of span files, of content store files, of content store files inflated) under a
    trace dir."""
    spans = content = inflated = 0
    for root, _dirs, files in os.walk(trace_dir):
        for name in files:
            path = os.path.join(root, name)
            size = os.path.getsize(path)
            if name.endswith(".nodes.gz"):
                content += size
                with open(path, "rb") as f:
                    inflated += sum(len(m[2] or b"") for m in iter_members(f.read()))
            elif name.endswith(".nodes"):
                content += size
                inflated += size
            elif name.endswith(".jsonl") and os.sep + "spool" not in root:
                spans += size
    return spans, content, inflated


#: the ``zipf`` text: characters by rank (a fixed permutation of 151,646 code points past the
#: ASCII range, surrogates left out) and their Zipf weights
_VOCAB = 151_646
_RNG = random.Random(18)
_CODES = _RNG.sample([c for c in range(0x100, 0x100 + _VOCAB + 0x800)
                      if not 0xD800 <= c < 0xE000], _VOCAB)
_CUM_WEIGHTS = list(itertools.accumulate(1.0 / (rank + 1) ** 1.07 for rank in range(_VOCAB)))


def _zipf_row(index: int, context_tokens: int) -> dict[str, Any]:
    rng = random.Random(index)
    chars = rng.choices(_CODES, cum_weights=_CUM_WEIGHTS, k=context_tokens - 40)
    for at in range(0, len(chars), 5):  # words: a space every few characters
        chars[at] = 32
    filler = "".join(map(chr, chars))
    return {"raw_prompt": [{"role": "user", "content": f"{filler}\nWhat is 12*7? ({index})"}],
            "reward_model": {"ground_truth": "84"}, "extra_info": {"index": index}}


def run_mode(mode: str, n: int, context: int, text: str = "filler") -> dict[str, Any]:
    trace_dir = tempfile.mkdtemp(prefix=f"bench_content_{mode}_")
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("bench", "content", "file", trace_dir=trace_dir,
                            content_dedup=(mode == "after"))
    tokenizer = stub.FastCharTokenizer()
    client = RecordingClient(tokenizer)
    loop = ToolAgentLoop(client, tokenizer, tools=[CalculatorTool()], reward_fn=Gsm8kReward(),
                         max_assistant_turns=4, max_user_turns=4, max_response_length=4096)
    make_row = stub._row if text == "filler" else _zipf_row
    rows = [make_row(i, context) for i in range(n)]

    async def one(i: int) -> Any:
        with rollout_trace_attr(step=1, sample_index=i, rollout_n=0, name="agent_loop"):
            return await loop.run({"temperature": 1.0, "max_tokens": 256}, **rows[i])

    async def batch() -> list[Any]:
        return await asyncio.gather(*(one(i) for i in range(n)))

    outs = asyncio.run(batch())
    RolloutTraceConfig.shutdown(60.0)
    unique = sum(_compact(o.prompt_ids + o.response_ids) + _compact(o.extra_fields["messages"])
                 for o in outs)
    spans_bytes, content_bytes, inflated_bytes = _sizes(trace_dir)
    complete = None
    spans = list(read_spans(trace_dir, warn=False))
    payload = sum(len(str(v).encode()) for span in spans for k, v in span["attributes"].items()
                  if k in _CONTENT_ATTRS)
    if mode == "after":
        rebuilt = sorted(map(tuple, (p.get("prompt") or [] for p in
                                     turn_prompts(spans, ContentIndex.load(trace_dir)))))
        complete = rebuilt == sorted(map(tuple, client.received))
    return {"spans": spans_bytes / n, "content": content_bytes / n, "unique": unique / n,
            "payload": payload / n, "complete": complete, "inflated": inflated_bytes / n}


def turn_cpu(context: int, dedup: bool, repeats: int) -> tuple[float, float]:
    """Median seconds of the input capture of (turn 1, turn 4) of a 4-turn trajectory."""
    RolloutTraceConfig.reset()
    trace_dir = tempfile.mkdtemp(prefix="bench_content_cpu_")
    RolloutTraceConfig.init("bench", "content", "file", trace_dir=trace_dir,
                            content_dedup=dedup)
    runtime = STATE.runtime
    assert runtime is not None
    firsts, lasts = [], []
    for r in range(repeats):
        prompt = [r] + list(range(1000, 1000 + context))  # a new prompt each time (no dedup)
        traj = Trajectory({}, None, True)
        token = TRAJECTORY.set(traj)
        try:
            ids = prompt
            times = []
            for _turn in range(4):
                inputs = {"request_id": "r", "prompt_ids": ids, "sampling_params": {}}
                t0 = time.perf_counter()
                payload_attrs(runtime, inputs, UNSET, {})
                times.append(time.perf_counter() - t0)
                ids = ids + list(range(50, 150)) + list(range(200, 300))  # answer + tool turn
            firsts.append(times[0])
            lasts.append(times[-1])
        finally:
            TRAJECTORY.reset(token)
    RolloutTraceConfig.reset()
    return statistics.median(firsts), statistics.median(lasts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--contexts", default="32768,131072")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--texts", default="filler,zipf")
    parser.add_argument("--bytes-only", action="store_true", help="skip the capture CPU")
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    print(f"store bytes per trajectory ({args.trajectories} trajectories x 4 turns, file "
          "backend; 'inflated': the content store counted before compression)")
    print(f"{'context':>8} {'text':>6} {'mode':>7} {'span files':>11} {'content':>9} "
          f"{'total':>9} {'unique':>9} {'total/unique':>12} {'(payloads+content)/unique':>26} "
          f"{'inflated total/unique':>22}  complete")
    for context in contexts:
        for text in args.texts.split(","):
            for mode in ("before", "after"):
                r = run_mode(mode, args.trajectories, context, text)
                total = r["spans"] + r["content"]
                done = "-" if r["complete"] is None else ("yes" if r["complete"] else "NO")
                print(f"{context:>8} {text:>6} {mode:>7} {r['spans'] / 1024:>9.1f}Ki "
                      f"{r['content'] / 1024:>7.1f}Ki {total / 1024:>7.1f}Ki "
                      f"{r['unique'] / 1024:>7.1f}Ki {total / r['unique']:>12.2f} "
                      f"{(r['payload'] + r['content']) / r['unique']:>26.2f} "
                      f"{(r['spans'] + r['inflated']) / r['unique']:>22.2f}  {done}",
                      flush=True)
    if args.bytes_only:
        return
    print("\ninput capture of one LLM turn (payload_attrs), medians of interleaved repeats")
    for context in contexts:
        before: list[tuple[float, float]] = []
        after: list[tuple[float, float]] = []
        for _ in range(3):  # interleaved blocks: load on the machine cancels out
            before.append(turn_cpu(context, False, args.repeats))
            after.append(turn_cpu(context, True, args.repeats))
        for turn, label in ((0, "turn 1 (whole prompt)"), (1, "turn 4 (+200 tokens)")):
            b = statistics.median(x[turn] for x in before)
            a = statistics.median(x[turn] for x in after)
            print(f"{context:>8} tokens, {label}: before {b * 1e6:7.0f} us  after "
                  f"{a * 1e6:7.0f} us  after/before {a / b:.2f}", flush=True)


if __name__ == "__main__":
    main()
