"""Cluster scale: whole-run analytics over many nodes' stores, on Ray Data.

A verl cluster already runs Ray. When every node's store is reachable from the cluster (a shared
filesystem, or the gateway collector's file output), the same lake schema and the same query
functions run on Ray Data's workers instead of one DuckDB process:

1. ``ray.data.read_parquet`` reads each node's committed segments (its manifest's, minus the
   generations its manifest excludes), only the columns the trajectory model reads;
2. the span rows are grouped by a hash bucket of ``TraceId`` (Ray Data's ``groupby`` /
   ``map_groups``), so every span of a trace meets in one group whichever node stored it (an
   engine's spans often sit on another node than the rollout's), and each group runs the lake's
   trajectory model (:func:`otel_verl.store._query.trajectories_sql`, DuckDB over the group's
   Arrow table);
3. the trajectory rows are grouped again by a hash bucket of (experiment, validate, step), and
   each group runs the lake's step statistics (:func:`otel_verl.store._query.steps_sql`): every
   step is computed whole in one group, so putting the groups' rows together is exact (no
   partial sums to merge);
4. :meth:`otel_verl.store._query.Lake.steps` finishes them on the driver as it does on one
   machine (the spread, the reasons, the workers' sampling reports, the order).

No engine of our own: Ray Data moves the rows, DuckDB computes inside each group.

Only compacted lines are read: compact each node's store first (``otel-verl compact --live
--dir DIR``; ``otel-verl ui`` and a training process's exporter compact closed files by
themselves).

Usage::

    import ray
    from otel_verl.store._ray import step_statistics, trajectories

    ray.init()                                    # or ray.init(address="auto") on the cluster
    dirs = ["/shared/traces/node0", "/shared/traces/node1", "/shared/traces/node2"]
    for row in step_statistics(dirs):
        print(row["step"], row["reward_mean"], row["error_rate"])
    ds = trajectories(dirs)                       # a ray.data.Dataset: the lake's trajectory rows
    ds.filter(lambda r: r["tool_errors"] > 0).count()

Needs ``ray[data]`` (in every verl cluster), duckdb and pyarrow (the ``lake`` extra).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from otel_verl.store._compact import Manifest, lake_dir
from otel_verl.store._query import REPORT_ORDER, Lake, steps_sql, trajectories_sql

if TYPE_CHECKING:
    import ray.data

__all__ = ["segment_files", "spans", "step_statistics", "trajectories"]

#: the span columns the trajectory model and the sampling reports read
SPAN_COLUMNS = (
    "TraceId", "SpanId", "ParentSpanId", "SpanName", "Timestamp", "Duration", "StatusCode",
    "experiment", "project", "step", "sample_index", "rollout_n", "validate", "is_trajectory",
    "is_report", "is_llm", "is_tool", "tool_error", "reward", "eval_score", "eval_label", "turns",
    "tokens_in", "tokens_out", "termination", "sampling_reason", "sampling_weight", "error_text",
    "finish_reason", "policy_version", "report_counts", "source",
)
#: hash buckets per CPU of the cluster (groups of traces, groups of steps)
BUCKETS_PER_CPU = 2
_STEP_KEY = ("concat_ws('|', coalesce(experiment, '~'), coalesce(validate::VARCHAR, '~'), "
             "coalesce(step::VARCHAR, '~'))")


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def segment_files(directory: str | os.PathLike[str]) -> tuple[list[str], list[str]]:
    """``(segment paths, excluded sources)`` of one node's store, from its manifest."""
    lake = lake_dir(os.path.abspath(os.fspath(directory)))
    manifest = Manifest.load(lake)
    return [os.path.join(lake, s) for s in manifest.segments], list(manifest.excluded)


