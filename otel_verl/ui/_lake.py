"""The viewer's read path over the lakehouse (DuckDB over the Parquet segments and the raw files).

:class:`LakeSource` answers what the views ask (:class:`otel_verl.ui.views.Source`) from the
query layer :class:`otel_verl.store.Lake`: the trajectory rows from its ``trajectories``
table, the step statistics from :meth:`Lake.steps` (the one implementation the CLI and
``otel-verl sql`` use too), the flat GRPO groups from :meth:`Lake.flat_groups`. What the lake's
columns do not hold is taken from where it lives:

- a trajectory page re-reads the store lines its spans came from (``source`` and
  ``source_offset`` in the ``spans`` view) and decodes its trace's spans of them with the store's
  own decoder, so the page shows every attribute with its type as written; a line no longer in the store (the file
  was removed after compaction) is rebuilt from the segments' columns and payloads instead;
- the table's prompt and answer snippets and the free-text filter's text are columns of the
  trajectory rows (``trajectories_text``: ``prompt``, ``response``, ``search``), built at
  compaction from the spans' text columns (:func:`otel_verl.store._schema.span_texts`, the
  trajectory model's :func:`~otel_verl.store.prompt_and_response`), and the same way for the
  raw lines' traces, so a table page, a group or a prompt through training is one DuckDB query
  (filters, sort and limit inside it).

Background (``otel-verl ui``): one thread compacts the store's closed files
(:func:`otel_verl.store.compact`) and, when the store or the manifest changed, opens a
new :class:`Lake` beside the one serving and swaps it in, so a request never waits for either.
Files not compacted yet are read directly by the lake, so a live run shows within ``poll_s``.

The lake is the viewer's only read path: without the ``lake`` extra (DuckDB, pyarrow),
:func:`open_source` raises ``ImportError`` with :data:`otel_verl.store.LAKE_EXTRA`, and the CLI
prints it and exits. The filters, the sort and the page follow the one rule the CLI's
``traces list`` shares (:func:`otel_verl.store.filter_clauses`).
"""

from __future__ import annotations

import atexit
import bisect
import fcntl
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from otel_verl.store import (
    DUCKDB,
    FILE_SUFFIXES,
    LAKE_EXTRA,
    TRAJECTORY_COLUMNS,
    LineCache,
    filter_clauses,
    lake_available,
    line_at,
    list_files,
    page_window,
    sort_column,
)
from otel_verl.store import clean_text as _clean
from otel_verl.store import decode_quietly as _quiet_decode

if TYPE_CHECKING:
    from otel_verl.store import Lake
    from otel_verl.ui.views import Source

__all__ = ["LakeSource", "lake_available", "open_lake", "open_source", "store_directory"]

_logger = logging.getLogger(__name__)
_T = TypeVar("_T")

#: decoded store lines kept for trajectory pages (the rollouts of a group share their lines)
_LINE_CACHE = 16
#: rows of the pages served last kept for their trajectory pages
_ROW_CACHE = 256
_COLUMNS = ", ".join(TRAJECTORY_COLUMNS)
#: the search text is kept in memory too while compaction's file holds at most this many bytes
#: of it (a free-text filter then reads no Parquet)
_SEARCH_IN_MEMORY = 128 << 20
_SKIP = (".otel_verl_lake" + os.sep, "content" + os.sep, ".otel_verl_index" + os.sep)  # old index


#: flagged trajectories per step and flag (``rl.flags`` on trajectory spans)
_FLAGS_PER_STEP = """
SELECT experiment, validate, step, flag, count(DISTINCT TraceId || SpanId) AS n FROM (
    SELECT TraceId, SpanId, experiment, validate, step, unnest(from_json(
        map_extract(SpanAttributes, 'rl.flags')[1], '["VARCHAR"]')) AS flag
    FROM spans WHERE is_trajectory AND len(map_extract(SpanAttributes, 'rl.flags')) > 0)
GROUP BY ALL"""


