"""backend=otlp at scale, on paper: what one trajectory costs on the wire, and what one process
and one local collector sustain -- the numbers docs/scale.md builds on.

Part 1 -- spans and bytes per trajectory, for two verl-shaped trajectories made with otel_verl's
real API (payloads sized like GSM8K math and like a 5-turn tool-using agent; no engine):
  spans, OTLP protobuf bytes (what backend=otlp sends), gzip'd (what crosses the network with the
  collector's default compression), per trajectory.

Part 2 -- throughput, side by side in one run, each mode emitting the same agentic trajectories
as fast as one Python thread can, for --seconds each:
  backend=otlp (gRPC)          -> rotel on 127.0.0.1 (forwarding to its blackhole exporter)
  backend=otlp (HTTP/protobuf) -> the same rotel
  backend=file                 -> local OTLP/JSON store (no collector)
  tracing on but trace=False   (the unsampled cost)
  reported: trajectories/s and spans/s on the rollout thread, spans the collector accepted, and
  the collector's CPU-seconds per 1,000 spans (from /proc).

Run: python bench/bench_otlp.py [--seconds 5]   (needs `rotel` from requirements/collector.txt)
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from otel_verl import (
    RolloutTraceConfig,
    SpanKindName,
    get_tracer,
    record_reward,
    rollout_trace_attr,
    rollout_trace_op,
    semconv,
)
from otel_verl.testing import capture_spans


def _vocabulary(n: int = 2000) -> list[str]:
    rng = random.Random(0)
    return ["".join(rng.choice("etaoinshrdlucmfwypvbgkqjxz"[: 8 + k % 18])
                    for _ in range(2 + k % 8)) for k in range(n)]


VOCAB = _vocabulary()
ZIPF = [1.0 / (rank + 1) for rank in range(len(VOCAB))]


@functools.cache
def text(n_bytes: int, seed: int) -> str:
    """Synthetic prose: Zipf-distributed words, so gzip shrinks it about as much as real text.

    Cached (the workload must not cost more than what is measured); callers pick among 97 seeds,
    which with >= 1 KB each is more than gzip's 32 KiB window can exploit."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_bytes:
        word = rng.choices(VOCAB, weights=ZIPF)[0]
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:n_bytes]


class Loop:
    """A verl ToolAgentLoop-shaped trajectory: run -> per turn generate (+ chat span) -> tool."""

    def __init__(self, turns: int, prompt_bytes: int, response_bytes: int, tool_bytes: int):
        self.turns, self.prompt_bytes = turns, prompt_bytes
        self.response_bytes, self.tool_bytes = response_bytes, tool_bytes

    @rollout_trace_op(name="ToolAgentLoop.run", kind=SpanKindName.AGENT)
    def run(self, raw_prompt: list[dict[str, str]], sample_index: int) -> dict[str, Any]:
        messages = list(raw_prompt)
        for turn in range(self.turns):
            seed = (sample_index * 31 + turn) % 97
            reply = self.generate(messages, seed)
            messages.append({"role": "assistant", "content": reply})
            if turn < self.turns - 1:
                messages.append({"role": "tool", "content": self.execute("python", seed)})
        return {"num_turns": self.turns, "response": messages[-1]["content"]}

    @rollout_trace_op(name="AsyncLLMServerManager.generate", kind=SpanKindName.LLM)
    def generate(self, messages: list[dict[str, str]], seed: int) -> str:
        tracer = get_tracer()
        with tracer.start_as_current_span("chat qwen2.5-7b", attributes={
            semconv.GEN_AI_OPERATION_NAME: "chat",
            semconv.GEN_AI_REQUEST_MODEL: "qwen2.5-7b",
            semconv.GEN_AI_REQUEST_TEMPERATURE: 1.0,
            semconv.GEN_AI_USAGE_INPUT_TOKENS: sum(len(m["content"]) for m in messages) // 4,
            semconv.GEN_AI_USAGE_OUTPUT_TOKENS: self.response_bytes // 4,
            semconv.GEN_AI_RESPONSE_FINISH_REASONS: ["stop"],
        }):
            return text(self.response_bytes, seed)

    @rollout_trace_op(name="execute_tool python", kind=SpanKindName.TOOL)
    def execute(self, tool: str, seed: int) -> str:
        return text(self.tool_bytes, seed)


SHAPES = {
    # GSM8K-like: one turn, short prompt and answer
    "math-1turn": {"turns": 1, "prompt_bytes": 400, "response_bytes": 1200, "tool_bytes": 0},
    # a tool-using agent: 5 turns, 4 tool calls, the history re-sent as each turn's input
    "agent-5turn": {"turns": 5, "prompt_bytes": 1500, "response_bytes": 1500, "tool_bytes": 800},
}


def one_trajectory(loop: Loop, shape: dict[str, int], i: int, trace: bool = True) -> None:
    prompt = [{"role": "user", "content": text(shape["prompt_bytes"], i % 97)}]
    with rollout_trace_attr(sample_index=i, step=1, rollout_n=i % 8, trace=trace):
        loop.run(prompt, i)
        record_reward(1.0)


