"""Cost of tracing on the rollout's own thread, measured side by side in one run.

Prints, as medians over interleaved rounds (this machine is shared and noisy):
  1. traced op / bare OTel SDK span with the same processor        (target <= 1.5x), against a
     hand-written span that records the same input/output JSON, and against an empty span;
     and an op inside an open trajectory / an SDK span recording the same attributes (the
     trajectory's, the kind, input/output JSON) inside a hand-made trajectory span (<= 1.2x)
  2. unsampled (trace=False) op - plain call, absolute µs per op    (target < 2 µs)
  3. verl's weave backend style (create_call/finish_call on a local in-memory Weave server)
     / traced op                                                   (target >= 10x)

Run: `python3 -m nox -s bench` (or `python bench/bench_core.py` where weave 0.52.42 is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_verl import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op
from otel_verl.exporters._processor import BoundedBatchProcessor

MESSAGES = [{"role": "user", "content": "What is 12*7? Use the calculator."},
            {"role": "assistant", "content": "<tool_call>{\"name\": \"calculator\"}</tool_call>"}]


class NullExporter(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def work(messages, temperature=1.0):
    return {"n": len(messages)}


class Loop:
    @rollout_trace_op
    def generate(self, messages, temperature=1.0):
        return {"n": len(messages)}


def per_call_us(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - start) / n / 1000.0


def interleaved(cases: dict[str, Callable[[], object]], n: int, rounds: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            samples[name].append(per_call_us(fn, n))
    return {name: statistics.median(values) for name, values in samples.items()}


def weave_style_case():
    """verl's weave backend: client.create_call + finish_call inside weave.attributes()."""
    if os.environ.get("WEAVE_DISABLED", "").lower() in ("1", "true"):
        os.environ.pop("WEAVE_DISABLED")  # weave would turn create_call into a no-op
    try:
        import weave
        from weave.trace.context.weave_client_context import set_weave_client_global
        from weave.trace.weave_client import WeaveClient
    except ImportError as exc:
        print(f"(weave comparison skipped: {exc}; run via `nox -s bench`)")
        return None
    # Weave's own SQLite server behind its ExternalTraceServer adapter (the weave tier's helper);
    # a file database, since the client writes from its own worker threads
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "weave"))
    from _weave_server import make_server

    server = make_server(str(Path(tempfile.mkdtemp(prefix="bench-weave-")) / "weave.db"))
    client = WeaveClient("bench", "bench", server, ensure_project_exists=False)
    set_weave_client_global(client)  # what weave.init does; otherwise calls are not recorded
    attrs = {"step": 1, "sample_index": 2, "rollout_n": 0, "validate": False,
             "experiment_name": "bench"}

    def call():
        with weave.attributes(attrs):
            c = client.create_call("Loop.generate", inputs={"messages": MESSAGES,
                                                            "temperature": 1.0})
            client.finish_call(c, output={"n": 2})

    return call, client


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=5000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--metadata-only", action="store_true",
                        help="capture_payloads=False (the SDK baselines record no JSON either)")
    args = parser.parse_args()
    payloads = not args.metadata_only

    # bare SDK span, same processor kind and settings as otel_verl's
    bare_processor = BoundedBatchProcessor(NullExporter())
    bare_provider = TracerProvider()
    bare_provider.add_span_processor(bare_processor)
    tracer = bare_provider.get_tracer("bench")

    def bare_span():
        with tracer.start_as_current_span("Loop.generate"):
            return work(MESSAGES)

    def bare_span_same_data():
        """What hand instrumentation recording the same data costs: JSON in, JSON out."""
        attrs = {"input.value": json.dumps({"messages": MESSAGES, "temperature": 1.0}),
                 "input.mime_type": "application/json", "openinference.span.kind": "CHAIN"}
        with tracer.start_as_current_span("Loop.generate", attributes=attrs) as span:
            result = work(MESSAGES)
            span.set_attributes({"output.value": json.dumps(result),
                                 "output.mime_type": "application/json"})
            return result

    # a temp trace dir: what the NullExporter has not taken at shutdown goes to the durable log
    # there, not to ./otel_verl_traces of whatever directory the bench runs in
    RolloutTraceConfig.init("bench", "bench", "console", exporter=NullExporter(),
                            max_queue_size=1 << 20, capture_payloads=payloads,
                            trace_dir=tempfile.mkdtemp(prefix="bench-core-"))
    loop = Loop()

    def traced():
        return loop.generate(MESSAGES)

    def traced_in_trajectory():
        with rollout_trace_attr(step=1, sample_index=2, rollout_n=0):
            return loop.generate(MESSAGES)

    def bare_in_trajectory():
        with tracer.start_as_current_span("rollout_trace"):
            with tracer.start_as_current_span("Loop.generate"):
                return work(MESSAGES)

    def unsampled():
        return loop.generate(MESSAGES)

    def plain():
        return work(MESSAGES)

    # the case the rollout pays for: an op inside an open trajectory, against the SDK recording
    # the same attributes on a span inside a hand-made trajectory span (the trajectory attributes
    # as otel_verl puts them on every span, the kind, the input and output JSON)
    traj_attrs = {"rollout.step": 1, "rollout.sample_index": 2, "rollout.rollout_n": 0,
                  "rollout.validate": False, "rollout.experiment_name": "bench",
                  "metadata": json.dumps({"step": 1, "sample_index": 2, "rollout_n": 0,
                                          "validate": False, "experiment_name": "bench"}),
                  "session.id": "bench/step-1/sample-2"}

    def bare_span_same_data_in_trajectory():
        attrs = {**traj_attrs, "otel_verl.trajectory_child": True,
                 "openinference.span.kind": "LLM"}
        if payloads:
            attrs.update({"input.value": json.dumps({"messages": MESSAGES, "temperature": 1.0}),
                          "input.mime_type": "application/json"})
        with tracer.start_as_current_span("Loop.generate", attributes=attrs) as span:
            result = work(MESSAGES)
            if payloads:
                span.set_attributes({"output.value": json.dumps(result),
                                     "output.mime_type": "application/json"})
            return result

    def op_in_open_trajectory() -> float:
        with rollout_trace_attr(step=1, sample_index=2, rollout_n=0):
            return per_call_us(traced, args.n)

    def sdk_in_open_trajectory() -> float:
        with tracer.start_as_current_span("rollout_trace", attributes=traj_attrs):
            return per_call_us(bare_span_same_data_in_trajectory, args.n)

    in_traj: dict[str, list[float]] = {"op_in_open_trajectory": [],
                                       "sdk_span_same_data_in_trajectory": []}
    for _ in range(args.rounds):
        in_traj["op_in_open_trajectory"].append(op_in_open_trajectory())
        in_traj["sdk_span_same_data_in_trajectory"].append(sdk_in_open_trajectory())
    in_traj_ratios = [a / b for a, b in zip(in_traj["op_in_open_trajectory"],
                                            in_traj["sdk_span_same_data_in_trajectory"],
                                            strict=True)]

    results = interleaved({"bare_span": bare_span, "bare_span_same_data": bare_span_same_data,
                           "traced_op": traced,
                           "bare_trajectory+span": bare_in_trajectory,
                           "trajectory+traced_op": traced_in_trajectory}, args.n, args.rounds)
    with rollout_trace_attr(sample_index=1, trace=False):
        silent = interleaved({"plain_call": plain, "unsampled_op": unsampled}, args.n * 10,
                             args.rounds)
    results.update(silent)
    results.update({name: statistics.median(v) for name, v in in_traj.items()})
    weave_case = weave_style_case()
    if weave_case is not None:
        call, client = weave_case
        results.update(interleaved({"weave_create_finish": call}, max(200, args.n // 20),
                                   args.rounds))
        results.update(interleaved({"traced_op_again": traced}, args.n, args.rounds))
        client.flush()
        recorded = len(list(client.get_calls()))
        if recorded:
            print(f"(Weave's server recorded {recorded} calls: the comparison did real work)")
        else:
            print("WARNING: Weave's server recorded no calls; the weave figure below is not valid")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, n={args.n}, "
          f"rounds={args.rounds} (medians, µs per call)"
          f"{', metadata only (capture_payloads=False)' if args.metadata_only else ''}")
    for name, value in results.items():
        print(f"  {name:24s} {value:9.2f} µs")
    print("ratios:")
    print(f"  traced op / SDK span with same data     "
          f"{results['traced_op'] / results['bare_span_same_data']:.2f}x   (target <= 1.5x)")
    print(f"  traced op / empty SDK span              {results['traced_op'] / results['bare_span']:.2f}x")
    print(f"  op in a trajectory / SDK span with the same attributes in a trajectory "
          f"{statistics.median(in_traj_ratios):.2f}x (rounds {min(in_traj_ratios):.2f}-"
          f"{max(in_traj_ratios):.2f})   (target <= 1.2x)")
    print(f"  trajectory+op / bare trajectory+span    "
          f"{results['trajectory+traced_op'] / results['bare_trajectory+span']:.2f}x")
    overhead = results["unsampled_op"] - results["plain_call"]
    print(f"  unsampled op overhead vs plain call     {overhead:.2f} µs  (target < 2 µs)")
    if weave_case is not None:
        print(f"  weave create/finish_call / traced op    "
              f"{results['weave_create_finish'] / results['traced_op_again']:.1f}x"
              "   (target >= 10x)")
    print(f"  spans dropped: {RolloutTraceConfig.stats().get('dropped_queue_full', 0)}")
    RolloutTraceConfig.shutdown()
    bare_processor.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
