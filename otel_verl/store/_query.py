"""The lake's query layer: one DuckDB read path over the Parquet segments and the raw store.

Usage::

    from otel_verl.store._query import Lake

    lake = Lake.open("otel_verl_traces")        # reads the manifest and the raw tails
    lake.sql("SELECT step, avg(reward) FROM trajectories GROUP BY step").fetchall()
    lake.steps()                                # per (experiment, validate, step), weighted
    lake.trajectories(step=3, order="reward", descending=True, limit=50)
    lake.trajectory(trace_id)                   # the spans of one trace (otel_traces columns)
    lake.refresh()                              # pick up new segments and new raw lines

Needs the ``lake`` extra (``pip install 'otel-verl[lake]'``: duckdb and pyarrow).

The schema (views in the DuckDB connection ``lake.connection``):

``spans``
    one row per stored span: the Collector ClickHouse exporter's ``otel_traces`` columns plus
    the RL columns (see :mod:`otel_verl.store._schema`). Segments (compacted) and raw lines
    (not compacted yet) together, each span from exactly one of them; a span delivered twice
    (at-least-once delivery) appears twice here, once in ``trajectories``.
``payloads``
    ``TraceId``, ``SpanId``, ``Payload`` (map: ``input.value``, ``output.value``, messages, ...).
``trajectories``
    one row per trajectory, built from ``spans`` on :meth:`Lake.refresh`: ``key``,
    ``trace_id``, ``span_id`` (the trajectory span's; ``''`` when it is missing), ``name``,
    ``project``, ``experiment``, ``step``, ``sample_index``, ``rollout_n``, ``validate``,
    ``group_key`` (the GRPO group: experiment/validate/step/sample_index), ``reward``,
    ``reward_label``, ``weight`` (``rollout.sampling.weight``; 1 when not recorded, 0 for a
    partial trajectory), ``turns``, ``spans``, ``llm_calls``, ``tokens_in``, ``tokens_out``,
    ``tool_calls``, ``tool_errors``, ``errors``, ``error``, ``start_ns``, ``duration_ns``,
    ``llm_ns``, ``status`` (``ok`` / ``error`` / ``partial``), ``sampling_reason``,
    ``termination``, ``finish_reason``, ``policy_version``.
    A trajectory is the trajectory span and the spans carrying its identity (every span inside
    a trajectory carries it); spans without any identity (an engine's) join their trace's
    trajectory when the trace has one; a trace without any is one partial trajectory.
``steps``
    per (experiment, validate, step): the weighted statistics (the ONE implementation; see
    :data:`STEPS_SQL`): ``trajectories``, ``traced`` (with their trajectory span), ``partial``,
    ``weight`` = ``estimated``, ``reward_mean`` (sum w*r / sum w), ``reward_std``,
    ``reward_mean_unweighted``, ``pass_rate``, ``reward_min`` / ``reward_max``,
    ``error_rate`` (weighted share with a span in error), ``with_errors``, ``turns_mean``,
    ``tokens_in_mean`` / ``tokens_out_mean`` (weighted), ``tool_calls``, ``tool_errors``,
    ``duration_mean_ns`` / ``duration_max_ns``, ``llm_mean_ns``, ``prompts``, ``by_reason``.

Every read goes through :meth:`Lake.sql` or a typed method on the same views, so the CLI, the
viewer and ``otel-verl sql`` give the same numbers.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_verl.store import list_files
from otel_verl.store._compact import (
    NULL_PART,
    SKIP_DIRS,
    Manifest,
    decode_range,
    lake_dir,
    raw_start,
)
from otel_verl.store._filters import DUCKDB, filter_clauses, query_int
from otel_verl.store._schema import PAYLOAD_SCHEMA, SPAN_SCHEMA, Columns

__all__ = ["STEPS_SQL", "TRAJECTORIES_SQL", "TRAJECTORY_ORDER", "Lake", "LakeState", "steps_sql",
           "trajectories_sql"]

_MAX = 2**63 - 1
#: seconds an earlier compaction's trajectories files stay after a new run replaced them
CACHE_GRACE_S = 120.0
_MAP_COLUMNS = ("ResourceAttributes", "SpanAttributes", "reward_components", "report_counts")
_IDENTITY = ("step IS NULL AND sample_index IS NULL AND rollout_n IS NULL")

#: the columns of a span row the trajectory model reads (beside ``TraceId``, ``SpanId``), in
#: the order :data:`DUPLICATE_ORDER` compares them
_MODEL_COLUMNS = ("ParentSpanId", "SpanName", "start_ns", "Duration", "StatusCode", "experiment",
                  "project", "step", "sample_index", "rollout_n", "validate", "is_trajectory",
                  "is_llm", "is_tool", "tool_error", "reward", "eval_score", "eval_label",
                  "turns", "tokens_in", "tokens_out", "termination", "sampling_reason",
                  "sampling_weight", "error_text", "finish_reason", "policy_version")
#: which copy of a span stored twice (the same ``TraceId`` and ``SpanId``) the trajectory model
#: reads, when the copies disagree (a replayed spool, a span re-exported after a change): the
#: first by this order, whatever the order of the files and lines. The one that ended later
#: (``Timestamp`` + ``Duration``; a copy without an end after one with it), then the more
#: complete (more of the model's columns not NULL), then the smaller value of each column in
#: :data:`_MODEL_COLUMNS` order and of the text columns (NULL last): copies that tie on all of
#: it are the same to every reader. ``{t}``: the text columns' terms (or nothing).
DUPLICATE_ORDER = ("(start_ns::HUGEINT + Duration) DESC NULLS LAST, ("
                   + " + ".join(f"({c} IS NOT NULL)::INTEGER" for c in _MODEL_COLUMNS)
                   + ") DESC, " + ", ".join(f"{c} NULLS LAST" for c in _MODEL_COLUMNS) + "{t}")
#: the order of the copies of a sampling report stored twice (the first is read): the one
#: with more counts, then by its counts' text, experiment, validate, step
REPORT_ORDER = ("TraceId, SpanId, cardinality(report_counts) DESC NULLS LAST, "
                "report_counts::VARCHAR NULLS LAST, experiment NULLS LAST, validate NULLS LAST, "
                "step NULLS LAST")
#: ties between spans of one trajectory in ``arg_min`` / ``arg_max`` by start time: by span id
_BY_START = "CASE WHEN start_ns IS NOT NULL THEN (start_ns, SpanId) END"

#: the trajectory model in SQL (over the ``spans`` view), with the marks
#: :func:`trajectories_sql` fills. A span stored twice is read once (``r`` -> ``s``): the
#: spans stored once as they are, the copies of the others by :data:`DUPLICATE_ORDER` (only
#: those few are sorted)
_TRAJECTORIES_TEMPLATE = f"""
WITH r AS MATERIALIZED (
    SELECT
        TraceId, SpanId, ParentSpanId, SpanName, epoch_ns(Timestamp) AS start_ns, Duration,
        StatusCode, experiment, project, step, sample_index, rollout_n, validate,
        is_trajectory, is_llm, is_tool, tool_error, reward, eval_score, eval_label, turns,
        tokens_in, tokens_out, termination, sampling_reason, sampling_weight, error_text,
        finish_reason, policy_version__TEXT_S__,
        CASE WHEN {_IDENTITY} THEN (CASE WHEN is_trajectory THEN 'root:' || SpanId END)
             ELSE concat_ws('|', coalesce(experiment, '~'), coalesce(validate::VARCHAR, '~'),
                            coalesce(step::VARCHAR, '~'), coalesce(sample_index::VARCHAR, '~'),
                            coalesce(rollout_n::VARCHAR, '~')) END AS k
    FROM __SOURCE__ WHERE NOT is_report),
