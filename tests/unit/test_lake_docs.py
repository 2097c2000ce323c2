"""docs/lakehouse.md's RL questions run as written on a store, and answer what the trajectory
model says; the background compactor compacts what a writer leaves."""

from __future__ import annotations

import re
import time
from pathlib import Path

import _lake_store as S

from otel_verl.store import group_trajectories, read_spans
from otel_verl.store._compact import BackgroundCompactor, Manifest, lake_dir
from otel_verl.store._query import Lake

ROOT = Path(__file__).resolve().parents[2]


def _questions() -> list[str]:
    text = (ROOT / "docs" / "lakehouse.md").read_text()
    text = text[text.index("## Five RL questions"):text.index("## The ClickHouse path")]
    return re.findall(r"```sql\n(.*?)```", text, re.S)


def test_the_documented_queries_run_and_answer(tmp_path: Path) -> None:
    S.write_store(tmp_path, 3, steps=4)
    queries = _questions()
    assert len(queries) == 5
    with Lake.open(tmp_path) as lake:
        results = [lake.rows(q) for q in queries]
    assert all(results)
    trajectories = [t for t in group_trajectories(read_spans(tmp_path)) if t.root is not None]
    groups: dict[tuple[object, ...], list[float]] = {}
    for t in trajectories:
        if t.reward is not None:
            groups.setdefault((t.step, t.validate, t.sample_index), []).append(t.reward)
    for row in results[1]:  # the collapsed group rate, from the model
        mine = [len(set(r)) == 1 for (step, _, _), r in groups.items()
                if step == row["step"] and len(r) > 1]
        assert row["groups"] == len(mine)
        assert abs(row["collapsed_rate"] - sum(mine) / len(mine)) < 1e-12


def test_the_background_compactor_compacts(tmp_path: Path) -> None:
    S.write_store(tmp_path, 4)
    done = []
    compactor = BackgroundCompactor(tmp_path, interval_s=0.05, on_done=done.append,
                                    live_bytes=0).start()
    try:
        deadline = time.monotonic() + 60
        while not done and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        compactor.stop()
    assert done and done[0].spans > 0
    assert Manifest.load(lake_dir(tmp_path)).segments