def _signature(trace_dir: str) -> tuple[Any, ...]:
    """What changes when the lake must be reopened: each store file's size and mtime, and the
    manifest's (a compaction committed)."""
    seen: list[tuple[str, int, int]] = []
    try:
        paths = list_files(trace_dir)
    except FileNotFoundError:
        paths = []
    from otel_verl.store import Manifest

    manifest = Manifest.path_of(trace_dir)
    for path in [*paths, manifest]:
        try:
            st = os.stat(path)
        except OSError:
            continue
        seen.append((path, st.st_size, st.st_mtime_ns))
    return tuple(seen)


class LakeSource:
    """The lakehouse as the viewer's source (see the module docstring).

    Args:
        trace_dir: the store directory.
        compact: whether :meth:`start` compacts closed files in the background.
        poll_s: seconds between looks for new lines (background thread).
    """

    def __init__(self, trace_dir: str | os.PathLike[str], *, compact: bool = True,
                 poll_s: float = 1.0) -> None:
        self._trace_dir = os.path.abspath(os.fspath(trace_dir))
        self.compact = compact
        self.poll_s = poll_s
        self._generation = 0
        self._swap_lock = threading.Lock()
        self._lines = LineCache(_LINE_CACHE)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._retired: list[Lake] = []
        self.compactions = 0
        self.last_error: str | None = None
        #: what was repaired (a damaged lake set aside), shown in the problems banner
        self.notices: list[str] = []
        self._signature: tuple[Any, ...] = ()
        self._serving: _Serving = self._open()
        self._problems = self._count_problems(self._lake)

    # -- opening and swapping ------------------------------------------------------------------
    def _open(self) -> _Serving:
        self._signature = _signature(self._trace_dir)
        _, serving = open_lake(self._trace_dir, say=self._say_damaged, prepare=self._prepare)
        assert serving is not None
        return serving

    @staticmethod
    def _prepare(lake: Lake) -> _Serving:
        """The serving state of a lake just opened (reads every segment's columns it needs)."""
        with lake._lock:
            con = lake.connection
            # the table's rows in memory, without the search text (read from compaction's file
            # when a filter needs it): a page, a row or a count is a scan of a few columns, not
            # a Parquet read per request (~0.3 KB a trajectory plus its two snippets)
            held = _search_bytes(lake.state.cache) <= _SEARCH_IN_MEMORY
            con.execute(f"CREATE OR REPLACE TABLE viewer_rows AS SELECT {_COLUMNS}"
                        f"{', search' if held else ''} FROM trajectories_text")
            # which store lines hold each trace (the trajectory page re-reads them), sorted by
            # trace id for a binary search
            lines = con.execute(
                "SELECT DISTINCT TraceId, source, source_offset FROM spans WHERE source IS NOT "
                "NULL ORDER BY TraceId, source, source_offset").fetchall()
            total = con.execute("SELECT count(*) FROM viewer_rows").fetchall()[0][0]
        return _Serving(lake, [t for t, _, _ in lines], [(s, o) for _, s, o in lines], total,
                        held)

    @property
    def _lake(self) -> Lake:
        return self._serving.lake

    def _say_damaged(self, text: str) -> None:
        _logger.warning("%s", text)
        self.notices.append(text)

    def _reopen_if_changed(self) -> bool:
        """Open a new lake when the store or the manifest changed, and swap it in."""
        if _signature(self._trace_dir) == self._signature:
            return False
        with self._swap_lock:
            before = self._lake.state
            fresh = self._open()
            problems = self._count_problems(fresh.lake)
            old = self._lake
            self._serving, self._problems = fresh, problems
            self._lines.clear()
            # close the lake before the previous one: a request that took it just before the
            # swap has finished by now (requests take milliseconds)
            for retired in self._retired:
                retired.close()
            self._retired = [old]
            after = fresh.lake.state
            if (before.trajectories, before.raw_bytes, before.raw_spans, before.segment_rows) != (
                    after.trajectories, after.raw_bytes, after.raw_spans, after.segment_rows):
                self._generation += 1
        return True

    def start(self) -> None:
        """Compact (when enabled) and look for new lines every ``poll_s`` on a thread."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="otel-verl-ui-lake", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.background_step()
            self._stop.wait(self.poll_s)

    def background_step(self) -> None:
        """One round of the background thread: compact closed files, reopen when changed."""
        if self.compact:
            try:
                from otel_verl.store import compact

                stats = compact(self._trace_dir)
                if stats.spans:
                    self.compactions += 1
                    _logger.info("otel-verl ui: compacted %d span(s) of %d file(s) in %.1fs",
                                 stats.spans, stats.files, stats.seconds)
            except OSError as error:  # a read-only store: keep reading the raw files
                if self.last_error is None:
                    _logger.warning("otel-verl ui: cannot compact %s (%s); reading its files "
                                    "directly", self._trace_dir, error)
                self.last_error = str(error)
                self.compact = False
            except Exception:  # noqa: BLE001 - the viewer keeps serving what it has
                _logger.exception("otel-verl ui: compaction failed")
        try:
            self._reopen_if_changed()
        except Exception:  # noqa: BLE001
            _logger.exception("otel-verl ui: reading the store failed")

    # -- the Source protocol -------------------------------------------------------------------
    @property
    def trace_dir(self) -> str:
        return self._trace_dir

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def lake(self) -> Lake:
        """The lake serving now."""
        return self._lake

    def update(self) -> bool:
        """Look for new lines now (a no-op while the background thread does it)."""
        if self._thread is not None:
            return False
        return self._reopen_if_changed()

    def _count_problems(self, lake: Lake) -> dict[str, Any]:
        from otel_verl.store import Manifest

        manifest = Manifest.load(lake.lake_dir)
        state = lake.state
        lines = bad_lines = bad_spans = files = size = 0
        for path in list_files(self._trace_dir):
            rel = os.path.relpath(path, self._trace_dir)
            if rel.startswith(_SKIP):
                continue
            files += 1
            try:
                size += os.stat(path).st_size
            except OSError:
                continue
            entry = manifest.sources.get(rel)
            if entry is not None:
                lines += int(entry.get("lines", 0))
                bad_lines += int(entry.get("bad_lines", 0))
                bad_spans += int(entry.get("bad_spans", 0))
        bad_lines += state.bad_lines
        bad_spans += state.bad_spans
        counts = lake.rows(
            "SELECT count(*) AS total, count(*) FILTER (WHERE span_id = '') AS partial "
            "FROM trajectories")[0]
        spans = lake.rows("SELECT count(*) AS n FROM spans")[0]["n"]
        examples = list(state.problems[:8])
        return {
            "files": files, "lines": lines, "bad_lines": bad_lines, "bad_spans": bad_spans,
            "files_with_incomplete_last_line": state.truncated_lines, "bytes": size,
            "trajectories": counts["total"], "partial_trajectories": counts["partial"],
            "spans": spans, "bad_trajectories": 0, "notices": list(self.notices),
            "examples": examples,
            "segments": state.segments, "raw_files": state.raw_files,
        }

    def problems(self) -> dict[str, Any]:
        return dict(self._problems)

    def experiments(self) -> list[str]:
        return [r["experiment"] for r in self._lake.rows(
            "SELECT DISTINCT experiment FROM trajectories WHERE experiment IS NOT NULL "
            "ORDER BY experiment")]

    def overview(self, experiment: str | None = None) -> list[dict[str, Any]]:
        serving = self._serving
        steps = serving.lake.steps(experiment or None)
        counts = serving.flags
        if counts is None:  # once per lake opened: it scans the spans' attributes
            counts = {}
            for r in serving.lake.rows(_FLAGS_PER_STEP):  # the detectors' flags (docs/signals.md)
                counts.setdefault((r["experiment"], r["validate"], r["step"]), {})[
                    r["flag"]] = r["n"]
            serving.flags = counts
        for s in steps:
            s["flags"] = counts.get((s.get("experiment"), s.get("validate"), s.get("step")), {})
        return steps

    def flat_groups(self, experiment: str | None = None) -> list[dict[str, Any]]:
        return self._lake.flat_groups(experiment or None)

    def trajectories(
        self, *, experiment: str | None = None, step: int | None = None,
        sample_index: int | None = None, rollout_n: int | None = None,
        validate: bool | None = None, reward_min: float | None = None,
        reward_max: float | None = None, errors_only: bool = False, text: str | None = None,
        trace_id: str | None = None, order: str = "start_ns", descending: bool = False,
        page: int = 0, page_size: int = 50, with_search: bool = False,
        max_page_size: int = 5000, flag: str | None = None) -> dict[str, Any]:
        """One page of trajectory rows matching every given filter, and the total count (the
        filters of :func:`otel_verl.store.filter_clauses`, as ``traces list``)."""
        matching = filter_clauses(
            DUCKDB, experiment=experiment, step=step, sample_index=sample_index,
            rollout_n=rollout_n, validate=validate, reward_min=reward_min,
            reward_max=reward_max, errors_only=errors_only, text=text, trace_id=trace_id,
            flag=flag.strip().lower() if flag else None)  # a detector's flag (docs/signals.md)
        where, params = matching.where, list(matching.params)
        order = sort_column(order)
        direction = "DESC" if descending else "ASC"
        page, page_size = page_window(page, page_size, max_page_size)
        serving = self._serving
        lake = serving.lake
        # the filters, the sort and the limit in DuckDB, over the rows in memory; the search
        # text is read from compaction's file (and the raw traces' rows) when a filter needs it
        rows, names = "viewer_rows", _COLUMNS + (", search" if with_search else "")
        if not serving.search_held and (with_search or text):
            rows = ("(SELECT v.*, x.search FROM viewer_rows v JOIN (SELECT key, search FROM "
                    "trajectories_text) x USING (key))")
        # the count (known when nothing filters), then the page: two scans of the rows in
        # memory cost less than one with a window over every row
        total = serving.total if not where else lake.rows(
            f"SELECT count(*) AS n FROM {rows} {where}", params, spans=bool(flag))[0]["n"]
        found = lake.rows(
            f"SELECT {names} FROM {rows} {where} ORDER BY {order} {direction} NULLS LAST, step, "
            f"sample_index, rollout_n, key LIMIT {page_size} OFFSET {page * page_size}",
            params, spans=bool(flag))
        serving.remember(found)
        return {"total": total, "page": page, "page_size": page_size, "rows": found}

    def trajectory_row(self, key: str) -> dict[str, Any] | None:
        """One row (the table's columns, its prompt and answer snippets included); a row of a
        page just served is not asked again (a group page shows each of its rollouts)."""
        serving = self._serving
        key = _clean(str(key))
        row = serving.rows.get(key)
        if row is not None:
            return {c: row[c] for c in TRAJECTORY_COLUMNS}
        found = serving.lake.rows(f"SELECT {_COLUMNS} FROM viewer_rows WHERE key = ?", [key],
                                  spans=False)
        return found[0] if found else None

    def trace_spans(self, trace_id: str) -> list[dict[str, Any]]:
        """Every stored span of one trace, fully decoded: re-read from the store lines that hold
        it (the segments' columns when a line is gone), once per span id."""
        serving = self._serving
        lake = serving.lake
        trace_id = _clean(str(trace_id)).lower()
        spans: list[dict[str, Any]] = []
        seen: set[str] = set()
        lost = False
        for source, offset in serving.places(trace_id):
            rel = str(source).rsplit("#", 1)[0]
            decoded = self._line(os.path.join(self._trace_dir, rel), int(offset), trace_id)
            if decoded is None:
                lost = True
                continue
            for span in decoded:
                if span["trace_id"] == trace_id and span["span_id"] not in seen:
                    seen.add(span["span_id"])
                    spans.append(span)
        if lost:
            for span in _spans_from_columns(lake, trace_id):
                if span["span_id"] not in seen:
                    seen.add(span["span_id"])
                    spans.append(span)
        return spans

    def _line(self, path: str, offset: int, trace_id: str) -> list[dict[str, Any]] | None:
        """The decoded spans of one stored line that may be the trace's (None: the line is not
        there any more). The line is parsed once and kept (a group's rollouts share their
        lines); only the spans of the trace asked are decoded (an exporter's line holds
        hundreds: 1 MB, 520 spans of bench_ui's store, 11 ms to decode whole, 0.4 ms a trace)."""
        cached = self._lines.get(path, offset)
        if cached is None:
            raw = line_at(path, offset)
            if raw is None or not raw.endswith(b"\n"):
                return None
            try:
                request = orjson.loads(raw)
            except Exception:  # noqa: BLE001 - the lake read it; a page must not fail on it
                request = None
            cached = _ParsedLine(request if isinstance(request, dict) else None)
            self._lines.put(path, offset, cached)
        return cached.spans_of(trace_id)

    def close(self) -> None:
        self.stop()
        for lake in [*self._retired, self._lake]:
            lake.close()


class _ParsedLine:
    """One store line, parsed, and the decoded spans of each trace asked of it."""

    __slots__ = ("by_trace", "request")

    def __init__(self, request: dict[str, Any] | None) -> None:
        self.request = request
        self.by_trace: dict[str, list[dict[str, Any]]] = {}

    def spans_of(self, trace_id: str) -> list[dict[str, Any]]:
        found = self.by_trace.get(trace_id)
        if found is None:
            try:
                found = (_quiet_decode(_only_trace(self.request, trace_id))
                         if self.request is not None else [])
            except Exception:  # noqa: BLE001 - the lake read it; a page must not fail on it
                found = []
            self.by_trace[trace_id] = found
        return found


def _other_trace(span: Any, trace_id: str) -> bool:
    """Whether a raw span is certainly of another trace (a hex id that is not ``trace_id``)."""
    found = span.get("traceId") if isinstance(span, dict) else None
    return isinstance(found, str) and len(found) == 32 and found.lower() != trace_id


def _only_trace(request: dict[str, Any], trace_id: str) -> dict[str, Any]:
    """``request`` without the spans of other traces: the spans whose id is another hex id go,
    anything else (another id form, an entry of another shape) stays for the decoder, which
    gives the kept spans exactly as it gives them in the whole request."""
    resource_spans = request.get("resourceSpans")
    if not isinstance(resource_spans, list):
        return request
    kept = []
    for rs in resource_spans:
        scope_spans = rs.get("scopeSpans") if isinstance(rs, dict) else None
        if not isinstance(scope_spans, list):
            kept.append(rs)
            continue
        scopes = []
        for ss in scope_spans:
            spans = ss.get("spans") if isinstance(ss, dict) else None
            if not isinstance(spans, list):
                scopes.append(ss)
                continue
            mine = [span for span in spans if not _other_trace(span, trace_id)]
            if mine:
                scopes.append({**ss, "spans": mine})
        if scopes:
            kept.append({**rs, "scopeSpans": scopes})
    return {**request, "resourceSpans": kept}


def _search_bytes(cache: str | None) -> int:
    """The ``search`` column's bytes in compaction's trajectories file (its footer)."""
    if cache is None:
        return 0
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(cache).metadata
    except OSError:
        return 0
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    if "search" not in names:
        return 0
    column = names.index("search")
    return sum(meta.row_group(g).column(column).total_uncompressed_size
               for g in range(meta.num_row_groups))


class _Serving:
    """One opened lake and what the viewer keeps beside it (swapped together)."""

    def __init__(self, lake: Lake, trace_ids: list[str], places: list[tuple[str, int]],
                 total: int, search_held: bool) -> None:
        self.lake = lake
        self.search_held = search_held  # viewer_rows holds the search text too
        self.total = total  # trajectory rows
        self._trace_ids = trace_ids
        self._places = places
        self.rows: dict[str, dict[str, Any]] = {}  # the rows of the pages served last
        #: flagged trajectories per (experiment, validate, step) and flag, on first use
        self.flags: dict[tuple[Any, Any, Any], dict[str, int]] | None = None

    def places(self, trace_id: str) -> list[tuple[str, int]]:
        """The (source, offset) of each store line holding a span of the trace."""
        ids = self._trace_ids
        start = bisect.bisect_left(ids, trace_id)
        return self._places[start:bisect.bisect_right(ids, trace_id, lo=start)]

    def remember(self, rows: list[dict[str, Any]]) -> None:
        if len(rows) > _ROW_CACHE:
            return
        if len(self.rows) + len(rows) > _ROW_CACHE:
            self.rows = {}
        self.rows.update((r["key"], dict(r)) for r in rows)


_CODES = {"Unset": "UNSET", "Ok": "OK", "Error": "ERROR"}
_KINDS = {"Internal": "INTERNAL", "Server": "SERVER", "Client": "CLIENT",
          "Producer": "PRODUCER", "Consumer": "CONSUMER"}


def _typed(value: str) -> Any:
    """An attribute the segments hold as text, back as the value it most likely was."""
    if value[:1] in "-0123456789[{tfn" and value not in ("", "-"):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _spans_from_columns(lake: Lake, trace_id: str) -> list[dict[str, Any]]:
    """A trace's spans rebuilt from the segments (when their store lines are gone): the
    ``otel_traces`` columns and the payloads; attribute values come back from their text."""
    payloads = lake.payloads_of(trace_id)
    out = []
    for row in lake.trajectory(trace_id):
        attributes = {k: _typed(v) for k, v in dict(row["SpanAttributes"] or {}).items()}
        attributes.update(payloads.get(row["SpanId"], {}))
        start = row["Timestamp"]
        start_ns = None if start is None else int(start.timestamp() * 1e9) if not isinstance(
            start, int) else start
        duration = row["Duration"]
        events = [{"name": name, "time_ns": None,
                   "attributes": {k: _typed(v) for k, v in dict(attrs or {}).items()}}
                  for name, attrs in zip(row["Events.Name"] or [], row["Events.Attributes"] or [],
                                         strict=False)]
        out.append({
            "trace_id": row["TraceId"], "span_id": row["SpanId"],
            "parent_span_id": row["ParentSpanId"] or None, "name": row["SpanName"],
            "start_ns": start_ns,
            "end_ns": None if start_ns is None or duration is None else start_ns + duration,
            "kind": _KINDS.get(row["SpanKind"], row["SpanKind"]),
            "attributes": attributes,
            "resource": {k: _typed(v) for k, v in dict(row["ResourceAttributes"] or {}).items()},
            "status": {"code": _CODES.get(row["StatusCode"], row["StatusCode"]),
                       "message": row["StatusMessage"] or ""},
            "events": events, "links": [],
            "scope": {"name": row["ScopeName"] or "", "version": row["ScopeVersion"] or ""},
            "parent_is_remote": None,
        })
    return out


def open_lake(trace_dir: str | os.PathLike[str], progress: Callable[[int], None] | None = None,
              *, say: Callable[[str], None] | None = None,
              prepare: Callable[[Lake], _T] | None = None) -> tuple[Lake, _T | None]:
    """:meth:`Lake.open` (then ``prepare(lake)``, the caller's first reads), with a damaged lake
    set aside: the lake is derived data, so when its files cannot be read (a garbled manifest,
    a cut segment) it is renamed to ``.otel_verl_lake.damaged-<time>`` (kept, never deleted) and
    the store is opened again over its raw files; the next compaction rebuilds it. Said through
    ``say``. Damage that ``Lake.open`` and ``prepare`` do not read (a segment only a later query
    reads) is not seen here.

    Raises:
        FileNotFoundError: ``trace_dir`` does not exist.
        the open's own error: the lake could not be set aside (a compaction holds it, or the
            store cannot be written), or the store fails without it too.
    """
    from otel_verl.store import Lake

    lake_path = os.path.join(os.fspath(trace_dir), ".otel_verl_lake")
    failure: Exception | None = None
    for attempt in range(2):
        lake = None
        try:
            lake = Lake.open(trace_dir, progress)
            return lake, (prepare(lake) if prepare is not None else None)
        except (ImportError, MemoryError):
            raise
        except Exception as error:  # noqa: BLE001 - any damage of derived files
            if lake is not None:
                lake.close()
            if not os.path.isdir(lake_path):  # no lake (or no store): nothing to set aside
                raise
            failure = error
        if attempt == 0:  # a compaction may have replaced a file under us: look once more
            time.sleep(0.2)
    assert failure is not None
    kept = f"{lake_path}.damaged-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    try:
        with open(os.path.join(lake_path, "lock"), "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # no compaction runs
            os.rename(lake_path, kept)
    except OSError:
        raise failure from None
    (say or _logger.warning)(
        f"otel-verl: the lake under {trace_dir} could not be read ({type(failure).__name__}: "
        f"{str(failure)[:200]}); kept as {kept}, reading the store's files directly (the next "
        "compaction rebuilds it)")
    lake = Lake.open(trace_dir, progress)
    return lake, (prepare(lake) if prepare is not None else None)


def store_directory(path: str | os.PathLike[str]) -> tuple[str, bool]:
    """The directory to open the lake over, and whether it is the store itself.

    A directory is returned as it is. One store file (e.g. a collector's file output) is read
    through a temporary directory holding a link to it, removed at exit: the lake reads its
    lines directly and nothing is compacted (``False``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        OSError: the link cannot be made.
    """
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        return path, True
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no trace file or directory at {path}")
    link_dir = tempfile.mkdtemp(prefix="otel_verl_file_")
    atexit.register(shutil.rmtree, link_dir, True)
    name = os.path.basename(path)
    if not name.endswith(FILE_SUFFIXES):
        name += ".jsonl"
    os.symlink(path, os.path.join(link_dir, name))
    return link_dir, False


def open_source(trace_dir: str | os.PathLike[str], *, background: bool = False,
                poll_s: float = 1.0, say: Callable[[str], None] | None = None) -> LakeSource:
    """The viewer's source for a store (a directory, or one store file): the lakehouse, brought
    up to date.

    Args:
        trace_dir: the store.
        background: compact closed files and look for new lines on a thread (``otel-verl ui``).
        poll_s: the background thread's period.
        say: where the one-line summaries go (stderr for the CLI).

    Raises:
        ImportError: the ``lake`` extra (DuckDB, pyarrow) is not installed; the message says
            how to install it (:data:`otel_verl.store.LAKE_EXTRA`).
        FileNotFoundError: ``trace_dir`` does not exist.
    """
    tell = say or (lambda text: None)
    if not lake_available():
        raise ImportError(LAKE_EXTRA)
    directory, whole = store_directory(trace_dir)
    started = time.perf_counter()
    source = LakeSource(directory, compact=background and whole, poll_s=poll_s)
    problems = source.problems()
    tell(f"otel-verl: read {problems['trajectories']} trajectories, {problems['spans']} "
         f"spans in {time.perf_counter() - started:.1f}s ({problems['segments']} Parquet "
         f"segment(s), {problems['raw_files']} file(s) read directly; lake: "
         f"{source.lake.lake_dir if whole else '-'})")
    _say_skipped(problems, tell)
    if background:
        source.start()
    return source


def _say_skipped(problems: dict[str, Any], tell: Callable[[str], None]) -> None:
    skipped = [f"{problems[k]} {label}" for k, label in (
        ("bad_lines", "bad line(s)"), ("bad_spans", "bad span(s)"),
        ("files_with_incomplete_last_line", "file(s) ending in an incomplete line"),
        ("partial_trajectories", "trace(s) without a trajectory span (shown as partial)"))
        if problems[k]]
    if skipped:
        tell("otel-verl: " + ", ".join(skipped))


def _as_source(source: LakeSource) -> Source:
    return source  # the lake is a Source (checked by mypy here)
