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

from otel_verl import _otlp_json, semconv
from otel_verl.exporters import (
    TRUNCATED_ATTRIBUTE,
    BoundedBatchProcessor,
    DurableSpanExporter,
    _io,
    _log,
    _records,
    replay,
)
from otel_verl.store import read_spans


class Switchable(SpanExporter):
    """Accepts or refuses on demand; records every accepted request."""

    def __init__(self, up: bool = True, refuse=lambda span: False) -> None:
        self.up = up
        self.refuse = refuse
        self.requests: list[list[str]] = []
        self.spans: list = []
        self.sizes: list[int] = []
        self.suppressed: list[bool] = []
        self.lock = threading.Lock()

    def export(self, spans):
        self.suppressed.append(bool(get_value(_SUPPRESS_INSTRUMENTATION_KEY)))
        if not self.up or any(self.refuse(s) for s in spans):
            return SpanExportResult.FAILURE
        with self.lock:
            self.requests.append([f"{s.context.span_id:016x}" for s in spans])
            self.spans.extend(spans)
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


def test_a_span_capture_cut_and_then_the_log_cut_keeps_both_marks(tmp_path):
    """Capture writes ``otel_verl.truncated`` (the fields it cut); the request-size cut has its
    own key, so a span cut by both says both."""
    memory = InMemorySpanExporter()
    tracer, processor, _ = pipeline(memory, tmp_path, max_request_bytes=8192)
    tracer.start_span("huge", attributes={semconv.OTEL_VERL_TRUNCATED: ("input.value",),
                                          "input.value": "y" * 100_000}).end()
    assert processor.force_flush(10000)
    (span,) = memory.get_finished_spans()
    assert TRUNCATED_ATTRIBUTE == semconv.OTEL_VERL_REQUEST_TRUNCATED != semconv.OTEL_VERL_TRUNCATED
    assert span.attributes[semconv.OTEL_VERL_REQUEST_TRUNCATED] is True
    assert tuple(span.attributes[semconv.OTEL_VERL_TRUNCATED]) == ("input.value",)
    processor.shutdown()
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
    assert stats["spool_bytes"] <= budget + durable.settings.segment_bytes
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
    monkeypatch.setattr(_io, "write", full)
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

    monkeypatch.setattr(_io, "write", full)
    inner = Switchable(up=False)
    tracer, processor, durable = pipeline(inner, tmp_path, max_overflow_bytes=20_000)
    record(tracer, 200, size=500)
    assert processor.force_flush_to_exporter(10)
    stats = durable.stats()
    assert stats["spool_failed"] > 0 and stats["spool_held_bytes"] <= 20_000
    assert stats["spool_failed"] + stats["spool_pending"] == 200
    processor.shutdown(timeout_millis=300)