d AS (SELECT TraceId, SpanId FROM r GROUP BY TraceId, SpanId HAVING count(*) > 1),
s AS (SELECT * FROM r ANTI JOIN d USING (TraceId, SpanId) UNION ALL
      SELECT * FROM (SELECT DISTINCT ON (TraceId, SpanId) * FROM r SEMI JOIN d
                     USING (TraceId, SpanId) ORDER BY TraceId, SpanId, __DUPLICATE_ORDER__)),
g AS (SELECT TraceId, count(DISTINCT k) AS nk, min(k) AS k1 FROM s GROUP BY TraceId),
a AS (SELECT s.*, coalesce(s.k, CASE WHEN g.nk = 1 THEN g.k1 WHEN g.nk = 0 THEN '' END) AS tk
      FROM s JOIN g USING (TraceId)),
t AS (
    SELECT TraceId AS trace_id,
        coalesce(min(SpanId) FILTER (WHERE is_trajectory), '') AS span_id,
        coalesce(min(SpanName) FILTER (WHERE is_trajectory), arg_min(SpanName, {_BY_START}))
            AS name,
        coalesce(min(project) FILTER (WHERE is_trajectory),
                 arg_min(project, {_BY_START}) FILTER (WHERE project IS NOT NULL)) AS project,
        coalesce(min(experiment) FILTER (WHERE is_trajectory),
                 arg_min(experiment, {_BY_START}) FILTER (WHERE experiment IS NOT NULL))
            AS experiment,
        coalesce(min(step) FILTER (WHERE is_trajectory),
                 arg_min(step, {_BY_START}) FILTER (WHERE step IS NOT NULL)) AS step,
        coalesce(min(sample_index) FILTER (WHERE is_trajectory),
                 arg_min(sample_index, {_BY_START}) FILTER (WHERE sample_index IS NOT NULL))
            AS sample_index,
        coalesce(min(rollout_n) FILTER (WHERE is_trajectory),
                 arg_min(rollout_n, {_BY_START}) FILTER (WHERE rollout_n IS NOT NULL))
            AS rollout_n,
        coalesce(bool_or(validate) FILTER (WHERE is_trajectory),
                 arg_min(validate, {_BY_START}) FILTER (WHERE validate IS NOT NULL)) AS validate,
        coalesce(min(reward) FILTER (WHERE is_trajectory),
                 arg_min(reward, {_BY_START}) FILTER (WHERE reward IS NOT NULL),
                 arg_min(eval_score, {_BY_START}) FILTER (WHERE eval_score IS NOT NULL)) AS reward,
        arg_min(eval_label, {_BY_START}) FILTER (WHERE eval_label IS NOT NULL) AS reward_label,
        CASE WHEN bool_or(is_trajectory) THEN coalesce(
            min(sampling_weight) FILTER (WHERE is_trajectory AND sampling_weight >= 0), 1.0)
             ELSE 0.0 END AS weight,
        coalesce(min(turns) FILTER (WHERE is_trajectory),
                 arg_min(turns, {_BY_START}) FILTER (WHERE turns IS NOT NULL)) AS turns,
        count(*) AS spans,
        count(*) FILTER (WHERE is_llm) AS llm_calls,
        least(coalesce(sum(tokens_in) FILTER (WHERE is_llm), 0), {_MAX})::BIGINT AS tokens_in,
        least(coalesce(sum(tokens_out) FILTER (WHERE is_llm), 0), {_MAX})::BIGINT AS tokens_out,
        count(*) FILTER (WHERE is_tool) AS tool_calls,
        count(*) FILTER (WHERE tool_error) AS tool_errors,
        count(*) FILTER (WHERE StatusCode = 'Error') AS errors,
        arg_min(error_text, {_BY_START}) FILTER (WHERE error_text IS NOT NULL) AS error,
        coalesce(min(start_ns) FILTER (WHERE is_trajectory), min(start_ns)) AS start_ns,
        coalesce(min(start_ns::HUGEINT + Duration) FILTER (WHERE is_trajectory),
                 max(start_ns::HUGEINT + Duration)) AS end_ns,
        least(coalesce(sum(Duration) FILTER (WHERE is_llm), 0), {_MAX})::BIGINT AS llm_ns,
        bool_or(is_trajectory) AS rooted,
        min(sampling_reason) FILTER (WHERE is_trajectory) AS sampling_reason,
        coalesce(min(termination) FILTER (WHERE is_trajectory),
                 arg_min(termination, {_BY_START}) FILTER (WHERE termination IS NOT NULL))
            AS termination,
        arg_max(finish_reason, {_BY_START}) FILTER (WHERE is_llm AND finish_reason IS NOT NULL)
            AS finish_reason,
        coalesce(min(policy_version) FILTER (WHERE is_trajectory),
                 arg_min(policy_version, {_BY_START}) FILTER (WHERE policy_version IS NOT NULL))
            AS policy_version__TEXT_T__
    FROM a WHERE tk IS NOT NULL GROUP BY TraceId, tk)
SELECT trace_id || ':' || span_id AS key, trace_id, span_id, name, project, experiment, step,
    sample_index, rollout_n, validate,
    concat_ws('/', coalesce(experiment, '~'), coalesce(validate::VARCHAR, '~'),
              coalesce(step::VARCHAR, '~'), coalesce(sample_index::VARCHAR, '~')) AS group_key,
    reward, reward_label, weight, turns, spans, llm_calls, tokens_in, tokens_out, tool_calls,
    tool_errors, errors, error, start_ns,
    least(end_ns - start_ns, {_MAX})::BIGINT AS duration_ns, llm_ns,
    CASE WHEN errors > 0 THEN 'error' WHEN NOT rooted THEN 'partial' ELSE 'ok' END AS status,
    sampling_reason, termination, finish_reason, policy_version__TEXT_F__
FROM t
"""
#: the viewer's text columns of a trajectory row (the SQLite index's rule, ``_row_of_trajectory``:
#: the first prompt and the last answer of its spans by (start, span id), cut at 400
#: characters; ``search``: prompt, answer, tool calls and the error, lower-cased, 4000 at most)
TEXT_COLUMNS = ("prompt", "response", "search")
_TEXT_S = ", text_prompt, text_response, text_tool"
_ORDER = "(coalesce(start_ns, 0), SpanId)"
_TEXT_T = f""",
        arg_min(text_prompt, {_ORDER}) FILTER (WHERE text_prompt IS NOT NULL) AS text_prompt,
        arg_max(text_response, {_ORDER}) FILTER (WHERE text_response IS NOT NULL)
            AS text_response,
        list(text_tool ORDER BY {_ORDER}) FILTER (WHERE text_tool IS NOT NULL) AS text_tools"""
_SNIPPET_SQL = ("CASE WHEN coalesce({c}, '') = '' THEN NULL WHEN length({c}) <= 400 THEN {c} "
                "ELSE left({c}, 399) || '…' END")
_TEXT_F = (", " + _SNIPPET_SQL.format(c="text_prompt") + " AS prompt, "
           + _SNIPPET_SQL.format(c="text_response") + " AS response, "
           "lower(left(array_to_string(list_concat([coalesce(text_prompt, ''), "
           "coalesce(text_response, '')], coalesce(text_tools, []), CASE WHEN coalesce(error, '') "
           "<> '' THEN [error] ELSE [] END), chr(10)), 4000)) AS search")


def trajectories_sql(source: str = "spans", *, texts: bool = False) -> str:
    """:data:`TRAJECTORIES_SQL` over another relation of span rows (``texts``: with the
    viewer's :data:`TEXT_COLUMNS` too, from the spans' ``text_*`` columns)."""
    sql = _TRAJECTORIES_TEMPLATE.replace("__SOURCE__", source).replace(
        "__DUPLICATE_ORDER__", DUPLICATE_ORDER.format(
            t="".join(f", {c} NULLS LAST" for c in _TEXT_S.strip(", ").split(", ")) if texts
            else ""))
    for mark, text in (("__TEXT_S__", _TEXT_S), ("__TEXT_T__", _TEXT_T),
                       ("__TEXT_F__", _TEXT_F)):
        sql = sql.replace(mark, text if texts else "")
    return sql


#: the trajectory model in SQL (over the ``spans`` view)
TRAJECTORIES_SQL = trajectories_sql("__SOURCE__")

#: the weighted step statistics (the one implementation; docs/sampling.md)
STEPS_SQL = """
SELECT experiment, validate, step,
    count(*) AS trajectories,
    count(*) FILTER (WHERE span_id <> '') AS traced,
    count(*) FILTER (WHERE span_id = '') AS partial,
    sum(weight) AS weight,
    sum(weight) AS estimated,
    sum(weight * reward) / nullif(sum(weight) FILTER (WHERE reward IS NOT NULL), 0)
        AS reward_mean,
    sum(weight * reward * reward) / nullif(sum(weight) FILTER (WHERE reward IS NOT NULL), 0)
        AS reward_mean_sq,
    avg(reward) FILTER (WHERE span_id <> '') AS reward_mean_unweighted,
    coalesce(sum(weight) FILTER (WHERE reward > 0), 0)
        / nullif(sum(weight) FILTER (WHERE reward IS NOT NULL), 0) AS pass_rate,
    min(reward) AS reward_min, max(reward) AS reward_max,
    coalesce(sum(weight) FILTER (WHERE errors > 0), 0) / nullif(sum(weight), 0) AS error_rate,
    count(*) FILTER (WHERE errors > 0) AS with_errors,
    avg(turns) AS turns_mean,
    sum(weight * tokens_in) / nullif(sum(weight), 0) AS tokens_in_mean,
    sum(weight * tokens_out) / nullif(sum(weight), 0) AS tokens_out_mean,
    sum(tool_calls) AS tool_calls, sum(tool_errors) AS tool_errors,
    avg(duration_ns) AS duration_mean_ns, max(duration_ns) AS duration_max_ns,
    avg(llm_ns) AS llm_mean_ns,
    count(DISTINCT sample_index) AS prompts,
    histogram(coalesce(sampling_reason, 'unknown')) FILTER (WHERE span_id <> '') AS by_reason,
    list(DISTINCT sampling_reason) FILTER (WHERE sampling_reason IS NOT NULL)
        AS sampling_reasons
