"""The trajectory page on a store compacted the way a live run compacts it, against its size.

bench_ui's GRPO trajectories (12 spans each, the engine's ``llm_request`` spans in a second
file), written in pieces of ``--piece`` trajectories, each piece compacted in two runs: its
engine file first (those spans do not know their trajectory yet: they wait in the
spans-without-a-step partition), then its rollout file; trace ids replaced by random-looking
ones (a hash of the generated id), as real ids are. So the store's segment files grow with its
size, as they do when the viewer or the exporter compacts every few MiB of a live run.

Measured per size: ``Lake.trajectory`` of random traces (median of 30, warm; the first page of
a reader just opened, median of 9), and per page the Parquet files opened and the row groups
read (span segments and the page's lookup file). A page should cost its trajectory, so these
should not grow with the size.

Run: python bench/bench_lake_page.py [--sizes 2000,8000] [--piece 500] [--keep DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ui import generate_store  # noqa: E402

from otel_verl.store._compact import compact  # noqa: E402
from otel_verl.store._query import Lake  # noqa: E402

_TRACE = re.compile(rb'"traceId":"([0-9a-f]{32})"')


def _random_ids(path: str) -> None:
    """The file's trace ids replaced by a hash of each (the same id gives the same hash)."""
    with open(path, "rb") as handle:
        data = handle.read()
    data = _TRACE.sub(lambda m: b'"traceId":"' + hashlib.blake2b(
        m.group(1), digest_size=16).hexdigest().encode() + b'"', data)
    with open(path, "wb") as handle:
        handle.write(data)


def build(store: str, trajectories: int, piece: int) -> int:
    """The store, compacted piece by piece (engine file, then rollout file); the runs."""
    scratch = tempfile.mkdtemp(prefix="bench_page_piece_")
    runs = 0
    try:
        os.makedirs(store, exist_ok=True)
        for start in range(0, trajectories, piece):
            generate_store(scratch, min(piece, trajectories - start), start=start)
            names = sorted(os.listdir(scratch), key=lambda n: "engine" not in n)
            for name in names:  # the engine's file first
                _random_ids(os.path.join(scratch, name))
                shutil.move(os.path.join(scratch, name), os.path.join(store, name))
                compact(store, live_bytes=0)
                runs += 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return runs


class _Work:
    """Parquet files opened and row groups read (counted around pyarrow's reader)."""

    def __init__(self) -> None:
        self.opened = self.groups = 0
        init, read = pq.ParquetFile.__init__, pq.ParquetFile.read_row_groups
        work = self

        def opened(reader: Any, *args: Any, **kwargs: Any) -> None:
            work.opened += 1
            init(reader, *args, **kwargs)

        def read_groups(reader: Any, groups: Any, *args: Any, **kwargs: Any) -> Any:
            work.groups += len(groups)
            return read(reader, groups, *args, **kwargs)

        pq.ParquetFile.__init__ = opened  # type: ignore[method-assign]
        pq.ParquetFile.read_row_groups = read_groups  # type: ignore[method-assign]


def measure(store: str, work: _Work) -> dict[str, float]:
    with Lake.open(store) as lake:
        ids = [r[0] for r in lake.sql("SELECT trace_id FROM trajectories").fetchall()]
        segments = lake.state.segments
        rng = random.Random(1)
        lake.trajectory(ids[0])
        times = []
        work.opened = work.groups = 0
        for _ in range(30):
            trace = rng.choice(ids)
            t0 = time.perf_counter()
            spans = lake.trajectory(trace)
            times.append(time.perf_counter() - t0)
            assert len(spans) == 12, len(spans)
        groups = work.groups / 30

    def fresh() -> tuple[float, int]:
        with Lake.open(store) as reader:
            trace = rng.choice(ids)
            work.opened = 0
            t0 = time.perf_counter()
            reader.trajectory(trace)
            return time.perf_counter() - t0, work.opened
    first = [fresh() for _ in range(9)]
    return {"segments": segments, "page_ms": statistics.median(times) * 1e3,
            "page_fresh_ms": statistics.median(t for t, _ in first) * 1e3,
            "files_per_fresh_page": statistics.median(n for _, n in first),
            "groups_per_page": groups, "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2000,8000")
    parser.add_argument("--piece", type=int, default=500)
    parser.add_argument("--keep", help="keep the stores under this directory")
    args = parser.parse_args()
    base = args.keep or tempfile.mkdtemp(prefix="bench_lake_page_")
    work = _Work()
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            store = os.path.join(base, f"store-{n}")
            shutil.rmtree(store, ignore_errors=True)
            t0 = time.perf_counter()
            runs = build(store, n, args.piece)
            built = time.perf_counter() - t0
            r = measure(store, work)
            print(f"{n} trajectories, {runs} compaction runs ({built:.0f} s), "
                  f"{r['segments']:.0f} span segments: page {r['page_ms']:.1f} ms "
                  f"(a fresh reader's first: {r['page_fresh_ms']:.1f} ms, "
                  f"{r['files_per_fresh_page']:.0f} files opened), "
                  f"{r['groups_per_page']:.1f} row groups read per page (load {r['load']:.1f})",
                  flush=True)
            if not args.keep:
                shutil.rmtree(store, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
