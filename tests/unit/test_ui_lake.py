"""The viewer over the lake (otel_verl/ui/_lake.py): the same numbers from the CLI, the viewer
and ``otel-verl sql``; every hostile kind survived raw and compacted; background compaction while
serving, with a live file's new lines shown; one store file; the extra's name when DuckDB is
missing."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from _modules import load_file

from otel_verl.cli import main
from otel_verl.store import LAKE_EXTRA, group_trajectories, read_spans
from otel_verl.store._compact import compact
from otel_verl.ui._lake import LakeSource, open_source
from otel_verl.ui.server import UIServer

HERE = Path(__file__).resolve().parent
L = load_file(HERE / "test_lake.py", "test_lake")              # the synthetic GRPO store
HS = load_file(HERE / "test_hostile_store.py", "test_hostile_store")  # every view, as served
H = HS.H


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


class _Served:
    def __init__(self, source: Any) -> None:
        self.srv = UIServer(source, port=0, poll_s=0.0)
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        self.api = self.srv.url + "api/"

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def _same(a: Any, b: Any) -> bool:
    """Equal; floats to 1e-12 (DuckDB sums doubles on several threads, so the last bit of a
    mean may differ between two runs of the same query)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-12 * max(1.0, abs(a))
    return bool(a == b)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


_SAME = ("trajectories", "traced", "partial", "estimated", "weight", "reward_mean",
         "reward_mean_unweighted", "pass_rate", "error_rate", "with_errors", "by_reason", "ran",
         "dropped")


def test_cli_viewer_and_sql_give_the_same_numbers(tmp_path: Path, capsys: Any) -> None:
    """One store (weights, errors, partial trajectories, reports), half compacted: the step
    statistics of ``traces list --steps``, of the viewer's overview and of ``sql`` over
    ``steps`` are the same numbers, and so are the trajectory counts per step."""
    store = tmp_path / "store"
    L.write_store(store, 11, files=2)
    compact(store, live_bytes=0, chunk_spans=50)
    L.write_store(store, 12, steps=4, files=1, base=10_000)  # raw lines beside the segments
    cli = _cli(capsys, "traces", "list", "--steps", "--dir", str(store), "--json")
    columns = ", ".join(c for c in _SAME if c not in ("ran", "dropped"))
    sql = _cli(capsys, "sql", f"SELECT experiment, validate, step, {columns} FROM steps",
               "--dir", str(store), "--json")
    served = _Served(open_source(store))
    try:
        viewer = _get(served.api + "overview")["steps"]
        by_step = {(s["experiment"], s["validate"], s["step"]): s for s in viewer}
        assert len(by_step) == len(cli) and len(cli) >= 4
        for row in cli:
            shown = by_step[(row["experiment"], row["validate"], row["step"])]
            for key in row:
                assert _same(shown[key], row[key]), (key, shown[key], row[key])
        assert len(sql) == len([s for s in viewer if s["trajectories"]])
        for row in sql:
            shown = by_step[(row["experiment"], row["validate"], row["step"])]
            for key in row:
                assert _same(shown[key], row[key]), (key, shown[key], row[key])
        for step in sorted({r["step"] for r in cli if r["step"] is not None}):
            listed = _cli(capsys, "traces", "list", "--dir", str(store), "--json", "--step",
                          str(step))
            counted = _cli(capsys, "sql", f"SELECT count(*) AS n FROM trajectories WHERE "
                           f"step = {step}", "--dir", str(store), "--json")[0]["n"]
            page = _get(served.api + f"trajectories?step={step}&page_size=1")
            assert page["total"] == len(listed) == counted
    finally:
        served.close()


