"""Throughput of WeaveSpanExporter: µs per span translated, and spans/s through translate +
encode + HTTP POST to a local endpoint, side by side with the SDK's OTLP/HTTP exporter to the
same endpoint, in one run.

The exporter runs pinned to one core (CPU 0); the sink (a stdlib HTTP server answering 200 to
every POST, in a subprocess) is pinned to the other core when there is one. Spans look like
otel_verl's: trajectory attributes, openinference kind, GenAI usage, JSON input/output payloads
(~256 B and ~2 KiB of text, and ~28 KB of token ids each way). Batches of 512 spans (BatchSpanProcessor's default).

Rows (median of ROUNDS rounds):
- translate            Translator.translate only (span -> call dict)
- translate+encode     + the per-call JSON encoding with the size cap
- export -> HTTP       WeaveSpanExporter.export of a 512-span batch to the local sink
- OTLP/HTTP export     opentelemetry-exporter-otlp-proto-http to the same sink (reference)

Run: python bench/bench_weave_exporter.py [--rounds N] [--batches N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_weave_exporter import WeaveSpanExporter
from otel_weave_exporter._encode import encode_call
from otel_weave_exporter._translate import Translator

BATCH = 512

SINK = r"""
import os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > 1:
    os.sched_setaffinity(0, {1})
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else the 2-byte body waits for a delayed ACK (40 ms)
    def log_message(self, *a): pass
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        while n > 0:
            n -= len(self.rfile.read(min(n, 1 << 20)))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def make_spans(n: int, payload_bytes: int) -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("otel_verl", "0.1.0")
    if payload_bytes >= 10_000:  # token ids, as an RL rollout's generate call carries them
        n_ids = payload_bytes // 7
        inputs = json.dumps({"request_id": "r", "prompt_ids": list(range(20_000, 20_000 + n_ids))})
        output = json.dumps({"token_ids": list(range(30_000, 30_000 + n_ids)), "stop_reason": "stop"})
    else:
        text = "x" * max(payload_bytes - 60, 1)
        inputs = json.dumps({"messages": [{"role": "user", "content": text}], "request_id": "r"})
        output = json.dumps({"token_ids": [1, 2, 3], "text": text})
    with tracer.start_as_current_span("rollout_trace", attributes={"otel_verl.trajectory": True}):
        for i in range(n):
            with tracer.start_as_current_span("AsyncLLMServerManager.generate", attributes={
                "rollout.step": 3, "rollout.sample_index": i, "rollout.rollout_n": 0,
                "rollout.validate": False, "rollout.experiment_name": "exp",
                "openinference.span.kind": "LLM", "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "Qwen/Qwen2.5-7B-Instruct",
                "gen_ai.usage.input_tokens": 120, "gen_ai.usage.output_tokens": 40,
                "input.value": inputs, "input.mime_type": "application/json",
                "output.value": output, "output.mime_type": "application/json",
            }):
                pass
    return [s for s in memory.get_finished_spans() if s.name != "rollout_trace"]


def per_span_us(fn, spans, rounds: int) -> tuple[float, float]:
    """(wall, CPU of this thread) µs per span, medians over rounds. On a shared machine the CPU
    figure is the steadier one: it is what one core spends, whatever else runs."""
    wall, cpu = [], []
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn(spans)
        cpu.append((time.thread_time() - c0) / len(spans) * 1e6)
        wall.append((time.perf_counter() - t0) / len(spans) * 1e6)
    return statistics.median(wall), statistics.median(cpu)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batches", type=int, default=20, help="batches of 512 per export round")
    args = ap.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    os.environ.setdefault("WANDB_API_KEY", "bench-key")
    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{sink.stdout.readline().strip()}"
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            OTLPSpanExporter = None

        print(f"batch={BATCH} spans, rounds={args.rounds}, exporter pinned to CPU 0, sink {url}")
        print("µs per span, CPU of the exporter's thread (wall in brackets); spans/s = 1e6 / CPU µs")
        print(f"{'payload':>8} | {'translate':>16} | {'+encode':>16} | {'export->HTTP':>16} | "
              f"{'spans/s':>9} | {'OTLP/HTTP export':>16} | {'weave/OTLP':>10}")
        for payload in (256, 2048, 28_000):
            spans = make_spans(BATCH, payload)
            tr = Translator("e", "p")
            tr.begin_batch(spans)
            t_tr = per_span_us(lambda ss, tr=tr: [tr.translate(s) for s in ss], spans, args.rounds)
            t_enc = per_span_us(
                lambda ss, tr=tr: [encode_call(tr.translate(s), 3_500_000) for s in ss], spans,
                args.rounds)
            exporter = WeaveSpanExporter(project="e/p", base_url=url)
            many = spans * args.batches

            failures: list[str] = []

            def export_all(ss, exp=exporter, failures=failures):
                for i in range(0, len(ss), BATCH):
                    if exp.export(ss[i : i + BATCH]).name != "SUCCESS":
                        failures.append(type(exp).__name__)

            export_all(spans)  # warm the connection
            t_exp = per_span_us(export_all, many, args.rounds)
            exporter.shutdown()
            t_otlp = (float("nan"), float("nan"))
            if OTLPSpanExporter is not None:
                otlp = OTLPSpanExporter(endpoint=url + "/v1/traces")
                export_all(spans, otlp)
                t_otlp = per_span_us(lambda ss, otlp=otlp: export_all(ss, otlp), many, args.rounds)
                otlp.shutdown()

            def cell(t):
                return f"{t[1]:6.2f} ({t[0]:6.2f})"

            print(f"{payload:>7}B | {cell(t_tr):>16} | {cell(t_enc):>16} | {cell(t_exp):>16} | "
                  f"{1e6 / t_exp[1]:>9,.0f} | {cell(t_otlp):>16} | {t_exp[1] / t_otlp[1]:>9.2f}x"
                  + (f"  FAILED exports: {failures}" if failures else ""))
    finally:
        sink.terminate()
        sink.wait(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