def _with_bucket(batch: pa.Table, key_sql: str, buckets: int,
                 excluded: Sequence[tuple[str, str]] = ()) -> pa.Table:
    """The batch with a ``bucket`` column (DuckDB's hash of ``key_sql``, the same in every
    worker), less the rows of excluded source generations: ``excluded`` holds (segment file,
    source) pairs, matched against the batch's ``path`` column (dropped) when it has one, since
    two nodes may name the same source (a collector's ``traces.jsonl`` on each) and only the
    node that replaced it excludes its old rows."""
    con = duckdb.connect(":memory:")
    try:
        con.register("batch", batch)
        rows, where = "batch", ""
        if "path" in batch.column_names:
            rows = ("(SELECT * EXCLUDE (path) FROM batch b WHERE b.source IS NULL OR NOT EXISTS "
                    "(SELECT 1 FROM excluded x WHERE x.source = b.source AND x.path = "
                    "regexp_replace(b.path, '^[A-Za-z0-9+.-]+://', '')))")
            con.register("excluded", pa.table({"path": [p.split("://", 1)[-1]
                                                        for p, _ in excluded],
                                               "source": [s for _, s in excluded]},
                                              schema=pa.schema([("path", pa.string()),
                                                                ("source", pa.string())])))
        elif excluded:
            where = (f"WHERE source IS NULL OR source NOT IN "
                     f"({', '.join(_q(s) for _, s in excluded)})")
        return con.execute(f"SELECT *, (hash({key_sql}) % {int(buckets)})::BIGINT AS bucket "
                           f"FROM {rows} {where}").to_arrow_table()
    finally:
        con.close()


def _run_sql(group: pa.Table, sql: str) -> pa.Table:
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET threads = 1")  # one Ray task, one core
        con.register("grp", group)
        return con.execute(sql).to_arrow_table()
    finally:
        con.close()


def _trajectories_of(group: pa.Table) -> pa.Table:
    """The lake's trajectory model over one bucket of whole traces."""
    return _run_sql(group.drop_columns(["bucket"]), trajectories_sql("grp"))


def _steps_of(group: pa.Table) -> pa.Table:
    """The lake's step statistics over one bucket of whole steps (``by_reason`` as two lists:
    a map column does not cross every Arrow path Ray Data takes)."""
    steps = steps_sql("grp")
    return _run_sql(group.drop_columns(["bucket"]),
                    f"SELECT * EXCLUDE (by_reason), map_keys(by_reason) AS reason_names, "
                    f"map_values(by_reason) AS reason_counts FROM ({steps})")


def _buckets(buckets: int | None) -> int:
    if buckets is not None:
        return max(1, int(buckets))
    import ray

    cpus = int(ray.cluster_resources().get("CPU", 1)) if ray.is_initialized() else 1
    return max(1, cpus * BUCKETS_PER_CPU)


def spans(dirs: Iterable[str | os.PathLike[str]], *, buckets: int | None = None
          ) -> ray.data.Dataset:
    """The span rows (:data:`SPAN_COLUMNS` and ``bucket``, by ``TraceId``) of every node's
    segments, as one Ray dataset.

    One ``read_parquet`` over every node's files (one read per node, unioned, cost a dataset
    plan and its file listing each: 3-6x slower for three small stores), each row carrying its
    file's path until the node's own excluded generations are dropped."""
    import ray.data

    files: list[str] = []
    excluded: list[tuple[str, str]] = []
    n = _buckets(buckets)
    for directory in dirs:
        mine, gone = segment_files(directory)
        files.extend(mine)
        excluded.extend((path, source) for path in mine for source in gone)
    if not files:
        raise FileNotFoundError("no compacted segments in any of the stores (run otel-verl "
                                "compact --live --dir DIR on each)")
    ds = ray.data.read_parquet(files, columns=list(SPAN_COLUMNS), partitioning=None,
                               include_paths=bool(excluded))
    return ds.map_batches(_with_bucket, batch_format="pyarrow", fn_kwargs={
        "key_sql": "TraceId", "buckets": n, "excluded": excluded})


