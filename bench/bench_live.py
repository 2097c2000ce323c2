"""What live tracking (``live=true``, otel_verl._live) costs the rollout, side by side in one run.

1. The rollout stub bench's shape (``bench_rollout_stub._batch``: ToolAgentLoop, the traced token
   client, calculator, GSM8K reward, 4 turns, 32k-token contexts, N concurrent), ``backend=file``
   with ``live=false`` vs ``live=true``, rounds interleaved (order alternates): trajectories/s and
   the event-loop CPU per trajectory, as median ratios live/plain.
2. The unsampled path: ``rollout_trace_attr(trace=False)`` entered and left, live off vs on
   (absolute µs per trajectory), and the two counter calls live adds to it (target < 1 µs).
3. The registry itself: ``LiveTracker.on_start`` + ``on_end`` per span (µs), times the spans of
   one stub trajectory, as a share of the plain loop CPU per trajectory (target <= 0.5 %): the
   figure that survives a loaded machine, where round-to-round noise in (1) is several %.

Run: ``python bench/bench_live.py [--rounds 5] [--trajectories 32] [--turn-s 0.05]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_rollout_stub as stub  # noqa: E402

from otel_verl import RolloutTraceConfig, rollout_trace_attr  # noqa: E402
from otel_verl._state import STATE  # noqa: E402

SPANS_PER_TRAJECTORY: list[float] = []


def _round(live: bool, n: int, step: int, context: int, trace_dir: str) -> tuple[float, float]:
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("bench", "live", "file", trace_dir=trace_dir, live=live)
    wall, loop_cpu = asyncio.run(stub._batch(n, step, context))
    runtime = STATE.runtime
    if runtime is not None and runtime.live is not None:
        runtime.live.tick()  # accounts what ended
        SPANS_PER_TRAJECTORY.append(runtime.live.ended_total / n)
    RolloutTraceConfig.flush(30.0)
    return n / wall, loop_cpu / n


def _unsampled_us(live: bool, n: int, trace_dir: str) -> float:
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("bench", "live", "file", trace_dir=trace_dir, live=live)
    t0 = time.perf_counter()
    for i in range(n):
        with rollout_trace_attr(step=1, sample_index=i, trace=False):
            pass
    return (time.perf_counter() - t0) / n * 1e6


def _counter_us(n: int, trace_dir: str) -> float:
    """What live adds to an unsampled trajectory: its two counter calls."""
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("bench", "live", "file", trace_dir=trace_dir, live=True)
    runtime = STATE.runtime
    assert runtime is not None and runtime.live is not None
    tracker = runtime.live
    t0 = time.perf_counter()
    for _ in range(n):
        tracker.unsampled_started(1, False)
        tracker.unsampled_ended(1, False)
    return (time.perf_counter() - t0) / n * 1e6


def _registry_us(n: int, trace_dir: str) -> float:
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("bench", "live", "file", trace_dir=trace_dir, live=True)
    runtime = STATE.runtime
    assert runtime is not None and runtime.live is not None
    tracker = runtime.live
    spans = [runtime.tracer.start_span("op") for _ in range(n)]
    for span in spans:
        span.end()  # finished spans: on_start/on_end below run on them alone
    t0 = time.perf_counter()
    for span in spans:
        tracker.on_start(span)
        tracker.on_end(span)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trajectories", type=int, default=32)
    parser.add_argument("--context", type=int, default=32 * 1024)
    parser.add_argument("--turn-s", type=float, default=0.05)
    args = parser.parse_args()
    stub.TURN_S = args.turn_s
    tput: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for live in ((False, True) if r % 2 == 0 else (True, False)):
                t, c = _round(live, args.trajectories, r, args.context, tmp)
                tput[live].append(t)
                cpu[live].append(c)
        ratios = [a / b for a, b in zip(tput[True], tput[False], strict=True)]
        cpu_ratios = [a / b for a, b in zip(cpu[True], cpu[False], strict=True)]
        print(f"rollout stub shape ({args.trajectories} trajectories x 4 turns, "
              f"{args.context} tokens, turn {args.turn_s}s), {args.rounds} interleaved rounds")
        print(f"  throughput live/plain  median {statistics.median(ratios):.4f} "
              f"(rounds {min(ratios):.4f}..{max(ratios):.4f}; target >= 0.995)")
        print(f"  loop CPU per trajectory live/plain  median {statistics.median(cpu_ratios):.4f}"
              f"  (plain {statistics.median(cpu[False]) * 1e3:.2f} ms, live "
              f"{statistics.median(cpu[True]) * 1e3:.2f} ms)")
        off: list[float] = []
        on: list[float] = []
        for r in range(6):
            for live in ((False, True) if r % 2 == 0 else (True, False)):
                (on if live else off).append(_unsampled_us(live, 20000, tmp))
        print(f"  unsampled trajectory (6 interleaved rounds, best): live off {min(off):.2f} µs,"
              f" on {min(on):.2f} µs; the counter alone {_counter_us(200000, tmp):.2f} µs "
              "(target < 1 µs)")
        per_span = min(_registry_us(20000, tmp) for _ in range(3))
        spans = statistics.median(SPANS_PER_TRAJECTORY)
        share = spans * per_span / (statistics.median(cpu[False]) * 1e6)
        print(f"  registry on_start+on_end per span: {per_span:.2f} µs; {spans:.0f} spans per "
              f"trajectory: {spans * per_span:.1f} µs = {share:.2%} of the plain loop CPU per "
              "trajectory (target <= 0.5 %)")
        RolloutTraceConfig.reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
