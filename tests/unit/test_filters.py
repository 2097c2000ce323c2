"""The trajectory filters as SQL (otel_verl/store/_filters.py), the one rule the SQLite index, the
viewer's lake and ``traces list`` share: values are checked before they reach SQL, and each
dialect's clauses keep exactly the rows the documented rules keep, run by the engine itself."""

from __future__ import annotations

import math
import sqlite3
from typing import Any

import duckdb
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from otel_verl import semconv
from otel_verl.store._filters import (
    DUCKDB,
    INT64_MAX,
    INT64_MIN,
    SQLITE,
    BadRequest,
    filter_clauses,
    page_window,
    sort_column,
)

_INT_FILTERS = ("step", "sample_index", "rollout_n")
_DIALECTS = st.sampled_from([SQLITE, DUCKDB])
_NOT_INTS = st.one_of(st.booleans(), st.text(max_size=12), st.floats(), st.just(b"3"),
                      st.lists(st.integers(), max_size=2))


@given(dialect=_DIALECTS, name=st.sampled_from(_INT_FILTERS), value=_NOT_INTS)
def test_an_int_filter_refuses_what_is_not_an_int(dialect, name, value):
    """A bool (an int to Python), a string (even "3"), a float: refused, naming the filter."""
    with pytest.raises(BadRequest, match=f"^{name} must be an integer, not "):
        filter_clauses(dialect, **{name: value})


@given(dialect=_DIALECTS, name=st.sampled_from(_INT_FILTERS),
       value=st.one_of(st.integers(INT64_MIN, INT64_MAX),
                       st.integers(min_value=INT64_MAX + 1), st.integers(max_value=INT64_MIN - 1)))
def test_an_int_filter_binds_64_bit_integers_and_refuses_the_rest(dialect, name, value):
    if INT64_MIN <= value <= INT64_MAX:
        found = filter_clauses(dialect, **{name: value})
        assert found.clauses == (f"{name} = ?",) and found.params == (value,)
        assert type(found.params[0]) is int
    else:
        with pytest.raises(BadRequest, match=f"^{name} .* is out of range"):
            filter_clauses(dialect, **{name: value})


@given(dialect=_DIALECTS, bound=st.sampled_from(["reward_min", "reward_max"]),
       value=st.one_of(st.booleans(), st.text(max_size=8), st.just(math.nan),
                       st.integers(min_value=2**1024)))
def test_a_reward_bound_refuses_bools_strings_nan_and_huge_ints(dialect, bound, value):
    with pytest.raises(BadRequest, match="^reward bound "):
        filter_clauses(dialect, **{bound: value})


@given(dialect=_DIALECTS, name=st.sampled_from(_INT_FILTERS),
       value=st.integers(INT64_MIN, INT64_MAX),
       kind=st.sampled_from([np.int64, np.int32, np.int8, np.uint8, np.uint64]))
def test_a_numpy_integer_is_an_integer_and_binds_as_a_plain_int(dialect, name, value, kind):
    """A step read from a frame (``df.step[0]``, a numpy integer) filters like the same int; the
    engines get a plain ``int`` (DuckDB's binder refuses numpy scalars)."""
    info = np.iinfo(kind)
    value = kind(min(max(value, int(info.min)), int(info.max)))
    found = filter_clauses(dialect, **{name: value})
    assert found.params == (int(value),) and type(found.params[0]) is int
    with pytest.raises(BadRequest, match=f"^{name} must be an integer, not "):
        filter_clauses(dialect, **{name: np.bool_(True)})  # a bool, numpy's or Python's


@given(dialect=_DIALECTS,
       value=st.one_of(st.sampled_from(["false", "true", "0", "", 2, -1, 1.0, 0.0, b"0"]),
                       st.text(max_size=6), st.floats(), st.integers().filter(
                           lambda v: v not in (0, 1))))
def test_validate_takes_a_bool_not_a_string(dialect, value):
    """``bool("false")`` is True: a string reaching the dialect's ``bool`` kept the validation
    rows for ``validate="false"``; now it is refused, as the int filters refuse strings."""
    with pytest.raises(BadRequest, match="^validate must be true or false, not "):
        filter_clauses(dialect, validate=value)


@pytest.mark.parametrize("value, want", [(True, True), (False, False), (np.bool_(True), True),
                                         (np.bool_(False), False), (1, True), (0, False),
                                         (np.int64(0), False)])
def test_validate_binds_each_dialects_value(value, want):
    assert filter_clauses(SQLITE, validate=value).params == (int(want),)
    found = filter_clauses(DUCKDB, validate=value)
    assert found.params == (want,) and type(found.params[0]) is bool


def test_a_numpy_number_is_a_reward_bound():
    assert filter_clauses(DUCKDB, reward_min=np.float32(0.5),
                          reward_max=np.int64(2)).params == (0.5, 2.0)
    with pytest.raises(BadRequest, match="^reward bound must be a number, not NaN"):
        filter_clauses(DUCKDB, reward_min=np.float64("nan"))


