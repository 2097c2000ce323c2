"""The CLI through the lake: ``traces list``, ``traces list --steps``, ``sql`` and ``compact``
give the numbers of the store's trajectory model and of the query layer, raw and compacted."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import _lake_store as L
import _step_oracle as REF  # the step statistics in Python: the reference
import pytest

from otel_verl.cli import main
from otel_verl.store import group_trajectories, read_spans, sampling_reports
from otel_verl.store._compact import Manifest, lake_dir
from otel_verl.store._query import Lake


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if out.strip() else None), err


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9)
    return bool(a == b)


@pytest.mark.parametrize("compacted", [False, True])
def test_traces_list_json_is_the_models_summary(tmp_path: Path, capsys: Any,
                                                compacted: bool) -> None:
    L.write_store(tmp_path, 5)
    expected = [t.summary() for t in group_trajectories(read_spans(tmp_path))]
    if compacted:
        assert _run(capsys, "compact", "--live", "--dir", str(tmp_path), "--json")[0] == 0
        assert Manifest.load(lake_dir(tmp_path)).segments
    rc, rows, _ = _run(capsys, "traces", "list", "--dir", str(tmp_path), "--json")
    assert rc == 0
    assert len(rows) == len(expected)
    mine = {(r["trace_id"], r["span_id"]): r for r in rows}
    for want in expected:
        got = mine[(want["trace_id"], want["span_id"])]
        for key, value in want.items():
            assert _same(got[key], value), (key, got[key], value)
    rc, rows, _ = _run(capsys, "traces", "list", "--dir", str(tmp_path), "--json", "--step", "1")
    assert sorted(r["trace_id"] for r in rows) == sorted(
        w["trace_id"] for w in expected if w["step"] == 1)


def test_one_store_file_lists_like_its_directory(tmp_path: Path, capsys: Any) -> None:
    """``--dir FILE`` reads the file through the lake (the old whole-store read did it in
    Python): the same rows and steps as the directory holding only it, nothing written."""
    L.write_store(tmp_path / "s", 4, files=1)
    (path,) = (tmp_path / "s").glob("*.jsonl")
    for argv in (["--json"], ["--json", "--steps"], ["--json", "--step", "2"]):
        rc, by_dir, _ = _run(capsys, "traces", "list", "--dir", str(tmp_path / "s"), *argv)
        rc_file, by_file, _ = _run(capsys, "traces", "list", "--dir", str(path), *argv)
        assert rc == rc_file == 0 and by_dir and len(by_file) == len(by_dir)
        for got, want in zip(by_file, by_dir, strict=True):
            assert all(_same(got[k], v) for k, v in want.items()), (got, want)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [path.name]


def test_steps_and_sql_give_the_same_numbers(tmp_path: Path, capsys: Any) -> None:
    L.write_store(tmp_path, 9)
    spans = list(read_spans(tmp_path))
    model = [s.as_dict() for s in REF.step_statistics(group_trajectories(spans),
                                                    sampling_reports(spans))]
    rc, steps, _ = _run(capsys, "traces", "list", "--steps", "--dir", str(tmp_path), "--json")
    assert rc == 0 and len(steps) == len(model)
    for got, want in zip(steps, model, strict=True):
        for key, value in want.items():
            assert _same(got[key], value), (key, got[key], value)
    query = ("SELECT experiment, validate, step, reward_mean, traced FROM steps "
             "ORDER BY experiment, validate, step")
    rc, rows, _ = _run(capsys, "sql", query, "--dir", str(tmp_path), "--json")
    assert rc == 0
    with Lake.open(tmp_path) as lake:
        assert rows == json.loads(json.dumps(lake.rows(query)))
    for row in rows:
        want = next(m for m in model if (m["experiment"], m["validate"], m["step"]) == (
            row["experiment"], row["validate"], row["step"]))
        assert _same(row["reward_mean"], want["reward_mean"]) and row["traced"] == want["traced"]
    per_step = "SELECT step, avg(reward) AS r FROM trajectories GROUP BY step ORDER BY step"
    rc, rows, _ = _run(capsys, "sql", per_step, "--dir", str(tmp_path), "--json")
    trajectories = group_trajectories(spans)
    for row in rows:
        rewards = [t.reward for t in trajectories if t.step == row["step"]
                   and t.reward is not None]
        assert _same(row["r"], sum(rewards) / len(rewards))


def test_sql_prints_a_table_and_refuses_bad_sql(tmp_path: Path, capsys: Any) -> None:
    L.write_store(tmp_path, 2)
    assert main(["sql", "SELECT count(*) AS n FROM trajectories", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].strip() == "n" and int(out[1]) == len(group_trajectories(read_spans(tmp_path)))
    assert main(["sql", "SELEC nonsense", "--dir", str(tmp_path)]) == 2
    assert "otel-verl sql:" in capsys.readouterr().err
