"""The exporter's compactor (otel_verl/exporters/_compactor.py), its policy with stand-in
children: when a child starts (bytes, closed files, the rate), that one runs at a time, that a
hung child is killed and shutdown is bounded, that a forked process owes nothing, that the option
and a missing lake extra mean no child. The real compaction children: tests/faults/
test_store_compactor_faults.py."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from otel_verl import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op
from otel_verl._config import resolve_config
from otel_verl.exporters import _compactor
from otel_verl.exporters._compactor import StoreCompactor
from otel_verl.store import _writers
from otel_verl.store._compact import LIVE_BYTES

QUICK = [sys.executable, "-c", "pass"]
#: ignores SIGTERM and sleeps: a hung compaction
HANG = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)"
        "; print('up', flush=True); time.sleep(600)"]


def _make(tmp_path: Path, command: list[str] | None, **options: float) -> StoreCompactor:
    compactor = StoreCompactor(tmp_path, command=command, **options)  # type: ignore[arg-type]
    compactor.check_s = 0.0
    return compactor


def _wait_done(compactor: StoreCompactor, timeout: float = 30.0) -> None:
    proc = compactor.running
    assert proc is not None
    proc.wait(timeout)


def _closed_file(directory: Path, name: str = "otel_verl-elsewhere-7-20260101T000000000Z.jsonl",
                 size: int = 100) -> Path:
    path = directory / name
    path.write_bytes(b"x" * (size - 1) + b"\n")
    old = time.time() - 2 * _writers.IDLE_S
    os.utime(path, (old, old))
    return path


def test_the_defaults_are_compactions_own() -> None:
    config = resolve_config({}, environ={})
    assert config.compact is True
    assert config.compact_live_bytes == LIVE_BYTES == _writers.LIVE_BYTES
    assert StoreCompactor(".").live_bytes == LIVE_BYTES


def test_own_bytes_start_a_child_at_the_live_threshold_once_per_interval(tmp_path: Path) -> None:
    c = _make(tmp_path, QUICK, interval_s=10.0, live_bytes=1000)
    c.wrote(999)
    c.maybe_run(now=100.0)
    assert c.running is None and c.counts["started"] == 0  # below the threshold
    c.wrote(1)
    c.maybe_run(now=100.0)
    assert c.running is not None and c.counts["started"] == 1
    first = c.running
    c.wrote(5000)
    c.maybe_run(now=100.5)  # one at a time
    assert c.running is first and c.counts["started"] == 1
    _wait_done(c)
    c.maybe_run(now=105.0)  # reaped; the interval has not passed
    assert c.running is None and c.counts == {**c.counts, "started": 1, "done": 1}
    c.maybe_run(now=110.0)
    assert c.running is not None and c.counts["started"] == 2
    _wait_done(c)
    c.maybe_run(now=200.0)
    assert c.counts["done"] == 2 and c.running is None  # nothing new written: no third


def test_the_export_thread_looks_at_most_every_check_s(tmp_path: Path) -> None:
    c = StoreCompactor(tmp_path, command=QUICK, interval_s=0.01, live_bytes=1)
    c.check_s = 5.0
    c.maybe_run(now=100.0)  # nothing to do; next look at 105
    c.wrote(10)
    c.maybe_run(now=104.0)
    assert c.counts["started"] == 0
    c.maybe_run(now=105.0)
    assert c.counts["started"] == 1
    _wait_done(c)


def test_a_closed_file_starts_a_child_once_per_size(tmp_path: Path) -> None:
    path = _closed_file(tmp_path)
    (tmp_path / "otel_verl-notours.txt").write_text("x")
    c = _make(tmp_path, QUICK, interval_s=1.0, live_bytes=1 << 30)
    c.maybe_run(now=10.0)
    assert c.counts["started"] == 1
    _wait_done(c)
    c.maybe_run(now=20.0)
    assert c.counts["started"] == 1 and c.counts["done"] == 1  # taken at this size
    with open(path, "ab") as handle:
        handle.write(b"more\n")
    old = time.time() - 2 * _writers.IDLE_S
    os.utime(path, (old, old))
    c.maybe_run(now=30.0)
    assert c.counts["started"] == 2  # it grew


def test_a_live_file_of_this_host_is_not_closed(tmp_path: Path) -> None:
    import socket

    name = f"otel_verl-{socket.gethostname()}-{os.getpid()}-20260101T000000000Z.jsonl"
    assert _writers.WRITER_NAME.search(name)
    _closed_file(tmp_path, name)  # old mtime, but its writer (this process) is alive
    c = _make(tmp_path, QUICK, interval_s=1.0, live_bytes=1 << 30)
    c.maybe_run(now=10.0)
    assert c.counts["started"] == 0


def test_a_failed_child_is_logged_and_backs_off(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    c = _make(tmp_path, [sys.executable, "-c", "raise SystemExit(1)"], interval_s=10.0,
                   live_bytes=100)
    c.wrote(100)
    with caplog.at_level(logging.WARNING, logger="otel_verl.exporters._compactor"):
        c.maybe_run(now=0.0)
        _wait_done(c)
        c.maybe_run(now=10.0)  # reaped: failed; the next start waits 2 x interval
        assert c.counts["failed"] == 1 and c.running is None
        assert any("exited with 1" in r.getMessage() for r in caplog.records)
        c.maybe_run(now=19.0)
        assert c.counts["started"] == 1
        c.maybe_run(now=20.0)
        assert c.counts["started"] == 2
        _wait_done(c)


def test_a_child_that_cannot_start_is_logged_and_swallowed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    c = _make(tmp_path, [str(tmp_path / "no-such-program")], interval_s=1.0, live_bytes=1)
    c.wrote(10)
    with caplog.at_level(logging.WARNING, logger="otel_verl.exporters._compactor"):
        c.maybe_run(now=0.0)
    assert c.running is None and c.counts["failed"] == 1 and c.counts["started"] == 0
    assert any("could not start" in r.getMessage() for r in caplog.records)


def test_a_hung_child_is_killed_after_hang_s(tmp_path: Path) -> None:
    c = _make(tmp_path, HANG, interval_s=1.0, live_bytes=1)
    c.hang_s = 5.0
    c.wrote(10)
    c.maybe_run(now=0.0)
    proc = c.running
    assert proc is not None
    c.maybe_run(now=4.0)
    assert proc.poll() is None
    c.maybe_run(now=6.0)
    assert proc.returncode == -signal.SIGKILL and c.counts["killed"] == 1
    # its bytes are owed again, and 2 x interval passed (one failure): the next one started
    assert c.running is not None and c.running is not proc and c.counts["started"] == 2
    c.stop_s = 0.5
    c.shutdown()


def test_shutdown_is_bounded_when_the_child_hangs(tmp_path: Path) -> None:
    c = _make(tmp_path, HANG, interval_s=1.0, live_bytes=1)
    c.stop_s = 0.5
    c.wrote(10)
    c.maybe_run(now=0.0)
    proc = c.running
    assert proc is not None and proc.stdout is None
    time.sleep(0.3)  # it is up and ignores SIGTERM
    began = time.monotonic()
    c.shutdown()
    took = time.monotonic() - began
    assert proc.returncode == -signal.SIGKILL
    assert took < 2 * c.stop_s + 0.5, took
    assert c.counts["killed"] == 1
    c.wrote(10)
    c.maybe_run(now=100.0)  # never again after shutdown
    assert c.running is None and c.counts["started"] == 1
    c.shutdown()  # idempotent


def test_a_forked_process_owes_nothing_and_does_not_own_the_parents_child(
        tmp_path: Path) -> None:
    c = _make(tmp_path, HANG, interval_s=0.01, live_bytes=100)
    c.wrote(100)
    c.maybe_run(now=0.0)
    parents_child = c.running
    assert parents_child is not None
    c.wrote(99)  # owed by the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the forked process
        try:
            ok = (c.running is None and c._own_bytes == 0 and c.counts["started"] == 0)
            c.command = QUICK
            c.maybe_run(now=50.0)  # the parent's bytes are not its own: nothing to start
            ok = ok and c.running is None
            c.wrote(100)  # its own
            c.maybe_run(now=60.0)
            ok = ok and c.running is not None and c.running.pid != parents_child.pid
            if c.running is not None:
                c.running.wait(30)
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"1"
    assert c.running is parents_child and parents_child.poll() is None
    c.stop_s = 0.5
    c.shutdown()
    assert parents_child.returncode is not None


def test_without_the_lake_extra_no_child_and_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "duckdb", None)  # imports of it fail, as if not installed
    c = _make(tmp_path, None, interval_s=0.01, live_bytes=1)
    with caplog.at_level(logging.INFO, logger="otel_verl.exporters._compactor"):
        for now in (0.0, 1.0, 2.0):
            c.wrote(10)
            c.maybe_run(now=now)
    assert c.running is None and c.counts["started"] == 0
    said = [r for r in caplog.records if "lake extra is not installed" in r.getMessage()]
    assert len(said) == 1


def test_a_child_without_the_lake_extra_stops_the_compactor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    shadow = tmp_path / "shadow" / "pyarrow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no pyarrow here')\n")
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shadow.parent), str(root)]))
    store = tmp_path / "store"
    store.mkdir()
    c = _make(store, None, interval_s=0.01, live_bytes=1)
    c.wrote(10)
    with caplog.at_level(logging.INFO, logger="otel_verl.exporters._compactor"):
        c.maybe_run(now=0.0)
        assert c.running is not None  # this process has the extra; the child does not
        _wait_done(c)
        c.maybe_run(now=1.0)
        c.wrote(10)
        c.maybe_run(now=2.0)
    assert c.counts["started"] == 1 and c.running is None
    assert sum("lake extra is not installed" in r.getMessage() for r in caplog.records) == 1
    assert not (store / ".otel_verl_lake").exists()


@rollout_trace_op
def _op(text: str) -> int:
    return len(text)


@pytest.mark.parametrize("options, wired", [
    ({}, True), ({"compact": False}, False), ({"processor": "simple"}, False)])
def test_the_option_wires_a_compactor_or_none(tmp_path: Path, options: dict[str, object],
                                              wired: bool) -> None:
    RolloutTraceConfig.init("p", "e", "file", trace_dir=str(tmp_path), **options)
    with rollout_trace_attr(step=0, sample_index=0):
        _op("x")
    RolloutTraceConfig.flush(10)
    exporter = RolloutTraceConfig.get_client()
    compactor = exporter._compactor
    assert (compactor is not None) is wired
    assert ("compact_started" in exporter.stats()) is wired
    if compactor is not None:
        assert compactor.trace_dir == str(tmp_path) and compactor.running is None


def test_the_boot_lowers_priority_before_importing_otel_verl() -> None:
    boot = _compactor._BOOT
    assert boot.index("SCHED_IDLE") < boot.index("os.nice(19)") < boot.index("otel_verl")


def test_the_child_neither_traces_nor_compacts_by_itself(tmp_path: Path) -> None:
    check = ("import os, sys; e = os.environ; sys.exit(0 if (e['OTEL_SDK_DISABLED'], "
             "e['OTEL_VERL_BACKEND'], e['OTEL_VERL_COMPACT']) == ('true', 'none', 'false') else 1)")
    c = _make(tmp_path, [sys.executable, "-c", check], interval_s=1.0, live_bytes=1)
    c.wrote(10)
    c.maybe_run(now=0.0)
    _wait_done(c)
    c.maybe_run(now=1.0)
    assert c.counts["done"] == 1 and c.counts["failed"] == 0
