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
- tail, metatail (``--tail``): ``on`` and ``meta`` with ``tail_keep=errors,truncated`` and every
  trajectory provisional (``trace=False``, so each is recorded, then dropped by the tail rules:
  what tail sampling costs the loop)

- compact (``--compactor``): ``on`` with the exporter's compactor
  (``otel_verl/exporters/_compactor.py``), its threshold lowered to ``--compact-bytes`` (256 KiB;
  the default 64 MiB is more than a round writes) and the export thread looking every 0.25 s
  (5 s by default). With ``--compactor`` every round first runs 4 trajectories untimed and
  flushes them (in every mode): in compact mode their export starts the child, which then
  compacts while the timed 64 run (this process's files of the earlier rounds, all live and
  past the threshold: ~2 rounds' bytes). Every other mode runs with ``compact=False``; off, on
  and compact run, and compact/on is printed paired per round. After the timed part (and the
  flush) a round waits for its child to finish (untimed); printed: the children's CPU
  (``RUSAGE_CHILDREN``; during the timed part: also ``/proc/<pid>/stat`` of the running one) and
  the bytes they compacted.
- compactnormal (``--compactor --normal-priority``): the same child without lowering its
  priority (what SCHED_IDLE buys)

``--modes on,meta`` picks modes by name (``off`` is always run). ``--profile-mode MODE`` runs only
that mode's rounds, for ``py-spy record``.

Printed: trajectories/s per round, the median ratio on/off (target >= 0.98) with the spread of
the per-round ratios, and the event-loop
CPU that tracing adds per trajectory (``time.thread_time()`` on the loop's thread, on minus off,
divided by the trajectories). The export thread's CPU is not on the loop's thread; it is
printed too (process CPU minus loop CPU), and so is the cyclic GC's time and number of
collections per trajectory (``gc.callbacks``, any thread).

``--group-size N``: the trajectories come in GRPO groups of N rollouts of one prompt, handed the
very same row objects (as verl's repeated batch hands them over); default 1, each its own.

Run: ``python bench/bench_rollout_stub.py [--rounds 5] [--trajectories 64]`` in a venv with the
unit tier's requirements (httpx).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from _paired import bootstrap_ratio_of_sums, fmt, median_interval

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


async def _batch(n: int, step: int, context_tokens: int, trace: bool = True
                 ) -> tuple[float, float]:
    """Run ``n`` trajectories concurrently; returns (wall seconds, loop-thread CPU seconds)."""
    tokenizer = FastCharTokenizer()
    loop_obj = ToolAgentLoop(SlowEngineClient(tokenizer), tokenizer, tools=[CalculatorTool()],
                             reward_fn=Gsm8kReward(), max_assistant_turns=4, max_user_turns=4,
                             max_response_length=4096)
    groups = [_row(g, context_tokens) for g in range((n + GROUP[0] - 1) // GROUP[0])]
    rows = [groups[i // GROUP[0]] for i in range(n)]  # a group's rollouts: the same row objects

    async def one(i: int) -> float | None:
        with rollout_trace_attr(step=step, sample_index=i, rollout_n=0, name="agent_loop",
                                trace=trace):
            out = await loop_obj.run({"temperature": 1.0, "max_tokens": 256}, **rows[i])
        assert out.extra_fields["assistant_turns"] == 4, out.extra_fields
        return out.reward_score

    cpu0, wall0 = time.thread_time(), time.perf_counter()
    scores = await asyncio.gather(*(one(i) for i in range(n)))
    wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
    assert all(s == 1.0 for s in scores)
    return wall, cpu


#: ``--group-size``: rollouts per prompt (a GRPO group: its rollouts get the very same row
#: objects, as verl's repeated batch hands them over); 1 = every trajectory its own prompt
GROUP = [1]
#: BENCH_DEBUG_GC=1: print each round's collections by generation and by thread
DEBUG_GC = bool(os.environ.get("BENCH_DEBUG_GC"))
TAIL = {"tail_keep": "errors,truncated"}
#: the options of each traced mode (``off``: not initialised)
MODES: dict[str, dict[str, Any]] = {
    "on": {}, "cap8k": {"max_field_bytes": 8192}, "meta": {"capture_payloads": False},
    "tail": TAIL, "metatail": {"capture_payloads": False, **TAIL},
    "compact": {"compact": True, "compact_interval_s": 1.0}}
MODES["compactnormal"] = MODES["compact"]
#: ``--compact-bytes``: the compact modes' ``compact_live_bytes``
COMPACT_BYTES = [256 << 10]
#: ``--compactor``: trajectories run (untimed) before each round's timed batch, in every mode
PRELUDE = [0]
#: the compactnormal mode's child: the compactor's own, without lowering its priority
NORMAL_BOOT = ("import sys\nfrom otel_verl.exporters._compactor import child_main\n"
               "sys.exit(child_main(sys.argv[1:]))\n")
#: modes whose trajectories run with ``trace=False`` (recorded provisionally by the tail rules)
TAIL_MODES = ("tail", "metatail")


class _GcClock:
    """Time and count the cyclic GC's collections (any thread) while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self.by_thread: dict[str, int] = {}
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.collections[info["generation"]] += 1
            if DEBUG_GC:
                name = threading.current_thread().name
                self.by_thread[name] = self.by_thread.get(name, 0) + 1


def _round(mode: str, n: int, step: int, context_tokens: int, trace_dir: str
           ) -> tuple[float, ...]:
    """(trajectories/s, loop-thread CPU s, other threads' CPU s, GC s, GC collections, then
    the collections of generations 0, 1 and 2 in the round, then the compaction children
    started, their CPU s and the bytes compacted in the round), the CPU and GC figures per
    trajectory; the generations from ``gc.get_stats()`` before and after."""
    RolloutTraceConfig.reset()
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    compacted0 = _compacted_bytes(trace_dir)
    if mode != "off":
        options = {"compact": False, **MODES.get(mode, {})}
        if options["compact"]:
            options["compact_live_bytes"] = COMPACT_BYTES[0]
        RolloutTraceConfig.init("bench", "stub", "file", trace_dir=trace_dir, **options)
        compactor = getattr(RolloutTraceConfig.get_client(), "_compactor", None)
        if compactor is not None and mode == "compactnormal":  # the child at normal priority
            compactor.command = [sys.executable, "-c", NORMAL_BOOT, compactor.trace_dir,
                                 str(compactor.live_bytes), str(compactor.hang_s)]
    if PRELUDE[0]:  # untimed: its export starts the compaction child before the timed part
        asyncio.run(_batch(PRELUDE[0], step, context_tokens, trace=mode not in TAIL_MODES))
        RolloutTraceConfig.flush(30.0)
    clock = _GcClock()
    stats0 = [g["collections"] for g in gc.get_stats()]
    gc.callbacks.append(clock)
    try:
        proc0 = time.process_time()
        wall, loop_cpu = asyncio.run(_batch(n, step, context_tokens,
                                            trace=mode not in TAIL_MODES))
        during = _children_cpu(children0)  # the compaction's CPU while the rollout ran
        RolloutTraceConfig.flush(30.0)  # the export of this round is charged to this round
        other_cpu = time.process_time() - proc0 - loop_cpu
    finally:
        gc.callbacks.remove(clock)
    gens = [g["collections"] - c for g, c in zip(gc.get_stats(), stats0, strict=True)]
    started = 0
    compactor = getattr(RolloutTraceConfig.get_client(), "_compactor", None)
    if compactor is not None:  # untimed: let this round's child finish its compaction
        if compactor.running is not None:
            compactor.running.wait(300)
        started = compactor.counts["started"]
    RolloutTraceConfig.reset()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (children.ru_utime + children.ru_stime - children0.ru_utime - children0.ru_stime)
    compacted = _compacted_bytes(trace_dir) - compacted0
    if DEBUG_GC:
        print(mode, "gc collections by generation", clock.collections, clock.by_thread,
              f"{clock.seconds * 1e3:.1f} ms")
    return (n / wall, loop_cpu / n, other_cpu / n, clock.seconds / n, sum(clock.collections) / n,
            float(gens[0]), float(gens[1]), float(gens[2]), float(started), child_cpu,
            float(compacted), during)


def _children_cpu(children0: resource.struct_rusage) -> float:
    """CPU seconds of the compaction children since ``children0``: those reaped, and the one
    running now (``/proc/<pid>/stat``)."""
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = now.ru_utime + now.ru_stime - children0.ru_utime - children0.ru_stime
    proc = getattr(getattr(RolloutTraceConfig.get_client(), "_compactor", None), "running", None)
    if proc is not None:
        try:
            with open(f"/proc/{proc.pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            pass
    return cpu


def _compacted_bytes(trace_dir: str) -> int:
    """The store bytes the lake's manifest says are compacted."""
    from otel_verl.store import Manifest

    path = Manifest.path_of(trace_dir)
    if not os.path.exists(path):
        return 0
    manifest = Manifest.load(os.path.dirname(path))
    return sum(entry.get("end", 0) for entry in manifest.sources.values())


def _gens(medians: list[float]) -> str:
    return "/".join(f"{g:g}" for g in medians[5:8])


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} (rounds {min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--context-tokens", type=int, default=32 * 1024)
    parser.add_argument("--group-size", type=int, default=1,
                        help="rollouts per prompt, sharing its row objects (GRPO's n)")
    parser.add_argument("--all-modes", action="store_true",
                        help="also max_field_bytes=8192 and capture_payloads=False")
    parser.add_argument("--tail", action="store_true",
                        help="also on and meta with tail_keep set (trajectories provisional)")
    parser.add_argument("--compactor", action="store_true",
                        help="modes off, on and compact (the exporter's compactor running)")
    parser.add_argument("--compact-bytes", type=int, default=COMPACT_BYTES[0],
                        help="the compact modes' compact_live_bytes (default 256 KiB)")
    parser.add_argument("--normal-priority", action="store_true",
                        help="with --compactor: also compactnormal (the child not lowered)")
    parser.add_argument("--modes", default=None, help="comma-separated modes besides off")
    parser.add_argument("--profile-mode", default=None,
                        help="run only this mode's rounds (for a profiler)")
    args = parser.parse_args()
    COMPACT_BYTES[0] = args.compact_bytes
    GROUP[0] = max(1, args.group_size)
    from otel_verl.exporters._compactor import StoreCompactor

    StoreCompactor.check_s = 0.25  # (5 s by default: longer than a round)
    if args.profile_mode:
        with tempfile.TemporaryDirectory() as trace_dir:
            _round("off", 4, 0, args.context_tokens, trace_dir)  # warm-up
            for r in range(args.rounds):
                res = _round(args.profile_mode, args.trajectories, r + 1, args.context_tokens,
                             trace_dir)
                print(f"{args.profile_mode}: {res[0]:6.2f} traj/s, loop CPU "
                      f"{res[1] * 1e3:6.2f} ms/traj", flush=True)
        return
    if args.compactor:
        modes = ["off", "on", "compact"] + (["compactnormal"] if args.normal_priority else [])
        PRELUDE[0] = 4
    elif args.modes:
        modes = ["off"] + [m for m in args.modes.split(",") if m and m != "off"]
    else:
        modes = ["off", "on"] + (["cap8k", "meta"] if args.all_modes else []) + \
            (["tail", "metatail"] if args.tail else [])
    unknown = [m for m in modes if m != "off" and m not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; known: off, {', '.join(MODES)}")
    results: dict[str, list[tuple[float, ...]]] = {m: [] for m in modes}
    written: list[int] = []  # store bytes per traced round
    with tempfile.TemporaryDirectory() as trace_dir:
        _round("off", 4, 0, args.context_tokens, trace_dir)  # warm-up
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            line = []
            for mode in order:
                before = _store_bytes(trace_dir)
                res = _round(mode, args.trajectories, r + 1, args.context_tokens, trace_dir)
                if mode != "off":
                    written.append(_store_bytes(trace_dir) - before)
                results[mode].append(res)
                line.append(f"{mode}: {res[0]:6.2f} traj/s, loop CPU {res[1] * 1e3:6.2f} ms/traj,"
                            f" other threads {res[2] * 1e3:6.2f}, GC {res[3] * 1e3:5.2f} ms/traj")
            print(f"round {r + 1}: " + " | ".join(line), flush=True)
    med = {m: [statistics.median(x[i] for x in results[m]) for i in range(12)] for m in modes}
    print(f"\n{args.trajectories} concurrent trajectories, 4 turns of {TURN_S * 1e3:.0f} ms, "
          f"{args.context_tokens}-token contexts, {args.rounds} rounds"
          f"{f', groups of {GROUP[0]} rollouts per prompt' if GROUP[0] > 1 else ''} "
          f"(medians; per-round ratio spread in brackets)")
    for mode in modes[1:]:
        ratios = [m[0] / off[0] for m, off in zip(results[mode], results["off"], strict=True)]
        # loop CPU added, paired per round (the same round's off), then the median and spread
        added = [(m[1] - off[1]) * 1e3 for m, off in zip(results[mode], results["off"],
                                                          strict=True)]
        print(f"{mode:>8}/off throughput {_spread(ratios)}; event-loop CPU added "
              f"{statistics.median(added):.2f} ms/traj (rounds {min(added):.2f}-{max(added):.2f}),"
              f" export threads {(med[mode][2] - med['off'][2]) * 1e3:.2f} ms/traj; GC "
              f"{med[mode][3] * 1e3:.2f} ms/traj in {med[mode][4]:.1f} collections (off "
              f"{med['off'][3] * 1e3:.2f} in {med['off'][4]:.1f}); "
              f"{med[mode][0]:.2f} vs {med['off'][0]:.2f} traj/s; collections per round by "
              f"generation {_gens(med[mode])} (off {_gens(med['off'])})")
    for name in ("compact", "compactnormal"):
        if name not in modes or "on" not in modes:
            continue
        ratios = [c[0] / on[0] for c, on in zip(results[name], results["on"], strict=True)]
        added = [(c[1] - on[1]) * 1e3 for c, on in zip(results[name], results["on"],
                                                         strict=True)]
        rounds = results[name]
        rates = ([c[0] for c in rounds], [on[0] for on in results["on"]])
        print(f"{name:>13}/on throughput {_spread(ratios)}, median "
              f"{fmt(median_interval(ratios))}, ratio of sums "
              f"{fmt(bootstrap_ratio_of_sums(*rates))}; event-loop CPU added "
              f"{statistics.median(added):.2f} ms/traj (rounds {min(added):.2f}-{max(added):.2f});"
              f" compaction children started {sum(r[8] for r in rounds):.0f} in "
              f"{len(rounds)} rounds, their CPU {statistics.median(r[9] for r in rounds):.2f} s "
              f"per round (rounds {min(r[9] for r in rounds):.2f}-"
              f"{max(r[9] for r in rounds):.2f}; during the timed rollout "
              f"{statistics.median(r[11] for r in rounds):.2f} s), compacted "
              f"{statistics.median(r[10] for r in rounds) / 2**20:.1f} MiB per round; store "
              f"bytes per traced round {statistics.median(written) / 2**20:.1f} MiB (the "
              f"threshold {COMPACT_BYTES[0] / 2**20:g} MiB)")
    print(f"event-loop CPU per trajectory, off: {med['off'][1] * 1e3:.2f} ms   "
          "(targets: on/off >= 0.98 at 32k, >= 0.97 at 128k; meta >= 0.99; added <= 1 ms)")


def _store_bytes(trace_dir: str) -> int:
    return sum(os.path.getsize(os.path.join(trace_dir, name)) for name in os.listdir(trace_dir)
               if name.endswith(".jsonl"))


if __name__ == "__main__":
    main()
