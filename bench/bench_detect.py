"""Cost of the RL-signal detectors (``detect_flags=all``) against tracing without them, in one run.

Prints, as medians over interleaved rounds (this machine is shared and noisy):
  - event-loop CPU per trajectory (the thread the rollout coroutines run on: ``thread_time``),
    traced without detectors (``all``) and with every built-in detector (``detect``), and their
    ratio: the detectors run on their own thread, so this ratio should stay ~1;
  - the detectors' worker CPU per trajectory (``detect_cpu_ns`` / trajectories) and the whole
    process's CPU per trajectory for both modes.

The workload is agent-loop shaped: per trajectory 3 model turns with the GenAI chat attributes
(finish reason, tokens, max_tokens), 2 tool calls with arguments, a reward with two components,
an input and an answer of a few hundred characters; GRPO groups of 4, 64 samples a step (steps
one after another, so the step detectors decide each step as the next begins). Exports go to a
null exporter through the default chain (batch processor, redaction, the durable log in a
temporary directory). Run: `python bench/bench_detect.py [--rounds 5 --samples 64 --steps 3]`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from opentelemetry import trace

import otel_verl
from otel_verl import (
    RolloutTraceConfig,
    SpanKindName,
    rollout_trace_attr,
    rollout_trace_op,
    semconv,
)

N = 4
PROMPT = "Worked examples of arithmetic follow. " * 8 + "What is 12*7?"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or imported
from bench_core import NullExporter  # noqa: E402 - the benches' one null exporter

TRACE_DIR = tempfile.mkdtemp(prefix="bench_detect_")


class Loop:
    @rollout_trace_op(kind=SpanKindName.LLM)
    async def generate(self, prompt_ids, sampling_params, tokens):
        await asyncio.sleep(0)
        span = trace.get_current_span()
        span.set_attributes({semconv.GEN_AI_OPERATION_NAME: "chat",
                             semconv.GEN_AI_REQUEST_MAX_TOKENS: 512,
                             semconv.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
                             semconv.GEN_AI_USAGE_OUTPUT_TOKENS: tokens})
        return {"token_ids": list(range(tokens))}

    @rollout_trace_op(kind=SpanKindName.TOOL)
    async def execute(self, call_id, arguments):
        await asyncio.sleep(0)
        trace.get_current_span().set_attributes({
            semconv.GEN_AI_OPERATION_NAME: "execute_tool", semconv.GEN_AI_TOOL_NAME: "calc",
            semconv.GEN_AI_TOOL_CALL_ARGUMENTS: json.dumps({"expression": arguments})})
        return {"text": "84"}

    @rollout_trace_op(kind=SpanKindName.EVALUATOR)
    async def reward(self, score):
        otel_verl.record_reward(score, name="verifier", components={
            "correctness": 1.0 if score > 1 else 0.0, "format": 0.2})
        return score

    @rollout_trace_op
    async def run(self, rng_tokens, score, sample):
        otel_verl.set_trajectory_input(PROMPT)
        for turn, tokens in enumerate(rng_tokens):
            await self.generate(list(range(40)), {"max_tokens": 512}, tokens)
            if turn < 2:
                await self.execute(f"call_{turn}", f"{sample}*{turn}")
        otel_verl.set_trajectory_output(answer="Thinking about it carefully, #### 84")
        await self.reward(score)
        return score


def rows(samples: int, seed: int) -> list[tuple[int, int, list[int], float]]:
    rng = random.Random(seed)
    return [(s, n, [rng.randrange(20, 200) for _ in range(3)], 1.2 + rng.random())
            for s in range(samples) for n in range(N)]


def run_steps(mode: str, steps: int, plan) -> tuple[float, float, float]:
    RolloutTraceConfig.reset()
    extra = {"detect_flags": "all"} if mode == "detect" else {}
    RolloutTraceConfig.init("bench", "bench", "console", exporter=NullExporter(),
                            trace_dir=TRACE_DIR, group_size=N, **extra)
    loop = Loop()

    async def one(step, sample, n, tokens, score):
        with rollout_trace_attr(step=step, sample_index=sample, rollout_n=n):
            await loop.run(tokens, score, sample)

    async def main() -> float:
        elapsed = 0.0
        for step in range(steps):
            start = time.thread_time()
            await asyncio.gather(*(one(step, s, n, t, r) for s, n, t, r in plan))
            elapsed += time.thread_time() - start
        return elapsed

    gc.collect()
    process_start = time.process_time()
    elapsed = asyncio.run(main())
    RolloutTraceConfig.flush(30.0)
    process = time.process_time() - process_start
    stats = RolloutTraceConfig.stats()
    RolloutTraceConfig.reset()
    count = steps * len(plan)
    worker = stats.get("detect_cpu_ns", 0) / 1e9 / max(1, stats.get("detect_trajectories", 1))
    if mode == "detect":
        assert stats.get("detect_trajectories") == count, stats
    return elapsed / count, process / count, worker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    plan = rows(args.samples, seed=1)
    results: dict[str, list[tuple[float, float, float]]] = {"all": [], "detect": []}
    run_steps("all", 1, plan)  # warm up imports and caches
    for _ in range(args.rounds):
        for mode in ("all", "detect"):
            results[mode].append(run_steps(mode, args.steps, plan))
    loop_all = statistics.median(r[0] for r in results["all"])
    loop_detect = statistics.median(r[0] for r in results["detect"])
    proc_all = statistics.median(r[1] for r in results["all"])
    proc_detect = statistics.median(r[1] for r in results["detect"])
    worker = statistics.median(r[2] for r in results["detect"])
    ratios = [d[0] / a[0] for a, d in zip(results["all"], results["detect"], strict=True)]
    print(f"trajectories per round: {args.steps * len(plan)} ({args.rounds} rounds, medians)")
    print(f"event-loop CPU per trajectory: all {loop_all * 1e6:8.1f} us   detect "
          f"{loop_detect * 1e6:8.1f} us   ratio {loop_detect / loop_all:5.2f} "
          f"(per round {min(ratios):.2f}-{max(ratios):.2f})")
    print(f"process CPU per trajectory:    all {proc_all * 1e6:8.1f} us   detect "
          f"{proc_detect * 1e6:8.1f} us   ratio {proc_detect / proc_all:5.2f}")
    print(f"detector worker CPU per trajectory: {worker * 1e6:8.1f} us (off the event loop)")
    shutil.rmtree(TRACE_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
