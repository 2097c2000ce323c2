"""The bounded batch processor and the spooling exporter: counts, time bounds, nothing lost silently."""

import threading
import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_verl import RolloutTraceConfig, rollout_trace_op
from otel_verl._processor import BoundedBatchProcessor
from otel_verl._spool import SpoolingSpanExporter, replay
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
    assert time.perf_counter() - start < 1.0  # the producer never waits on the exporter
    assert processor.stats()["dropped_queue_full"] >= 40
    begin = time.perf_counter()
    assert processor.force_flush(200) is False  # bounded
    processor.shutdown(timeout_millis=300)
    assert time.perf_counter() - begin < 2.0
    assert processor.stats()["abandoned_at_shutdown"] >= 1
    hanging.release.set()


def test_failures_counted():
    tracer, processor = make(Failing(), schedule_delay_s=0.01)
    tracer.start_span("x").end()
    processor.force_flush(2000)
    assert processor.stats()["export_failed"] == 1
    processor.shutdown()


def test_spooling_keeps_failed_batches_and_replays(tmp_path):
    spool = SpoolingSpanExporter(Failing(), tmp_path / "spool")
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
    assert time.perf_counter() - start < 3.0
    hanging.release.set()
