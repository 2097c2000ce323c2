"""The durable log (DurableSpanExporter): outage and recovery, byte caps, budget, adoption by the
next process, replay from the cursor, quarantine, a full disk. In-process, with fake exporters;
tests/faults does the same on real sockets, processes and a real full disk."""

from __future__ import annotations

import errno
import json
import threading
import time

import pytest
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, get_value
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_verl import _otlp_json, _spool
from otel_verl.exporters import (
    TRUNCATED_ATTRIBUTE,
    BoundedBatchProcessor,
    DurableSpanExporter,
    replay,
)
from otel_verl.store import read_spans


class Switchable(SpanExporter):
    """Accepts or refuses on demand; records every accepted request."""

    def __init__(self, up: bool = True, refuse=lambda span: False) -> None:
        self.up = up
        self.refuse = refuse
        self.requests: list[list[str]] = []
        self.sizes: list[int] = []
        self.suppressed: list[bool] = []
        self.lock = threading.Lock()

    def export(self, spans):
        self.suppressed.append(bool(get_value(_SUPPRESS_INSTRUMENTATION_KEY)))
        if not self.up or any(self.refuse(s) for s in spans):
            return SpanExportResult.FAILURE
        with self.lock:
            self.requests.append([f"{s.context.span_id:016x}" for s in spans])
            self.sizes.append(len(_otlp_json.encode_line(spans)))
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def ids(self) -> set[str]:
        return {i for r in self.requests for i in r}


def pipeline(inner, directory, **kwargs):
    options = {"export_delay_s": 0.05, "retry_initial_s": 0.02, "retry_max_s": 0.1,
               "shutdown_timeout_s": 2.0}
    options.update(kwargs)
    durable = DurableSpanExporter(inner, directory, **options)
    processor = BoundedBatchProcessor(durable, schedule_delay_s=0.02)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return provider.get_tracer("t"), processor, durable


def record(tracer, n, size=0, prefix="s"):
    ids = set()
    for i in range(n):
        span = tracer.start_span(f"{prefix}{i}", attributes={"blob": "x" * size} if size else {})
        span.end()
        ids.add(f"{span.get_span_context().span_id:016x}")
    return ids


