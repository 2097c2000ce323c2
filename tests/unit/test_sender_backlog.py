"""The durable log's sender drains a backlog without waiting ``export_delay_s`` inside it: after
an outage, the requests of what waited on disk leave one after another (the same process used to
wait the delay again after every request full by bytes, and before the rest of any backlog).

The outage lasts two minutes on the sender's clock (``_sender.time.monotonic`` moved forward,
the spans already on disk); ``export_delay_s`` is 60 s: one wait inside the backlog would miss
the 20 s the test allows by far."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_verl.exporters import DurableSpanExporter, _sender


class _Clock:
    """``time`` for the sender, its monotonic clock ``offset`` seconds ahead."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


class _DownThenUp(SpanExporter):
    """Refuses every request until ``up`` is set; records the request sizes after."""

    def __init__(self) -> None:
        self.up = threading.Event()
        self.requests: list[int] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self.up.is_set():
            return SpanExportResult.FAILURE
        self.requests.append(len(spans))
        return SpanExportResult.SUCCESS


def _spans(count: int, payload_bytes: int) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for i in range(count):
        tracer.start_span(f"s{i}", attributes={"input.value": "x" * payload_bytes}).end()
    return list(memory.get_finished_spans())


def _drained(durable: DurableSpanExporter, total: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if durable.stats()["delivered"] >= total:
            return True
        time.sleep(0.02)
    return False


def _outage(monkeypatch, durable: DurableSpanExporter, inner: _DownThenUp) -> None:
    """The first attempt fails; two minutes pass (on the sender's clock); the backend is up."""
    deadline = time.monotonic() + 10
    while durable.stats()["retries"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    clock = _Clock()
    monkeypatch.setattr(_sender, "time", clock)
    clock.offset = 120.0
    inner.up.set()


def test_a_backlog_of_large_spans_leaves_without_waiting_the_delay(tmp_path, monkeypatch):
    inner = _DownThenUp()
    # requests full by bytes (about 5 spans of 50 KB in 256 KiB) far below max_batch_spans
    durable = DurableSpanExporter(inner, tmp_path, max_request_bytes=256 * 1024,
                                  max_batch_spans=16, export_delay_s=60.0, retry_initial_s=0.05,
                                  retry_max_s=0.05)
    try:
        for span in _spans(40, 50_000):
            assert durable.export([span]) is SpanExportResult.SUCCESS
        assert durable.stats()["spool_pending"] == 40
        _outage(monkeypatch, durable, inner)  # 40 >= max_batch_spans: tried at once, fails
        assert _drained(durable, 40, 20.0), durable.stats()
        assert sum(inner.requests) == 40 and max(inner.requests) <= 6
    finally:
        durable.shutdown()