@pytest.mark.parametrize("compacted", [False, True])
def test_every_hostile_kind_through_the_lake(tmp_path: Path, compacted: bool) -> None:
    """The hostile catalogue (tests/_hostile_spans.py) in one store, read raw or compacted:
    every good trajectory is listed and shown by every view, and the banner's counts say what
    was skipped (lines apart from spans)."""
    good_store = tmp_path / "good"
    H.write_good_store(good_store, HS.GOOD)
    good = HS._good_keys(good_store, tmp_path)
    store = HS._copy(good_store, tmp_path)
    H.poison_store(store, list(H.KINDS))
    if compacted:
        compact(store, live_bytes=0)
    source = LakeSource(store, compact=False)
    try:
        assert source.problems()["segments"] > 0 if compacted else source.problems()["raw_files"]
        keys = {r["key"] for r in source.trajectories(page_size=1000)["rows"]}
        assert good <= keys
        assert HS._every_view(source, good) == HS.GOOD
        problems = source.problems()
        assert problems["bad_lines"] >= 4 and problems["bad_spans"] >= 10, problems
    finally:
        source.close()


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_background_compaction_while_serving_and_a_live_file_shows(tmp_path: Path) -> None:
    """``otel-verl ui``'s background: the closed files (their writer is gone) are compacted on
    the thread while the viewer answers; a file still being written is not, and its new lines
    show within the poll period; no trajectory is counted twice."""
    store = tmp_path / "store"
    L.write_store(store, 5, files=2)
    host = socket.gethostname()
    for i, path in enumerate(sorted(store.glob("*.jsonl"))):  # as written by a finished run
        path.rename(store / f"otel_verl-{host}-{_dead_pid()}-20261201T00000000{i}Z.jsonl")
    expected = len(group_trajectories(read_spans(store)))
    source = open_source(store, background=True, poll_s=0.05)
    assert isinstance(source, LakeSource)
    served = _Served(source)
    try:
        deadline = time.monotonic() + 60
        while source.problems()["segments"] == 0 and time.monotonic() < deadline:
            assert _get(served.api + "trajectories?page_size=1")["total"] == expected
            time.sleep(0.05)
        assert source.compactions >= 1 and source.problems()["raw_files"] == 0
        assert _get(served.api + "trajectories?page_size=1")["total"] == expected
        generation = _get(served.api + "meta")["generation"]
        live = store / f"otel_verl-{host}-{os.getpid()}-20261201T000000009Z.jsonl"
        L.write_store(tmp_path / "more", 6, steps=2, files=1, base=50_000)
        (more,) = (tmp_path / "more").glob("*.jsonl")
        added = len(group_trajectories(read_spans(more)))
        live.write_bytes(more.read_bytes())
        while (_get(served.api + "trajectories?page_size=1")["total"] != expected + added
               and time.monotonic() < deadline):
            time.sleep(0.05)
        assert _get(served.api + "trajectories?page_size=1")["total"] == expected + added
        assert _get(served.api + "meta")["generation"] > generation
        assert source.problems()["raw_files"] == 1  # the live file is read directly
    finally:
        served.close()
        source.close()


def test_without_duckdb_the_viewer_says_what_to_install(tmp_path: Path, monkeypatch: Any) -> None:
    """No fallback engine: the viewer's source names the extra (the CLI prints it and exits)."""
    L.write_store(tmp_path, 3)
    monkeypatch.setitem(sys.modules, "duckdb", None)  # import duckdb raises ImportError
    monkeypatch.delitem(sys.modules, "otel_verl.store._query", raising=False)
    said: list[str] = []
    with pytest.raises(ImportError, match=re.escape(LAKE_EXTRA)):
        open_source(tmp_path, say=said.append)
    assert said == [] and not (tmp_path / ".otel_verl_index").exists()


