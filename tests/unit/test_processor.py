"""The bounded batch processor and the durable exporter: counts, time bounds, byte bounds, the
transform hook, nothing lost silently."""

import math
import multiprocessing
import random
import threading
import time

import pytest
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, get_value
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_verl import RolloutTraceConfig, rollout_trace_op
from otel_verl._config import ConfigError, resolve_config
from otel_verl.exporters._processor import BoundedBatchProcessor
from otel_verl.exporters._spool import DurableSpanExporter, replay
from otel_verl.store import read_spans


class Hanging(SpanExporter):
    def __init__(self):
        self.release = threading.Event()

    def export(self, spans):
        self.release.wait(30)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self.release.wait(30)


class Failing(SpanExporter):
    def export(self, spans):
        return SpanExportResult.FAILURE

    def shutdown(self):
        pass


def make(exporter, **kwargs):
    processor = BoundedBatchProcessor(exporter, **kwargs)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return provider.get_tracer("t"), processor


def test_exports_everything_and_counts():
    memory = InMemorySpanExporter()
    tracer, processor = make(memory, max_export_batch_size=10, schedule_delay_s=5)
    for i in range(25):
        tracer.start_span(f"s{i}").end()
    assert processor.force_flush(5000)
    assert len(memory.get_finished_spans()) == 25
    assert processor.stats()["exported"] == 25 and processor.stats()["pending"] == 0
    processor.shutdown()


def test_full_queue_drops_are_counted_not_blocking():
    hanging = Hanging()
    tracer, processor = make(hanging, max_queue_size=5, max_export_batch_size=1)
    start = time.perf_counter()
    for i in range(50):
        tracer.start_span(f"s{i}").end()
    # the producer never waits on the exporter (its export hangs 30 s; a loaded machine
    # stalls for seconds, never for 30)
    assert time.perf_counter() - start < 10
    assert processor.stats()["dropped_queue_full"] >= 40
    begin = time.perf_counter()
    assert processor.force_flush(200) is False  # bounded
    processor.shutdown(timeout_millis=300)
    assert time.perf_counter() - begin < 10  # not the export's 30 s
    assert processor.stats()["abandoned_at_shutdown"] >= 1
    hanging.release.set()


def test_failures_counted():
    tracer, processor = make(Failing(), schedule_delay_s=0.01)
    tracer.start_span("x").end()
    processor.force_flush(2000)
    assert processor.stats()["export_failed"] == 1
    processor.shutdown()


def test_spooling_keeps_failed_batches_and_replays(tmp_path):
    spool = DurableSpanExporter(Failing(), tmp_path / "spool", shutdown_timeout_s=0.3)
    provider = TracerProvider()
    processor = BoundedBatchProcessor(spool, schedule_delay_s=0.01)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("parent", attributes={"k": 1}):
        tracer.start_span("child").end()
    processor.force_flush(2000)
    processor.shutdown()
    assert spool.stats()["spooled"] == 2
    assert {s["name"] for s in read_spans(tmp_path / "spool")} == {"parent", "child"}
    memory = InMemorySpanExporter()
    sent, failed = replay(tmp_path / "spool", memory, remove=True)
    assert (sent, failed) == (2, 0)
    got = {s.name: s for s in memory.get_finished_spans()}
    assert got["child"].parent.span_id == got["parent"].context.span_id
    assert got["parent"].attributes["k"] == 1
    assert not list((tmp_path / "spool").glob("*.jsonl"))


def test_shutdown_bounded_even_if_exporter_hangs(tmp_path):
    hanging = Hanging()
    RolloutTraceConfig.init("p", "e", "console", exporter=hanging)

    @rollout_trace_op
    def work():
        return 1

    work()
    start = time.perf_counter()
    assert RolloutTraceConfig.shutdown(timeout_s=1.0) is False
    assert time.perf_counter() - start < 10  # not the export's 30 s
    hanging.release.set()


def test_queue_is_bounded_in_bytes():
    hanging = Hanging()
    tracer, processor = make(hanging, max_queue_bytes=200_000, max_export_batch_size=1)
    for i in range(50):
        tracer.start_span(f"s{i}", attributes={"blob": "x" * 20_000}).end()
    stats = processor.stats()
    assert stats["dropped_queue_full"] >= 35 and stats["queue_bytes"] <= 200_000
    processor.shutdown(timeout_millis=100)
    hanging.release.set()