def wait_for(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_outage_then_recovery_delivers_everything_in_the_same_process(tmp_path):
    inner = Switchable(up=False)
    tracer, processor, durable = pipeline(inner, tmp_path)
    ids = record(tracer, 300)
    assert processor.force_flush_to_exporter(10)
    assert processor.force_flush(300) is False  # the backend is down: not delivered yet
    assert wait_for(lambda: durable.stats()["retries"] >= 1)
    stats = durable.stats()
    assert stats["spooled"] == 300 and stats["spool_pending"] == 300
    inner.up = True
    assert wait_for(lambda: inner.ids() >= ids)
    assert processor.force_flush(10000)
    assert durable.stats()["spool_pending"] == 0 and durable.stats()["delivered"] >= 300
    assert all(inner.suppressed)  # the exporter's own calls are not traced
    processor.shutdown()
    assert not list(tmp_path.glob("wal-*")), "a delivered log is removed at shutdown"


def test_requests_fill_up_and_stay_under_the_byte_cap(tmp_path):
    inner = Switchable()
    cap = 64 * 1024
    tracer, processor, durable = pipeline(inner, tmp_path, max_request_bytes=cap,
                                          export_delay_s=0.5, max_batch_spans=100)
    ids = record(tracer, 50, size=100)            # small spans, slowly: one request
    ids |= record(tracer, 30, size=10_000, prefix="big")  # ~10 KB each: 6 per request
    ids |= record(tracer, 1, size=200_000, prefix="huge")  # alone, cut to fit, marked
    assert processor.force_flush(10000)
    assert inner.ids() == ids
    assert max(inner.sizes) <= cap
    assert len(inner.requests) <= 1 + 30 // 5 + 1 + 1
    assert durable.stats()["truncated"] == 1
    processor.shutdown()


def test_truncated_span_is_marked(tmp_path):
    memory = InMemorySpanExporter()
    tracer, processor, _ = pipeline(memory, tmp_path, max_request_bytes=8192)
    tracer.start_span("huge", attributes={"input.value": "y" * 100_000, "k": 1}).end()
    assert processor.force_flush(10000)
    (span,) = memory.get_finished_spans()
    assert span.attributes[TRUNCATED_ATTRIBUTE] is True and span.attributes["k"] == 1
    assert len(_otlp_json.encode_line([span])) <= 8192
    processor.shutdown()


def test_log_is_bounded_in_bytes_and_drops_are_counted(tmp_path):
    inner = Switchable(up=False)
    budget = 256 * 1024
    tracer, processor, durable = pipeline(inner, tmp_path, max_spool_bytes=budget)
    for _ in range(10):
        record(tracer, 50, size=2000)
        assert processor.force_flush_to_exporter(10)  # into the log (not delivered)
    stats = durable.stats()
    assert stats["dropped_spool_full"] > 0
    assert stats["spool_bytes"] <= budget + durable._segment_bytes
    assert stats["spool_pending"] + stats["dropped_spool_full"] == 500
    inner.up = True
    assert wait_for(lambda: durable.stats()["spool_pending"] == 0)
    assert durable.stats()["delivered"] == 500 - stats["dropped_spool_full"]
    processor.shutdown()


def test_the_next_process_delivers_what_an_earlier_one_left(tmp_path):
    down = Switchable(up=False)
    tracer, processor, durable = pipeline(down, tmp_path)
    ids = record(tracer, 40)
    assert processor.force_flush_to_exporter(10)
    processor.shutdown(timeout_millis=500)  # still down: the spans stay in the log
    assert durable.stats()["spool_pending"] == 40
    assert {s["span_id"] for s in read_spans(tmp_path)} == ids  # readable as a store
    up = Switchable()
    _, processor2, durable2 = pipeline(up, tmp_path)
    assert wait_for(lambda: up.ids() >= ids)
    # counted just after the export returns: wait for it too (a race under load otherwise)
    assert wait_for(lambda: durable2.stats()["recovered"] == 40)
    processor2.shutdown()
    assert not list(tmp_path.glob("wal-*"))


def test_a_live_process_log_is_not_adopted(tmp_path):
    down = Switchable(up=False)
    tracer, processor, _ = pipeline(down, tmp_path)
    record(tracer, 5)
    assert processor.force_flush_to_exporter(10)
    other = Switchable()
    _, processor2, durable2 = pipeline(other, tmp_path)
    time.sleep(0.3)
    assert other.ids() == set() and durable2.stats()["recovered"] == 0
    assert replay(tmp_path, other) == (0, 0)  # nor replayed by hand
    processor2.shutdown()
    processor.shutdown(timeout_millis=300)


def test_replay_resumes_from_the_cursor_and_splits_by_bytes(tmp_path):
    flaky = Switchable()
    tracer, processor, _ = pipeline(flaky, tmp_path, max_batch_spans=10)
    first = record(tracer, 10)
    assert processor.force_flush(10000)
    flaky.up = False
    rest = record(tracer, 30, size=3000)
    assert processor.force_flush_to_exporter(10)
    processor.shutdown(timeout_millis=300)
    target = Switchable()
    sent, failed = replay(tmp_path, target, max_request_bytes=16 * 1024, remove=True)
    assert (sent, failed) == (30, 0)
    assert target.ids() == rest and not (target.ids() & first)
    assert max(target.sizes) <= 16 * 1024
    assert not list(tmp_path.glob("wal-*"))


def test_replay_of_a_store_file_and_a_failing_backend(tmp_path):
    from otel_verl.exporters import FileSpanExporter

    provider = TracerProvider()
    store = FileSpanExporter(tmp_path / "store")
    processor = BoundedBatchProcessor(store, schedule_delay_s=0.02)
    provider.add_span_processor(processor)
    record(provider.get_tracer("t"), 7)
    processor.shutdown()
    assert replay(tmp_path / "store", Switchable(up=False)) == (0, 7)
    target = Switchable()
    assert replay(tmp_path / "store", target, batch_size=3) == (7, 0)
    assert [len(r) for r in target.requests] == [3, 3, 1]


def test_a_span_the_backend_refuses_is_quarantined_not_blocking(tmp_path):
    inner = Switchable(refuse=lambda span: span.name == "poison")
    tracer, processor, durable = pipeline(inner, tmp_path)
    before = record(tracer, 5, prefix="a")
    tracer.start_span("poison").end()
    after = record(tracer, 5, prefix="b")
    assert wait_for(lambda: inner.ids() >= before | after)
    assert wait_for(lambda: durable.stats()["quarantined"] == 1)
    quarantined = [s["name"] for s in read_spans(tmp_path / "quarantine")]
    assert quarantined == ["poison"]
    processor.shutdown()


def test_full_disk_sends_directly_and_counts_only_real_losses(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    inner = Switchable()
    tracer, processor, durable = pipeline(inner, tmp_path)
    monkeypatch.setattr(_spool, "_write", full)
    ids = record(tracer, 20)
    assert processor.force_flush(10000)
    assert inner.ids() == ids and durable.stats()["spool_failed"] == 0
    inner.up = False
    held = record(tracer, 5)
    assert processor.force_flush_to_exporter(10)
    stats = durable.stats()  # no disk and no backend: held in memory, not lost
    assert stats["spool_failed"] == 0 and stats["spool_held_bytes"] > 0
    assert stats["spool_pending"] == 5
    inner.up = True
    assert wait_for(lambda: inner.ids() >= held)
    assert durable.stats()["spool_held_bytes"] == 0 and durable.stats()["spool_pending"] == 0
    processor.shutdown(timeout_millis=300)


def test_full_disk_and_no_backend_beyond_the_memory_bound_counts_the_loss(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_spool, "_write", full)
    inner = Switchable(up=False)
    tracer, processor, durable = pipeline(inner, tmp_path, max_overflow_bytes=20_000)
    record(tracer, 200, size=500)
    assert processor.force_flush_to_exporter(10)
    stats = durable.stats()
    assert stats["spool_failed"] > 0 and stats["spool_held_bytes"] <= 20_000
    assert stats["spool_failed"] + stats["spool_pending"] == 200
    processor.shutdown(timeout_millis=300)


def test_partial_write_on_a_full_disk_is_cut_back(tmp_path, monkeypatch):
    real = _spool._write
    calls = {"n": 0}

    def half_then_full(fd, data):
        calls["n"] += 1
        if calls["n"] == 2:
            real(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    inner = Switchable(up=False)
    monkeypatch.setattr(_spool, "_write", half_then_full)
    tracer, processor, _ = pipeline(inner, tmp_path)
    for _ in range(3):
        record(tracer, 4)
        assert processor.force_flush_to_exporter(10)
    for path in tmp_path.glob("wal-*.jsonl"):
        for line in path.read_bytes().splitlines():
            json.loads(line)  # every line whole
    processor.shutdown(timeout_millis=200)


def test_export_after_shutdown_goes_direct(tmp_path):
    inner = Switchable()
    durable = DurableSpanExporter(inner, tmp_path, shutdown_timeout_s=0.5)
    durable.shutdown()
    provider = TracerProvider()
    span = provider.get_tracer("t").start_span("late")
    span.end()
    assert durable.export([span]) is SpanExportResult.SUCCESS and len(inner.requests) == 1


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), -1, 0])
def test_odd_timeouts_are_bounded(tmp_path, timeout):
    durable = DurableSpanExporter(Switchable(), tmp_path, shutdown_timeout_s=0.5)
    assert durable.force_flush(timeout) in (True, False)
    durable.shutdown(timeout_millis=timeout if timeout != float("inf") else 500)


