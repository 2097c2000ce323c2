"""What a query of the trajectory table may ask, as SQL: the filters, the sort, the page.

The viewer (:meth:`otel_verl.ui._lake.LakeSource.trajectories`), the query layer
(:meth:`otel_verl.store.Lake.trajectories`) and ``otel-verl traces list`` filter the same rows the
same way, all over DuckDB; this module is that rule, written once. :class:`Dialect` names what
would differ in another SQL (:data:`SQLITE`, the old SQLite index's spelling, is no read path's
any more: tests/unit/test_filters.py still runs the rule on both engines).

Every value is checked before it reaches SQL: an integer filter takes an integer within 64 bits
(an ``int`` or another :class:`numbers.Integral`, such as a numpy integer read from a frame; not a
bool, not a string: the HTTP layer parses the query string first), a reward bound a finite or
infinite real number (not NaN), ``validate`` a bool (a numpy bool, 0 or 1 too; not the string
"false", which ``bool()`` would take as true), and text is made encodable as UTF-8. A value
that fails is the caller's mistake, :class:`BadRequest` (answered 400 by the viewer).

Usage::

    found = filter_clauses(DUCKDB, step=3, validate=False, text="tool error")
    con.execute(f"SELECT * FROM trajectories {found.where}", found.params)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from otel_verl import semconv

__all__ = ["DUCKDB", "SORTABLE", "SQLITE", "TRAJECTORY_COLUMNS", "BadRequest", "Dialect",
           "Filters", "clean_text", "filter_clauses", "page_window", "query_bool", "query_float",
           "query_int", "query_text", "sort_column"]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

#: the columns of a trajectory row, in order (what the viewer's table and the report carry)
TRAJECTORY_COLUMNS = (
    "key", "trace_id", "span_id", "name", "project", "experiment", "step", "sample_index",
    "rollout_n", "validate", "reward", "reward_label", "weight", "turns", "spans", "llm_calls",
    "tokens_in", "tokens_out", "tool_calls", "tool_errors", "errors", "error", "start_ns",
    "duration_ns", "llm_ns", "status", "sampling_reason", "termination", "prompt", "response",
)
#: the columns a page may be sorted by
SORTABLE = frozenset(c for c in TRAJECTORY_COLUMNS if c not in ("prompt", "response", "error",
                                                                "key"))


class BadRequest(ValueError):
    """A query the index cannot answer as asked (an integer beyond 64 bits, a page past the
    end of any table): the caller's mistake, to be answered 400, not 500."""


def clean_text(text: str) -> str:
    """``text`` encodable as UTF-8 (lone surrogates, valid in JSON, are not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def query_int(what: str, value: Any) -> int | None:
    """``value`` as an integer filter (None stays None), a plain ``int``.

    Raises:
        BadRequest: a bool, a string or anything else that is not an integer
            (:class:`numbers.Integral`: an ``int``, a numpy integer), or an integer beyond 64
            bits.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise BadRequest(f"{what} must be an integer, not {value!r:.40}")
    number = int(value)
    if not INT64_MIN <= number <= INT64_MAX:
        raise BadRequest(f"{what} {str(number)[:24]} is out of range (64-bit integers)")
    return number


def query_float(what: str, value: Any) -> float:
    """``value`` as a number to compare with (a real number: an int, a float, a numpy number;
    not a bool, not NaN).

    Raises:
        BadRequest: not a number, NaN, or an integer too large for a float.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise BadRequest(f"{what} must be a number, not {value!r:.40}")
    try:
        number = float(value)
    except OverflowError:
        raise BadRequest(f"{what} {str(value)[:20]}... is out of range") from None
    if math.isnan(number):
        raise BadRequest(f"{what} must be a number, not NaN")
    return number


def query_bool(what: str, value: Any) -> bool | None:
    """``value`` as a yes/no filter (None stays None): a bool, a numpy bool, or 0 or 1.

    Raises:
        BadRequest: anything else (the string "false" among them: ``bool()`` takes it as true).
    """
    if value is None or isinstance(value, bool):
        return value
    dtype = getattr(value, "dtype", None)
    if getattr(dtype, "kind", None) == "b" and getattr(value, "shape", None) == ():
        return bool(value)  # a numpy bool scalar
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
        return bool(int(value))
    raise BadRequest(f"{what} must be true or false, not {value!r:.40}")


def query_text(value: str | None) -> str | None:
    """A text filter (None stays None), encodable as UTF-8."""
    return None if value is None else clean_text(str(value))


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern for ``prefix`` (its own wildcards dropped: trace ids are hex)."""
    return prefix.replace("%", "").replace("_", "") + "%"