def test_spans_ending_after_shutdown_are_counted(caplog):
    memory = InMemorySpanExporter()
    tracer, processor = make(memory)
    late = tracer.start_span("late")
    processor.shutdown()
    late.end()
    assert processor.stats()["dropped_after_shutdown"] == 1
    assert "after tracing was shut down" in caplog.text


def test_spans_ending_after_shutdown_are_counted_through_the_api():
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("p", "e", "console", exporter=InMemorySpanExporter(), durable=False)
    from otel_verl import get_tracer

    late = get_tracer().start_span("late")
    RolloutTraceConfig.shutdown()
    late.end()
    assert RolloutTraceConfig.stats()["dropped_after_shutdown"] == 1
    RolloutTraceConfig.reset()


@pytest.mark.parametrize("timeout", [math.inf, float("nan"), -5, 0])
def test_shutdown_and_flush_accept_any_timeout(timeout):
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("p", "e", "console", exporter=InMemorySpanExporter())
    assert RolloutTraceConfig.flush(timeout) in (True, False)
    start = time.perf_counter()
    assert RolloutTraceConfig.shutdown(timeout) in (True, False)
    assert time.perf_counter() - start < 10
    RolloutTraceConfig.reset()


def test_schedule_delay_has_a_lower_bound():
    for bad in (0.0001, 0.0):
        with pytest.raises(ConfigError, match="schedule_delay_s"):
            resolve_config({"schedule_delay_s": bad}, None, {})
    assert resolve_config({}, None, {"OTEL_BSP_SCHEDULE_DELAY": "1"}).schedule_delay_s == 1.0
    processor = BoundedBatchProcessor(InMemorySpanExporter(), schedule_delay_s=1e-9)
    assert processor._delay >= 0.01
    processor.shutdown()


class Recording(InMemorySpanExporter):
    def __init__(self):
        super().__init__()
        self.suppressed = []

    def export(self, spans):
        self.suppressed.append(bool(get_value(_SUPPRESS_INSTRUMENTATION_KEY)))
        return super().export(spans)


def test_transform_runs_before_export_and_a_failing_one_drops_the_span():
    from opentelemetry.sdk.trace import ReadableSpan

    def scrub(span):
        if span.name == "boom":
            raise RuntimeError("scrubber bug")
        return ReadableSpan(name=span.name.replace("secret", "[REDACTED]"), context=span.context,
                            parent=span.parent, resource=span.resource,
                            attributes={k: "[REDACTED]" for k in span.attributes},
                            start_time=span.start_time, end_time=span.end_time)

    memory = Recording()
    tracer, processor = make(memory, transform=scrub, schedule_delay_s=0.02)
    tracer.start_span("secret-op", attributes={"key": "sk-live-123"}).end()
    tracer.start_span("boom", attributes={"key": "sk-live-456"}).end()
    assert processor.force_flush(2000)
    (span,) = memory.get_finished_spans()
    assert span.name == "[REDACTED]-op" and span.attributes["key"] == "[REDACTED]"
    assert processor.stats()["dropped_transform_failed"] == 1
    assert memory.suppressed and all(memory.suppressed)  # no self-tracing on the export thread
    processor.shutdown()


def test_transform_applies_before_the_durable_log_writes(tmp_path):
    from opentelemetry.sdk.trace import ReadableSpan

    def scrub(span):
        return ReadableSpan(name=span.name, context=span.context, parent=span.parent,
                            resource=span.resource, attributes={"key": "[REDACTED]"},
                            start_time=span.start_time, end_time=span.end_time)

    durable = DurableSpanExporter(Failing(), tmp_path, shutdown_timeout_s=0.2)
    tracer, processor = make(durable, transform=scrub, schedule_delay_s=0.02)
    tracer.start_span("op", attributes={"key": "sk-live-123"}).end()
    processor.force_flush(300)
    processor.shutdown(timeout_millis=300)
    on_disk = b"".join(p.read_bytes() for p in tmp_path.glob("wal-*.jsonl"))
    assert b"[REDACTED]" in on_disk and b"sk-live" not in on_disk