def test_the_log_line_is_the_store_line_of_one_span():
    from opentelemetry.sdk.resources import Resource

    provider = TracerProvider(resource=Resource.create({"service.name": "s", "k": "ü\ud800"}))
    memory = InMemorySpanExporter()
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("scope", "1.0", schema_url="https://schema")
    tracer.start_span("a", attributes={"x": "\ud800 lone", "n": 10**30}).end()
    tracer.start_span("b").end()
    for span in memory.get_finished_spans():
        assert _otlp_json.encode_span_line(span) == _otlp_json.encode_line((span,))


def test_nudge_delivers_now_instead_of_after_the_delays(tmp_path):
    """The end of a step's rollouts: the processor and the log both skip their wait."""
    inner = Switchable()
    durable = DurableSpanExporter(inner, tmp_path, export_delay_s=60.0)
    processor = BoundedBatchProcessor(durable, schedule_delay_s=60.0)
    tracer = TracerProvider()
    tracer.add_span_processor(processor)
    ids = record(tracer.get_tracer("t"), 5)
    time.sleep(0.3)
    assert not inner.requests and durable.stats()["spooled"] == 0  # both wait their delays
    processor.nudge()
    assert wait_for(lambda: inner.ids() >= ids, timeout_s=5.0)
    assert len(inner.requests) == 1
    # nudges in a burst are merged: at most one export per MIN_NUDGE_INTERVAL_S
    for _ in range(50):
        record(tracer.get_tracer("t"), 1)
        processor.nudge()
    assert wait_for(lambda: len(inner.ids()) == 55, timeout_s=5.0)
    assert len(inner.requests) <= 4, len(inner.requests)
    processor.shutdown()


def test_nudge_respects_the_backoff_of_a_failing_backend(tmp_path):
    inner = Switchable(up=False)
    durable = DurableSpanExporter(inner, tmp_path, export_delay_s=60.0, retry_initial_s=0.5,
                                  retry_max_s=0.5)
    processor = BoundedBatchProcessor(durable, schedule_delay_s=60.0)
    tracer = TracerProvider()
    tracer.add_span_processor(processor)
    ids = record(tracer.get_tracer("t"), 3)
    processor.nudge()
    assert wait_for(lambda: durable.stats()["retries"] >= 1, timeout_s=5.0)
    for _ in range(20):  # nudging a backend that is down does not turn into a retry storm
        durable.nudge()
        time.sleep(0.05)
    assert durable.stats()["retries"] <= 4, durable.stats()
    inner.up = True
    assert wait_for(lambda: inner.ids() >= ids, timeout_s=5.0)
    processor.shutdown()


def test_stats_include_the_backend_exporters_own_counters(tmp_path):
    class Counting(Switchable):
        def stats(self):
            return {"calls_sent": len(self.requests), "note": "not a number"}

    class Broken(Switchable):
        def stats(self):
            raise RuntimeError("boom")

    inner = Counting()
    tracer, processor, durable = pipeline(inner, tmp_path / "a")
    record(tracer, 3)
    assert processor.force_flush(10000)
    stats = durable.stats()
    assert stats["backend.calls_sent"] == len(inner.requests) >= 1
    assert "backend.note" not in stats and stats["delivered"] == 3
    processor.shutdown()
    tracer, processor, durable = pipeline(Broken(), tmp_path / "b")
    assert durable.stats()["spooled"] == 0  # a broken stats() of the backend costs only its keys
    processor.shutdown()
