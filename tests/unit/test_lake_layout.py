"""A lake written by an older layout (its manifest has another name: ``manifest.v1``) is derived
data: the next compaction removes its segments, payloads and caches and compacts the store
again, and until then readers answer from the raw files. A stale cache of the old layout must
never be read as the new one's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import _lake_store as S

from otel_verl.store._compact import MANIFEST, OLD_MANIFESTS, Manifest, compact, lake_dir
from otel_verl.store._query import Lake


def _rounded(value: Any) -> Any:
    """Floats to 12 significant digits (sums of the same rewards in another order)."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def _answers(trace_dir: Path) -> Any:
    lake = Lake.open(trace_dir)
    try:
        return _rounded([lake.steps(), lake.trajectories(limit=1000)])
    finally:
        lake.close()


def _as_old_layout(trace_dir: Path) -> Path:
    """The compacted lake as an older layout left it: its manifest under v1's name."""
    lake = Path(lake_dir(trace_dir))
    os.replace(lake / MANIFEST, lake / OLD_MANIFESTS[0])
    return lake


def test_an_old_layout_is_compacted_again_and_read_raw_until_then(tmp_path: Path) -> None:
    store = tmp_path / "traces"
    S.write_store(store, 7)
    fresh = tmp_path / "fresh"
    shutil.copytree(store, fresh)
    raw_answers = _answers(fresh)  # nothing compacted: the raw files
    compact(store, live_bytes=0)
    assert Manifest.load(lake_dir(store)).segments
    lake = _as_old_layout(store)
    segments = sorted(p.relative_to(lake) for p in (lake / "spans").rglob("*.parquet"))
    caches = sorted((lake / "trajectories").glob("*"))
    assert segments and caches
    # before the next compaction: no manifest of this layout, so the raw files answer
    assert _answers(store) == raw_answers
    stats = compact(store, live_bytes=0)
    assert stats.spans > 0  # compacted again, from the store
    assert not (lake / OLD_MANIFESTS[0]).exists() and (lake / MANIFEST).exists()
    manifest = Manifest.load(str(lake))
    assert manifest.runs >= 1 and manifest.segments
    on_disk = {str(p.relative_to(lake)) for p in (lake / "spans").rglob("*.parquet")}
    assert on_disk == set(manifest.segments)  # the old layout's segments are gone
    compact(fresh, live_bytes=0)
    assert _answers(store) == _answers(fresh) == raw_answers


def test_a_lake_of_this_layout_is_left_alone(tmp_path: Path) -> None:
    store = tmp_path / "traces"
    S.write_store(store, 3)
    compact(store, live_bytes=0)
    before = Manifest.load(lake_dir(store))
    (Path(lake_dir(store)) / OLD_MANIFESTS[0]).write_bytes(b"{}")  # a stray old name beside it
    stats = compact(store, live_bytes=0)
    assert stats.spans == 0  # nothing new: nothing compacted again
    assert Manifest.load(lake_dir(store)).segments == before.segments
