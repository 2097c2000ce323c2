"""Rollout throughput with tracing on vs off against the real vLLM engine, side by side.

One vLLM CPU server (tracing on, exporting to an in-process OTLP receiver in both modes), one
tokenizer, the same multi-turn tool rollouts (seeded sampling + the demo's structured-output
policy, so both modes do the same token work). Each round runs ``--trajectories`` rollouts at
``--concurrency`` in each mode, back to back, the order cycling through all six permutations of
the three modes (so each mode runs first, second and third equally often):

- off: ``RolloutTraceConfig`` not initialised (every ``rollout_trace_op`` calls straight through)
- on:  ``backend=file`` (the default: bounded batch processor + OTLP/JSON file writer), every
       trajectory traced, ``traceparent`` sent so vLLM's ``llm_request`` joins each chat turn
- meta: the same with ``capture_payloads=False`` (spans, attributes, usage, no inputs/outputs)

The unit is the round: its paired ratio on/off (and meta/off) and its paired differences. The
report gives the median paired ratio with a distribution-free 95 % interval (order statistics),
the ratio of summed rates with a bootstrap interval over rounds (``bench/_paired.py``), and per
mode, each with its interval: the rollout process's CPU per trajectory (and what tracing adds,
paired), the vLLM process group's CPU per trajectory, the client-side time between a response
and the next request of the same trajectory, the engine's latency per request as the client sees
it, the mean number of requests in flight at the engine, and the cores busy (vLLM's and the
whole machine's). The load average is sampled each round. Target for on/off: >= 0.97.

The paired ratio splits exactly into the client's share (requests in flight) and the engine's as
the client sees it (1 / latency per request), since rate = in flight / (requests x latency).
``--loop-lag`` adds a probe of the event loop's wake-up lag (mean and 99th percentile per round,
per mode, with intervals); ``--from-json`` reprints a saved run.

CPU isolation (off by default): ``--engine-cpus 1 --client-cpus 0`` (either alone gives the other
side the rest) starts the vLLM server's process group on its CPUs (every process and thread of it
inherits the affinity; ``VLLM_CPU_OMP_THREADS_BIND`` and ``OMP_NUM_THREADS`` tell vLLM's OpenMP
workers and torch the same cores) and pins every thread of the bench process (event loop, export
threads, the OTLP receiver) to the others. The report then gives, per mode, how busy each side's
CPU set was (every process on them counts, the other sessions' too) beside what each side's own
processes used, and checks after the warm-up and at the end that no thread of either side may run
outside its set.

Run: ``python3 -m nox -s bench_engine [-- --engine-cpus 1 --client-cpus 0 --loop-lag]`` or
``python bench/bench_rollout.py [--repeats 18] [--json rounds.json]`` in a venv with
requirements/engine.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time

from _cpus import cpu_busy_s, format_cpu_list, group_pids, pin_tasks, split_cpus, tasks_outside
from _paired import Estimate, bootstrap_ratio_of_sums, fmt, median_interval

from otel_verl import RolloutTraceConfig, rollout_trace_attr
from otel_verl.demo.otlp_receiver import OTLPReceiver
from otel_verl.demo.run import MODEL_NAME, ForcedToolPolicy, make_rows
from otel_verl.demo.server import VLLMServer
from otel_verl.demo.tiny_model import build_tiny_model
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import VLLMCompletionsClient
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool


def _group_cpu_by_name(pgid: int) -> dict[str, float]:
    """CPU seconds (user + system) used so far by the processes of a process group, summed by
    process name (``python`` is vLLM's API server, ``VLLM::EngineCor`` its engine core, ...)."""
    tick = os.sysconf("SC_CLK_TCK")
    total: dict[str, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                head, tail = fh.read().rsplit(")", 1)
        except OSError:
            continue
        fields, name = tail.split(), head.split("(", 1)[1]
        if int(fields[2]) == pgid:  # fields after "(comm)": state ppid pgrp ...
            total[name] = total.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return total


def _group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) used so far by every process in a process group (Linux)."""
    return sum(_group_cpu_by_name(pgid).values())


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (not idle or iowait) since boot (Linux)."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


class _TimedClient(VLLMCompletionsClient):
    """The bench's client: records, per trajectory (``request_id``), when each engine request
    starts and ends, so the client-side time between turns can be told from the engine's."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.last_end: dict[str, float] = {}
        self.gaps: list[float] = []  # response -> next request of the same trajectory, s
        self.latencies: list[float] = []  # request -> response, s

    async def _generate(self, request_id, prompt_ids, sp, headers):
        t0 = time.perf_counter()
        prev = self.last_end.get(request_id)
        if prev is not None:
            self.gaps.append(t0 - prev)
        out = await super()._generate(request_id, prompt_ids, sp, headers)
        t1 = time.perf_counter()
        self.latencies.append(t1 - t0)
        self.last_end[request_id] = t1
        return out


async def _lag_probe(stop: asyncio.Event, lags: list[float], period_s: float = 0.002) -> None:
    """How late the event loop wakes a coroutine that sleeps ``period_s`` (its lag), repeatedly."""
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(period_s)
        lags.append(time.perf_counter() - t - period_s)


async def _batch(base_url: str, tokenizer, n: int, concurrency: int, step: int,
                 loop_lag: bool = False) -> dict[str, float]:
    """Run ``n`` rollouts; returns the round's measures for one mode (see ``MEASURES``)."""
    client = _TimedClient(base_url, MODEL_NAME, tokenizer=tokenizer, max_connections=concurrency)
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

    stop, lags = asyncio.Event(), []
    probe = asyncio.create_task(_lag_probe(stop, lags)) if loop_lag else None
    t0, c0 = time.perf_counter(), time.process_time()
    outs = await asyncio.gather(*(one(i) for i in range(n)))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    stop.set()
    if probe is not None:
        await probe
    await client.aclose()
    assert all(o.extra_fields["num_tool_calls"] == 1 for o in outs)
    return {
        "rate": n / elapsed,
        "elapsed_s": elapsed,
        "cpu_ms": 1000 * cpu / n,
        "gap_ms": 1000 * statistics.fmean(client.gaps),
        "latency_ms": 1000 * statistics.fmean(client.latencies),
        "in_flight": sum(client.latencies) / elapsed,
        "requests": len(client.latencies) / n,
        **({"loop_lag_ms": 1000 * statistics.fmean(lags),
            "loop_lag_p99_ms": 1000 * _quantile(lags, 0.99)} if lags else {}),
    }


def _quantile(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank: the ceil(q n)-th smallest)."""
    ys = sorted(xs)
    return ys[min(len(ys) - 1, max(0, math.ceil(q * len(ys)) - 1))]


MODES = ("off", "on", "meta")
ORDERS = list(itertools.permutations(MODES))


def _report(rounds: list[dict[str, dict[str, float]]], loads: list[float]) -> dict[str, str]:
    """Print the summary of the paired rounds; returns the figures as text, for the JSON dump."""
    def col(mode: str, key: str) -> list[float]:
        return [r[mode][key] for r in rounds]

    out: dict[str, str] = {}
    for r in rounds:  # with --engine-cpus: what ran on each side's CPUs besides that side
        for m in MODES:
            got = r[m]
            if "engine_set_busy" in got and "client_cores" in got:
                got["engine_set_others"] = got["engine_set_busy"] - got["engine_cores"]
                got["client_set_others"] = got["client_set_busy"] - got["client_cores"]

    def line(label: str, est: Estimate, digits: int = 3, unit: str = "") -> None:
        out[label] = fmt(est, digits) + unit
        print(f"  {label:<44s} {out[label]}")

    n = len(rounds)
    print(f"\n{n} paired rounds; medians [95 % interval]; load average (1 min) over the rounds: "
          f"min {min(loads):.2f}, median {statistics.median(loads):.2f}, max {max(loads):.2f}")
    for mode in ("on", "meta"):
        ratios = [r[mode]["rate"] / r["off"]["rate"] for r in rounds]
        line(f"{mode}/off, median paired ratio", median_interval(ratios))
        line(f"{mode}/off, ratio of summed rates (bootstrap)",
             bootstrap_ratio_of_sums(col(mode, "rate"), col("off", "rate")))
    # rate = (requests in flight) / (requests per trajectory x latency per request), exactly; so
    # the paired ratio splits into the client's share (fewer requests in flight while the client
    # works between turns) and the engine's as the client sees it (each request takes longer)
    for mode in ("on", "meta"):
        line(f"{mode}/off, requests in flight ratio (client)",
             median_interval([r[mode]["in_flight"] / r["off"]["in_flight"] for r in rounds]))
        line(f"{mode}/off, 1 / latency ratio (engine as seen)",
             median_interval([r["off"]["latency_ms"] / r[mode]["latency_ms"] for r in rounds]))
    for mode in MODES:
        line(f"{mode}: trajectories/s", median_interval(col(mode, "rate")), 2)
    for mode in ("on", "meta"):
        added = [r[mode]["cpu_ms"] - r["off"]["cpu_ms"] for r in rounds]
        line(f"{mode}: rollout CPU added per trajectory (paired)", median_interval(added), 2,
             " ms")
    for key, label, unit, digits in (
        ("cpu_ms", "rollout process CPU per trajectory", " ms", 2),
        ("engine_ms", "vLLM process group CPU per trajectory", " ms", 1),
        ("gap_ms", "client time response -> next request", " ms", 2),
        ("latency_ms", "engine latency per request (client view)", " ms", 1),
        ("in_flight", "requests in flight at the engine (mean)", "", 2),
        ("engine_cores", "vLLM process group CPU, cores busy", "", 2),
        ("machine_cores", "whole machine CPU, cores busy", "", 2),
        ("client_cores", "rollout process CPU, cores busy", "", 2),
        ("engine_set_busy", "engine's CPU set, cores busy (all processes)", "", 2),
        ("client_set_busy", "client's CPU set, cores busy (all processes)", "", 2),
        ("engine_set_others", "engine's CPU set, cores busy by others", "", 2),
        ("client_set_others", "client's CPU set, cores busy by others", "", 2),
        ("loop_lag_ms", "event-loop lag of a 2 ms sleep (mean)", " ms", 2),
        ("loop_lag_p99_ms", "event-loop lag of a 2 ms sleep (p99)", " ms", 2),
    ):
        if any(key not in r[m] for r in rounds for m in MODES):
            continue
        for mode in MODES:
            line(f"{mode}: {label}", median_interval(col(mode, key)), digits, unit)
        for mode in ("on", "meta"):
            diff = [r[mode][key] - r["off"][key] for r in rounds]
            line(f"{mode} - off: {label} (paired)", median_interval(diff), digits, unit)
    names = sorted({k for r in rounds for m in MODES for k in r[m]
                    if k.startswith("engine_cores:")})
    for key in names:  # vLLM's processes one by one (runs saved before this have none)
        if any(key not in r[m] for r in rounds for m in MODES):
            continue
        name = key.split(":", 1)[1]
        for mode in MODES:
            line(f"{mode}: vLLM's '{name}' processes, cores busy",
                 median_interval(col(mode, key)), 2)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trajectories", type=int, default=32, help="rollouts per mode per round")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--repeats", type=int, default=18,
                   help="paired rounds (each runs every mode once; 18 = each order 3 times)")
    p.add_argument("--model-dir", default=None)
    p.add_argument("--json", default=None, help="write every round's measures here")
    p.add_argument("--loop-lag", action="store_true",
                   help="also measure the event loop's lag (a probe coroutine, every mode)")
    p.add_argument("--from-json", default=None,
                   help="print the report of a run saved with --json, running nothing")
    p.add_argument("--engine-cpus", default=None,
                   help="CPU list (e.g. 1 or 2-7) for the vLLM server's processes; the client "
                        "gets the rest unless --client-cpus says otherwise. Default: no pinning")
    p.add_argument("--client-cpus", default=None,
                   help="CPU list for the bench process (event loop, export threads); the "
                        "engine gets the rest unless --engine-cpus says otherwise")
    args = p.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as fh:
            saved = json.load(fh)
        if saved.get("cpus"):
            print(f"cpus: {saved['cpus']}")
        _report(saved["rounds"], saved["loads"])
        return 0
    cpus: tuple[frozenset[int], frozenset[int]] | None = None
    if args.engine_cpus is not None or args.client_cpus is not None:
        try:
            cpus = split_cpus(args.engine_cpus, args.client_cpus, os.sched_getaffinity(0))
        except ValueError as exc:
            p.error(str(exc))

    from transformers import AutoTokenizer

    model_dir = build_tiny_model(args.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trace_dir = tempfile.mkdtemp(prefix="bench-rollout-")
    server_env: dict[str, str] = {}
    if cpus is not None:
        engine_cpus, client_cpus = cpus
        server_env = {"VLLM_CPU_OMP_THREADS_BIND": format_cpu_list(engine_cpus),
                      "OMP_NUM_THREADS": str(len(engine_cpus))}
        # the server inherits the affinity of the thread that forks it (this one)
        os.sched_setaffinity(0, engine_cpus)
    with OTLPReceiver() as receiver, VLLMServer(
        model_dir, served_model_name=MODEL_NAME, otlp_endpoint=receiver.traces_url,
        otlp_protocol="http/protobuf", env=server_env,
    ) as server:
        if cpus is not None:
            pin_tasks(os.getpid(), client_cpus)  # every thread of the bench, this one included
        print(f"vLLM up in {server.startup_s:.1f}s; {args.trajectories} trajectories x "
              f"{args.repeats} paired rounds, concurrency {args.concurrency}", flush=True)
        cpus_text = ""

        def check_isolation(when: str) -> str:
            """Which threads of either side may run outside its CPU set (none: it held)."""
            if cpus is None:
                return ""
            e_pids = group_pids(server.process.pid)
            e_n, e_out = tasks_outside(e_pids, engine_cpus)
            c_n, c_out = tasks_outside([os.getpid()], client_cpus)
            text = (f"vLLM on CPUs {format_cpu_list(engine_cpus)} ({len(e_pids)} processes, "
                    f"{e_n} threads), client on CPUs {format_cpu_list(client_cpus)} ({c_n} "
                    f"threads); env {' '.join(f'{k}={v}' for k, v in server_env.items())}")
            outside = e_out + c_out
            text += (f"; {when}: isolation held" if not outside else
                     f"; {when}: NOT HELD, {len(outside)} threads outside: " + ", ".join(outside))
            print(f"cpus: {text}", flush=True)
            return text

        def run(mode: str, step: int) -> dict[str, float]:
            RolloutTraceConfig.reset()
            if mode != "off":
                RolloutTraceConfig.init("bench", "bench_rollout", backend="file",
                                        trace_dir=trace_dir, capture_payloads=mode == "on")
            e0, m0, b0 = _group_cpu_by_name(server.process.pid), _machine_busy_s(), cpu_busy_s()
            got = asyncio.run(_batch(server.base_url, tokenizer, args.trajectories,
                                     args.concurrency, step, args.loop_lag))
            e1 = _group_cpu_by_name(server.process.pid)
            engine_s = sum(e1.values()) - sum(e0.values())
            for name in e1:  # which of vLLM's processes the engine's cores went to
                got[f"engine_cores:{name}"] = (e1[name] - e0.get(name, 0.0)) / got["elapsed_s"]
            got["engine_ms"] = 1000 * engine_s / args.trajectories
            got["engine_cores"] = engine_s / got["elapsed_s"]
            got["machine_cores"] = (_machine_busy_s() - m0) / got["elapsed_s"]
            got["client_cores"] = got["cpu_ms"] * args.trajectories / 1000 / got["elapsed_s"]
            if cpus is not None:
                b1 = cpu_busy_s()
                for side, cset in (("engine", engine_cpus), ("client", client_cpus)):
                    busy = sum(b1[c] - b0[c] for c in cset)
                    got[f"{side}_set_busy"] = busy / got["elapsed_s"]
            if mode != "off":  # export what is left outside the timed part, like a real step end
                RolloutTraceConfig.flush(timeout_s=30)
            RolloutTraceConfig.reset()
            return got

        for _ in range(2):  # warm-up: regex compilation, prefix cache, connection setup
            for mode in MODES:
                run(mode, 0)
        cpus_text = check_isolation("after the warm-up")
        rounds: list[dict[str, dict[str, float]]] = []
        loads: list[float] = []
        t_start = time.perf_counter()
        for r in range(args.repeats):
            order = ORDERS[r % len(ORDERS)]
            got = {mode: run(mode, 2 + r) for mode in order}
            rounds.append(got)
            loads.append(os.getloadavg()[0])
            print(f"round {r + 1:2d} ({'/'.join(order):12s}): "
                  + "  ".join(f"{m} {got[m]['rate']:5.2f}" for m in MODES)
                  + f" traj/s  on/off {got['on']['rate'] / got['off']['rate']:.3f}  meta/off "
                  f"{got['meta']['rate'] / got['off']['rate']:.3f}  engine ms/traj "
                  + "/".join(f"{got[m]['engine_ms']:.0f}" for m in MODES)
                  + "  gap ms " + "/".join(f"{got[m]['gap_ms']:.1f}" for m in MODES)
                  + ("  lag ms " + "/".join(f"{got[m]['loop_lag_ms']:.1f}" for m in MODES)
                     if args.loop_lag else "")
                  + ("  busy e/c " + "/".join(f"{got[m]['engine_set_busy']:.2f}:"
                                              f"{got[m]['client_set_busy']:.2f}" for m in MODES)
                     if cpus is not None else "")
                  + f"  load {loads[-1]:.2f}  ({time.perf_counter() - t_start:.0f} s)",
                  flush=True)
        if cpus is not None:
            cpus_text = check_isolation("at the end")
        summary = _report(rounds, loads)
        ratio = median_interval([r["on"]["rate"] / r["off"]["rate"] for r in rounds])
        verdict = ("too few rounds for a 95 % interval" if ratio.coverage < 0.95
                   else "met" if ratio.lo >= 0.97 else "not met" if ratio.hi < 0.97
                   else "not settled (the interval straddles it)")
        print(f"target on/off >= 0.97: {verdict}")
        print(f"engine spans received: {sum(s['name'] == 'llm_request' for s in receiver.spans())}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"args": vars(args), "rounds": rounds, "loads": loads, "cpus": cpus_text,
                           "summary": summary, "orders": [ORDERS[i % len(ORDERS)]
                                                          for i in range(len(rounds))]},
                          fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
