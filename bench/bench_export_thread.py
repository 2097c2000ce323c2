"""The export thread's CPU per trajectory (redaction + OTLP/JSON encoding), side by side in one run.

The spans are the rollout stub's (``bench_rollout_stub``: 64 trajectories of 4 turns at 32k-token
contexts, payloads on), recorded once through ``backend=file`` and read back, with one resource
and scope object as the SDK shares them. Each round, interleaved (medians, spread in brackets):

- scrub:           ``Scrubber()`` over every span (fresh caches each round: each trajectory's
                   content is new to it, as in a run)
- encode:          ``encode_line`` over the spans in 512-span batches (the file backend's line)
- encode, stdlib:  the same bytes by the stdlib encoder alone (``json.dumps`` of
                   ``encode_request``: what ``encode_line`` wrote before orjson; asserted equal)

Printed: ms of CPU per trajectory for each, and encode / encode-stdlib. What the export thread
holds the GIL for competes with the rollout's event loop when trajectories wake up together
(``bench_rollout_stub`` measures that end to end: "export threads ... ms/traj").

Run: ``python bench/bench_export_thread.py [--rounds 7] [--trajectories 64]`` in a venv with the
unit tier's requirements.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import glob
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_rollout_stub  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402

from otel_verl import RolloutTraceConfig, _otlp_json  # noqa: E402
from otel_verl.exporters import _scrub  # noqa: E402
from otel_verl.exporters._spans import copy_span  # noqa: E402


def _record(trajectories: int, context_tokens: int, trace_dir: str) -> list[ReadableSpan]:
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("bench", "stub", "file", trace_dir=trace_dir)
    asyncio.run(bench_rollout_stub._batch(trajectories, 0, context_tokens))
    RolloutTraceConfig.flush(30.0)
    RolloutTraceConfig.reset()
    spans = []
    for path in glob.glob(os.path.join(trace_dir, "*.jsonl")):
        with open(path, "rb") as f:
            for line in f:
                spans.extend(_otlp_json.readable_span(s)
                             for s in _otlp_json.iter_spans(_otlp_json.decode_line(line)))
    resource, scope = spans[0].resource, spans[0].instrumentation_scope
    return [copy_span(s, resource=resource, instrumentation_scope=scope) for s in spans]


def _timed(fn: Any) -> float:
    gc.collect()
    began = time.thread_time()
    fn()
    return time.thread_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--context-tokens", type=int, default=32 * 1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as trace_dir:
        spans = _record(args.trajectories, args.context_tokens, trace_dir)
    batches = [spans[i:i + 512] for i in range(0, len(spans), 512)]
    for batch in batches:  # the file format did not change
        assert _otlp_json.encode_line(batch) == \
            _otlp_json._dumps(_otlp_json.encode_request(batch)).encode("utf-8", "replace") + b"\n"

    def scrub() -> None:
        _scrub._CACHE.clear()
        _scrub._scrub_short.cache_clear()
        scrubber = _scrub.Scrubber()
        for span in spans:
            scrubber(span)

    def encode() -> None:
        for batch in batches:
            _otlp_json.encode_line(batch)

    def encode_stdlib() -> None:
        for batch in batches:
            _otlp_json._dumps(_otlp_json.encode_request(batch)).encode("utf-8", "replace")

    cases = {"scrub": scrub, "encode": encode, "encode, stdlib": encode_stdlib}
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            times[name].append(_timed(cases[name]) / args.trajectories)
    print(f"{len(spans)} spans of {args.trajectories} trajectories ({args.context_tokens}-token "
          f"contexts), {args.rounds} rounds, CPU ms per trajectory (median, rounds min-max)")
    for name, values in times.items():
        print(f"  {name:15s} {statistics.median(values) * 1e3:6.3f}  "
              f"({min(values) * 1e3:.3f}-{max(values) * 1e3:.3f})")
    ratios = [a / b for a, b in zip(times["encode"], times["encode, stdlib"], strict=True)]
    print(f"  encode / encode-stdlib {statistics.median(ratios):.3f} "
          f"(rounds {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
