"""Compaction under faults: SIGKILL at any moment, and a writer appending while it runs.

- A compaction process is killed with SIGKILL at random moments (and once exactly between
  renaming its segments and committing the manifest); after each kill the store reads
  completely through the lake (every span of the raw files, as often as the raw files hold it:
  no duplicates, none lost) and the next compaction finishes the job.
- A real writer process (the SDK + otel_verl's FileSpanExporter) appends spans while
  compactions and reads run in a loop: every read is a consistent snapshot (no span twice), and
  at the end every span the writer wrote is read exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from _lake_store import spans_in_files, spans_in_lake, write_store

from otel_verl.store._compact import Manifest, compact, lake_dir
from otel_verl.store._query import Lake, locator_path, write_locator

ROOT = Path(__file__).resolve().parents[2]


_COMPACT = """
import os, signal, sys
from otel_verl.store._compact import compact
calls = []
def hook():
    calls.append(1)
    if sys.argv[2] == "between" and len(calls) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    print("chunk", flush=True)
print("started", flush=True)
compact(sys.argv[1], live_bytes=0, chunk_spans=300, _after_rename=hook)
print("done", flush=True)
"""

_WRITER = """
import sys, time
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from otel_verl.exporters import FileSpanExporter
exporter = FileSpanExporter(sys.argv[1])
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
tracer = provider.get_tracer("writer")
n = int(sys.argv[2])
for i in range(n):
    with tracer.start_as_current_span("turn", attributes={"rollout.step": i // 100,
                                                          "rollout.sample_index": i % 100}):
        pass
    if i % 50 == 0:
        time.sleep(0.01)
provider.shutdown()
print(exporter.exported_spans, flush=True)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_sigkill_at_any_moment_loses_nothing_and_duplicates_nothing(
        tmp_path: Path, figure: Any) -> None:
    store = tmp_path / "store"
    write_store(store, 1, steps=40, prompts=8, n=4, files=3)
    expected = spans_in_files(store)
    rng = random.Random(0)
    kills = 0
    began = time.monotonic()
    for attempt in range(6):
        mode = "between" if attempt == 0 else "random"
        child = subprocess.Popen([sys.executable, "-c", _COMPACT, str(store), mode],
                                 stdout=subprocess.PIPE, text=True, env=_env())
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "started"
        if mode == "random":  # after a random number of chunks, at a random moment
            for _ in range(rng.randint(1, 4)):
                if child.stdout.readline().strip() != "chunk":
                    break
            time.sleep(rng.uniform(0, 0.05))
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
        rc = child.wait(timeout=120)
        kills += rc == -signal.SIGKILL
        assert spans_in_lake(store) == expected  # complete, nothing twice
    assert kills >= 2
    stats = compact(store, live_bytes=0)
    assert not stats.busy
    assert spans_in_lake(store) == expected
    with Lake.open(store) as lake:
        assert lake.state.raw_spans == 0
    lake_files = {str(p.relative_to(lake_dir(store)))
                  for p in Path(lake_dir(store)).rglob("part-*.parquet")}
    manifest = Manifest.load(lake_dir(store))
    assert lake_files == set(manifest.segments) | set(manifest.payloads)  # orphans removed
    fresh = str(tmp_path / "locate-fresh.parquet")  # the page's locator: every segment, once
    write_locator(lake_dir(store), manifest, None, fresh)
    assert pq.read_table(locator_path(lake_dir(store), manifest.runs)).equals(pq.read_table(fresh))
    figure(fault="compaction SIGKILLed", recorded=sum(expected.values()),
           received=sum(spans_in_lake(store).values()), lost=0, allowed=0, duplicates=0,
           seconds=round(time.monotonic() - began, 1), note=f"{kills} kills, then completed")


def test_a_store_written_while_compacted_loses_nothing(tmp_path: Path, figure: Any) -> None:
    store = tmp_path / "store"
    store.mkdir()
    total = 6000
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(store), str(total)],
                              stdout=subprocess.PIPE, text=True, env=_env())
    began = time.monotonic()
    rounds = 0
    seen_growing = set()
    try:
        while writer.poll() is None:
            compact(store, live_bytes=0, chunk_spans=500)  # live files too, to their last line
            counts = spans_in_lake(store)
            assert all(n == 1 for n in counts.values()), "a span read twice"
            seen_growing.add(sum(counts.values()))
            rounds += 1
    finally:
        out, _ = writer.communicate(timeout=120)
    assert writer.returncode == 0
    written = int(out.strip())
    assert written == total
    assert rounds >= 2 and len(seen_growing) >= 2  # compaction really ran during the writes
    compact(store, live_bytes=0)
    counts = spans_in_lake(store)
    assert counts == spans_in_files(store)
    assert sum(counts.values()) == written and all(n == 1 for n in counts.values())
    figure(fault="written while compacted", recorded=written, received=sum(counts.values()),
           lost=written - len(counts), allowed=0, duplicates=0,
           seconds=round(time.monotonic() - began, 1), note=f"{rounds} compaction rounds")
    json.dumps(counts.most_common(1))
