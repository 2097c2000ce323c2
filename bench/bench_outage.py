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

Part 3, draining a backlog (``--drain``): spans of ~2 KiB and of ~32 KiB (OTLP/JSON line bytes)
over gRPC and over HTTP/protobuf, written to the durable log while the receiver is down, then
delivered once it is up, by the same process (the exporter that wrote them) and by a next one (a
new exporter on the same directory adopts the log, as the next process does), against the SDK's
own OTLP exporter sending the same spans directly (``export`` in requests of the same size) to
the same receiver. The receiver runs in its own process (it does not take the sender's GIL).
Rates are spans per second from the first accepted request to the last, the median of
``--rounds`` interleaved rounds; ratios are against the SDK's rate in the same round.

Run: python bench/bench_outage.py [--seconds 600] [--rate 400] [--budget-mib 256]
                                  [--batch-seconds 20] [--skip-outage] [--drain [--rounds 3]]
(needs grpcio and the OTLP exporters: requirements/faults.txt)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
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


# --- part 3: draining a backlog --------------------------------------------------------------------

MAX_REQUEST_BYTES = 3 * 1024 * 1024  # the durable log's default request bound
MAX_BATCH_SPANS = 512


def make_spans(line_bytes: int, count: int) -> list:
    """``count`` finished spans whose OTLP/JSON lines are about ``line_bytes`` long (two payloads
    and the trajectory attributes, as the load above records)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_verl import _otlp_json

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench_outage",
                                                        "rollout.project_name": "bench"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("otel_verl")

    def record(payload: str, n: int) -> None:
        for i in range(n):
            with tracer.start_as_current_span("chat", attributes={
                    "input.value": payload, "output.value": payload,
                    "input.mime_type": "text/plain", "gen_ai.usage.input_tokens": 170,
                    "rollout.step": i // 20, "rollout.sample_index": i % 64,
                    "rollout.rollout_n": 0, "rollout.validate": False,
                    "rollout.experiment_name": "outage"}):
                pass

    record("", 1)
    base = len(_otlp_json.encode_span_line(memory.get_finished_spans()[0]))
    memory.clear()
    record("token " * max(1, (line_bytes - base) // 12), count)
    return list(memory.get_finished_spans())


def requests_of(spans: list) -> list[list]:
    """``spans`` in the requests the durable log sends (max_request_bytes, max_batch_spans)."""
    from otel_verl import _otlp_json

    out: list[list] = [[]]
    size = 0
    for span in spans:
        n = len(_otlp_json.encode_span_line(span))
        if out[-1] and (size + n > MAX_REQUEST_BYTES - 1024 or len(out[-1]) >= MAX_BATCH_SPANS):
            out.append([])
            size = 0
        out[-1].append(span)
        size += n
    return out


class ReceiverProcess:
    """The faults tier's receiver (accepting everything) in a child process, on a fixed port."""

    def __init__(self, protocol: str, port: int) -> None:
        self.protocol, self.port = protocol, port
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> ReceiverProcess:
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", self.protocol,
                                      str(self.port)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the receiver did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(10)


def serve(protocol: str, port: int) -> None:
    receiver = FaultyReceiver(protocol)
    receiver.port = port
    with receiver:
        print("ready", flush=True)
        sys.stdin.read()  # until the parent closes it


def sdk_exporter(protocol: str, port: int):
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=2)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return Http(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=2)


Rate = tuple[float, float]  # (spans per second, this process's CPU µs per span)


def direct_rate(protocol: str, port: int, requests: list[list]) -> Rate:
    """The SDK's exporter sending ``requests`` itself, the first left out (a warm connection)."""
    exporter = sdk_exporter(protocol, port)
    try:
        assert exporter.export(requests[0]).name == "SUCCESS"
        count = sum(len(r) for r in requests[1:])
        t0, c0 = time.perf_counter(), time.process_time()
        for request in requests[1:]:
            assert exporter.export(request).name == "SUCCESS"
        return (count / (time.perf_counter() - t0),
                (time.process_time() - c0) / count * 1e6)
    finally:
        exporter.shutdown()


def durable_exporter(protocol: str, port: int, directory: Path):
    from otel_verl.exporters import DurableSpanExporter

    # the defaults (export_delay_s 1 s included), but a short backoff: the bench does not wait
    # for the sender's next attempt once the receiver is up (the rate is timed from the first
    # accepted request anyway)
    return DurableSpanExporter(sdk_exporter(protocol, port), directory,
                               max_request_bytes=MAX_REQUEST_BYTES,
                               max_batch_spans=MAX_BATCH_SPANS, retry_initial_s=0.05,
                               retry_max_s=0.2, shutdown_timeout_s=0.5)


def drained_rate(exporter, total: int, key: str = "delivered") -> Rate:
    """Spans per second from the first accepted request (seen by polling ``stats()``) to the
    last; the first request is left out as the direct rate leaves out its first."""
    deadline = time.monotonic() + 600
    while exporter.stats()[key] == 0:
        if time.monotonic() > deadline:
            raise RuntimeError("nothing was delivered")
        time.sleep(0.002)
    t0, c0, first = time.perf_counter(), time.process_time(), exporter.stats()[key]
    while exporter.stats()[key] < total:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{exporter.stats()[key]} of {total} delivered")
        time.sleep(0.005)
    count = total - first
    return count / (time.perf_counter() - t0), (time.process_time() - c0) / count * 1e6