def test_the_flag_filter_needs_the_lake_and_pages_stay_in_bounds():
    with pytest.raises(BadRequest, match="flag filter needs the lake"):
        filter_clauses(SQLITE, flag="length_cap")
    assert filter_clauses(DUCKDB, flag="length_cap").params == (semconv.flag_key("length_cap"),)
    assert page_window(-3, 0, 50) == (0, 1) and page_window(2, 10**6, 50) == (2, 50)
    with pytest.raises(BadRequest, match="past the end"):
        page_window(INT64_MAX, 50, 50)
    with pytest.raises(BadRequest, match="^page must be an integer"):
        page_window(True, 50, 50)
    assert sort_column("reward") == "reward" and sort_column("prompt; DROP") == "start_ns"


# --- the clauses, run by each engine, against the rules written out in Python ------------------

_ROW = st.fixed_dictionaries({
    "trace_id": st.one_of(st.sampled_from(["0a", "a0", "ab", "ba"]),
                          st.text(alphabet="0ab", min_size=1, max_size=3)),
    "experiment": st.one_of(st.none(), st.sampled_from(["a", "b", "é"])),
    "step": st.one_of(st.none(), st.integers(-2, 2), st.just(INT64_MAX)),
    "sample_index": st.one_of(st.none(), st.integers(0, 2)),
    "rollout_n": st.one_of(st.none(), st.integers(0, 2)),
    "validate": st.one_of(st.none(), st.booleans()),
    "status": st.one_of(st.none(), st.sampled_from(["OK", "ERROR", "UNSET"])),
    "reward": st.one_of(st.none(), st.sampled_from([0.0, 1.0, -1.0, 0.5, math.inf, -math.inf]),
                        st.floats(-2, 2)),
    "errors": st.integers(0, 2),
    "tool_errors": st.integers(0, 2),
    "search": st.one_of(st.none(), st.sampled_from(["ab", "a x", "b_%", "xab"]),
                        st.text(alphabet="ab x_%", max_size=6)),
    "flags": st.sets(st.sampled_from(["length_cap", "loop"])),
})
_FILTER_VALUES = {
    "experiment": st.sampled_from(["a", "b", "é", ""]),
    "step": st.one_of(st.integers(-2, 2), st.just(INT64_MAX)),
    "sample_index": st.integers(0, 2),
    "rollout_n": st.integers(0, 2),
    "validate": st.booleans(),
    "status": st.sampled_from(["OK", "ERROR", "ok"]),
    "reward_min": st.one_of(st.sampled_from([0, 1, 0.5, -math.inf]), st.floats(-3, 3)),
    "reward_max": st.one_of(st.sampled_from([0, 1, 0.5, math.inf]), st.floats(-3, 3)),
    "errors_only": st.booleans(),
    "text": st.one_of(st.sampled_from(["A", "Ab", "B", "x", "%", "_", ""]),
                      st.text(alphabet="aAbB x_%", max_size=3)),
    "trace_id": st.one_of(st.sampled_from(["a", "A", "%a", "_a", "a%", "0"]),
                          st.text(alphabet="0abA%_", max_size=3)),
}


@st.composite
def _filters(draw: Any) -> dict[str, Any]:
    """A few filters at once (with every filter at once, almost no row would be kept)."""
    names = draw(st.lists(st.sampled_from(sorted(_FILTER_VALUES)), max_size=3, unique=True))
    return {name: draw(_FILTER_VALUES[name]) for name in names}


def _kept(row: dict[str, Any], f: dict[str, Any], dialect_name: str) -> bool:
    """The documented rules, one by one (what each filter keeps)."""
    for name in ("experiment", "step", "sample_index", "rollout_n", "validate", "status"):
        if name in f and row[name] != f[name]:  # None in the row never equals
            return False
    if "reward_min" in f and (row["reward"] is None or not row["reward"] >= f["reward_min"]):
        return False
    if "reward_max" in f and (row["reward"] is None or not row["reward"] <= f["reward_max"]):
        return False
    if f.get("errors_only") and not (row["errors"] > 0 or row["tool_errors"] > 0):
        return False
    if f.get("text") and (row["search"] is None or f["text"].lower() not in row["search"]):
        return False
    prefix = f.get("trace_id", "").lower()
    if dialect_name == "sqlite":  # LIKE's own wildcards are dropped: trace ids are hex
        prefix = prefix.replace("%", "").replace("_", "")
    if f.get("trace_id") and not row["trace_id"].startswith(prefix):
        return False
    return not ("flag" in f and f["flag"] not in row["flags"])


_COLUMNS = ("key", "trace_id", "span_id", "experiment", "step", "sample_index", "rollout_n",
            "validate", "status", "reward", "errors", "tool_errors", "search")
_SQLITE_TABLE = ("CREATE TABLE trajectories (key TEXT, trace_id TEXT, span_id TEXT, "
                 "experiment TEXT, step INTEGER, sample_index INTEGER, rollout_n INTEGER, "
                 "validate INTEGER, status TEXT, reward REAL, errors INTEGER, tool_errors INTEGER, "
                 "search TEXT)")
