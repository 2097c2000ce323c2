"""The exporter's compactor with real compaction children (otel_verl/exporters/_compactor.py).

- A traced process (backend=file, the batch processor) gets its own store compacted by its
  exporter's child while it runs; afterwards the lake answers as a fresh compaction of the same
  files does (steps, trajectory rows, every span once).
- The child runs at idle priority (``SCHED_IDLE``, read with ``os.sched_getscheduler``).
- A child SIGKILLed in the middle of a compaction leaves a store that reads completely (every
  span, none twice) and the compactor's next child finishes the job.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _lake_store import spans_in_files, spans_in_lake, write_store

from otel_verl.exporters._compactor import StoreCompactor
from otel_verl.store._compact import Manifest, compact, lake_dir
from otel_verl.store._query import Lake
from otel_verl.store._writers import IDLE_S

ROOT = Path(__file__).resolve().parents[2]

_TRACED = """
import json, os, sys, time
from otel_verl import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op
from otel_verl.exporters._compactor import StoreCompactor

StoreCompactor.check_s = 0.05
RolloutTraceConfig.init("proj", "exp", "file", trace_dir=sys.argv[1],
                        compact_live_bytes=256 * 1024, compact_interval_s=0.2)


@rollout_trace_op
def turn(text):
    return text.upper()


exporter = RolloutTraceConfig.get_client()
deadline = time.monotonic() + 120
step = 0
while time.monotonic() < deadline:
    for i in range(20):
        with rollout_trace_attr(step=step, sample_index=i, rollout_n=0, name="agent_loop"):
            turn(("%d-%d " % (step, i)) * 200)
    step += 1
    if exporter.stats()["compact_done"] >= 2 and step >= 12:
        break
    time.sleep(0.02)
RolloutTraceConfig.flush(30)
print(json.dumps({"stats": exporter.stats(), "steps": step, "file": exporter.path}), flush=True)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _answers(store: Path) -> tuple[Any, Any]:
    with Lake.open(store) as lake:
        rows = lake.sql("SELECT * FROM trajectories ORDER BY trace_id").fetchall()
        return lake.steps(), rows


def _closed_store(store: Path) -> None:
    write_store(store, 3, steps=40, prompts=8, n=4, files=3)
    old = time.time() - 2 * IDLE_S  # the files of another host, unchanged for long: closed
    for path in store.glob("*.jsonl"):
        os.utime(path, (old, old))


def test_a_traced_process_compacts_its_own_store(tmp_path: Path, figure: Any) -> None:
    store = tmp_path / "store"
    began = time.monotonic()
    out = subprocess.run([sys.executable, "-c", _TRACED, str(store)], env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    stats = result["stats"]
    assert stats["compact_done"] >= 2 and stats["compact_failed"] == 0, stats
    manifest = Manifest.load(lake_dir(store))
    rel = os.path.relpath(result["file"], store)
    size = os.path.getsize(result["file"])
    # compacted while the process wrote (a live file: up to its last line then), not all of it
    assert 0 < manifest.sources[rel]["end"] < size
    expected = spans_in_files(store)
    assert spans_in_lake(store) == expected
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copy(result["file"], fresh)
    compact(fresh, live_bytes=0)
    with Lake.open(fresh) as lake:
        assert lake.state.raw_spans == 0
    assert _answers(store) == _answers(fresh)
    figure(fault="training process compacts its store", recorded=sum(expected.values()),
           received=sum(spans_in_lake(store).values()), lost=0, allowed=0, duplicates=0,
           seconds=round(time.monotonic() - began, 1),
           note=f"{stats['compact_done']} compactions by its own child")


def test_the_child_runs_at_idle_priority(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _closed_store(store)
    compactor = StoreCompactor(store, interval_s=0.05)
    compactor.check_s = 0.0
    compactor.maybe_run()
    proc = compactor.running
    assert proc is not None
    policy = None
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            policy = os.sched_getscheduler(proc.pid)
            if policy == os.SCHED_IDLE:
                with open(f"/proc/{proc.pid}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                assert int(fields[38]) == os.SCHED_IDLE  # field 41 of stat: policy
                break
            time.sleep(0.002)
    finally:
        compactor.shutdown()
    assert policy == os.SCHED_IDLE


def test_a_child_killed_midway_leaves_a_readable_store_and_the_next_finishes(
        tmp_path: Path, figure: Any) -> None:
    store = tmp_path / "store"
    _closed_store(store)
    expected = spans_in_files(store)
    compactor = StoreCompactor(store, interval_s=0.05)
    compactor.check_s = 0.0
    began = time.monotonic()
    compactor.maybe_run()
    proc = compactor.running
    assert proc is not None
    tmp = Path(lake_dir(store)) / "tmp"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if tmp.is_dir() and any(tmp.iterdir()):  # segments being written
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.001)
    assert proc.wait(60) == -signal.SIGKILL
    assert spans_in_lake(store) == expected  # complete, nothing twice
    deadline = time.monotonic() + 120
    while compactor.counts["done"] == 0 and time.monotonic() < deadline:
        compactor.maybe_run()
        time.sleep(0.05)
    assert compactor.counts["done"] == 1 and compactor.counts["failed"] == 1
    with Lake.open(store) as lake:
        assert lake.state.raw_spans == 0  # the next child compacted all of it
    assert spans_in_lake(store) == expected
    figure(fault="exporter's compaction child SIGKILLed", recorded=sum(expected.values()),
           received=sum(spans_in_lake(store).values()), lost=0, allowed=0, duplicates=0,
           seconds=round(time.monotonic() - began, 1), note="then its next child finished")


def test_a_compaction_that_fails_is_logged_and_swallowed(
        tmp_path: Path, caplog: Any) -> None:
    """The lake cannot be written (here its directory's name is taken by a file, as a full or
    read-only disk would fail it): the real child exits with an error, the exporter's side logs
    it and backs off, nothing raises."""
    import logging

    store = tmp_path / "store"
    _closed_store(store)
    Path(lake_dir(store)).write_bytes(b"not a directory")
    compactor = StoreCompactor(store, interval_s=0.05)
    compactor.check_s = 0.0
    with caplog.at_level(logging.WARNING, logger="otel_verl.exporters._compactor"):
        compactor.maybe_run()
        proc = compactor.running
        assert proc is not None
        assert proc.wait(120) == 1
        compactor.maybe_run()
    assert compactor.counts["failed"] == 1 and compactor.counts["done"] == 0
    assert any("exited with 1" in r.getMessage() for r in caplog.records)
    assert compactor._interval() == 2 * compactor.interval_s  # backs off
    compactor.shutdown()
