"""How late the rollout's event loop wakes, tracing off vs on, at long contexts (issue 18).

``bench_rollout_stub``'s rollout (64 concurrent 4-turn trajectories against an engine that
answers after 500 ms, the project's ``ToolAgentLoop``), plus a probe coroutine on the same loop
that sleeps 1 ms again and again and records how late each wake-up is. Lateness is what the
trajectories waking up wait for: the loop's own work (the other coroutines' turns) and any
other thread holding the GIL (the content-hash thread, the content store's thread, the export
thread, the GC wherever it runs). Modes interleave round by round, as in the stub bench.

Printed per mode: throughput, the probe's wake-ups, their lateness (median, p99, max) and the
time spent more than 5 ms late per round, each the median over rounds with the spread; the
difference against ``off`` in the same rounds is what tracing adds.

Run: ``python bench/bench_content_lag.py [--context-tokens 131072] [--modes on,meta]
[--rounds 3]`` in a venv with the unit tier's requirements.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import bench_rollout_stub as stub

from otel_verl import RolloutTraceConfig

PROBE_S = 0.001
#: a wake-up later than this counts towards "time late" (a switch interval: another thread's
#: GIL hold, or a long stretch of loop work)
LATE_S = 0.005


async def _probe(stop: asyncio.Event, lags: list[float]) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(PROBE_S)
        lags.append(time.perf_counter() - t0 - PROBE_S)


async def _run(n: int, step: int, context: int, trace: bool) -> tuple[float, list[float]]:
    stop = asyncio.Event()
    lags: list[float] = []
    probe = asyncio.create_task(_probe(stop, lags))
    wall, _cpu = await stub._batch(n, step, context, trace=trace)
    stop.set()
    await probe
    return wall, lags


def _round(mode: str, n: int, step: int, context: int, trace_dir: str
           ) -> tuple[float, float, float, float, float, int]:
    """(trajectories/s, median lag, p99 lag, max lag, seconds late, wake-ups)."""
    RolloutTraceConfig.reset()
    if mode != "off":
        RolloutTraceConfig.init("bench", "lag", "file", trace_dir=trace_dir,
                                **stub.MODES.get(mode, {}))
    try:
        wall, lags = asyncio.run(_run(n, step, context, mode not in stub.TAIL_MODES))
        RolloutTraceConfig.flush(30.0)
    finally:
        RolloutTraceConfig.reset()
    lags.sort()
    late = sum(x for x in lags if x > LATE_S)
    return (n / wall, statistics.median(lags), lags[int(len(lags) * 0.99)], lags[-1], late,
            len(lags))


def _spread(values: list[float], scale: float = 1e3) -> str:
    return (f"{statistics.median(values) * scale:.2f} "
            f"({min(values) * scale:.2f}-{max(values) * scale:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--context-tokens", type=int, default=128 * 1024)
    parser.add_argument("--modes", default="on,meta", help="comma-separated modes besides off")
    args = parser.parse_args()
    modes = ["off"] + [m for m in args.modes.split(",") if m and m != "off"]
    unknown = [m for m in modes if m != "off" and m not in stub.MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; known: off, {', '.join(stub.MODES)}")
    results: dict[str, list[tuple[float, ...]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as trace_dir:
        _round("off", 4, 0, args.context_tokens, trace_dir)  # warm-up
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for mode in order:
                results[mode].append(_round(mode, args.trajectories, r + 1,
                                            args.context_tokens, trace_dir))
            print(f"round {r + 1}: " + " | ".join(
                f"{m}: {results[m][-1][0]:.2f} traj/s, p99 lag {results[m][-1][2] * 1e3:.2f} ms"
                for m in modes), flush=True)
    print(f"\n{args.trajectories} trajectories, {args.context_tokens}-token contexts, "
          f"{args.rounds} rounds; a {PROBE_S * 1e3:.0f} ms probe's lateness in ms, median "
          "over rounds (spread)")
    for mode in modes:
        rows = results[mode]
        ratio = [m[0] / o[0] for m, o in zip(rows, results["off"], strict=True)]
        print(f"{mode:>8}: on/off {_spread(ratio, 1):>22}  lag median {_spread([x[1] for x in rows])}"
              f"  p99 {_spread([x[2] for x in rows])}  max {_spread([x[3] for x in rows])}"
              f"  >{LATE_S * 1e3:.0f} ms late: {_spread([x[4] for x in rows])} ms/round"
              f"  wake-ups {statistics.median(x[5] for x in rows):.0f}")


if __name__ == "__main__":
    main()
