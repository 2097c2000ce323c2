"""Faults at a recording endpoint on 127.0.0.1: 500, 429, no answer. export() returns FAILURE
within its bound, shutdown() within its bound, and the producing thread never waits."""

from __future__ import annotations

import json
import threading
import time

import pytest
from _common import API_KEY, PROJECT_ID
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_weave_exporter import WeaveSpanExporter

TIMEOUT_S = 0.6
#: what a loaded machine may add to a bound (CI: 2 cores, load 10): the bounds these tests check
#: are against waits of 15-30 s (a hanging server, a backoff), not against fractions of a second
SLACK_S = 5.0
#: the bound of the tests that also check it retried: room for two attempts on a loaded machine
RETRY_TIMEOUT_S = 3.0


def _spans(n=5):
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("faults")
    for i in range(n):
        with tracer.start_as_current_span(f"op{i}", attributes={"rollout.step": i}):
            pass
    return memory.get_finished_spans()


def _exporter(url, **options):
    options.setdefault("timeout_s", TIMEOUT_S)
    options.setdefault("backoff_initial_s", 0.05)
    options.setdefault("shutdown_timeout_s", 1.0)
    return WeaveSpanExporter(project=PROJECT_ID, api_key=API_KEY, base_url=url, **options)


@pytest.mark.parametrize("status", [500, 503, 429])
def test_retryable_status_forever_fails_within_the_bound(recorder, status):
    recorder.statuses = [status] * 10_000
    exporter = _exporter(recorder.url, timeout_s=RETRY_TIMEOUT_S)
    t0 = time.monotonic()
    assert exporter.export(_spans()) is SpanExportResult.FAILURE
    elapsed = time.monotonic() - t0
    assert elapsed < RETRY_TIMEOUT_S + SLACK_S
    assert len(recorder.requests) >= 2  # it did retry
    assert exporter.stats()["undelivered"] == 5 and exporter.stats()["delivered"] == 0
    t0 = time.monotonic()
    exporter.shutdown()
    assert time.monotonic() - t0 < 1.0 + SLACK_S


def test_retry_after_is_honoured_and_then_succeeds(recorder):
    recorder.statuses = [429]
    recorder.retry_after = "0.3"
    exporter = _exporter(recorder.url, timeout_s=3.0)
    t0 = time.monotonic()
    assert exporter.export(_spans()) is SpanExportResult.SUCCESS
    assert time.monotonic() - t0 >= 0.3
    assert len(recorder.requests) == 2 and exporter.stats()["delivered"] == 5


def test_idle_connection_closed_by_the_server_is_reopened_without_backoff(recorder):
    recorder.drop_keepalive = True
    exporter = _exporter(recorder.url, timeout_s=60.0, backoff_initial_s=30.0)
    for _ in range(3):
        t0 = time.monotonic()
        assert exporter.export(_spans(2)) is SpanExportResult.SUCCESS
        assert time.monotonic() - t0 < SLACK_S  # no 15-30 s backoff wait
    assert exporter.stats()["delivered"] == 6 and len(recorder.requests) == 3
    assert exporter.stats()["requests"] == 3  # accepted
    assert exporter.stats()["retries"] == 2  # two attempts met the closed connection


def test_non_retryable_status_fails_at_once(recorder):
    recorder.statuses = [401]
    exporter = _exporter(recorder.url, timeout_s=30.0)
    t0 = time.monotonic()
    assert exporter.export(_spans()) is SpanExportResult.FAILURE
    assert time.monotonic() - t0 < SLACK_S and len(recorder.requests) == 1


def test_413_splits_the_batch(recorder):
    recorder.statuses = [413]
    exporter = _exporter(recorder.url, timeout_s=5.0)
    assert exporter.export(_spans(4)) is SpanExportResult.SUCCESS
    assert [len(b["batch"]) for b in recorder.bodies()] == [4, 2, 2]


