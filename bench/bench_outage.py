"""Memory and disk during a long OTLP outage, and requests per batch before/after, in one run.

Part 1, the outage: tracing with ``backend="otlp"`` (the durable log on) to an endpoint where
nothing listens, spans recorded at RATE per second (~2 KiB each: input/output payloads and the
trajectory attributes) for SECONDS. Every second it samples the process's RSS (VmRSS) and the
log's size on disk, and prints the peak RSS against the RSS before tracing started, the log's
peak size against its byte budget (``max_spool_bytes``), and the drop counters. Then the backend
comes up (a gRPC receiver on the same port) and it reports how long delivering the log took and
how many spans were lost.

Part 2, requests per batch: the same load for BATCH_SECONDS against a healthy receiver, first as
before this change (no durable log: the processor exports whatever one schedule delay gathered),
then as now (the durable log fills requests up to max_export_batch_size / max_request_bytes,
or sends a partial one after export_delay_s). Reports requests, spans per request and bytes per
request (protobuf bytes as the receiver got them).

Run: python bench/bench_outage.py [--seconds 600] [--rate 400] [--budget-mib 256]
                                  [--batch-seconds 20]
(needs grpcio and the OTLP gRPC exporter: requirements/faults.txt)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "faults"))

from _receiver import FaultyReceiver  # noqa: E402

from otel_verl import RolloutTraceConfig, get_tracer, rollout_trace_attr  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def dir_mib(path: Path) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total / (1024 * 1024)


def load(seconds: float, rate: float, stop: threading.Event | None = None) -> set[str]:
    """Trajectories of 4 turns, ~2 KiB per span, at ``rate`` spans per second."""
    tracer = get_tracer()
    ids: set[str] = set()
    start = time.monotonic()
    sent = 0
    step = 0
    payload = "token " * 170  # ~1 KiB
    while time.monotonic() - start < seconds and not (stop and stop.is_set()):
        with rollout_trace_attr(step=step, sample_index=step % 64, rollout_n=0, name="traj"):
            for turn in range(4):
                with tracer.start_as_current_span(
                        "chat", attributes={"input.value": payload, "output.value": payload,
                                            "gen_ai.usage.input_tokens": 170 + turn}) as span:
                    pass
                ids.add(f"{span.get_span_context().span_id:016x}")
        sent += 5
        step += 1
        behind = sent / rate - (time.monotonic() - start)
        if behind > 0:
            time.sleep(behind)
    return ids


def outage(seconds: float, rate: float, budget_mib: int) -> None:
    trace_dir = Path(tempfile.mkdtemp(prefix="bench_outage_"))
    receiver = FaultyReceiver("grpc")  # not started: nothing listens on its port
    base = rss_mib()
    RolloutTraceConfig.init("bench", "outage", "otlp", trace_dir=str(trace_dir),
                            otlp_endpoint=receiver.endpoint, export_timeout_s=2.0,
                            max_spool_bytes=budget_mib * 1024 * 1024)
    peak_rss = peak_disk = 0.0
    samples = []
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_rss, peak_disk
        while not done.wait(1.0):
            r, d = rss_mib(), dir_mib(trace_dir)
            peak_rss, peak_disk = max(peak_rss, r), max(peak_disk, d)
            samples.append((r, d))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    ids = load(seconds, rate)
    elapsed = time.monotonic() - t0
    RolloutTraceConfig.flush(0.5)
    stats = RolloutTraceConfig.stats()
    done.set()
    sampler.join()
    mid = samples[len(samples) // 2][0] if samples else 0.0
    print(f"outage: {elapsed:.0f} s at {rate:.0f} spans/s: {stats.get('queued', 0)} spans recorded "
          f"({len(ids)} chat spans), {stats.get('spooled', 0)} written to the log, "
          f"{dir_mib(trace_dir):.0f} MiB in the log at the end")
    print(f"  RSS before tracing {base:.0f} MiB; peak {peak_rss:.0f} MiB (+{peak_rss - base:.0f}); "
          f"half-way {mid:.0f} MiB; end {samples[-1][0] if samples else 0:.0f} MiB")
    print(f"  log on disk: peak {peak_disk:.0f} MiB against a budget of {budget_mib} MiB; "
          f"dropped_spool_full={stats.get('dropped_spool_full', 0)}, "
          f"dropped_queue_full={stats.get('dropped_queue_full', 0)}, "
          f"spool_failed={stats.get('spool_failed', 0)}, spool_pending="
          f"{stats.get('spool_pending', 0)}")
    with receiver:
        t1 = time.monotonic()
        pending = stats.get("spool_pending", 0)
        while RolloutTraceConfig.stats().get("spool_pending", 0) and time.monotonic() - t1 < 600:
            time.sleep(0.5)
        took = time.monotonic() - t1
        got = receiver.ids()
        dropped = RolloutTraceConfig.stats().get("dropped_spool_full", 0)
        print(f"  backend back: {pending} pending spans delivered in {took:.1f} s "
              f"({receiver.requests} requests); chat spans lost {len(ids - got)} "
              f"(dropped for the budget: {dropped} spans in all)")
    RolloutTraceConfig.reset()


def batches(seconds: float, rate: float) -> None:
    for label, durable in (("before (no log, export per schedule delay)", False),
                           ("after (durable log, requests fill up)", True)):
        trace_dir = tempfile.mkdtemp(prefix="bench_batches_")
        with FaultyReceiver("grpc") as receiver:
            RolloutTraceConfig.init("bench", "batches", "otlp", trace_dir=trace_dir,
                                    otlp_endpoint=receiver.endpoint, durable=durable)
            ids = load(seconds, rate)
            RolloutTraceConfig.flush(20)
            n = max(1, receiver.requests)
            spans = sum(receiver.received.values())
            print(f"{label}: {receiver.requests} requests for {spans} spans over {seconds:.0f} s: "
                  f"{spans / n:.1f} spans/request, {sum(receiver.request_bytes) / n / 1024:.0f} KiB"
                  f"/request (largest {max(receiver.request_bytes, default=0) / 1024:.0f} KiB); "
                  f"chat spans lost {len(ids - receiver.ids())}")
            RolloutTraceConfig.reset()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--rate", type=float, default=400.0, help="spans per second")
    parser.add_argument("--budget-mib", type=int, default=256)
    parser.add_argument("--batch-seconds", type=float, default=20.0)
    parser.add_argument("--skip-outage", action="store_true")
    args = parser.parse_args()
    if args.batch_seconds > 0:
        batches(args.batch_seconds, args.rate)
    if not args.skip_outage:
        outage(args.seconds, args.rate, args.budget_mib)


if __name__ == "__main__":
    main()