def test_partial_write_on_a_full_disk_is_cut_back(tmp_path, monkeypatch):
    real = _io.write
    calls = {"n": 0}

    def half_then_full(fd, data):
        calls["n"] += 1
        if calls["n"] == 2:
            real(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    inner = Switchable(up=False)
    monkeypatch.setattr(_io, "write", half_then_full)
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


# --- damaged, poisoned and shared logs (issue 25, items 1-5) -------------------------------------

def _dead_log(directory, n, poison_last=False):
    """A log a dead process left: ``n`` spans (and a refused one last), the backend down."""
    down = Switchable(up=False)
    tracer, processor, _ = pipeline(down, directory)
    ids = record(tracer, n, prefix="dead")
    if poison_last:
        tracer.start_span("poison").end()
    assert processor.force_flush_to_exporter(10)
    processor.shutdown(timeout_millis=300)
    return ids


def test_a_refused_last_line_of_a_dead_log_is_quarantined_and_blocks_nobody(tmp_path):
    old = _dead_log(tmp_path, 20, poison_last=True)
    inner = Switchable(refuse=lambda span: span.name == "poison")
    tracer, processor, durable = pipeline(inner, tmp_path)
    mine = record(tracer, 100, prefix="own")
    assert wait_for(lambda: inner.ids() >= old | mine)
    assert wait_for(lambda: durable.stats()["quarantined"] == 1)
    assert [s["name"] for s in read_spans(tmp_path / "quarantine")] == ["poison"]
    processor.shutdown()
    assert not list(tmp_path.glob("wal-*.jsonl"))


@pytest.mark.parametrize("damage", ["past-last-segment", "past-size", "negative", "garbage",
                                    "mid-record"])
def test_a_damaged_cursor_falls_back_to_the_segment_start(tmp_path, damage):
    ids = _dead_log(tmp_path, 30)
    (segment,) = tmp_path.glob("wal-*.jsonl")
    cursor_file = segment.with_name(segment.name.rsplit("-", 1)[0] + ".cursor")
    seq = int(segment.stem.rsplit("-", 1)[1])
    cursor_file.write_text({"past-last-segment": f"{seq + 5} 0", "past-size": f"{seq} 99999999",
                            "negative": f"{seq} -40", "garbage": "\x00\xff!",
                            "mid-record": f"{seq} 7"}[damage])
    inner = Switchable()
    _, processor, durable = pipeline(inner, tmp_path)
    assert wait_for(lambda: inner.ids() >= ids)
    assert durable.stats()["log_cursor_resets"] == 1
    processor.shutdown()


def test_damaged_records_are_kept_counted_and_never_delivered_altered(tmp_path):
    ids = _dead_log(tmp_path, 10)
    (segment,) = tmp_path.glob("wal-*.jsonl")
    lines = segment.read_bytes().splitlines(keepends=True)
    # a flip that keeps the JSON valid (a digit of the start time), and a garbage line
    flipped = lines[3].replace(b'"startTimeUnixNano":"1', b'"startTimeUnixNano":"2', 1)
    assert flipped != lines[3]
    lines[3] = flipped
    lines.insert(5, b"garbage\n")
    segment.write_bytes(b"".join(lines))
    inner = Switchable()
    _, processor, durable = pipeline(inner, tmp_path)
    assert wait_for(lambda: durable.stats()["log_damaged"] == 2)
    assert wait_for(lambda: len(inner.ids() & ids) == 9)  # the altered one is not delivered
    assert len(inner.spans) == 9
    kept = list((tmp_path / "damaged").glob("*.damaged"))
    assert len(kept) == 1 and kept[0].read_bytes().count(b"\n") == 2
    processor.shutdown()


def test_an_unreadable_segment_keeps_its_log_and_is_retried(tmp_path, monkeypatch):
    ids = _dead_log(tmp_path, 25)
    real_open = open
    fails = {"n": 0}

    def flaky_open(file, mode="r", *args, **kwargs):
        if str(file).endswith(".jsonl") and "wal-" in str(file) and fails["n"] < 3:
            fails["n"] += 1
            raise OSError(errno.EIO, "Input/output error")
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", flaky_open)
    inner = Switchable()
    _, processor, durable = pipeline(inner, tmp_path)
    assert wait_for(lambda: inner.ids() >= ids)
    assert durable.stats()["log_read_errors"] >= 1
    processor.shutdown()


def test_records_carry_a_checksum_and_format_1_lines_still_read():
    line = b'{"resourceSpans":[]}\n'
    record_ = _records.seal(line)
    assert _records.unseal(record_, sealed_stream=True) == (line, False)
    assert _records.unseal(_records.seal(line, raw=True), sealed_stream=True) == (line, True)
    assert _records.unseal(line, sealed_stream=False) == (line, False)  # an old log
    assert _records.unseal(line, sealed_stream=True) == (None, False)
    json.loads(record_)  # still one OTLP/JSON line for the store's readers


def test_a_format_1_log_left_by_an_older_version_is_delivered(tmp_path):
    ids = _dead_log(tmp_path, 12)
    for meta in tmp_path.glob("wal-*.meta"):
        meta.unlink()
    for segment in tmp_path.glob("wal-*.jsonl"):
        lines = segment.read_bytes().splitlines(keepends=True)
        segment.write_bytes(b"".join(_records.unseal(line, True)[0] for line in lines))
    inner = Switchable()
    _, processor, durable = pipeline(inner, tmp_path)
    assert wait_for(lambda: inner.ids() >= ids)
    assert durable.stats()["log_damaged"] == 0
    processor.shutdown()


def test_a_log_written_for_another_backend_is_not_adopted(tmp_path):
    down = Switchable(up=False)
    durable = DurableSpanExporter(down, tmp_path, backend_id="team-a", shutdown_timeout_s=0.2)
    processor = BoundedBatchProcessor(durable, schedule_delay_s=0.02)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    ids = record(provider.get_tracer("t"), 8)
    assert processor.force_flush_to_exporter(10)
    processor.shutdown(timeout_millis=300)
    other = Switchable()
    durable_b = DurableSpanExporter(other, tmp_path, backend_id="team-b", export_delay_s=0.05)
    time.sleep(0.5)
    assert other.ids() == set() and durable_b.stats()["recovered"] == 0
    durable_b.shutdown()
    mine = Switchable()
    durable_a = DurableSpanExporter(mine, tmp_path, backend_id="team-a", export_delay_s=0.05)
    assert wait_for(lambda: mine.ids() >= ids)
    durable_a.shutdown()


def test_log_dir_names_are_collision_free_and_hold_no_credentials():
    base = "http://collector.example.com:4318/" + "a" * 120
    one, two = _log.log_dir_name("otlp-http", base + "/team-one"), \
        _log.log_dir_name("otlp-http", base + "/team-two")
    assert one != two and len(one) <= 100
    for endpoint in ("http://user:hunter2@host:4318/v1/traces", "http://host:4318?api_key=K3Y",
                     "https://host/sk-abcdefghijklmnopqrstuvwx/v1/traces#frag"):
        name = _log.log_dir_name("otlp-http", endpoint)
        assert "host" in name
        for secret in ("user", "hunter2", "api_key", "K3Y", "sk-", "abcdefghij", "frag"):
            assert secret not in name, (secret, name)
    assert _log.log_dir_name("otlp-http", "http://u:a@h:1") != \
        _log.log_dir_name("otlp-http", "http://u:b@h:1")


def test_shutdown_that_runs_out_of_time_hands_the_queue_to_the_log_unredacted(tmp_path):
    def slow_redact(span):
        time.sleep(0.05)
        return _redact_secret(span)

    inner = Switchable()
    durable = DurableSpanExporter(inner, tmp_path, export_delay_s=0.05, shutdown_timeout_s=0.1)
    processor = BoundedBatchProcessor(durable, schedule_delay_s=0.02, transform=slow_redact)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    ids = set()
    for i in range(200):
        span = tracer.start_span(f"s{i}", attributes={"secret": "SECRET"})
        span.end()
        ids.add(f"{span.get_span_context().span_id:016x}")
    processor.shutdown(timeout_millis=300)
    stats = processor.stats()
    assert stats.get("abandoned_at_shutdown", 0) == 0
    assert stats["kept_in_log_at_shutdown"] > 0
    # the next process (whose log knows the provider's transform) delivers them, redacted
    durable2 = DurableSpanExporter(inner, tmp_path, export_delay_s=0.05, transform=_redact_secret)
    assert wait_for(lambda: inner.ids() >= ids, 20)
    assert all(s.attributes.get("secret") == "[REDACTED]" for s in inner.spans)
    durable2.shutdown()


def _redact_secret(span):
    from otel_verl.exporters._spans import copy_span

    attributes = dict(span.attributes or {})
    if attributes.get("secret") == "SECRET":
        attributes["secret"] = "[REDACTED]"
    return copy_span(span, attributes=attributes)