def trajectories(dirs: Iterable[str | os.PathLike[str]], *, buckets: int | None = None,
                 span_rows: ray.data.Dataset | None = None) -> ray.data.Dataset:
    """One row per trajectory over every node's store: the lake's ``trajectories`` columns.
    ``span_rows``: :func:`spans` of the same stores, already read (reused, not read again)."""
    n = _buckets(buckets)
    rows = span_rows if span_rows is not None else spans(dirs, buckets=n)
    return rows.groupby("bucket", num_partitions=n).map_groups(
        _trajectories_of, batch_format="pyarrow")


def step_statistics(dirs: Iterable[str | os.PathLike[str]], experiment: str | None = None,
                    *, buckets: int | None = None, span_rows: ray.data.Dataset | None = None,
                    trajectory_rows: ray.data.Dataset | None = None) -> list[dict[str, Any]]:
    """Per (experiment, validate, step): the weighted statistics of :meth:`Lake.steps` over
    every node's store, computed on Ray Data (see the module docstring). Same rows, same
    keys, same order as ``Lake.steps`` over one store holding all the nodes' lines.

    ``span_rows`` / ``trajectory_rows``: :func:`spans` / :func:`trajectories` of the same
    stores, already computed (reused, not read again)."""
    dirs = list(dirs)
    n = _buckets(buckets)
    if span_rows is None:
        span_rows = spans(dirs, buckets=n).materialize()
    per_trajectory = trajectory_rows if trajectory_rows is not None else trajectories(
        dirs, buckets=n, span_rows=span_rows)
    per_step = per_trajectory.map_batches(
        _with_bucket, batch_format="pyarrow", fn_kwargs={"key_sql": _STEP_KEY, "buckets": n}
    ).groupby("bucket", num_partitions=n).map_groups(_steps_of, batch_format="pyarrow")
    steps = _arrow(per_step)
    reports = _arrow(span_rows.filter(expr="is_report").select_columns(
        ["TraceId", "SpanId", "experiment", "validate", "step", "report_counts"]))
    lake = Lake(dirs[0] if dirs else ".")
    try:
        con = lake.connection
        if steps is None:
            return []
        con.register("ray_steps", steps)
        con.execute("CREATE OR REPLACE TABLE steps AS SELECT * EXCLUDE (reason_names, "
                    "reason_counts), map(reason_names, reason_counts) AS by_reason "
                    "FROM ray_steps")
        reports_table(con, reports)
        return lake.steps(experiment)
    finally:
        lake.close()


def reports_table(con: duckdb.DuckDBPyConnection, reports: pa.Table | None) -> None:
    """``reports`` (the sampling reports' span rows gathered from every node, in whatever order
    Ray's blocks came) as the table :meth:`Lake.steps` reads: one copy of a report stored twice,
    the first by the lake's :data:`~otel_verl.store._query.REPORT_ORDER` (the one with more
    counts), as on one machine; not the first the scan met."""
    if reports is None:
        con.execute("CREATE OR REPLACE TABLE reports (TraceId VARCHAR, SpanId VARCHAR, "
                    "experiment VARCHAR, validate BOOLEAN, step BIGINT, "
                    "report_counts MAP(VARCHAR, BIGINT))")
        return
    con.register("ray_reports", reports)
    con.execute("CREATE OR REPLACE TABLE reports AS SELECT DISTINCT ON (TraceId, SpanId) "
                "TraceId, SpanId, experiment, validate, step, report_counts FROM ray_reports "
                f"ORDER BY {REPORT_ORDER}")
    con.unregister("ray_reports")


def _arrow(ds: ray.data.Dataset) -> pa.Table | None:
    """A (small) dataset's rows on the driver as one Arrow table; None when it has none."""
    tables = [t for t in ds.iter_batches(batch_size=None, batch_format="pyarrow")
              if t.num_rows]
    return pa.concat_tables(tables, promote_options="permissive") if tables else None
