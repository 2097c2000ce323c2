"""The per-span hot path: a traced op inside an open trajectory against an SDK span recording
the same attributes inside a hand-made trajectory span, in short interleaved blocks (this machine
is shared and noisy: each block's ratio is taken against the blocks beside it, then the median).

Cases:
- sdk:    ``tracer.start_as_current_span`` with the trajectory attributes, the kind, (with
          payloads) the input JSON at start and the output JSON at the end, same processor
- light:  ``rollout_trace_op`` as it runs (``otel_verl._hotpath.LightSpan``)
- sdkpath: the same op with the light span turned off (the tracer's own ``start_span``)

Also printed: objects the cyclic GC tracks per open span, each way, and the GC-counted
allocations a traced op adds while open and once ended (``tests/unit/test_span_path_cost.py``
keeps the latter from growing back).

Run: ``python bench/bench_span_path.py [--blocks 60] [--n 200] [--metadata-only]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

from otel_verl import RolloutTraceConfig, _hotpath, rollout_trace_attr, rollout_trace_op
from otel_verl._state import STATE
from otel_verl.exporters._processor import BoundedBatchProcessor

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or imported
from bench_core import Loop, NullExporter  # noqa: E402 - the same op and exporter
from bench_core import per_call_us as _block  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is 12*7? Use the calculator."}]


def _tracked_per_open_span(start: Callable[[], object], n: int = 300) -> float:
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        spans = [start() for _ in range(n)]
        held = len(gc.get_objects()) - before
    finally:
        gc.enable()
    for span in spans:
        span.end()  # type: ignore[attr-defined]
    return held / n


def _gc_counted_per_op(op: Callable[[], object], n: int = 40) -> tuple[float, float]:
    """What one call of ``op`` adds to the young generation's allocation counter (the one that
    starts a collection at 700), with the GC off: while the op runs (read inside it through
    ``_INSIDE``) and once it has returned (its finished span waiting for export)."""
    for _ in range(20):
        op()
    inside = after = 0
    for _ in range(n):
        gc.collect()
        gc.disable()
        try:
            start = gc.get_count()[0]
            op()
            end = gc.get_count()[0]
        finally:
            gc.enable()
        inside += _INSIDE[0] - start
        after += end - start
    return inside / n, after / n


_INSIDE = [0]


class _CountingLoop:
    """``Loop.generate`` that notes the allocation counter while its span is open."""

    @rollout_trace_op
    def generate(self, messages, temperature=1.0):
        _INSIDE[0] = gc.get_count()[0]
        return {"n": len(messages)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=60)
    parser.add_argument("--n", type=int, default=200, help="calls per block")
    parser.add_argument("--metadata-only", action="store_true")
    args = parser.parse_args()
    payloads = not args.metadata_only

    processor = BoundedBatchProcessor(NullExporter(), max_queue_size=1 << 20)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("bench")
    traj_attrs = {"rollout.step": 1, "rollout.sample_index": 2, "rollout.rollout_n": 0,
                  "rollout.validate": False, "rollout.experiment_name": "bench",
                  "metadata": json.dumps({"step": 1, "sample_index": 2, "rollout_n": 0,
                                          "validate": False, "experiment_name": "bench"}),
                  "session.id": "bench/step-1/sample-2"}

    def sdk() -> object:
        attrs = {**traj_attrs, "otel_verl.trajectory_child": True,
                 "openinference.span.kind": "LLM"}
        if payloads:
            attrs.update({"input.value": json.dumps({"messages": MESSAGES, "temperature": 1.0}),
                          "input.mime_type": "application/json"})
        with tracer.start_as_current_span("Loop.generate", attributes=attrs) as span:
            result = {"n": len(MESSAGES)}
            if payloads:
                span.set_attributes({"output.value": json.dumps(result),
                                     "output.mime_type": "application/json"})
            return result

    RolloutTraceConfig.init("bench", "bench", "console", exporter=NullExporter(),
                            trace_dir=tempfile.mkdtemp(prefix="bench-span-path-"),
                            max_queue_size=1 << 20, capture_payloads=payloads, live=False,
                            durable=False)
    loop = Loop()
    light_ok = _hotpath.LIGHT_SPAN_OK

    def op() -> object:
        return loop.generate(MESSAGES)

    def run(case: str) -> float:
        if case == "sdk":
            with tracer.start_as_current_span("rollout_trace", attributes=traj_attrs):
                return _block(sdk, args.n)
        _hotpath.LIGHT_SPAN_OK = light_ok and case == "light"
        _hotpath._STARTERS.clear()
        try:
            with rollout_trace_attr(step=1, sample_index=2, rollout_n=0):
                return _block(op, args.n)
        finally:
            _hotpath.LIGHT_SPAN_OK = light_ok
            _hotpath._STARTERS.clear()

    cases = ("sdk", "light", "sdkpath")
    times: dict[str, list[float]] = {case: [] for case in cases}
    for block in range(args.blocks):
        for case in cases[block % 3:] + cases[:block % 3]:  # the order rotates
            times[case].append(run(case))
    ratio = {case: statistics.median(a / b for a, b in zip(times[case], times["sdk"],
                                                            strict=True))
             for case in ("light", "sdkpath")}

    ours = STATE.runtime.tracer if STATE.runtime is not None else tracer
    tracked_sdk = _tracked_per_open_span(lambda: tracer.start_span("s", attributes={"a": 1}))
    tracked_light = _tracked_per_open_span(
        lambda: _hotpath.start_span(ours, "s", attributes={"a": 1}))

    print(f"python {sys.version.split()[0]}, blocks={args.blocks} x n={args.n}"
          f"{', metadata only' if args.metadata_only else ', with payloads'}"
          f" (light span {'on' if light_ok else 'OFF: SDK of another shape'})")
    for case in cases:
        print(f"  {case:8s} median {statistics.median(times[case]):8.2f} µs/op   "
              f"min {min(times[case]):8.2f}")
    print(f"  op in a trajectory (light span) / SDK span, same attributes   "
          f"{ratio['light']:.2f}x   (target <= 1.2x)")
    print(f"  op in a trajectory (SDK path)   / SDK span, same attributes   "
          f"{ratio['sdkpath']:.2f}x")
    print(f"  GC-tracked objects per open span: SDK {tracked_sdk:.1f}, light {tracked_light:.1f}")
    counting = _CountingLoop()
    with rollout_trace_attr(step=1, sample_index=2, rollout_n=0):
        traced = _gc_counted_per_op(lambda: counting.generate(MESSAGES))
    RolloutTraceConfig.shutdown(timeout_s=120.0)  # the queued spans delivered, then off
    RolloutTraceConfig.reset()
    with rollout_trace_attr(step=1, sample_index=2, rollout_n=0):
        untraced = _gc_counted_per_op(lambda: counting.generate(MESSAGES))
    print(f"  GC-counted allocations a traced op adds (vs tracing off): "
          f"{traced[0] - untraced[0]:.1f} while open, {traced[1] - untraced[1]:.1f} once ended "
          f"(the young collection starts at {gc.get_threshold()[0]})")
    RolloutTraceConfig.shutdown()
    processor.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
