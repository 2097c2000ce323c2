"""The durable log's seams, each part alone on real files (issue 23 item 1): the storage
(``_log.SpanLog``) under a real full disk (a tmpfs) while appending and while committing a
cursor, and the sender (``_sender.Sender``) against a real OTLP receiver that refuses, and
against an exporter that hangs. Each checks what the next process finds on disk: nothing lost,
nothing the backend took sent again."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from pathlib import Path

import pytest
from _receiver import FaultyReceiver
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_verl.exporters._log import Counts, LogSettings, Redactor, SpanLog
from otel_verl.exporters._sender import Sender

SETTINGS = LogSettings(max_spool_bytes=1 << 30, max_request_bytes=256 * 1024,
                       max_batch_spans=512, export_delay_s=0.05, retry_initial_s=0.05,
                       retry_max_s=0.2, shutdown_timeout_s=2.0, max_overflow_bytes=1 << 20)


@contextlib.contextmanager
def small_disk(path: Path, size: str = "1m"):
    """A real tmpfs of ``size`` at ``path`` (the fault tier runs as root)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs here ({done.stderr.strip()}); the fault tier runs as "
                    "root on Linux")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path, leave: int = 0) -> Path:
    """Fill the disk at ``path`` (up to ``leave`` bytes short of full)."""
    filler = path / "filler"
    with open(filler, "wb", buffering=0) as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * 4096)
    if leave:
        with open(filler, "r+b") as handle:
            handle.truncate(max(0, filler.stat().st_size - leave))
    return filler


def spans(prefix: str, n: int, size: int = 200) -> list[ReadableSpan]:
    tracer = TracerProvider().get_tracer("seams")
    out = []
    for i in range(n):
        span = tracer.start_span(f"{prefix}{i}", attributes={"blob": "x" * size})
        span.end()
        out.append(span)
    return out


def storage(directory: Path) -> SpanLog:
    counts = Counts()
    return SpanLog(directory, "backend-a", SETTINGS, counts, Redactor(None, counts))


def names_in_next_process(directory: Path) -> tuple[list[str], Counts]:
    """What a next process's storage adopts and reads from ``directory`` (its cursor on)."""
    log = storage(directory)
    log.orphans.adopt(None)
    names: list[str] = []
    for stream in list(log.orphans.streams):
        while (batch := log.read(stream)) is not None and batch.count:
            names.extend(span.name for span in batch.spans)
            log.commit(stream, batch.after)
    log.close(keep=True)
    return names, log.counts


def append(log: SpanLog, batch: list[ReadableSpan]) -> bool:
    lines, fitted = log.records(batch, raw=False)
    try:
        log.append(lines, fitted)
    except OSError:
        return False
    return True


def test_storage_alone_under_a_full_disk_keeps_every_record_whole(tmp_path, figure):
    """Appends on a disk that fills up mid-batch: each append is all or nothing (a partial
    write is cut back), and the next process reads exactly the appends that succeeded."""
    with small_disk(tmp_path / "disk") as disk:
        log = storage(disk / "log")
        written: list[str] = []
        assert append(log, first := spans("before", 20))
        written += [s.name for s in first]
        fill(disk, leave=16 * 1024)  # room for part of the next batch, not all of it
        failed = 0
        for round_ in range(5):
            batch = spans(f"full{round_}-", 40, size=2000)
            if append(log, batch):
                written += [s.name for s in batch]
            else:
                failed += 1
        assert failed, "the disk never filled: the test proves nothing"
        (disk / "filler").unlink()
        assert append(log, after := spans("after", 20))
        written += [s.name for s in after]
        log.close(keep=True)
        names, counts = names_in_next_process(disk / "log")
    figure(fault="storage alone: full disk mid-append (tmpfs)", recorded=len(written),
           received=len(set(names) & set(written)), lost=len(set(written) - set(names)),
           allowed=0, duplicates=len(names) - len(set(names)),
           note=f"{failed} append(s) refused whole")
    assert names == written  # in order, none torn, none from a refused append
    assert counts["log_damaged"] == 0