_DUCKDB_TABLES = (
    "CREATE OR REPLACE TABLE trajectories (key VARCHAR, trace_id VARCHAR, span_id VARCHAR, "
    "experiment VARCHAR, step BIGINT, sample_index BIGINT, rollout_n BIGINT, validate BOOLEAN, "
    "status VARCHAR, reward DOUBLE, errors BIGINT, tool_errors BIGINT, search VARCHAR)",
    "CREATE OR REPLACE TABLE spans (TraceId VARCHAR, SpanId VARCHAR, is_trajectory BOOLEAN, "
    "SpanAttributes MAP(VARCHAR, VARCHAR))")


def _values(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(str(i), r["trace_id"], f"s{i}", *(r[c] for c in _COLUMNS[3:])) for i, r in
            enumerate(rows)]


def _sqlite_keys(rows: list[dict[str, Any]], f: dict[str, Any]) -> set[str]:
    con = sqlite3.connect(":memory:")
    con.execute(_SQLITE_TABLE)
    con.executemany(f"INSERT INTO trajectories VALUES ({', '.join('?' * len(_COLUMNS))})",
                    _values(rows))
    found = filter_clauses(SQLITE, **f)
    return {k for (k,) in con.execute(f"SELECT key FROM trajectories {found.where}",
                                      found.params)}


_DUCK: list[duckdb.DuckDBPyConnection] = []


def _duckdb_keys(rows: list[dict[str, Any]], f: dict[str, Any]) -> set[str]:
    if not _DUCK:
        _DUCK.append(duckdb.connect())
    con = _DUCK[0]
    for statement in _DUCKDB_TABLES:
        con.execute(statement)
    if rows:
        con.executemany(f"INSERT INTO trajectories VALUES ({', '.join('?' * len(_COLUMNS))})",
                        _values(rows))
        spans = []
        for i, r in enumerate(rows):
            flags = {semconv.flag_key(n): "true" for n in r["flags"]}
            spans.append((r["trace_id"], f"s{i}", True, flags))
            # a child span flagged with what its trajectory is not: it does not count
            spans.append((r["trace_id"], f"c{i}", False, {semconv.flag_key("loop"): "true"}))
        con.executemany("INSERT INTO spans VALUES (?, ?, ?, ?)", spans)
    found = filter_clauses(DUCKDB, **f)
    return {k for (k,) in con.execute(f"SELECT key FROM trajectories {found.where}",
                                      list(found.params)).fetchall()}


def _row(trace_id: str, **values: Any) -> dict[str, Any]:
    row = {"trace_id": trace_id, "experiment": None, "step": None, "sample_index": None,
           "rollout_n": None, "validate": None, "status": None, "reward": None, "errors": 0,
           "tool_errors": 0, "search": None, "flags": set()}
    return {**row, **values}


#: rows where each rule's edge shows (the property's random rows rarely line up with one)
_EDGES = [
    _row("ab", experiment="é", step=INT64_MAX, validate=True, status="OK", reward=0.5,
         search="ab x",
         flags={"loop"}),
    _row("ba", experiment="a", step=0, validate=False, reward=-math.inf, errors=1,
         search="b_%"),
    _row("0a", validate=False, reward=1.0, tool_errors=2, search="xab", flags={"length_cap"}),
    _row("a0", reward=math.inf),
]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(rows=_EDGES, f={"text": "Ab"}, flag=None)
@example(rows=_EDGES, f={"text": "_%"}, flag=None)
@example(rows=_EDGES, f={"trace_id": "%A"}, flag=None)
@example(rows=_EDGES, f={"trace_id": "A"}, flag=None)
@example(rows=_EDGES, f={"trace_id": "a_"}, flag=None)
@example(rows=_EDGES, f={"reward_min": 0.5}, flag=None)
@example(rows=_EDGES, f={"reward_max": 1}, flag=None)
@example(rows=_EDGES, f={"reward_min": -math.inf, "reward_max": math.inf}, flag=None)
@example(rows=_EDGES, f={"validate": False}, flag="length_cap")
@example(rows=_EDGES, f={"errors_only": True}, flag=None)
@example(rows=_EDGES, f={"status": "OK"}, flag=None)
@example(rows=_EDGES, f={"experiment": "é", "step": INT64_MAX}, flag="loop")
@given(rows=st.lists(_ROW, max_size=10), f=_filters(),
       flag=st.one_of(st.none(), st.sampled_from(["length_cap", "loop", "Loop"])))
def test_each_dialect_keeps_exactly_the_rows_the_rules_keep(rows, f, flag):
    want = {dialect: {str(i) for i, r in enumerate(rows) if _kept(r, f, dialect)}
            for dialect in ("sqlite", "duckdb")}
    assert _sqlite_keys(rows, f) == want["sqlite"]
    with_flag = {**f, "flag": flag} if flag is not None else f
    assert _duckdb_keys(rows, with_flag) == {
        str(i) for i, r in enumerate(rows) if _kept(r, with_flag, "duckdb")}
    if "%" not in f.get("trace_id", "") and "_" not in f.get("trace_id", ""):
        assert want["sqlite"] == want["duckdb"]  # the two read paths agree
