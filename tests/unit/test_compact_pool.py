"""Compaction allocates from Arrow's jemalloc pool (freed pages kept for the next stretch) and
gives the process its default pool back when its last compaction ends, also when two run at
once in threads or one fails."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest
from _lake_store import write_store

from otel_verl.store._compact import arrow_pool, compact


def _jemalloc() -> pa.MemoryPool:
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:  # pragma: no cover - every Linux wheel has it
        pytest.fail("this pyarrow has no jemalloc pool")


def test_compaction_allocates_from_jemalloc_and_gives_the_pool_back(tmp_path: Path) -> None:
    write_store(tmp_path, seed=3)
    before = pa.default_memory_pool().backend_name
    seen: list[str] = []
    stats = compact(tmp_path, live_bytes=0, chunk_spans=50,
                    _after_rename=lambda: seen.append(pa.default_memory_pool().backend_name))
    assert stats.spans and seen
    assert set(seen) == {_jemalloc().backend_name}
    assert pa.default_memory_pool().backend_name == before


def test_overlapping_compactions_and_a_failure_restore_the_pool() -> None:
    original = pa.default_memory_pool().backend_name
    inside = threading.Barrier(2)
    leave = threading.Event()
    names: list[str] = []

    def run() -> None:
        with arrow_pool():
            inside.wait()
            names.append(pa.default_memory_pool().backend_name)
            leave.wait(10)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    while len(names) < 2:
        threading.Event().wait(0.01)
    leave.set()
    for thread in threads:
        thread.join(10)
    assert names == [_jemalloc().backend_name] * 2
    assert pa.default_memory_pool().backend_name == original
    with pytest.raises(RuntimeError), arrow_pool():
        raise RuntimeError("a failed compaction")
    assert pa.default_memory_pool().backend_name == original
