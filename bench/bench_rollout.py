"""Rollout throughput with tracing on vs off against the real vLLM engine, side by side.

One vLLM CPU server (tracing on, exporting to an in-process OTLP receiver in both modes), one
tokenizer, the same multi-turn tool rollouts (seeded sampling + the demo's structured-output
policy, so both modes do the same token work). Rounds alternate the order (off/on, on/off, ...);
each round runs ``--trajectories`` rollouts at ``--concurrency`` and measures trajectories/s.

- off: ``RolloutTraceConfig`` not initialised (every ``rollout_trace_op`` calls straight through)
- on:  ``backend=file`` (the default: bounded batch processor + OTLP/JSON file writer), every
       trajectory traced, ``traceparent`` sent so vLLM's ``llm_request`` joins each chat turn
- meta: the same with ``capture_payloads=False`` (spans, attributes, usage, no inputs/outputs)

Prints each round and the median ratios against off (target for on/off: >= 0.97). The three
modes rotate their order every round.

Run: ``python3 -m nox -s bench_engine`` or ``python bench/bench_rollout.py [--repeats 5]`` in a venv
with requirements/engine.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

from otel_verl import RolloutTraceConfig, rollout_trace_attr
from otel_verl.demo.otlp_receiver import OTLPReceiver
from otel_verl.demo.run import MODEL_NAME, ForcedToolPolicy, make_rows
from otel_verl.demo.server import VLLMServer
from otel_verl.demo.tiny_model import build_tiny_model
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import VLLMCompletionsClient
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool


def _group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) used so far by every process in a process group (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after "(comm)": state ppid pgrp ...
            total += int(fields[11]) + int(fields[12])  # utime stime
    return total / tick


async def _batch(base_url: str, tokenizer, n: int, concurrency: int, step: int
                 ) -> tuple[float, float]:
    """Run ``n`` rollouts; returns (trajectories per second, this process's CPU ms per trajectory)."""
    client = VLLMCompletionsClient(base_url, MODEL_NAME, tokenizer=tokenizer,
                                   max_connections=concurrency)
    loop = ToolAgentLoop(client, tokenizer, tools=[CalculatorTool()], reward_fn=Gsm8kReward(),
                         max_response_length=256, turn_sampling=ForcedToolPolicy(p_exact=1.0))
    rows = make_rows(max(1, n // 4))
    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int):
        row = rows[i % len(rows)]
        async with semaphore:
            with rollout_trace_attr(step=step, sample_index=row["extra_info"]["index"],
                                    rollout_n=i // len(rows), name="agent_loop"):
                return await loop.run({"temperature": 1.0, "max_tokens": 96, "seed": i,
                                       "logprobs": True}, **row)

    t0, c0 = time.perf_counter(), time.process_time()
    outs = await asyncio.gather(*(one(i) for i in range(n)))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    await client.aclose()
    assert all(o.extra_fields["num_tool_calls"] == 1 for o in outs)
    return n / elapsed, 1000 * cpu / n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trajectories", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--repeats", type=int, default=12, help="rounds per mode (interleaved)")
    p.add_argument("--model-dir", default=None)
    args = p.parse_args(argv)

    from transformers import AutoTokenizer

    model_dir = build_tiny_model(args.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trace_dir = tempfile.mkdtemp(prefix="bench-rollout-")
    with OTLPReceiver() as receiver, VLLMServer(
        model_dir, served_model_name=MODEL_NAME, otlp_endpoint=receiver.traces_url,
        otlp_protocol="http/protobuf",
    ) as server:
        print(f"vLLM up in {server.startup_s:.1f}s; {args.trajectories} trajectories x "
              f"{args.repeats} rounds per mode, concurrency {args.concurrency}", flush=True)

        modes = ("off", "on", "meta")
        engine_cpu: dict[str, list[float]] = {m: [] for m in modes}

        def run(mode: str, step: int) -> tuple[float, float]:
            RolloutTraceConfig.reset()
            e0 = _group_cpu_s(server.process.pid)
            if mode != "off":
                RolloutTraceConfig.init("bench", "bench_rollout", backend="file",
                                        trace_dir=trace_dir, capture_payloads=mode == "on")
            rate = asyncio.run(_batch(server.base_url, tokenizer, args.trajectories,
                                      args.concurrency, step))
            engine_cpu[mode].append(1000 * (_group_cpu_s(server.process.pid) - e0)
                                    / args.trajectories)
            if mode != "off":  # export what is left outside the timed part, like a real step end
                RolloutTraceConfig.flush(timeout_s=30)
            RolloutTraceConfig.reset()
            return rate

        for _ in range(2):
            run("off", 0)  # warm-up: regex compilation, prefix cache, connection setup
            run("on", 1)
        for values in engine_cpu.values():
            values.clear()
        rates: dict[str, list[float]] = {m: [] for m in modes}
        cpu: dict[str, list[float]] = {m: [] for m in modes}
        ratios, meta_ratios = [], []
        for r in range(args.repeats):
            got = {}
            for mode in modes[r % 3:] + modes[:r % 3]:
                got[mode], ms = run(mode, 2 + r)
                rates[mode].append(got[mode])
                cpu[mode].append(ms)
            ratios.append(got["on"] / got["off"])
            meta_ratios.append(got["meta"] / got["off"])
            print(f"round {r + 1:2d}: off {got['off']:6.2f}  on {got['on']:6.2f}  meta "
                  f"{got['meta']:6.2f} traj/s   on/off {ratios[-1]:.3f}  meta/off "
                  f"{meta_ratios[-1]:.3f}", flush=True)
        median = statistics.median(ratios)
        print(f"median off {statistics.median(rates['off']):.2f} traj/s, "
              f"on {statistics.median(rates['on']):.2f} traj/s, meta "
              f"{statistics.median(rates['meta']):.2f} traj/s; ratio of summed rates on/off "
              f"{sum(rates['on']) / sum(rates['off']):.3f}, meta/off "
              f"{sum(rates['meta']) / sum(rates['off']):.3f}")
        print(f"rollout process CPU per trajectory (median): off {statistics.median(cpu['off']):.2f}"
              f" ms, on {statistics.median(cpu['on']):.2f} ms (tracing adds "
              f"{statistics.median(cpu['on']) - statistics.median(cpu['off']):.2f} ms)")
        eng = {m: statistics.median(v) for m, v in engine_cpu.items()}
        roll = {m: statistics.median(v) for m, v in cpu.items()}
        print(f"vLLM process group CPU per trajectory (median): off {eng['off']:.2f} ms, "
              f"on {eng['on']:.2f} ms, meta {eng['meta']:.2f} ms")
        # the engine's CPU per trajectory is not a clean work measure (its busy loop spins while
        # it waits, so it grows when the machine is loaded); the rollout process's is
        added = roll["on"] - roll["off"]
        capacity = 1000 * (os.cpu_count() or 1) / statistics.median(rates["off"])
        print(f"estimate from CPU: tracing adds {added:.2f} ms per trajectory against "
              f"{capacity:.0f} ms of machine CPU per trajectory -> ratio ~{1 - added / capacity:.3f}"
              " (assumes a CPU-bound machine; insensitive to other load)")
        print(f"throughput ratio on/off (median of {len(ratios)} paired rounds): {median:.3f}  "
              f"(target >= 0.97) {'OK' if median >= 0.97 else 'BELOW TARGET'}")
        print(f"throughput ratio meta/off (capture_payloads=False): "
              f"{statistics.median(meta_ratios):.3f}")
        print(f"engine spans received: {sum(s['name'] == 'llm_request' for s in receiver.spans())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