@dataclass(frozen=True)
class Dialect:
    """Where two SQL engines spell a filter differently.

    Attributes:
        name: for messages.
        validate: the value a ``validate`` filter binds (SQLite stores 0/1, DuckDB a BOOLEAN).
        text: the clause "the row's ``search`` text holds ``?``".
        trace_prefix: the clause "``trace_id`` starts with ``?``".
        prefix_param: the parameter ``trace_prefix`` binds, from the lower-cased prefix.
        flag: the clause "a detector flagged the trajectory span with the attribute ``?``"
            (it reads the ``spans`` view); None where the engine has no spans to read.
    """

    name: str
    validate: Callable[[Any], Any]
    text: str
    trace_prefix: str
    prefix_param: Callable[[str], str]
    flag: str | None = None


#: the rule in SQLite (the SQLite index's, removed in issue 19; kept for the rule's cross-check)
SQLITE = Dialect(name="sqlite", validate=int, text="instr(search, ?) > 0",
                 trace_prefix="trace_id LIKE ?", prefix_param=_like_prefix)
#: the lake (:class:`otel_verl.store._query.Lake`): ``trajectories`` beside the ``spans`` view
DUCKDB = Dialect(
    name="duckdb", validate=bool, text="contains(search, ?)",
    trace_prefix="starts_with(trace_id, ?)", prefix_param=str,
    flag="trace_id || ':' || span_id IN (SELECT TraceId || ':' || SpanId FROM spans "
         "WHERE is_trajectory AND len(map_extract(SpanAttributes, ?)) > 0)")


@dataclass(frozen=True)
class Filters:
    """SQL clauses (joined with AND) and their parameters, in order."""

    clauses: tuple[str, ...] = ()
    params: tuple[Any, ...] = ()

    @property
    def where(self) -> str:
        """``WHERE ...``, or "" when nothing filters."""
        return ("WHERE " + " AND ".join(self.clauses)) if self.clauses else ""


def filter_clauses(
    dialect: Dialect,
    *,
    experiment: str | None = None,
    step: int | None = None,
    sample_index: int | None = None,
    rollout_n: int | None = None,
    validate: bool | None = None,
    reward_min: float | None = None,
    reward_max: float | None = None,
    errors_only: bool = False,
    text: str | None = None,
    trace_id: str | None = None,
    flag: str | None = None,
    status: str | None = None,
) -> Filters:
    """The clauses that keep the trajectory rows matching every given filter.

    Args:
        dialect: :data:`SQLITE` or :data:`DUCKDB`.
        experiment, step, sample_index, rollout_n, validate: equal to (None: any).
        reward_min, reward_max: the reward within (a row without a reward never is).
        errors_only: rows with an error or a tool error.
        text: the row's search text holds it, case folded ("" or None: any).
        trace_id: the trace id starts with it, case folded ("" or None: any).
        flag: a detector's flag name; the trajectory span has ``rl.flag.<flag>`` (None: any).
        status: the trajectory's status equals it (``"OK"``, ``"ERROR"``, ...; None: any).

    Raises:
        BadRequest: a value of the wrong type or range (see the module docstring), or a flag
            filter on a dialect that cannot read it.
    """
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (("experiment", query_text(experiment)),
                          ("step", query_int("step", step)),
                          ("sample_index", query_int("sample_index", sample_index)),
                          ("rollout_n", query_int("rollout_n", rollout_n)),
                          ("status", query_text(status))):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if (yes := query_bool("validate", validate)) is not None:
        clauses.append("validate = ?")
        params.append(dialect.validate(yes))
    for op, bound in ((">=", reward_min), ("<=", reward_max)):
        if bound is not None:
            clauses.append(f"reward {op} ?")
            params.append(query_float("reward bound", bound))
    if errors_only:
        clauses.append("(errors > 0 OR tool_errors > 0)")
    if text:
        clauses.append(dialect.text)
        params.append(clean_text(text.lower()))
    if trace_id:
        clauses.append(dialect.trace_prefix)
        params.append(clean_text(dialect.prefix_param(trace_id.lower())))
    if flag is not None:
        if dialect.flag is None:
            raise BadRequest(f"the flag filter needs the lake ({dialect.name} has no spans)")
        clauses.append(dialect.flag)
        params.append(semconv.flag_key(clean_text(flag)))
    return Filters(tuple(clauses), tuple(params))


def sort_column(order: str) -> str:
    """``order`` when a page may be sorted by it, else ``start_ns``."""
    return order if order in SORTABLE else "start_ns"


def page_window(page: Any, page_size: Any, max_page_size: int) -> tuple[int, int]:
    """(page, page size) held within bounds: at least one row a page, at most
    ``max_page_size``; pages from 0.

    Raises:
        BadRequest: not integers, or a page past the end of any table.
    """
    size = max(1, min(query_int("page_size", page_size) or 1, max_page_size))
    number = max(0, query_int("page", page) or 0)
    if number * size > INT64_MAX:
        raise BadRequest(f"page {number} is past the end of any table")
    return number, size