def part1() -> dict[str, dict[str, float]]:
    rows = {}
    for name, shape in SHAPES.items():
        with capture_spans("bench", "scale") as exporter:
            loop = Loop(**shape)
            for i in range(20):
                one_trajectory(loop, shape, i)
            spans = exporter.get_finished_spans()
        proto = encode_spans(spans).SerializeToString()
        rows[name] = {
            "spans": len(spans) / 20,
            "otlp_bytes": len(proto) / 20,
            "gzip_bytes": len(gzip.compress(proto)) / 20,
        }
    return rows


# --- part 2 ----------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_rotel(tmp: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    import rotel

    binary = str(Path(rotel.__file__).parent / "rotel-agent")
    g, h = free_port(), free_port()
    proc = subprocess.Popen(
        [binary, "start", "--otlp-grpc-endpoint", f"127.0.0.1:{g}",
         "--otlp-http-endpoint", f"127.0.0.1:{h}", "--otlp-grpc-max-recv-msg-size-mib", "64",
         "--exporter", "blackhole", "--pid-file", str(tmp / "rotel.pid"),
         "--log-file", str(tmp / "rotel.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for port in (g, h):
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    return proc, g, h


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_mode(label: str, seconds: float, init: dict[str, Any], trace: bool,
             rotel_pid: int | None, spans_per_traj: int) -> dict[str, Any]:
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("bench", "scale", **init)
    shape = SHAPES["agent-5turn"]
    loop = Loop(**shape)
    cpu0 = cpu_seconds(rotel_pid) if rotel_pid else 0.0
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        one_trajectory(loop, shape, n, trace=trace)
        n += 1
    emit_s = time.perf_counter() - t0
    RolloutTraceConfig.flush(30.0)
    total_s = time.perf_counter() - t0
    stats = RolloutTraceConfig.stats()
    RolloutTraceConfig.shutdown(10.0)
    time.sleep(0.5)  # let the collector finish what it was handed
    cpu = (cpu_seconds(rotel_pid) - cpu0) if rotel_pid else 0.0
    spans = n * spans_per_traj if trace else 0
    return {"mode": label, "trajectories": n, "traj_per_s": n / emit_s,
            "spans_per_s": spans / emit_s, "flush_s": total_s - emit_s,
            "dropped": stats.get("dropped_queue_full", 0), "exported": stats.get("exported"),
            "collector_cpu_s_per_1k_spans": (cpu / spans * 1000) if spans and rotel_pid else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)

    print("== part 1: per trajectory (mean of 20)")
    p1 = part1()
    print(f"{'shape':<14}{'spans':>7}{'OTLP bytes':>12}{'gzip bytes':>12}")
    for name, row in p1.items():
        print(f"{name:<14}{row['spans']:>7.1f}{row['otlp_bytes']:>12,.0f}{row['gzip_bytes']:>12,.0f}")
    spans_per_traj = int(p1["agent-5turn"]["spans"])

    print(f"\n== part 2: one Python thread, agent-5turn trajectories, {args.seconds:.0f} s per mode")
    try:
        import rotel  # noqa: F401
    except ImportError:
        print("skipped: needs rotel (pip install -r requirements/collector.txt)")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="bench_otlp_"))
    proc, grpc_port, http_port = start_rotel(tmp)
    try:
        modes = [
            ("otlp grpc -> rotel", {"backend": "otlp", "otlp_protocol": "grpc",
                                    "otlp_endpoint": f"http://127.0.0.1:{grpc_port}"},
             True, proc.pid),
            ("otlp http -> rotel", {"backend": "otlp", "otlp_protocol": "http/protobuf",
                                    "otlp_endpoint": f"http://127.0.0.1:{http_port}"},
             True, proc.pid),
            ("file store", {"backend": "file", "trace_dir": str(tmp / "store")}, True, None),
            ("trace=False", {"backend": "otlp", "otlp_endpoint": f"http://127.0.0.1:{grpc_port}"},
             False, None),
        ]
        rows = [run_mode(label, args.seconds, init, trace, pid, spans_per_traj)
                for label, init, trace, pid in modes]
    finally:
        proc.terminate()
        proc.wait(10)
        RolloutTraceConfig.reset()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'mode':<22}{'traj/s':>9}{'spans/s':>10}{'flush s':>9}{'dropped':>9}"
          f"{'collector CPU s/1k spans':>26}")
    for r in rows:
        cpu = r["collector_cpu_s_per_1k_spans"]
        print(f"{r['mode']:<22}{r['traj_per_s']:>9,.0f}{r['spans_per_s']:>10,.0f}"
              f"{r['flush_s']:>9.2f}{r['dropped']:>9}{(f'{cpu:.4f}' if cpu is not None else '-'):>26}")
    print(json.dumps({"part1": p1, "part2": rows}, default=str), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