def test_a_batch_fills_before_it_is_sent():
    memory = InMemorySpanExporter()
    calls = []
    real = memory.export
    memory.export = lambda spans: calls.append(len(spans)) or real(spans)
    # a schedule delay far longer than the test: only full batches leave before shutdown (with
    # 0.5 s, a loaded machine took longer than that for the 250 spans, and the delay sent 83)
    tracer, processor = make(memory, max_export_batch_size=100, schedule_delay_s=60)
    for i in range(250):
        tracer.start_span(f"s{i}").end()
    deadline = time.monotonic() + 20
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert calls == [100, 100]  # the last 50 wait for the delay
    processor.shutdown()
    assert calls == [100, 100, 50]


def _child_span_ids(conn):
    from otel_verl._provider import build_provider

    random.seed(42)
    provider, _, processor = build_provider(
        resolve_config({"backend": "console", "processor": "simple"}), lambda: None,
        InMemorySpanExporter())
    span = provider.get_tracer("t").start_span("x")
    conn.send((span.get_span_context().span_id, span.get_span_context().trace_id))
    conn.close()


def test_span_ids_stay_unique_when_every_worker_seeds_random():
    from otel_verl._provider import build_provider

    build_provider(resolve_config({"backend": "console", "processor": "simple"}), lambda: None,
                   InMemorySpanExporter())  # the generator exists before the fork
    ctx = multiprocessing.get_context("fork")
    ids = []
    for _ in range(4):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_child_span_ids, args=(child,))
        proc.start()
        ids.append(parent.recv())
        proc.join(10)
    assert len(set(ids)) == 4


def test_the_last_trajectory_in_flight_ending_exports_at_once(tmp_path):
    """A step's rollouts are done when no trajectory is in flight: what they recorded is
    exported then (a Ray worker may be ended right after, without exit hooks), not after the
    schedule delay; while any trajectory runs, the schedule applies."""
    import asyncio

    from otel_verl import rollout_trace_attr

    memory = InMemorySpanExporter()
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("p", "e", "console", exporter=memory, durable=False,
                            schedule_delay_s=60.0)
    try:
        async def trajectory(i: int, hold: asyncio.Event | None) -> None:
            with rollout_trace_attr(sample_index=i, step=1, rollout_n=0):
                if hold is not None:
                    await hold.wait()

        async def main() -> None:
            hold = asyncio.Event()
            slow = asyncio.create_task(trajectory(1, hold))
            await asyncio.sleep(0)  # the slow one starts first
            await trajectory(0, None)  # ends while the other one is in flight
            await asyncio.sleep(0.5)
            assert memory.get_finished_spans() == ()  # the 60 s schedule applies
            hold.set()
            await slow  # the last one in flight: both are exported now

        asyncio.run(main())
        deadline = time.monotonic() + 5
        while len(memory.get_finished_spans()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(s.attributes["rollout.sample_index"]
                      for s in memory.get_finished_spans()) == [0, 1]
    finally:
        RolloutTraceConfig.reset()


_HAND_BY_HAND = """
import os, signal, sys
from opentelemetry.sdk.trace import TracerProvider
from otel_verl.exporters import BoundedBatchProcessor, FileSpanExporter, install_sigterm_handoff
provider = TracerProvider()
provider.add_span_processor(BoundedBatchProcessor(FileSpanExporter(sys.argv[1]),
                                                  schedule_delay_s=3600))
if sys.argv[2] == "install":
    install_sigterm_handoff()
with provider.get_tracer("t").start_as_current_span("queued when SIGTERM came"):
    pass
os.kill(os.getpid(), signal.SIGTERM)
"""


@pytest.mark.parametrize("install", [True, False])
def test_a_provider_wired_by_hand_hands_its_queue_over_on_sigterm(tmp_path, install):
    """``install_sigterm_handoff`` (what ``init`` does itself): SIGTERM writes the queued span
    before the process dies as SIGTERM would; without it the span dies with the process."""
    import signal
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _HAND_BY_HAND, str(tmp_path),
                           "install" if install else "no"], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
    written = b"".join(p.read_bytes() for p in tmp_path.glob("*.jsonl"))
    assert (b"queued when SIGTERM came" in written) is install
