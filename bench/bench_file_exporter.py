"""µs per span of FileSpanExporter.export against the SDK's own encoders, side by side in one run.

A batch of 512 finished spans (BatchSpanProcessor's default batch), each with ~2 KiB of JSON
payload (input.value + output.value) plus the trajectory and GenAI attributes otel_verl sets.

Rows (median of ROUNDS rounds, µs per span):
- FileSpanExporter.export        the hand-written OTLP/JSON encoder + one append per batch
- proto JSON (same line format)  encode_spans + json_format.MessageToDict + hex ids + json.dumps +
                                 write: the straightforward way to produce the same file
- encode_spans only              the OTLP exporters' protobuf message build (no serialisation)
- encode_spans + serialize       what OTLP/protobuf over HTTP or gRPC pays before the network
- ConsoleSpanExporter > /dev/null the SDK's console exporter (span.to_json per span)
Then the reader over the file just written: otel_verl.store.read_spans and group_trajectories.

Run: python bench/bench_file_exporter.py [--rounds N] [--spans N]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import tempfile
import time

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_verl import semconv
from otel_verl.exporters._file_exporter import FileSpanExporter


def make_spans(n: int) -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({semconv.SERVICE_NAME: "bench", semconv.ROLLOUT_PROJECT_NAME: "p"})
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("otel_verl", "0.1.0")
    messages = [{"role": "user", "content": "x" * 480}, {"role": "assistant", "content": "y" * 480}]
    payload = json.dumps({"messages": messages})  # ~1 KiB each way
    with tracer.start_as_current_span("rollout_trace"):
        for i in range(n):
            attrs = {
                semconv.ROLLOUT_STEP: 3,
                semconv.ROLLOUT_SAMPLE_INDEX: i,
                semconv.ROLLOUT_ROLLOUT_N: 0,
                semconv.ROLLOUT_VALIDATE: False,
                semconv.ROLLOUT_EXPERIMENT_NAME: "exp",
                semconv.OPENINFERENCE_SPAN_KIND: semconv.SpanKindName.LLM,
                semconv.GEN_AI_REQUEST_TEMPERATURE: 0.7,
                semconv.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
                semconv.GEN_AI_USAGE_INPUT_TOKENS: 120,
                semconv.INPUT_VALUE: payload,
                semconv.INPUT_MIME_TYPE: semconv.MIME_JSON,
                semconv.OUTPUT_VALUE: payload,
                semconv.OUTPUT_MIME_TYPE: semconv.MIME_JSON,
            }
            with tracer.start_as_current_span("AgentLoop.generate", attributes=attrs):
                pass
    spans = [s for s in memory.get_finished_spans() if s.name != "rollout_trace"]
    provider.shutdown()
    return spans


def _hex_ids(obj):
    if isinstance(obj, dict):
        return {
            k: base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") else _hex_ids(v)
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [_hex_ids(v) for v in obj]
    return obj


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--spans", type=int, default=512)
    args = parser.parse_args()
    spans = make_spans(args.spans)
    tmp = tempfile.mkdtemp(prefix="bench_file_exporter_")
    exporter = FileSpanExporter(tmp)
    proto_path = os.path.join(tmp, "proto.jsonl")
    proto_fd = os.open(proto_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    devnull = open(os.devnull, "w")  # noqa: SIM115
    console = ConsoleSpanExporter(out=devnull)

    def proto_json() -> None:
        msg = json_format.MessageToDict(encode_spans(spans), use_integers_for_enums=True)
        line = json.dumps(_hex_ids(msg), separators=(",", ":")).encode() + b"\n"
        os.write(proto_fd, line)

    cases = {
        "FileSpanExporter.export": lambda: exporter.export(spans),
        "proto JSON (same line format)": proto_json,
        "encode_spans only": lambda: encode_spans(spans),
        "encode_spans + serialize": lambda: encode_spans(spans).SerializeToString(),
        "ConsoleSpanExporter > /dev/null": lambda: console.export(spans),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):  # interleaved rounds: drift hits every row alike
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) / len(spans) * 1e6)
    line_bytes = os.path.getsize(exporter.path) / args.rounds / len(spans)
    base = statistics.median(times["FileSpanExporter.export"])
    print(f"batch of {len(spans)} spans, ~{line_bytes:.0f} bytes of OTLP/JSON per span, "
          f"median of {args.rounds} rounds")
    print(f"{'':34} {'µs/span':>9} {'vs file':>8}")
    for name, samples in times.items():
        med = statistics.median(samples)
        print(f"{name:34} {med:9.1f} {med / base:7.2f}x")
    # the reader, over what the exporter just wrote (rounds x spans spans)
    from otel_verl.store import group_trajectories, read_spans

    t0 = time.perf_counter()
    spans_read = list(read_spans(exporter.path))
    t1 = time.perf_counter()
    group_trajectories(spans_read)
    t2 = time.perf_counter()
    print(f"{'store.read_spans':34} {(t1 - t0) / len(spans_read) * 1e6:9.1f}   "
          f"({len(spans_read)} spans, {os.path.getsize(exporter.path) / (t1 - t0) / 2**20:.0f} MiB/s)")
    print(f"{'store.group_trajectories':34} {(t2 - t1) / len(spans_read) * 1e6:9.1f}")
    exporter.shutdown()
    os.close(proto_fd)
    devnull.close()


if __name__ == "__main__":
    main()