def _close_rows(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Rows equal, floats to 1e-9 (DuckDB's parallel sums may add in another order)."""
    def same(x: Any, y: Any) -> bool:
        if isinstance(x, float) and isinstance(y, float):
            return x == pytest.approx(y, rel=1e-9, abs=1e-12)
        return bool(x == y)
    return len(a) == len(b) and all(
        r.keys() == q.keys() and all(same(r[k], q[k]) for k in r) for r, q in zip(a, b, strict=True))


def test_one_store_file_is_served_through_the_lake(tmp_path: Path) -> None:
    """``--dir FILE`` (a collector's one output file): read directly, nothing compacted or
    written beside it, the same rows and steps as the directory holding it."""
    L.write_store(tmp_path / "store", 3, files=1)
    (path,) = (tmp_path / "store").glob("*.jsonl")
    whole = LakeSource(tmp_path / "store", compact=False)
    one = open_source(path, background=True, poll_s=0.05)
    try:
        assert one.problems()["trajectories"] == whole.problems()["trajectories"] > 0
        assert _close_rows(one.overview(), whole.overview())
        page = one.trajectories(page_size=5000)
        assert page == whole.trajectories(page_size=5000)
        row = page["rows"][0]
        assert one.trace_spans(row["trace_id"]) == whole.trace_spans(row["trace_id"])
        time.sleep(0.3)  # the background thread ran: it compacts nothing for one file
        assert one.compactions == 0
        assert sorted(os.listdir(tmp_path / "store")) == [path.name]
    finally:
        one.close()
        whole.close()


# --- a damaged lake (what the SQLite index's self-repair tests covered) ------------------------

def _garble(path: Path) -> None:
    path.write_bytes(os.urandom(max(path.stat().st_size, 64)))


def _each(pattern: str, damage: Any) -> Any:
    def run(lake: Path) -> None:
        found = sorted(lake.glob(pattern))
        assert found, pattern
        for path in found:
            damage(path)
    return run


LAKE_DAMAGE = {
    "manifest garbage": _each("manifest.v2", _garble),
    "manifest emptied": _each("manifest.v2", lambda p: os.truncate(p, 0)),
    "manifest cut in half": _each("manifest.v2", lambda p: os.truncate(p, p.stat().st_size // 2)),
    "segment garbage": _each("spans/**/*.parquet", _garble),
    "segment cut in half": _each("spans/**/*.parquet",
                                 lambda p: os.truncate(p, p.stat().st_size // 2)),
    "segment removed": _each("spans/**/*.parquet", lambda p: p.unlink()),
    "payload segment garbage": _each("payload/**/*.parquet", _garble),
    "trajectories cache garbage": _each("trajectories/cache-*.parquet", _garble),
    "steps cache garbage": _each("trajectories/steps-*.parquet", _garble),
}


@pytest.fixture(scope="module")
def compacted_good(tmp_path_factory: Any) -> tuple[Path, set[str]]:
    store = tmp_path_factory.mktemp("damaged") / "traces"
    H.write_good_store(store, HS.GOOD)
    good = {r["key"] for r in LakeSource(store, compact=False).trajectories()["rows"]}
    compact(store, live_bytes=0)
    return store, good


@pytest.mark.parametrize("kind", list(LAKE_DAMAGE))
def test_a_damaged_lake_is_set_aside_said_and_rebuilt(kind: str, compacted_good: Any,
                                                      tmp_path: Path, capsys: Any) -> None:
    """The lake is derived data: damaged, it is kept beside the store under another name, the
    viewer and the CLI read the raw files and say so, and the next compaction rebuilds it."""
    good_store, good = compacted_good
    store = tmp_path / "traces"
    shutil.copytree(good_store, store)
    LAKE_DAMAGE[kind](store / ".otel_verl_lake")
    source = LakeSource(store, compact=False)
    try:
        assert {r["key"] for r in source.trajectories()["rows"]} == good
        assert HS._every_view(source, good) == HS.GOOD
        (notice,) = source.problems()["notices"]
        assert "could not be read" in notice and ".otel_verl_lake.damaged-" in notice
    finally:
        source.close()
    kept = [p.name for p in store.iterdir() if p.name.startswith(".otel_verl_lake.damaged-")]
    assert len(kept) == 1 and not (store / ".otel_verl_lake").exists()
    assert compact(store, live_bytes=0).segments > 0  # rebuilt
    capsys.readouterr()
    assert main(["traces", "list", "--dir", str(store), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {f"{r['trace_id']}:{r['span_id'] or ''}" for r in listed} == good


def test_the_cli_sets_a_damaged_lake_aside_and_says_so(compacted_good: Any, tmp_path: Path,
                                                       capsys: Any) -> None:
    good_store, good = compacted_good
    store = tmp_path / "traces"
    shutil.copytree(good_store, store)
    LAKE_DAMAGE["manifest garbage"](store / ".otel_verl_lake")
    assert main(["traces", "list", "--steps", "--dir", str(store), "--json"]) == 0
    out, err = capsys.readouterr()
    assert "could not be read" in err and "kept as" in err
    assert sum(s["traced"] for s in json.loads(out)) == HS.GOOD
