"""The Ray Data path's sampling reports (otel_verl/store/_ray.py ``reports_table``) without Ray:
a report stored twice whose copies disagree is read as the copy the lake reads
(``_query.REPORT_ORDER``: the one with more counts), whatever order the rows come in. The Ray
run itself: tests/verl/test_lake_ray.py."""

from __future__ import annotations

import itertools
from pathlib import Path

import _lake_store as S
import duckdb
import pyarrow as pa
import pytest

from otel_verl.store._query import Lake
from otel_verl.store._ray import reports_table

_TYPE = pa.schema([("TraceId", pa.string()), ("SpanId", pa.string()),
                   ("experiment", pa.string()), ("validate", pa.bool_()), ("step", pa.int64()),
                   ("report_counts", pa.map_(pa.string(), pa.int64()))])
FEWER = {"ran": 50}
MORE = {"ran": 50, "dropped": 7}
#: a third copy, as many counts as MORE: the tie goes by the counts' text
OTHER = {"ran": 49, "dropped": 7}


def _rows(copies: list[dict[str, int]]) -> pa.Table:
    n = len(copies)
    return pa.table({"TraceId": ["ab" * 16] * n, "SpanId": ["cd" * 8] * n,
                     "experiment": ["exp"] * n, "validate": [False] * n, "step": [3] * n,
                     "report_counts": [list(c.items()) for c in copies]}, schema=_TYPE)


def _read(copies: list[dict[str, int]]) -> dict[str, int]:
    con = duckdb.connect()
    try:
        reports_table(con, _rows(copies))
        rows = con.execute("SELECT report_counts FROM reports").fetchall()
    finally:
        con.close()
    assert len(rows) == 1
    return dict(rows[0][0])


def _lake_reads(tmp_path: Path, copies: list[dict[str, int]]) -> dict[str, int]:
    store = tmp_path / "store"
    store.mkdir()
    with open(store / "otel_verl-elsewhere-1-20260101T000000000Z.jsonl", "wb") as handle:
        for counts in copies:
            attrs = {"rollout.step": 3, "rollout.validate": False,
                     "rollout.experiment_name": "exp",
                     **{f"rollout.sampling.{k}": v for k, v in counts.items()}}
            handle.write(S._line([S._span("ab" * 16, "cd" * 8, None, "otel_verl.sampling_report",
                                           10**18, attrs)], {"service.name": "w"}))
    with Lake.open(store) as lake:
        reports = lake.sampling_reports()
    return reports[("exp", False, 3)]


@pytest.mark.parametrize("copies", list(itertools.permutations([FEWER, MORE, OTHER])))
def test_a_report_stored_twice_is_read_as_the_lake_reads_it(
        tmp_path: Path, copies: tuple[dict[str, int], ...]) -> None:
    want = _lake_reads(tmp_path, list(copies))
    assert want == OTHER or want == MORE  # more counts first (the lake's rule)
    assert _read(list(copies)) == want


def test_no_reports_is_an_empty_table() -> None:
    con = duckdb.connect()
    reports_table(con, None)
    assert con.execute("SELECT count(*) FROM reports").fetchone() == (0,)
    con.close()