def write_backlog(exporter, spans: list) -> None:
    for request in requests_of(spans):
        assert exporter.export(request).name == "SUCCESS"  # appends to the log


def same_process_rate(protocol: str, port: int, spans: list) -> Rate:
    directory = Path(tempfile.mkdtemp(prefix="bench_drain_same_"))
    exporter = durable_exporter(protocol, port, directory)
    try:
        write_backlog(exporter, spans)
        deadline = time.monotonic() + 30
        while exporter.stats()["retries"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the sender found the receiver down
        with ReceiverProcess(protocol, port):
            return drained_rate(exporter, len(spans))
    finally:
        exporter.shutdown()
        shutil.rmtree(directory, ignore_errors=True)


def next_process_rate(protocol: str, port: int, spans: list) -> Rate:
    directory = Path(tempfile.mkdtemp(prefix="bench_drain_next_"))
    try:
        first = durable_exporter(protocol, port, directory)
        write_backlog(first, spans)
        first.shutdown()  # the receiver is down: the log stays for the next process
        with ReceiverProcess(protocol, port):
            nxt = durable_exporter(protocol, port, directory)
            try:
                return drained_rate(nxt, len(spans), key="recovered")
            finally:
                nxt.shutdown()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def drain(rounds: int, count_2k: int, count_32k: int) -> None:
    import logging
    import statistics

    logging.getLogger("otel_verl").setLevel(logging.ERROR)
    for name in ("opentelemetry.exporter.otlp.proto.grpc.exporter",
                 "opentelemetry.exporter.otlp.common.http",
                 "opentelemetry.exporter.otlp.proto.http.trace_exporter"):
        logging.getLogger(name).setLevel(logging.CRITICAL)  # the outage's retry lines
    from _receiver import free_port

    rows = []
    for size, count in ((2048, count_2k), (32768, count_32k)):
        spans = make_spans(size, count)
        requests = requests_of(spans)
        if len(requests) < 4:
            raise SystemExit(f"{count} spans of {size} bytes make {len(requests)} requests; "
                             "give at least 4 requests' worth")
        for protocol in ("grpc", "http"):
            port = free_port()
            rates: dict[str, list[float]] = {"sdk": [], "same": [], "next": []}
            ratios: dict[str, list[float]] = {"same": [], "next": []}
            cpu: dict[str, list[float]] = {"sdk": [], "same": [], "next": []}
            for _ in range(rounds):
                with ReceiverProcess(protocol, port):
                    sdk = direct_rate(protocol, port, requests)
                same = same_process_rate(protocol, port, spans)
                nxt = next_process_rate(protocol, port, spans)
                for key, value in (("sdk", sdk), ("same", same), ("next", nxt)):
                    rates[key].append(value[0])
                    cpu[key].append(value[1])
                ratios["same"].append(same[0] / sdk[0])
                ratios["next"].append(nxt[0] / sdk[0])
            med = {k: statistics.median(v) for k, v in rates.items()}
            mcpu = {k: statistics.median(v) for k, v in cpu.items()}
            row = (f"| {protocol} | {size // 1024} KiB | {len(spans)} | {med['sdk']:,.0f} "
                   f"({mcpu['sdk']:.0f} µs) | {med['same']:,.0f} ({mcpu['same']:.0f} µs) | "
                   f"**{statistics.median(ratios['same']):.2f}x** "
                   f"({min(ratios['same']):.2f}-{max(ratios['same']):.2f}) | "
                   f"{med['next']:,.0f} ({mcpu['next']:.0f} µs) | "
                   f"**{statistics.median(ratios['next']):.2f}x** "
                   f"({min(ratios['next']):.2f}-{max(ratios['next']):.2f}) |")
            rows.append(row)
            print(row, flush=True)
    print("\n| protocol | span | spans | SDK exporter, direct: spans/s (CPU/span) | same process "
          "| rate ratio (rounds) | next process | rate ratio (rounds) |\n"
          "|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--rate", type=float, default=400.0, help="spans per second")
    parser.add_argument("--budget-mib", type=int, default=256)
    parser.add_argument("--batch-seconds", type=float, default=20.0)
    parser.add_argument("--skip-outage", action="store_true")
    parser.add_argument("--drain", action="store_true",
                        help="only part 3: the backlog drain rates against the SDK's exporter")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spans-2k", type=int, default=6000)
    parser.add_argument("--spans-32k", type=int, default=1200)
    args = parser.parse_args()
    if args.drain:
        drain(args.rounds, args.spans_2k, args.spans_32k)
        return
    if args.batch_seconds > 0:
        batches(args.batch_seconds, args.rate)
    if not args.skip_outage:
        outage(args.seconds, args.rate, args.budget_mib)


if __name__ == "__main__":
    main()