FROM __SOURCE__
GROUP BY experiment, validate, step
"""


def steps_sql(source: str = "trajectories") -> str:
    """:data:`STEPS_SQL` over another relation of trajectory rows."""
    return STEPS_SQL.replace("__SOURCE__", source)


#: columns :meth:`Lake.trajectories` may order by
TRAJECTORY_ORDER = frozenset({
    "trace_id", "span_id", "name", "project", "experiment", "step", "sample_index", "rollout_n",
    "validate", "reward", "reward_label", "weight", "turns", "spans", "llm_calls", "tokens_in",
    "tokens_out", "tool_calls", "tool_errors", "errors", "start_ns", "duration_ns", "llm_ns",
    "status", "sampling_reason", "termination", "finish_reason", "policy_version"})


@dataclass
class LakeState:
    """What the last :meth:`Lake.refresh` saw."""

    segments: int = 0
    segment_rows: int = 0
    raw_files: int = 0
    raw_bytes: int = 0
    raw_spans: int = 0
    trajectories: int = 0
    bad_spans: int = 0
    bad_lines: int = 0
    truncated_lines: int = 0
    cached: bool = False  # the segments' trajectories came from compaction's cache
    cache: str | None = None  # that file
    problems: list[str] = field(default_factory=list)


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _as_ints(table: pa.Table) -> pa.Table:
    """Times as int nanoseconds (Python's datetime has no nanoseconds)."""
    for name, kind in (("Timestamp", pa.int64()), ("Events.Timestamp", pa.list_(pa.int64()))):
        index = table.schema.get_field_index(name)
        table = table.set_column(index, name, table.column(index).cast(kind))
    return table


def cache_path(lake: str, runs: int) -> str:
    """Where compaction leaves the segments' ``trajectories`` rows for manifest run ``runs``."""
    return os.path.join(lake, "trajectories", f"cache-{runs}.parquet")


def _part_key(experiment: Any, step: Any) -> tuple[str, str]:
    """The partition directories of an (experiment, step), as compaction names them."""
    return ("experiment=" + (NULL_PART if experiment is None else
                             urllib.parse.quote(str(experiment), safe="")),
            "step=" + (NULL_PART if step is None else str(step)))


def _drop(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """Drop the table or view ``name`` of the main schema, whichever it is."""
    for kind, catalog in (("TABLE", "duckdb_tables()"), ("VIEW", "duckdb_views()")):
        if con.execute(f"SELECT count(*) FROM {catalog} WHERE schema_name = 'main' AND "
                       f"{'table_name' if kind == 'TABLE' else 'view_name'} = ?",
                       [name]).fetchall()[0][0]:
            con.execute(f"DROP {kind} {name}")


_WITHOUT_TEXT = f"SELECT * EXCLUDE ({', '.join(TEXT_COLUMNS)}) FROM trajectories_text"


def _has_texts(texts: str) -> bool:
    """Whether compaction's text file is there (a lake compacted before it was written is
    not read from its cache: the rows are built again from the segments)."""
    try:
        return set(TEXT_COLUMNS) <= set(pq.read_schema(texts).names)
    except (OSError, pa.ArrowException):
        return False


def texts_path(lake: str, runs: int) -> str:
    """The viewer's text of the :func:`cache_path` rows, row for row (``prompt``,
    ``response``, ``search``)."""
    return os.path.join(lake, "trajectories", f"texts-{runs}.parquet")


def traces_path(lake: str, runs: int) -> str:
    """``trace_id -> (experiment, step)`` of the segments' trajectories, sorted by trace id."""
    return os.path.join(lake, "trajectories", f"traces-{runs}.parquet")


def locator_path(lake: str, runs: int) -> str:
    """Where each trace's rows sit: ``TraceId -> (segment, row, rows)`` for every span and
    payload segment of manifest run ``runs`` (:data:`LOCATOR_SCHEMA`), sorted by trace id. A
    trajectory page reads only the row groups it names (:meth:`Lake.trajectory`)."""
    return os.path.join(lake, "trajectories", f"locate-{runs}.parquet")


#: a locator row: ``rows`` rows from row ``row`` of ``segment`` (relative to the lake) hold
#: spans (or payloads) of trace ``TraceId`` (a trace whose rows are not contiguous in a
#: segment has one row per run of them)
LOCATOR_SCHEMA = pa.schema([("TraceId", pa.string()), ("segment", pa.string()),
                            ("row", pa.int64()), ("rows", pa.int64())])
#: locator rows per row group: a lookup reads one (~0.7 ms); a reader parses the footer and
#: the groups' statistics once, ~5 ms at 1M trajectories (~600 groups; 2048 rows: ~1,200 groups,
#: ~14 ms)
_LOCATOR_GROUP = 4096


def _locate_segment(lake: str, rel: str) -> pa.Table:
    """The locator rows of one segment: each run of equal ``TraceId`` (segments are sorted by
    trace: one run per trace), read back from the file itself."""
    ids = pq.read_table(os.path.join(lake, rel), columns=["TraceId"],
                        use_threads=False).column(0).combine_chunks()
    n = len(ids)
    if n == 0:
        return LOCATOR_SCHEMA.empty_table()
    change = pc.not_equal(ids.slice(1), ids.slice(0, n - 1))
    starts = pa.concat_arrays([pa.array([0], pa.int64()), pc.add(
        pc.indices_nonzero(change).cast(pa.int64()), 1)])
    ends = pa.concat_arrays([starts.slice(1), pa.array([n], pa.int64())])
    return pa.table([ids.take(starts), pa.array([rel] * len(starts), pa.string()), starts,
                     pc.subtract(ends, starts)], schema=LOCATOR_SCHEMA)


def write_locator(lake: str, manifest: Manifest, runs0: int | None, tmp: str) -> None:
    """The locator of ``manifest`` (:func:`locator_path`) into ``tmp``: run ``runs0``'s
    locator (when it is there) for the segments it covers, the others read back (their
    ``TraceId`` column only)."""
    parts: list[pa.Table] = []
    covered: set[str] = set()
    if runs0 is not None:
        with contextlib.suppress(OSError, pa.ArrowException):
            old = pq.read_table(locator_path(lake, runs0))
            if old.schema.remove_metadata().equals(LOCATOR_SCHEMA):
                parts.append(old)
                covered = set(pc.unique(old.column("segment")).to_pylist())
    parts += [_locate_segment(lake, rel) for rel in [*manifest.segments, *manifest.payloads]
              if rel not in covered]
    table = pa.concat_tables(parts) if parts else LOCATOR_SCHEMA.empty_table()
    table = table.take(pc.sort_indices(table, sort_keys=[
        ("TraceId", "ascending"), ("segment", "ascending"), ("row", "ascending")]))
    pq.write_table(table, tmp, row_group_size=_LOCATOR_GROUP, compression="zstd",
                   write_statistics=["TraceId"], use_dictionary=["segment"])


def steps_path(lake: str, runs: int) -> str:
    """The segments' ``steps`` rows, beside :func:`cache_path`."""
    return os.path.join(lake, "trajectories", f"steps-{runs}.parquet")


def reports_path(lake: str, runs: int) -> str:
    """The segments' sampling report rows, beside :func:`cache_path`."""
    return os.path.join(lake, "trajectories", f"reports-{runs}.parquet")


_SQL_TYPES = {f.name: {pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.float64(): "DOUBLE",
                        pa.bool_(): "BOOLEAN"}[f.type] for f in SPAN_SCHEMA
              if f.type in (pa.string(), pa.int64(), pa.float64(), pa.bool_())}


def create_views(con: duckdb.DuckDBPyConnection, segments: list[str], payloads: list[str],
                 excluded: set[str]) -> None:
    """``segment_spans``, ``spans`` and ``payloads`` over the segments and the registered
    ``raw_spans_arrow`` / ``raw_payload_arrow`` tables."""
    where = (f" WHERE source NOT IN ({', '.join(_q(s) for s in sorted(excluded))})"
             if excluded else "")
    names = ", ".join(f'"{n}"' for n in SPAN_SCHEMA.names)
    if segments:
        files = "[" + ", ".join(_q(s) for s in segments) + "]"
        # segments written before a column was added (the text columns) read it as NULL
        held = [set(pq.read_schema(s).names) for s in segments]
        every, some = set.intersection(*held), set.union(*held)
        chosen = ", ".join(f'"{n}"' if n in some or n not in _SQL_TYPES else
                           f'NULL::{_SQL_TYPES[n]} AS "{n}"' for n in SPAN_SCHEMA.names)
        union = ", union_by_name = true" if some != every else ""
        con.execute(f"CREATE OR REPLACE VIEW segment_spans AS SELECT {chosen} FROM "
                    f"read_parquet({files}, hive_partitioning = false{union}){where}")
    else:
        con.execute(f"CREATE OR REPLACE VIEW segment_spans AS SELECT {names} FROM "
                    "raw_spans_arrow WHERE false")
    con.execute(f"CREATE OR REPLACE VIEW spans AS SELECT * FROM segment_spans UNION ALL "
                f"SELECT {names} FROM raw_spans_arrow")
    pnames = ", ".join(f'"{n}"' for n in PAYLOAD_SCHEMA.names)
    if payloads:
        files = "[" + ", ".join(_q(s) for s in payloads) + "]"
        con.execute(f"CREATE OR REPLACE VIEW payloads AS SELECT {pnames} FROM "
                    f"read_parquet({files}, hive_partitioning = false) UNION ALL SELECT {pnames} "
                    "FROM raw_payload_arrow")
    else:
        con.execute("CREATE OR REPLACE VIEW payloads AS SELECT * FROM raw_payload_arrow")


def _cache_complete(lake: str, runs: int) -> bool:
    """Whether run ``runs`` left its whole cache (the files :meth:`Lake.refresh` reads)."""
    return (os.path.exists(cache_path(lake, runs)) and _has_texts(texts_path(lake, runs))
            and os.path.exists(reports_path(lake, runs))
            and os.path.exists(steps_path(lake, runs)))


_REPORT_COLUMNS = "TraceId, SpanId, experiment, validate, step, report_counts"


def write_trajectory_cache(lake: str, manifest: Manifest, new_spans: pa.Table | None = None,
                           before: tuple[int, int, list[str]] | None = None) -> str | None:
    """Compaction's last step: the segments' ``trajectories`` rows, for readers to start from
    (a reader rebuilds the traces its raw lines touch). Written under a temp name, renamed.

    ``new_spans`` and ``before`` (compaction's path): the span rows this run added (their
    :data:`~otel_verl.store._compact.CACHE_COLUMNS`, held in memory: the segments after the
    first ``before[1]`` of ``manifest.segments``) and ``(manifest runs, segments, excluded)``
    when the run began. The rows are then built from them and the earlier segments, not read
    back from the new segments; with run ``before[0]``'s whole cache there and the same
    exclusions, that cache's rows are kept for the traces this run did not touch and only the
    touched traces are built again, from all their spans. The same rows either way."""
    segments = [os.path.join(lake, s) for s in manifest.segments]
    if not segments:
        return None
    excluded = set(manifest.excluded)
    con = duckdb.connect(":memory:")
    try:
        # one thread: compaction's other threads (the read-ahead parse, the segment writers)
        # are done by now, and DuckDB's second thread took ~1.3x the CPU for the same rows
        con.execute("SET enable_progress_bar = false; SET threads = 1")
        con.register("raw_spans_arrow", Columns().table())
        con.register("raw_payload_arrow", Columns().payload_table())
        texts = ", ".join(TEXT_COLUMNS)
        if new_spans is None or before is None:
            create_views(con, segments, [], excluded)
            rows_sql = trajectories_sql("segment_spans", texts=True)
            reports_sql = (f"SELECT DISTINCT ON (TraceId, SpanId) {_REPORT_COLUMNS} FROM "
                           f"segment_spans WHERE is_report ORDER BY {REPORT_ORDER}")
        else:
            runs0, old_count, excluded0 = before
            old = segments[:old_count]
            create_views(con, old, [], excluded)
            con.register("new_spans", new_spans)
            names = ", ".join(f'"{n}"' for n in new_spans.schema.names)
            where = (f" WHERE source NOT IN ({', '.join(_q(s) for s in sorted(excluded))})"
                     if excluded else "")
            fresh = f"SELECT {names} FROM new_spans{where}"
            reuse = bool(old) and set(excluded0) == excluded and _cache_complete(lake, runs0)
            if reuse:
                cache0 = _q(cache_path(lake, runs0))
                texts0 = _q(texts_path(lake, runs0))
                kept = (f"(SELECT * FROM read_parquet({cache0}, hive_partitioning = false) "
                        f"POSITIONAL JOIN read_parquet({texts0}, hive_partitioning = false))")
                expected = [d[0] for d in con.execute(
                    f"SELECT * FROM ({trajectories_sql('segment_spans', texts=True)}) "
                    "LIMIT 0").description or ()]
                reuse = [d[0] for d in con.execute(
                    f"SELECT * FROM {kept} LIMIT 0").description or ()] == expected
            if reuse:
                # the old cache's rows for the traces this run did not touch; the touched
                # ones from all their spans (the earlier segments' and this run's)
                con.execute("CREATE TEMP TABLE touched AS SELECT DISTINCT TraceId FROM new_spans")
                con.execute(f"CREATE TEMP VIEW cache_source AS {fresh} UNION ALL SELECT {names} "
                            "FROM segment_spans WHERE TraceId IN (SELECT TraceId FROM touched)")
                rows_sql = (f"SELECT * FROM {kept} WHERE trace_id NOT IN (SELECT TraceId FROM "
                            "touched) UNION ALL SELECT * FROM "
                            f"({trajectories_sql('cache_source', texts=True)})")
                reports0 = _q(reports_path(lake, runs0))
                reports_sql = (f"SELECT DISTINCT ON (TraceId, SpanId) * FROM (SELECT * FROM "
                               f"read_parquet({reports0}, hive_partitioning = false) UNION ALL "
                               f"SELECT {_REPORT_COLUMNS} FROM new_spans WHERE is_report"
                               f"{where.replace(' WHERE', ' AND')}) ORDER BY {REPORT_ORDER}")
            else:
                con.execute(f"CREATE TEMP VIEW cache_source AS {fresh}" + (
                    f" UNION ALL SELECT {names} FROM segment_spans" if old else ""))
                rows_sql = trajectories_sql("cache_source", texts=True)
                reports_sql = (f"SELECT DISTINCT ON (TraceId, SpanId) {_REPORT_COLUMNS} FROM "
                               f"cache_source WHERE is_report ORDER BY {REPORT_ORDER}")
        final = cache_path(lake, manifest.runs)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        tmp = os.path.join(lake, "tmp", f"cache-{os.getpid()}-{manifest.runs}.parquet")
        # the rows with the viewer's text once (a table, in the cache's order), then two
        # files of the same row order: the cache keeps exactly the trajectories columns (what
        # any reader of this layout unions with its own rows), the text goes beside it (read
        # by position)
        con.execute(f"CREATE TEMP TABLE cache_rows AS SELECT * FROM ({rows_sql}) ORDER BY "
                    "experiment, validate, step, start_ns, trace_id")
        con.execute(f"COPY (SELECT * EXCLUDE ({texts}) FROM cache_rows) TO {_q(tmp)} "
                    "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 8192)")
        final_texts = texts_path(lake, manifest.runs)
        tmp_texts = tmp.replace("cache-", "texts-")
        con.execute(f"COPY (SELECT {texts} FROM cache_rows) TO {_q(tmp_texts)} "
                    "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 8192)")
        final_reports = reports_path(lake, manifest.runs)
        tmp_reports = tmp.replace("cache-", "reports-")
        con.execute(f"COPY ({reports_sql}) TO {_q(tmp_reports)} (FORMAT parquet)")
        final_traces = traces_path(lake, manifest.runs)
        tmp_traces = tmp.replace("cache-", "traces-")
        con.execute("COPY (SELECT trace_id, experiment, step FROM cache_rows ORDER BY trace_id) "
                    f"TO {_q(tmp_traces)} (FORMAT parquet, ROW_GROUP_SIZE 4096)")
        final_steps = steps_path(lake, manifest.runs)
        tmp_steps = tmp.replace("cache-", "steps-")
        con.execute("COPY (" + steps_sql(f"(SELECT * EXCLUDE ({texts}) FROM cache_rows)")
                    + f") TO {_q(tmp_steps)} (FORMAT parquet)")
    finally:
        con.close()
    final_locator = locator_path(lake, manifest.runs)
    tmp_locator = tmp.replace("cache-", "locate-")
    write_locator(lake, manifest, before[0] if before is not None else None, tmp_locator)
    for path in (tmp, tmp_reports, tmp_steps, tmp_traces, tmp_texts, tmp_locator):
        with open(path, "rb+") as handle:
            os.fsync(handle.fileno())
    os.replace(tmp_texts, final_texts)
    os.replace(tmp_traces, final_traces)
    os.replace(tmp_locator, final_locator)
    os.replace(tmp_reports, final_reports)
    os.replace(tmp_steps, final_steps)
    os.replace(tmp, final)
    keep = {os.path.basename(p) for p in (final, final_reports, final_steps, final_traces,
                                          final_texts, final_locator)}
    # an earlier run's files go once no reader can still be on them: a lake opened on the
    # previous manifest (the viewer's, until its next poll) reads them per request
    now = time.time()
    for name in os.listdir(os.path.dirname(final)):
        path = os.path.join(os.path.dirname(final), name)
        with contextlib.suppress(OSError):
            if name not in keep and now - os.stat(path).st_mtime > CACHE_GRACE_S:
                os.remove(path)
    return final


def _copy_order(row: dict[str, Any]) -> tuple[Any, ...]:
    """:data:`DUPLICATE_ORDER` for a span row as :meth:`Lake.trajectory` reads it (``Timestamp``
    in int nanoseconds): the later end, the more complete, then each column (None last)."""
    values = [row["Timestamp"] if c == "start_ns" else row[c] for c in _MODEL_COLUMNS]
    values += [row.get(c) for c in _TEXT_S.strip(", ").split(", ")]
    end = (row["Timestamp"] + row["Duration"]
           if row["Timestamp"] is not None and row["Duration"] is not None else None)
    return (end is None, -(end or 0), -sum(v is not None for v in values[:len(_MODEL_COLUMNS)]),
            *((v is None, v if v is not None else 0) for v in values))


def _first_copies(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with one copy of each span id: the first by :data:`DUPLICATE_ORDER` (the copy
    the ``trajectories`` rows read), whatever order the copies came in."""
    if len({row["SpanId"] for row in rows}) == len(rows):
        return rows
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        held = best.get(row["SpanId"])
        if held is None or _copy_order(row) < _copy_order(held):
            best[row["SpanId"]] = row
    return list(best.values())


class Lake:
    """The store as DuckDB views (see the module docstring for the schema).

    Thread-safe: one lock around the connection (DuckDB connections are not shared across
    threads otherwise).
    """

    def __init__(self, trace_dir: str | os.PathLike[str]) -> None:
        self.trace_dir = os.path.abspath(os.fspath(trace_dir))
        self.lake_dir = lake_dir(self.trace_dir)
        self._con = duckdb.connect(":memory:")
        self._con.execute("SET enable_progress_bar = false")
        self._lock = threading.RLock()
        self._segments: list[str] = []
        self._partitions: dict[tuple[str, str], list[str]] = {}
        self._footers: dict[str, tuple[pq.ParquetFile, list[tuple[str, str]]]] = {}
        self._raw: pa.Table = Columns().table()
        self._raw_payload: pa.Table = Columns().payload_table()
        self._payload_files: list[str] = []
        self._excluded: set[str] = set()
        self._exclusion = ""
        self._views_pending: tuple[list[str], list[str], set[str]] | None = None
        self._steps_ready = False
        self._traces_index: str | None = None
        self._locator: str | None = None
        self._known: set[str] = set()  # the segments (span and payload) the manifest names
        self._span_set: set[str] = set()
        #: a segment's reader and its row groups' first rows (and the count past the last)
        self._readers: dict[str, tuple[pq.ParquetFile, list[int]]] = {}
        self._bounds: dict[str, list[str]] = {}  # the locator's row groups' first trace ids
        self.state = LakeState()

    @classmethod
    def open(cls, trace_dir: str | os.PathLike[str],
             progress: Callable[[int], None] | None = None) -> Lake:
        """Open a store (a directory ``backend="file"`` writes, compacted or not).

        ``progress`` is called with the bytes of each raw (not compacted) file read.

        Raises:
            FileNotFoundError: ``trace_dir`` does not exist.
        """
        if not os.path.isdir(trace_dir):
            raise FileNotFoundError(f"no trace directory at {trace_dir}")
        lake = cls(trace_dir)
        lake.refresh(progress)
        return lake

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def __enter__(self) -> Lake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- loading ------------------------------------------------------------------------------

    def refresh(self, progress: Callable[[int], None] | None = None) -> LakeState:
        """Re-read the manifest and the raw lines not compacted; rebuild ``trajectories``."""
        with self._lock:
            manifest = Manifest.load(self.lake_dir)
            state = LakeState()
            columns = Columns()
            excluded = set(manifest.excluded)
            counts: dict[str, int] = {}
            for path in list_files(self.trace_dir):
                rel = os.path.relpath(path, self.trace_dir)
                if rel.startswith(SKIP_DIRS):
                    continue
                try:
                    size = os.stat(path).st_size
                except OSError:
                    continue
                start, gen = raw_start(manifest, rel, path, size)
                entry = manifest.sources.get(rel)
                if entry is not None and gen != entry["gen"]:  # replaced since compacted
                    excluded.add(Manifest.source_id(rel, entry["gen"]))
                if size <= start:
                    continue
                state.raw_files += 1
                state.raw_bytes += size - start
                try:
                    decode_range(path, start, None, columns, Manifest.source_id(rel, gen),
                                 counts, state.problems)
                except OSError as error:
                    state.problems.append(f"{rel}: {error}")
                if progress is not None:
                    progress(size - start)
            state.bad_spans = counts.get("bad_spans", 0)
            state.bad_lines = counts.get("bad_lines", 0)
            state.truncated_lines = counts.get("truncated_lines", 0)
            raw = columns.table()
            raw_payload = columns.payload_table()
            state.raw_spans = raw.num_rows
            self._raw = raw
            self._raw_payload = raw_payload
            self._excluded = excluded
            con = self._con
            con.register("raw_spans_arrow", raw)
            con.register("raw_payload_arrow", raw_payload)
            segments = [os.path.join(self.lake_dir, s) for s in manifest.segments]
            payloads = [os.path.join(self.lake_dir, s) for s in manifest.payloads]
            self._segments = segments
            state.segments = len(segments)
            self._views_pending = (segments, payloads, excluded)
            self._exclusion = (f" AND source NOT IN ({', '.join(_q(s) for s in sorted(excluded))})"
                               if excluded else "")
            cache = cache_path(self.lake_dir, manifest.runs)
            reports = reports_path(self.lake_dir, manifest.runs)
            con.execute("CREATE OR REPLACE TEMP VIEW raw_reports AS SELECT TraceId, SpanId, "
                        "experiment, validate, step, report_counts FROM raw_spans_arrow "
                        "WHERE is_report")
            if (segments and excluded == set(manifest.excluded) and _has_texts(texts_path(self.lake_dir, manifest.runs))
                    and os.path.exists(reports)
                    and os.path.exists(steps_path(self.lake_dir, manifest.runs))):
                # the segments' trajectories as compaction left them; the traces the raw
                # lines touch are built again from all their spans
                _drop(con, "trajectories")
                cached = f"read_parquet({_q(cache)}, hive_partitioning = false)"
                texts = texts_path(self.lake_dir, manifest.runs)
                cached_text = (f"(SELECT * FROM {cached} POSITIONAL JOIN read_parquet("
                               f"{_q(texts)}, hive_partitioning = false))")
                cached_steps = (f"read_parquet({_q(steps_path(self.lake_dir, manifest.runs))}, "
                                "hive_partitioning = false)")
                con.execute(
                    "CREATE OR REPLACE VIEW reports AS SELECT * FROM "
                    f"read_parquet({_q(reports)}, hive_partitioning = false) "
                    "UNION ALL SELECT * FROM raw_reports")
                if not raw.num_rows:  # everything compacted: compaction's rows as they are
                    con.execute("CREATE OR REPLACE VIEW trajectories_text AS SELECT * FROM "
                                f"{cached_text}")
                    con.execute(f"CREATE OR REPLACE VIEW trajectories AS SELECT * FROM {cached}")
                    con.execute(f"CREATE OR REPLACE VIEW steps AS SELECT * FROM {cached_steps}")
                else:
                    self._ensure_views()
                    self._touched(con, cached, cached_text, cached_steps)
                state.cached = True
                state.cache = texts
            else:
                self._ensure_views()
                _drop(con, "trajectories")
                con.execute("CREATE OR REPLACE TABLE trajectories_all AS "
                            f"{trajectories_sql(texts=True)}")
                con.execute("CREATE OR REPLACE VIEW trajectories_text AS SELECT * FROM "
                            "trajectories_all")
                con.execute(f"CREATE OR REPLACE VIEW trajectories AS {_WITHOUT_TEXT}")
                con.execute("CREATE OR REPLACE VIEW reports AS SELECT TraceId, SpanId, experiment, "
                            "validate, step, report_counts FROM spans WHERE is_report")
                con.execute(f"CREATE OR REPLACE VIEW steps AS {steps_sql()}")
            self._steps_ready = False
            self._traces_index = (traces_path(self.lake_dir, manifest.runs) if state.cached
                                  else None)
            locator = locator_path(self.lake_dir, manifest.runs)
            self._locator = locator if state.cached and os.path.exists(locator) else None
            self._known = set(segments) | set(payloads)
            self._span_set = set(segments)
            self._payload_files = payloads
            self._partitions = self._partition_files(segments)
            state.segment_rows = manifest.rows
            state.trajectories = con.execute("SELECT count(*) FROM trajectories").fetchall()[0][0]
            self.state = state
            return state

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection holding the views (all of them bound: direct use may read any).
        Hold :attr:`_lock` while using it from several threads."""
        with self._lock:
            self._ensure_views()
            return self._con

    def _ensure_views(self) -> None:
        """``segment_spans`` / ``spans`` / ``payloads``, created on first use (binding them
        reads every segment's footer: an overview of a compacted store needs none of them)."""
        pending, self._views_pending = self._views_pending, None
        if pending is not None:
            create_views(self._con, *pending)

    # --- queries ------------------------------------------------------------------------------

    def sql(self, query: str, params: list[Any] | None = None) -> duckdb.DuckDBPyRelation:
        """Any SQL over ``spans``, ``payloads``, ``trajectories`` and ``steps``; a DuckDB
        relation (``.fetchall()``, ``.arrow()``, ``.df()``, ``.pl()``)."""
        with self._lock:
            self._ensure_views()
            return self._con.sql(query, params=params or None)

    def rows(self, query: str, params: list[Any] | dict[str, Any] | None = None, *,
             spans: bool = True) -> list[dict[str, Any]]:
        """The rows of a query as dicts (``spans=False``: the query reads none of ``spans``,
        ``segment_spans``, ``payloads``)."""
        with self._lock:
            if spans:
                self._ensure_views()
            cursor = self._con.execute(query, params or [])
            names = [d[0] for d in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def steps(self, experiment: str | None = None) -> list[dict[str, Any]]:
        """Per (experiment, validate, step): the weighted statistics (``steps`` view), with the
        workers' sampling reports (``ran``, ``dropped``) and steps that only have reports."""
        where, params = ("WHERE experiment = ?", [experiment]) if experiment is not None \
            else ("", [])
        with self._lock:
            if not self._steps_ready:
                if self._views_pending is not None and not self.state.cached:
                    self._ensure_views()
                self._con.execute("CREATE OR REPLACE TABLE steps_table AS "
                                        "SELECT * FROM steps")
                self._steps_ready = True
            out = self.rows(f"SELECT * FROM steps_table {where}", params, spans=False)
        for row in out:
            mean, mean_sq = row["reward_mean"], row.pop("reward_mean_sq")
            row["reward_std"] = (math.sqrt(max(mean_sq - mean * mean, 0.0))
                                 if mean is not None else None)
            row["by_reason"] = dict(row["by_reason"] or {})
            row["sampling_reasons"] = sorted(row["sampling_reasons"] or [])
            row["ran"] = row["dropped"] = None
        reports = self.sampling_reports()
        for row in out:
            counts = reports.pop((row["experiment"], row["validate"], row["step"]), None)
            if counts is not None:
                row["ran"], row["dropped"] = counts.get("ran", 0), counts.get("dropped", 0)
        for (exp, validate, step), counts in reports.items():
            if experiment is not None and exp != experiment:
                continue
            out.append({"experiment": exp, "validate": validate, "step": step,
                        "trajectories": 0, "traced": 0, "weight": 0.0, "estimated": 0.0,
                        "by_reason": {}, "ran": counts.get("ran", 0),
                        "dropped": counts.get("dropped", 0)})
        out.sort(key=lambda r: (str(r["experiment"]), bool(r["validate"]),
                                r["step"] if r["step"] is not None else -(2**63)))
        return out

    overview = steps

    def sampling_reports(self) -> dict[tuple[Any, Any, Any], dict[str, int]]:
        """The workers' ``otel_verl.sampling_report`` counts summed per step."""
        totals: dict[tuple[Any, Any, Any], dict[str, int]] = {}
        for row in self.rows("SELECT DISTINCT ON (TraceId, SpanId) experiment, validate, step, "
                             f"report_counts FROM reports ORDER BY {REPORT_ORDER}",
                             spans=not self.state.cached):
            exp, validate, step, counts = row.values()
            into = totals.setdefault((exp, validate, step), {})
            for name, value in (counts or {}).items():
                into[name] = into.get(name, 0) + value
        return totals

    def flat_groups(self, experiment: str | None = None) -> list[dict[str, Any]]:
        """Per step: GRPO groups (>1 rollout with a reward) and those with one reward for all
        (zero advantage: no learning signal)."""
        where, params = ("AND experiment = ?", [experiment]) if experiment is not None \
            else ("", [])
        return self.rows(f"""
            SELECT experiment, validate, step, count(*) AS groups,
                   count(*) FILTER (WHERE lo = hi) AS flat_groups FROM (
                SELECT experiment, validate, step, sample_index, min(reward) lo, max(reward) hi
                FROM trajectories WHERE reward IS NOT NULL AND sample_index IS NOT NULL {where}
                GROUP BY experiment, validate, step, sample_index HAVING count(*) > 1)
            GROUP BY experiment, validate, step ORDER BY experiment, validate, step""", params)

    def trajectories(self, *, experiment: str | None = None, step: int | None = None,
                     sample_index: int | None = None, rollout_n: int | None = None,
                     validate: bool | None = None, status: str | None = None,
                     reward_min: float | None = None, reward_max: float | None = None,
                     errors_only: bool = False, trace_id: str | None = None,
                     order: str = "start_ns", descending: bool = False,
                     limit: int | None = 50, offset: int = 0) -> dict[str, Any]:
        """One page of trajectory rows matching every filter, and the total count.

        The filters are the viewer's and ``traces list``'s
        (:func:`otel_verl.store._filters.filter_clauses`, checked the same way: a numpy integer
        is an integer, a bool or a string is not).

        Returns:
            ``{"total": int, "rows": [dict, ...]}`` (row keys: the ``trajectories`` columns).

        Raises:
            BadRequest: a filter, ``limit`` or ``offset`` of the wrong type or range.
        """
        found = filter_clauses(DUCKDB, experiment=experiment, step=step,
                               sample_index=sample_index, rollout_n=rollout_n,
                               validate=validate, status=status, reward_min=reward_min,
                               reward_max=reward_max, errors_only=errors_only,
                               trace_id=trace_id)
        where, params = found.where, list(found.params)
        limit = query_int("limit", limit)
        offset = query_int("offset", offset) or 0
        if order not in TRAJECTORY_ORDER:
            order = "start_ns"
        direction = "DESC" if descending else "ASC"
        total = self.rows(f"SELECT count(*) AS n FROM trajectories {where}", params,
                          spans=not self.state.cached)
        page = "" if limit is None else f" LIMIT {max(0, limit)} OFFSET {max(0, offset)}"
        rows = self.rows(
            f"SELECT * FROM trajectories {where} ORDER BY {order} {direction} NULLS LAST, "
            f"step, sample_index, rollout_n, key{page}", params, spans=not self.state.cached)
        return {"total": total[0]["n"], "rows": rows}

    @staticmethod
    def _touched(con: duckdb.DuckDBPyConnection, cached: str, cached_text: str,
                 cached_steps: str) -> None:
        """Views over compaction's rows where the raw lines' traces (and their steps, now and
        as compacted) are aggregated again from all their spans."""
        con.execute("CREATE OR REPLACE TEMP TABLE raw_traces AS "
                    "SELECT DISTINCT TraceId FROM raw_spans_arrow")
        con.execute("CREATE OR REPLACE TEMP VIEW touched_spans AS SELECT * FROM spans "
                    "WHERE TraceId IN (SELECT TraceId FROM raw_traces)")
        con.execute("CREATE OR REPLACE TABLE touched_trajectories AS "
                    f"{trajectories_sql('touched_spans', texts=True)}")
        con.execute(
            f"CREATE OR REPLACE VIEW trajectories_text AS SELECT * FROM {cached_text} WHERE "
            "trace_id NOT IN (SELECT TraceId FROM raw_traces) UNION ALL "
            "SELECT * FROM touched_trajectories")
        con.execute(
            f"CREATE OR REPLACE VIEW trajectories AS SELECT * FROM {cached} WHERE "
            "trace_id NOT IN (SELECT TraceId FROM raw_traces) UNION ALL "
            f"SELECT * EXCLUDE ({', '.join(TEXT_COLUMNS)}) FROM touched_trajectories")
        con.execute(
            "CREATE OR REPLACE TEMP TABLE touched_steps AS "
            "SELECT DISTINCT experiment, validate, step FROM touched_trajectories UNION "
            f"SELECT DISTINCT experiment, validate, step FROM {cached} "
            "WHERE trace_id IN (SELECT TraceId FROM raw_traces)")
        match = ("t.experiment IS NOT DISTINCT FROM x.experiment AND t.validate IS NOT "
                 "DISTINCT FROM x.validate AND t.step IS NOT DISTINCT FROM x.step")
        con.execute(
            f"CREATE OR REPLACE VIEW steps AS SELECT * FROM {cached_steps} x "
            f"WHERE NOT EXISTS (SELECT 1 FROM touched_steps t WHERE {match}) UNION ALL "
            "SELECT * FROM (" + steps_sql(
                "(SELECT * FROM trajectories x WHERE EXISTS (SELECT 1 FROM touched_steps "
                f"t WHERE {match}))") + ")")

    @staticmethod
    def _partition_files(segments: list[str]) -> dict[tuple[str, str], list[str]]:
        """Segment files by their partition directory (``experiment=..``, ``step=..``)."""
        out: dict[tuple[str, str], list[str]] = {}
        for path in segments:
            step_dir = os.path.dirname(path)
            key = (os.path.basename(os.path.dirname(step_dir)), os.path.basename(step_dir))
            out.setdefault(key, []).append(path)
        return out

    def _row_groups(self, path: str, column_name: str = "TraceId"
                    ) -> tuple[pq.ParquetFile, list[tuple[str, str]]]:
        """A segment's reader and its row groups' ``TraceId`` ranges (cached: segments never
        change once written)."""
        found = self._footers.get(path)
        if found is None:
            reader = pq.ParquetFile(path, memory_map=True)
            meta = reader.metadata
            column = [meta.schema.column(i).name for i in range(meta.num_columns)].index(
                column_name)
            ranges = []
            for g in range(meta.num_row_groups):
                stats = meta.row_group(g).column(column).statistics
                ranges.append((stats.min, stats.max) if stats is not None and stats.has_min_max
                              else ("", "\uffff"))
            found = self._footers[path] = (reader, ranges)
        return found

    def _located(self, trace_id: str) -> dict[str, list[tuple[int, int]]] | None:
        """``{segment path: [(first row, rows), ...]}`` of one trace from compaction's locator
        (:func:`locator_path`): one row group of it read; None without a locator."""
        if self._locator is None:
            return None
        try:
            reader, ranges = self._row_groups(self._locator)
        except OSError:  # gone (a later compaction's, past CACHE_GRACE_S): the partitions
            return None
        bounds = self._bounds.get(self._locator)
        if bounds is None:
            bounds = self._bounds[self._locator] = [lo for lo, _ in ranges]
        if bounds != sorted(bounds):  # (no statistics: every group may hold it)
            groups = [g for g, (lo, hi) in enumerate(ranges) if lo <= trace_id <= hi]
        else:  # sorted by trace id: the last group starting at or before it, and any before
            groups = []  # it that end with it
            g = bisect.bisect_right(bounds, trace_id) - 1
            while g >= 0 and ranges[g][1] >= trace_id:
                groups.insert(0, g)
                g -= 1
        out: dict[str, list[tuple[int, int]]] = {}
        if not groups:
            return out
        table = reader.read_row_groups(groups, use_threads=False)
        table = table.filter(pc.equal(table.column("TraceId"), pa.scalar(trace_id, pa.string())))
        for segment, row, rows in zip(table.column("segment").to_pylist(),
                                      table.column("row").to_pylist(),
                                      table.column("rows").to_pylist(), strict=True):
            path = os.path.join(self.lake_dir, segment)
            if path in self._known:
                out.setdefault(path, []).append((row, rows))
        return out

    def _read_rows(self, path: str, runs: list[tuple[int, int]], trace_id: str,
                   columns: list[str] | None = None) -> pa.Table:
        """The rows of ``trace_id`` among ``runs`` (first row, rows) of a segment: only the
        row groups holding them are read."""
        found = self._readers.get(path)
        if found is None:
            reader = pq.ParquetFile(path, memory_map=True)
            meta = reader.metadata
            starts = [0]
            for g in range(meta.num_row_groups):
                starts.append(starts[-1] + meta.row_group(g).num_rows)
            found = self._readers[path] = (reader, starts)
        reader, starts = found
        groups = sorted({g for row, rows in runs for g in range(
            max(0, bisect.bisect_right(starts, row) - 1),
            min(len(starts) - 1, bisect.bisect_right(starts, row + max(rows, 1) - 1)))})
        if not groups:
            return reader.schema_arrow.empty_table() if columns is None else \
                reader.schema_arrow.empty_table().select(columns)
        table = reader.read_row_groups(groups, columns=columns, use_threads=False)
        at, pos = {}, 0  # each group's first row in ``table``
        for g in groups:
            at[g] = pos
            pos += starts[g + 1] - starts[g]
        pieces = []
        for row, rows in runs:
            g = bisect.bisect_right(starts, row) - 1
            if g in at:
                pieces.append(table.slice(at[g] + row - starts[g], rows))
        table = pa.concat_tables(pieces) if len(pieces) != 1 else pieces[0]
        same = pc.equal(table.column("TraceId"), pa.scalar(trace_id, pa.string()))
        # the locator's runs hold only the trace's rows (a filter of every column costs more)
        return table if pc.all(same).as_py() is not False else table.filter(same)

    def _scan_partitions(self, trace_id: str) -> list[pa.Table]:
        """The rows of ``trace_id`` in the segments of its partitions (the trace index or the
        ``trajectories`` rows say which; the raw rows' too) and of the spans without a step,
        pruned by the row groups' ``TraceId`` ranges: a lake without a locator."""
        key = pa.scalar(trace_id, pa.string())
        where: set[tuple[str, str]] | None = None
        if self._traces_index is not None and os.path.exists(self._traces_index):
            reader, ranges = self._row_groups(self._traces_index, "trace_id")
            groups = [g for g, (lo, hi) in enumerate(ranges) if lo <= trace_id <= hi]
            if groups:
                table = reader.read_row_groups(groups, use_threads=False)
                table = table.filter(pc.equal(table["trace_id"], key))
                where = {_part_key(e, st) for e, st in zip(
                    table.column("experiment").to_pylist(), table.column("step").to_pylist(),
                    strict=True)}
        else:
            where = {_part_key(r["experiment"], r["step"]) for r in self.rows(
                "SELECT DISTINCT experiment, step FROM trajectories WHERE trace_id = ?",
                [trace_id])}
        if self._raw.num_rows:
            mine = self._raw.filter(pc.equal(self._raw["TraceId"], key))
            where = (where or set()) | {_part_key(e, st) for e, st in zip(
                mine.column("experiment").to_pylist(), mine.column("step").to_pylist(),
                strict=True) if st is not None}
        wanted = where or set()
        files = [f for part, paths in self._partitions.items()
                 if part in wanted or part[1] == "step=" + NULL_PART for f in paths]
        if not where:  # not a trajectory we know: look everywhere
            files = self._segments
        tables = []
        for path in files:
            reader, ranges = self._row_groups(path)
            groups = [g for g, (lo, hi) in enumerate(ranges) if lo <= trace_id <= hi]
            if groups:
                table = reader.read_row_groups(groups, use_threads=False)
                tables.append(table.filter(pc.equal(table["TraceId"], key)))
        return tables

    def trajectory(self, trace_id: str) -> list[dict[str, Any]]:
        """Every stored span of one trace (``spans`` columns; maps as dicts; ``Timestamp`` and
        ``Events.Timestamp`` as int nanoseconds), by start time, deduplicated.

        Reads the row groups compaction's locator names for the trace (:func:`locator_path`:
        the cost of the trace, whatever the store's size) and the raw rows of the trace; a lake
        without a locator (compacted before it existed), the row groups (sorted by ``TraceId``)
        of the trace's partitions (from ``trajectories``) and of the spans without a step."""
        trace_id = trace_id.lower()
        key = pa.scalar(trace_id, pa.string())
        with self._lock:
            located = self._located(trace_id)
            tables = ([self._read_rows(path, runs, trace_id) for path, runs in located.items()
                       if path in self._span_set]
                      if located is not None else self._scan_partitions(trace_id))
            raw = self._raw
            if raw.num_rows:
                tables.append(raw.filter(pc.equal(raw["TraceId"], key)))
        rows = _first_copies([row for table in tables for row in _as_ints(table).to_pylist()
                              if row["source"] not in self._excluded])
        rows.sort(key=lambda r: (r["Timestamp"] is None, r["Timestamp"] or 0, r["SpanId"]))
        seen: set[str] = set()
        out = []
        for row in rows:
            if row["SpanId"] in seen:
                continue
            seen.add(row["SpanId"])
            for name in _MAP_COLUMNS:
                if row[name] is not None:
                    row[name] = dict(row[name])
            for name in ("Events.Attributes", "Links.Attributes"):
                row[name] = [dict(m) for m in row[name] or ()]
            out.append(row)
        return out

    def payloads_of(self, trace_id: str) -> dict[str, dict[str, str]]:
        """``{span id: payload map}`` of one trace (prompts, answers, tool calls): the payload
        segments' row groups the locator names and the raw rows (without a locator, a query of
        ``payloads``)."""
        trace_id = trace_id.lower()
        with self._lock:
            located = self._located(trace_id)
            if located is None:
                return {row["SpanId"]: dict(row["Payload"] or {}) for row in self.rows(
                    "SELECT SpanId, Payload FROM payloads WHERE TraceId = ?", [trace_id])}
            names = ["TraceId", "SpanId", "Payload"]
            tables = [self._read_rows(path, located[path], trace_id, names)
                      for path in self._payload_files if path in located]
            raw = self._raw_payload
            if raw.num_rows:
                tables.append(raw.select(names).filter(
                    pc.equal(raw["TraceId"], pa.scalar(trace_id, pa.string()))))
        return {row["SpanId"]: dict(row["Payload"] or {}) for table in tables
                for row in table.to_pylist()}

    def iter_rows(self, query: str, params: list[Any] | None = None, batch: int = 10_000
                  ) -> Iterator[dict[str, Any]]:
        """The rows of a large query as dicts, fetched in batches."""
        with self._lock:
            self._ensure_views()
            cursor = self._con.execute(query, params or [])
            names = [d[0] for d in cursor.description or ()]
            while chunk := cursor.fetchmany(batch):
                yield from (dict(zip(names, row, strict=True)) for row in chunk)

    def arrow(self, query: str) -> pa.Table:
        """A query's result as an Arrow table."""
        with self._lock:
            self._ensure_views()
            return self._con.sql(query).arrow()
