"""Cost of tail sampling on the event loop, and the memory its buffer takes, in one run.

Prints, as medians over interleaved rounds (this machine is shared and noisy):
  1. event-loop time per trajectory (an agent-loop-shaped coroutine: 2 model turns, 1 tool call,
     1 reward, payloads of a few hundred bytes) with
       off   tracing not initialised (the bare workload),
       all   every trajectory traced,
       head  max_samples_per_step_per_worker=1 (1 of 64 samples per step traced),
       tail  head + tail_keep=errors,reward_outliers,groups (every trajectory recorded
             provisionally, ~2% errors, binary rewards: the kept share is printed),
     and the ratios tail/all, tail/head, head/all;
  2. peak memory of the buffer with 10,000 concurrent undecided trajectories (tracemalloc,
     against the same 10,000 trajectories unsampled), and the buffer's own byte estimate.

Exports go to a null exporter through the default chain (batch processor, redaction on the export
thread, the durable log in a temporary directory), so the export thread's share of the CPU and the
GIL is part of the "whole process" figures. Run: `python3 -m nox -s bench` or
`python bench/bench_tail.py [--rounds 5 --samples 64]`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import otel_verl
from otel_verl import RolloutTraceConfig, SpanKindName, rollout_trace_attr, rollout_trace_op

N = 4  # rollouts per sample (GRPO group)
RULES = ["errors", "reward_outliers", "groups"]
MESSAGES = [{"role": "system", "content": "You are a careful assistant. " * 4},
            {"role": "user", "content": "What is 12*7? Use the calculator tool when needed."}]


class NullExporter(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans):
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


class Loop:
    @rollout_trace_op(kind=SpanKindName.LLM)
    async def generate(self, messages, sampling_params):
        await asyncio.sleep(0)
        return {"text": "<tool_call>{\"name\": \"calculator\"}</tool_call>", "token_ids":
                list(range(32))}

    @rollout_trace_op(kind=SpanKindName.TOOL)
    async def execute(self, call_id, arguments):
        await asyncio.sleep(0)
        return {"text": "84"}

    @rollout_trace_op(kind=SpanKindName.EVALUATOR)
    async def reward(self, solution, ground_truth, score):
        otel_verl.record_reward(score)
        return score

    @rollout_trace_op
    async def run(self, sampling_params, fail, score, gate=None):
        await self.generate(MESSAGES, sampling_params)
        await self.execute("call_0", {"expression": "12*7"})
        if gate is not None:
            await gate.wait()
        await self.generate(MESSAGES + [{"role": "tool", "content": "84"}], sampling_params)
        await self.reward("#### 84", "84", score)
        if fail:
            raise RuntimeError("tool server went away")
        return score


async def trajectory(loop, step, sample, n, traced, fail, score, gate=None):
    try:
        with rollout_trace_attr(step=step, sample_index=sample, rollout_n=n, trace=traced):
            await loop.run({"temperature": 1.0}, fail, score, gate)
    except RuntimeError:
        pass


def plan(samples: int, seed: int) -> list[tuple[int, int, bool, float]]:
    """(sample, rollout, fail, score): ~2% failures; each sample has its own success rate."""
    rng = random.Random(seed)
    rows = []
    for sample in range(samples):
        rate = rng.choice((0.0, 0.0, 0.25, 1.0, 1.0, 1.0))
        for n in range(N):
            rows.append((sample, n, rng.random() < 0.02, float(rng.random() < rate)))
    return rows


TRACE_DIR = tempfile.mkdtemp(prefix="bench_tail_")  # the durable log's files go here


def init(mode: str, exporter: NullExporter, **extra) -> None:
    RolloutTraceConfig.reset()
    if mode == "off":
        return
    options = {"max_samples_per_step_per_worker": None if mode == "all" else 1,
               "trace_dir": TRACE_DIR, **extra}
    if mode == "tail":
        options.update(tail_keep=RULES, group_size=N)
    RolloutTraceConfig.init("bench", "bench", "console", exporter=exporter, **options)


def run_steps(mode: str, steps: int, rows) -> tuple[float, float, dict[str, int]]:
    """CPU seconds per trajectory of the event loop's thread, and of the whole process (the
    export thread included), for ``steps`` steps of ``rows``."""
    exporter = NullExporter()
    init(mode, exporter)
    loop = Loop()

    async def main() -> float:
        elapsed = 0.0
        for step in range(steps):
            chosen = RolloutTraceConfig.sampler().select(r[0] for r in rows)
            start = time.thread_time()
            await asyncio.gather(*(trajectory(loop, step, s, n, s in chosen, fail, score)
                                   for s, n, fail, score in rows))
            elapsed += time.thread_time() - start
        return elapsed

    gc.collect()
    process_start = time.process_time()
    elapsed = asyncio.run(main())
    RolloutTraceConfig.flush(10.0)
    process = time.process_time() - process_start
    stats = RolloutTraceConfig.stats()
    RolloutTraceConfig.reset()
    stats["exported_spans"] = exporter.spans
    return elapsed / (steps * len(rows)), process / (steps * len(rows)), stats


def peak_memory(mode: str, count: int) -> tuple[int, dict[str, int]]:
    """Memory (tracemalloc) while ``count`` trajectories are open at once, between their turns,
    after a flush (so the export queue is empty). The buffer limit is raised out of the way."""
    exporter = NullExporter()
    if mode == "tail":
        init(mode, exporter, tail_buffer_bytes=1 << 31)
    else:
        init(mode, exporter)
    loop = Loop()
    rows = plan(count // N, seed=7)
    traced = mode == "all"

    async def main() -> int:
        gate = asyncio.Event()
        tasks = [asyncio.ensure_future(trajectory(loop, 0, s, n, traced, fail, score, gate))
                 for s, n, fail, score in rows]
        for _ in range(20):  # every task reaches the gate
            await asyncio.sleep(0)
        RolloutTraceConfig.flush(30.0)
        gc.collect()
        current, _ = tracemalloc.get_traced_memory()
        gate.set()
        await asyncio.gather(*tasks)
        return current

    gc.collect()
    tracemalloc.start()
    try:
        current = asyncio.run(main())
    finally:
        tracemalloc.stop()
    RolloutTraceConfig.flush(10.0)
    stats = RolloutTraceConfig.stats()
    RolloutTraceConfig.reset()
    return current, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=64, help="samples per step (x4 rollouts)")
    parser.add_argument("--steps", type=int, default=3, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=10_000)
    parser.add_argument("--only", choices=("timing", "memory"), help="one part of the run")
    args = parser.parse_args()
    if args.only != "memory":
        timing(args)
    if args.only != "timing":
        memory(args)
    shutil.rmtree(TRACE_DIR, ignore_errors=True)


def timing(args: argparse.Namespace) -> None:
    rows = plan(args.samples, seed=1)
    modes = ("off", "all", "head", "tail")
    times: dict[str, list[float]] = {m: [] for m in modes}
    process: dict[str, list[float]] = {m: [] for m in modes}
    tail_stats: dict[str, int] = {}
    run_steps("tail", 1, rows)  # warm-up (imports, code paths)
    for round_ in range(args.rounds):
        order = modes[round_ % len(modes):] + modes[:round_ % len(modes)]  # rotate the order
        for mode in order:
            per, per_process, stats = run_steps(mode, args.steps, rows)
            times[mode].append(per)
            process[mode].append(per_process)
            if mode == "tail":
                tail_stats = stats
    med = {m: statistics.median(v) * 1e6 for m, v in times.items()}
    med_process = {m: statistics.median(v) * 1e6 for m, v in process.items()}
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, {args.samples} samples x {N} "
          f"rollouts per step, {args.steps} steps x {args.rounds} rounds")
    print("CPU time per trajectory (median): event-loop thread | whole process (+ export)")
    for mode in modes:
        print(f"  {mode:5s} {med[mode]:9.1f} µs | {med_process[mode]:9.1f} µs")
    ran = tail_stats.get("tail_ran", 0)
    kept = sum(v for k, v in tail_stats.items() if k.startswith("tail_kept."))
    print(f"  (tail: {kept}/{ran} trajectories exported in a round, "
          f"{tail_stats.get('tail_kept.head', 0)} of them with the head weight; a head-picked "
          f"one a tail rule matches counts under that rule)")
    print("ratios (event loop | process):")
    for a, b in (("tail", "all"), ("tail", "head"), ("head", "all"), ("all", "off")):
        print(f"  {a} / {b:4s}  {med[a] / med[b]:5.2f}x | {med_process[a] / med_process[b]:5.2f}x")


def memory(args: argparse.Namespace) -> None:
    unsampled, _ = peak_memory("head", args.concurrent)
    traced, _ = peak_memory("all", args.concurrent)
    with_tail, stats = peak_memory("tail", args.concurrent)
    buffer = with_tail - traced
    estimate = stats.get("tail_peak_buffer_bytes", 0)
    print(f"{args.concurrent} concurrent undecided trajectories (each: 2 spans open, 2 ended):")
    print(f"  the buffer (tail - traced, both flushed): {buffer / 2**20:.1f} MiB, "
          f"{buffer / args.concurrent:.0f} B per trajectory")
    print(f"  its own estimate (what tail_buffer_bytes bounds): {estimate / 2**20:.1f} MiB "
          f"({estimate / max(1, buffer):.2f}x the measured); spilled: "
          f"{stats.get('tail_spilled', 0)}")
    print(f"  provisional recording in all (tail - unsampled): {(with_tail - unsampled) / 2**20:.1f}"
          f" MiB, {(with_tail - unsampled) / args.concurrent:.0f} B per trajectory")


if __name__ == "__main__":
    main()