def test_storage_alone_a_cursor_commit_that_fails_sends_again_never_skips(tmp_path, figure):
    """A commit that cannot be saved (a full disk) leaves the saved cursor where it was: the
    next process sends those records again (at least once) and none before them."""
    with small_disk(tmp_path / "disk") as disk:
        log = storage(disk / "log")
        assert append(log, spans("s", 10))
        stream = log.stream
        assert stream is not None
        stream.limit = 5
        first = log.read(stream)
        assert first is not None and [s.name for s in first.spans] == [f"s{i}" for i in range(5)]
        log.commit(stream, first.after)  # saved
        second = log.read(stream)
        assert second is not None and second.count == 5
        filler = fill(disk)
        log.commit(stream, second.after)  # cannot be saved: the disk is full
        assert stream.cursor == second.after  # this process goes on from it
        log.close(keep=True)
        filler.unlink()
        names, _ = names_in_next_process(disk / "log")
    figure(fault="storage alone: cursor commit on a full disk", recorded=10,
           received=10, lost=0, allowed=0, duplicates=len(names),
           note="the unsaved commit's 5 spans sent again")
    assert names == [f"s{i}" for i in range(5, 10)]


def wait_for(predicate, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def _sender(log: SpanLog, inner: SpanExporter) -> Sender:
    return Sender(log, inner, SETTINGS, log.counts)


def test_sender_alone_against_a_refusing_backend_waits_then_delivers_all(tmp_path, figure):
    """A real OTLP/HTTP receiver refuses (503, then nothing listening): the sender keeps the
    records on disk and retries with backoff, halving its requests down to single spans;
    nothing is quarantined (an outage is no poison) and everything arrives once the receiver
    answers."""
    with FaultyReceiver("http") as receiver:
        receiver.set_mode("503")
        log = storage(tmp_path / "log")
        sender = _sender(log, OTLPSpanExporter(endpoint=receiver.endpoint, timeout=0.5))
        batch = spans("r", 30)
        ids = {f"{s.context.span_id:016x}" for s in batch}
        assert append(log, batch)
        sender.appended(len(batch), urgent=True)
        # refused long enough for requests to be halved down to single spans and probed
        assert wait_for(lambda: log.counts["retries"] >= 8)
        receiver.set_mode("refuse")
        retried = log.counts["retries"]
        assert wait_for(lambda: log.counts["retries"] >= retried + 4)
        assert not sender.flush(0.2) and sender.pending == 30
        receiver.set_mode("ok")
        assert sender.flush(20.0)
        assert not sender.stop(2.0)
        log.close(keep=sender.pending > 0)
        figure(fault="sender alone: backend 503 then refusing", recorded=len(ids),
               received=len(ids & receiver.ids()), lost=len(ids - receiver.ids()), allowed=0,
               duplicates=receiver.duplicates())
        assert receiver.ids() >= ids
        assert log.counts["quarantined"] == 0 and log.counts["delivered"] >= 30
        assert not (tmp_path / "log" / "quarantine").exists()
        assert not list((tmp_path / "log").glob("wal-*.jsonl"))  # delivered: removed


class Hanging(SpanExporter):
    """An exporter whose export blocks until released, then fails."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def export(self, spans):  # type: ignore[no-untyped-def]
        self.entered.set()
        self.release.wait(60)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.release.set()


def test_sender_alone_with_a_hanging_exporter_stops_in_bounded_time_and_keeps_the_log(
        tmp_path, figure):
    """The sender's stop is bounded even while its export hangs; the records stay on disk (the
    cursor not moved) and the next process reads them all."""
    log = storage(tmp_path / "log")
    inner = Hanging()
    sender = _sender(log, inner)
    assert append(log, spans("h", 12))
    sender.appended(12, urgent=True)
    assert inner.entered.wait(10), "the sender never called export"
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(sender.stop(0.3)), daemon=True)
    started = time.monotonic()
    stopper.start()
    stopper.join(30)
    assert not stopper.is_alive(), "stop did not return while export hung"
    assert stopped == [True]  # it says the thread is still inside export
    log.close(keep=True)
    inner.release.set()
    names, _ = names_in_next_process(tmp_path / "log")
    figure(fault="sender alone: export hangs at shutdown", recorded=12, received=len(names),
           lost=12 - len(set(names)), allowed=0,
           seconds=f"{time.monotonic() - started:.1f}", note="kept for the next process")
    assert names == [f"h{i}" for i in range(12)]