def test_a_call_the_server_refuses_costs_only_itself(recorder, tmp_path):
    """A payload declared JSON that is not JSON is spliced as is; the server refuses the batch
    (400) and the exporter halves it until only the bad call is left undelivered; that call is
    quarantined (with the server's answer), not spooled for a replay that would fail forever."""
    recorder.validate_json = True
    spans = _spans(7)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.get_tracer("t").start_span("bad", attributes={
        "output.value": "{oops", "output.mime_type": "application/json"}).end()
    batch = list(spans[:3]) + list(memory.get_finished_spans()) + list(spans[3:])
    exporter = _exporter(recorder.url, timeout_s=5.0, spool_dir=str(tmp_path))
    assert exporter.export(batch) is SpanExportResult.FAILURE
    stats = exporter.stats()
    assert stats["delivered"] == 7 and stats["undelivered"] == 1 and stats["quarantined"] == 1
    assert stats["spooled"] == 0 and not list(tmp_path.glob("weave-spool-*"))
    (rejected,) = tmp_path.glob("weave-rejected-*.jsonl")
    line = rejected.read_bytes().splitlines()
    assert len(line) == 1 and b'"error":"HTTP 400' in line[0] and b'"op_name":"bad"' in line[0]
    delivered = [json.loads(r["body"]) for r in recorder.requests if _is_json(r["body"])]
    assert sorted(c["op_name"] for b in delivered for c in b["batch"]) == [f"op{i}" for i in range(7)]
    assert len(recorder.requests) <= 2 * 8


def _is_json(raw):
    try:
        json.loads(raw)
        return True
    except ValueError:
        return False


def test_server_that_never_answers(recorder):
    recorder.hang.set()
    exporter = _exporter(recorder.url)
    t0 = time.monotonic()
    assert exporter.export(_spans()) is SpanExportResult.FAILURE
    assert time.monotonic() - t0 < TIMEOUT_S + SLACK_S
    t0 = time.monotonic()
    exporter.shutdown()
    assert time.monotonic() - t0 < 1.0 + SLACK_S
    assert exporter.export(_spans(1)) is SpanExportResult.FAILURE  # after shutdown
    assert exporter.stats()["dropped_after_shutdown"] == 1


def test_shutdown_cuts_an_export_in_flight(recorder):
    recorder.hang.set()
    exporter = _exporter(recorder.url, timeout_s=30.0, request_timeout_s=30.0)
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("r", exporter.export(_spans())))
    worker.start()
    deadline = time.monotonic() + 20
    while not recorder.requests and time.monotonic() < deadline:  # the request reached the server
        time.sleep(0.02)
    assert exporter.force_flush(100) is False  # an export is in flight, bounded wait
    t0 = time.monotonic()
    exporter.shutdown()
    worker.join(20)
    assert time.monotonic() - t0 < 1.0 + SLACK_S  # not the request's 30 s
    assert result["r"] is SpanExportResult.FAILURE
    exporter.shutdown()  # idempotent


def test_connection_refused_fails_within_the_bound():
    exporter = _exporter("http://127.0.0.1:9", timeout_s=RETRY_TIMEOUT_S)  # nothing listens
    t0 = time.monotonic()
    assert exporter.export(_spans()) is SpanExportResult.FAILURE
    assert time.monotonic() - t0 < RETRY_TIMEOUT_S + SLACK_S
    assert exporter.stats()["retries"] >= 2 and exporter.stats()["requests"] == 0


def test_the_rollout_thread_is_unaffected_by_a_dead_server(recorder):
    """Spans are produced at full speed through a BatchSpanProcessor while the server hangs."""
    recorder.hang.set()
    exporter = _exporter(recorder.url, timeout_s=0.5)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=2048,
                                                   schedule_delay_millis=20))
    tracer = provider.get_tracer("rollout")
    t0 = time.monotonic()
    for i in range(2000):
        with tracer.start_as_current_span("op", attributes={"rollout.step": i}):
            pass
    produce_s = time.monotonic() - t0
    assert produce_s < 4 * SLACK_S, produce_s  # no network on the producing thread (0.5 s each)
    t0 = time.monotonic()
    provider.shutdown()  # the processor drains (bounded exports) then shuts the exporter
    assert time.monotonic() - t0 < 15
    assert exporter.stats()["delivered"] == 0 and exporter.stats()["undelivered"] > 0
