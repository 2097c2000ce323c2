"""An incremental SQLite index of the local store: one row per trajectory, ready for the viewer.

Why SQLite (the standard library's ``sqlite3``) and not DuckDB: it ships with Python (the index
adds no dependency to the core), it is made for many small incremental writes (a few new lines
every second while a run writes) with readers in other threads (WAL mode), and the viewer's
queries are aggregates over ~10^5 rows, which it answers in tens of milliseconds.

The index lives beside the store (``<trace_dir>/.otel_verl_index/index.sqlite3``; when the store
is not writable, under ``~/.cache/otel_verl/index``). It remembers, per file, the byte offset up to
which complete lines were read, and on :meth:`StoreIndex.update` reads only what was appended. Each
line is decoded by :func:`otel_verl.store.spans_from_otlp_json` (the store's own decoder), each span
is reduced to what the viewer needs (ids, times, status, the trajectory attributes, usage, tool and
reward attributes, exception messages, short text snippets) and kept in ``spans``; the traces that
received spans are then regrouped with :func:`otel_verl.store.group_trajectories` (the store's own
trajectory model) into the ``trajectories`` table. ``trace_lines`` remembers which lines hold a
trace's spans, so a trajectory page re-reads only those lines. A file that shrank, vanished or was
replaced makes the next update rebuild the index from scratch.

Usage::

    index = StoreIndex("otel_verl_traces")
    index.update()                        # incremental; returns what it read
    index.overview()                      # per experiment / validate / step aggregates
    index.trajectories(step=3, order="reward", page_size=50)
    index.trajectory_spans(trace_id)      # full span dicts of one trace, from the store
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from otel_verl import semconv
from otel_verl.store import (
    Trajectory,
    finite_number,
    group_trajectories,
    list_files,
    sampling_reports,
)
from otel_verl.store._filters import INT64_MAX as _INT64_MAX
from otel_verl.store._filters import INT64_MIN as _INT64_MIN
from otel_verl.store._filters import (
    SQLITE,
    TRAJECTORY_COLUMNS,
    BadRequest,
    filter_clauses,
    page_window,
    sort_column,
)
from otel_verl.store._filters import clean_text as _clean
from otel_verl.store._lines import LineCache, line_at
from otel_verl.store._record import decode_quietly as _quiet_decode
from otel_verl.store._record import (
    first_error,
    is_llm_span,
    is_sampling_report,
    is_tool_error,
    is_tool_span,
    prompt_and_response,
    reward_label,
)
from otel_verl.store._record import snippet as _snippet

__all__ = ["TRAJECTORY_COLUMNS", "BadRequest", "IndexStats", "StoreIndex", "default_index_path"]

_logger = logging.getLogger(__name__)

SCHEMA_VERSION = "6"  # 5: a tool error marked by the record's rule; 6: answers via answer_text
#: bytes of a file's head and of the stretch before the indexed offset that identify its content
_PRINT = 4096
#: the attribute the tail sampler sets: how many trajectories this one stands for
SAMPLING_WEIGHT = semconv.ROLLOUT_SAMPLING_WEIGHT
_EXCEPTION_TYPE = "exception.type"
_EXCEPTION_MESSAGE = "exception.message"
_SNIPPET = 400
_SEARCH_TEXT = 4000
_READ_BLOCK = 32 * 1024 * 1024
#: decoded store lines kept for trajectory pages (a line is one exported batch, <= ~512 spans)
_LINE_CACHE = 16

#: attributes kept per span in the index (the rest stays in the store)
_KEPT_ATTRIBUTES = (
    *semconv.TRAJECTORY_KEYS,
    semconv.ROLLOUT_PROJECT_NAME,
    semconv.ROLLOUT_REWARD,
    semconv.ROLLOUT_NUM_TURNS,
    SAMPLING_WEIGHT,
    semconv.ROLLOUT_SAMPLING_REASON,
    semconv.ROLLOUT_TERMINATION,
    semconv.ERROR_TYPE,
    semconv.OTEL_VERL_TRAJECTORY,
    semconv.OPENINFERENCE_SPAN_KIND,
    semconv.GEN_AI_OPERATION_NAME,
    semconv.GEN_AI_USAGE_INPUT_TOKENS,
    semconv.GEN_AI_USAGE_OUTPUT_TOKENS,
    semconv.GEN_AI_TOOL_NAME,
    semconv.GEN_AI_EVALUATION_NAME,
    semconv.GEN_AI_EVALUATION_SCORE_VALUE,
    semconv.GEN_AI_EVALUATION_SCORE_LABEL,
    semconv.SERVICE_NAME,
)
_KEPT_RESOURCE = (semconv.ROLLOUT_PROJECT_NAME, semconv.ROLLOUT_EXPERIMENT_NAME,
                  semconv.SERVICE_NAME)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY, file_id INTEGER UNIQUE, offset INTEGER, size INTEGER, head TEXT,
    lines INTEGER, bad_lines INTEGER, bad_spans INTEGER, pending_bytes INTEGER,
    dev INTEGER, ino INTEGER, mtime_ns INTEGER, tail TEXT);
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT, span_id TEXT, parent TEXT, name TEXT, start_ns INTEGER, end_ns INTEGER,
    status TEXT, status_message TEXT, data TEXT,
    PRIMARY KEY (trace_id, span_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trace_lines (
    trace_id TEXT, file_id INTEGER, offset INTEGER,
    PRIMARY KEY (trace_id, file_id, offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trajectories (
    key TEXT PRIMARY KEY, trace_id TEXT, span_id TEXT, name TEXT, project TEXT, experiment TEXT,
    step INTEGER, sample_index INTEGER, rollout_n INTEGER, validate INTEGER, reward REAL,
    reward_label TEXT, weight REAL, turns INTEGER, spans INTEGER, llm_calls INTEGER,
    tokens_in INTEGER, tokens_out INTEGER, tool_calls INTEGER, tool_errors INTEGER,
    errors INTEGER, error TEXT, start_ns INTEGER, duration_ns INTEGER, llm_ns INTEGER,
    status TEXT, sampling_reason TEXT, termination TEXT, prompt TEXT, response TEXT,
    search TEXT);
CREATE TABLE IF NOT EXISTS reports (
    trace_id TEXT, span_id TEXT, attributes TEXT, PRIMARY KEY (trace_id, span_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS trajectories_trace ON trajectories (trace_id);
CREATE INDEX IF NOT EXISTS trajectories_group
    ON trajectories (experiment, step, sample_index, rollout_n);
CREATE INDEX IF NOT EXISTS trajectories_sample ON trajectories (experiment, sample_index, step);
"""


@dataclass
class IndexStats:
    """What one :meth:`StoreIndex.update` read (and, in ``problems``, what the index skipped)."""

    files: int = 0
    new_bytes: int = 0
    new_lines: int = 0
    new_spans: int = 0
    traces_updated: int = 0
    seconds: float = 0.0
    rebuilt: bool = False


@dataclass
class _FileState:
    path: str
    file_id: int
    offset: int = 0
    size: int = 0
    head: str = ""
    lines: int = 0
    bad_lines: int = 0
    bad_spans: int = 0
    pending_bytes: int = 0
    #: identity: device and inode (a renamed file keeps them), the last stat's mtime, and a hash
    #: of the bytes just before ``offset`` (a file rewritten in place changes them)
    dev: int = 0
    ino: int = 0
    mtime_ns: int = 0
    tail: str = ""
    problems: list[str] = field(default_factory=list)

    def row(self) -> tuple[Any, ...]:
        return (self.path, self.file_id, self.offset, self.size, self.head, self.lines,
                self.bad_lines, self.bad_spans, self.pending_bytes, self.dev, self.ino,
                self.mtime_ns, self.tail)


_FILE_COLUMNS = ("path, file_id, offset, size, head, lines, bad_lines, bad_spans, "
                 "pending_bytes, dev, ino, mtime_ns, tail")


class _Damaged(Exception):
    """The index file disagrees with itself or with the store: rebuild it."""


def default_index_path(trace_dir: str | os.PathLike[str]) -> Path:
    """Where the index of ``trace_dir`` lives: beside the store, or in the user cache when the
    store's directory is not writable (e.g. a collector's read-only output)."""
    store = Path(trace_dir).resolve()
    base = store if store.is_dir() else store.parent
    beside = base / ".otel_verl_index"
    name = "index.sqlite3" if store.is_dir() else f"{store.name}.index.sqlite3"
    if os.access(base, os.W_OK) and (not beside.exists() or os.access(beside, os.W_OK)):
        return beside / name
    digest = hashlib.sha256(str(store).encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "otel_verl" / "index" / f"{digest}.sqlite3"


def _fingerprints(path: str, offset: int) -> tuple[str, str]:
    """Hashes of a file's first bytes and of the bytes just before ``offset`` (the end of what
    was indexed). Every file of one producer starts alike, so the head alone says little; the
    stretch before the offset changes when a file is rewritten or regrown in place."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_PRINT)
            start = max(0, offset - _PRINT)
            handle.seek(start)
            tail = handle.read(offset - start)
    except OSError:
        return "", ""
    if len(tail) != offset - max(0, offset - _PRINT):
        return hashlib.sha256(head).hexdigest()[:16], "short"
    return (hashlib.sha256(head).hexdigest()[:16],
            hashlib.sha256(tail).hexdigest()[:16] + f":{offset}")


def _sql_int(value: Any) -> int | None:
    """An integer SQLite can store (64 bits), else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if _INT64_MIN <= value <= _INT64_MAX else None


def _clamp(value: int) -> int:
    """A sum held within 64 bits (hostile token counts must not overflow a column)."""
    return min(max(value, _INT64_MIN), _INT64_MAX)


def _text(value: Any, limit: int = 500) -> str | None:
    """A value as text for a TEXT column (None stays None)."""
    return None if value is None else _clean(_snippet(value, limit))


def _compact(span: dict[str, Any]) -> tuple[Any, ...]:
    """A span reduced to the index's row (see ``spans`` in the schema)."""
    attributes = span["attributes"]
    kept = {k: attributes[k] for k in _KEPT_ATTRIBUTES if k in attributes}
    resource = {k: span["resource"][k] for k in _KEPT_RESOURCE if k in span["resource"]}
    events = []
    for event in span["events"]:
        ev = event["attributes"]
        if event["name"] == semconv.GEN_AI_EVALUATION_RESULT:
            events.append({"name": event["name"], "time_ns": event["time_ns"], "attributes": {
                k: ev[k] for k in (semconv.GEN_AI_EVALUATION_NAME,
                                   semconv.GEN_AI_EVALUATION_SCORE_VALUE,
                                   semconv.GEN_AI_EVALUATION_SCORE_LABEL) if k in ev}})
        elif _EXCEPTION_TYPE in ev or _EXCEPTION_MESSAGE in ev:
            events.append({"name": event["name"], "time_ns": event["time_ns"], "attributes": {
                _EXCEPTION_TYPE: _snippet(ev.get(_EXCEPTION_TYPE), 200),
                _EXCEPTION_MESSAGE: _snippet(ev.get(_EXCEPTION_MESSAGE), 500)}})
    text: dict[str, str] = {}
    prompt, response = prompt_and_response(span)
    if prompt is not None:
        text["prompt"] = _snippet(prompt, 2000)
    if response is not None:
        text["response"] = _snippet(response, 2000)
    result = attributes.get(semconv.GEN_AI_TOOL_CALL_RESULT)
    if result is None:
        result = attributes.get(semconv.OUTPUT_VALUE)
    if semconv.GEN_AI_TOOL_NAME in attributes or attributes.get(
            semconv.OPENINFERENCE_SPAN_KIND) == semconv.SpanKindName.TOOL:
        arguments = attributes.get(semconv.GEN_AI_TOOL_CALL_ARGUMENTS)
        if arguments is None:
            arguments = attributes.get(semconv.INPUT_VALUE)
        text["tool"] = _snippet(f"{attributes.get(semconv.GEN_AI_TOOL_NAME, span['name'])}"
                                f"({_snippet(arguments, 300)}) -> {_snippet(result, 300)}", 700)
    if is_tool_error(span):  # the record's rule, read while the span still has its output
        text["tool_error"] = _snippet(result, 300)
    data: dict[str, Any] = {"a": kept}
    if resource:
        data["r"] = resource
    if events:
        data["e"] = events
    if text:
        data["t"] = text
    return (
        span["trace_id"], span["span_id"], span["parent_span_id"], _text(span["name"], 1000),
        _sql_int(span["start_ns"]), _sql_int(span["end_ns"]), _text(span["status"]["code"], 20),
        _text(span["status"]["message"], 500), _dumps(data),
    )


#: the index's own JSON (ASCII: lone surrogates travel escaped)
_dumps = json.JSONEncoder(default=str, separators=(",", ":")).encode


def _span_of_row(row: tuple[Any, ...]) -> dict[str, Any]:
    """An index row back into a (partial) span dict the store's trajectory model accepts."""
    trace_id, span_id, parent, name, start_ns, end_ns, status, status_message, data = row
    data = json.loads(data)
    return {
        "trace_id": trace_id, "span_id": span_id, "parent_span_id": parent, "name": name,
        "start_ns": start_ns, "end_ns": end_ns, "kind": "INTERNAL",
        "attributes": data["a"], "resource": data.get("r", {}),
        "status": {"code": status, "message": status_message},
        "events": data.get("e", []), "links": [], "text": data.get("t", {}),
    }


def _int(value: Any) -> int | None:
    return _sql_int(value)


def _row_of_trajectory(t: Trajectory) -> tuple[Any, ...]:
    llm = [s for s in t.spans if is_llm_span(s)]
    tools = [s for s in t.spans if is_tool_span(s)]
    # the record's rule (kept as a mark by _compact: the index's copy has no output)
    tool_errors = sum(1 for s in tools if "tool_error" in s.get("text", {}) or is_tool_error(s))
    tokens_in = sum(_int(s["attributes"].get(semconv.GEN_AI_USAGE_INPUT_TOKENS)) or 0 for s in llm)
    tokens_out = sum(_int(s["attributes"].get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS)) or 0
                     for s in llm)
    llm_ns = sum(s["end_ns"] - s["start_ns"] for s in llm
                 if s["end_ns"] is not None and s["start_ns"] is not None)
    prompt = response = None
    search = []
    for span in t.spans:
        text = span.get("text") or {}
        if prompt is None and "prompt" in text:
            prompt = text["prompt"]
        if "response" in text:
            response = text["response"]
        if "tool" in text:
            search.append(text["tool"])
    error = first_error(t)
    if error:
        search.append(error)
    # the store's rule: a trajectory stands for sampling_weight trajectories; a partial one
    # (no trajectory span) for none
    weight = t.sampling_weight if t.root is not None else 0.0
    validate = t.validate
    turns = _int(t.num_turns)
    search_text = "\n".join([prompt or "", response or "", *search])[:_SEARCH_TEXT]
    experiment = t.experiment
    return (
        f"{t.trace_id}:{t.span_id or ''}", t.trace_id, t.span_id or "", _text(t.name, 1000),
        _text(_snippet(t.attribute(semconv.ROLLOUT_PROJECT_NAME), 200)),
        _clean(experiment) if isinstance(experiment, str) else None,
        _int(t.step), _int(t.sample_index), _int(t.rollout_n),
        int(validate) if isinstance(validate, bool) else None,
        finite_number(t.reward), _text(reward_label(t), 200), finite_number(weight),
        turns, len(t.spans), len(llm), _clamp(tokens_in), _clamp(tokens_out), len(tools),
        tool_errors, len(t.errors), _text(error, 500) if error else None, _sql_int(t.start_ns),
        _sql_int(t.duration_ns), _clamp(llm_ns), _text(t.status, 20),
        _text(t.sampling_reason, 200),
        _text(t.attribute(semconv.ROLLOUT_TERMINATION), 100) or None,
        _text(prompt, _SNIPPET) if prompt else None,
        _text(response, _SNIPPET) if response else None, _clean(search_text.lower()),
    )


def _unreadable_row(trace_id: str, span_id: str | None, name: Any, error: BaseException
                    ) -> tuple[Any, ...]:
    """The row of a trajectory whose row could not be computed: listed, marked, never hidden."""
    why = f"not indexed: {type(error).__name__}: {error}"
    row: list[Any] = [None] * len(TRAJECTORY_COLUMNS) + [why.lower()]
    for column, value in (("key", f"{trace_id}:{span_id or ''}"), ("trace_id", trace_id),
                          ("span_id", span_id or ""), ("name", _text(name, 1000) or ""),
                          ("weight", 0.0), ("errors", 1), ("error", _text(why, 500)),
                          ("status", "error")):
        row[TRAJECTORY_COLUMNS.index(column)] = value
    return tuple(row)


def _marks(n: int) -> str:
    return ",".join("?" * n)


_ROW_ERRORS = (OverflowError, ValueError, TypeError, sqlite3.ProgrammingError,
               sqlite3.InterfaceError, sqlite3.DataError, sqlite3.IntegrityError)


def _insert(conn: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]],
            keyed: bool = False) -> list[Any]:
    """Insert ``rows``; one that cannot be stored is left out, not the batch. Returns what was
    left out: "why" texts, or (trace id, why) pairs when ``keyed``."""
    try:
        conn.executemany(sql, rows)
        return []
    except _ROW_ERRORS:
        pass  # row by row: the rows before the bad one are in; OR IGNORE / REPLACE skips them
    bad: list[Any] = []
    for row in rows:
        try:
            conn.execute(sql, row)
        except _ROW_ERRORS as error:
            why = f"{row[0]}:{row[1]}: not indexed: {type(error).__name__}: {error}"[:300]
            bad.append((row[1], why) if keyed else why)
    return bad


def _columns(conn: sqlite3.Connection) -> dict[str, list[str]]:
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")] for t in sorted(tables)}


_EXPECTED: dict[str, list[str]] = {}


def _expected_columns() -> dict[str, list[str]]:
    if not _EXPECTED:
        scratch = sqlite3.connect(":memory:")
        scratch.executescript(_SCHEMA)
        _EXPECTED.update(_columns(scratch))
        scratch.close()
    return _EXPECTED


def _transient(error: sqlite3.DatabaseError) -> bool:
    """Busy or locked: another process holds the file; waiting, not rebuilding, is the answer."""
    name = getattr(error, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(error)


def _is_damage(error: BaseException) -> bool:
    if isinstance(error, _Damaged):
        return True
    return (isinstance(error, sqlite3.DatabaseError)
            and not isinstance(error, sqlite3.ProgrammingError) and not _transient(error))


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _healed(method: Callable[Concatenate[StoreIndex, _P], _R]
            ) -> Callable[Concatenate[StoreIndex, _P], _R]:
    """A query or update that rebuilds a damaged index (once) and answers again."""

    @functools.wraps(method)
    def healed(self: StoreIndex, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        epoch = self._epoch
        try:
            return method(self, *args, **kwargs)
        except (sqlite3.DatabaseError, _Damaged) as error:
            if not _is_damage(error):
                raise
            self._heal(error, epoch)
        return method(self, *args, **kwargs)

    return healed


class StoreIndex:
    """The index of one store (a directory, or one file). Thread-safe: one connection per
    thread; :meth:`update` runs under a lock (one writer).

    The index file is a cache: when it is damaged (not a database, truncated, another schema,
    offsets that no longer point at the lines they name) it is deleted and rebuilt from the
    store, and :meth:`problems` says so (``notices``).
    """

    def __init__(self, trace_dir: str | os.PathLike[str],
                 index_path: str | os.PathLike[str] | None = None) -> None:
        self.trace_dir = os.fspath(trace_dir)
        self.path = Path(index_path) if index_path is not None else default_index_path(trace_dir)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._write_lock = threading.RLock()
        self._lines = LineCache(_LINE_CACHE)
        self._pending_notes: dict[str, str] = {}
        self._orphans: set[str] = set()
        #: bumped whenever the index file is replaced (each thread then reconnects)
        self._epoch = 0
        #: bumped whenever an update changed the trajectories (the viewer polls it)
        self.generation = 0
        with self._write_lock:
            try:
                self._prepare()
            except sqlite3.DatabaseError as error:
                if _transient(error):
                    raise
                self._discard(f"the index file {self.path} could not be read ({error}); it was "
                              "deleted and is rebuilt from the store")
                self._prepare()

    # -- connections -------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.epoch != self._epoch:  # the file was replaced
            conn.close()
            conn = None
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA cache_size=-65536")
            except sqlite3.DatabaseError:
                conn.close()
                raise
            self._local.conn = conn
            self._local.epoch = self._epoch
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _prepare(self) -> None:
        """Open the index; start it over when it holds another layout (or none)."""
        conn = self._conn()
        with conn:
            conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            version = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            fresh = version is None or version[0] != SCHEMA_VERSION
            if not fresh and _columns(conn) != _expected_columns():
                fresh = True
                self._note(f"the index file {self.path} had another layout under this schema "
                           "version; it was rebuilt from the store")
            if fresh:  # another layout: start over
                for table in ("files", "spans", "trace_lines", "trajectories", "reports", "meta"):
                    conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.executescript(_SCHEMA)
            if fresh:
                self._clear(conn)
            else:  # traces whose rows were lost (a crash between two commits, or damage)
                self._orphans = {r[0] for r in conn.execute(
                    "SELECT DISTINCT trace_id FROM trace_lines WHERE trace_id NOT IN "
                    "(SELECT trace_id FROM trajectories)")}
                if self._orphans:
                    self._note(f"{len(self._orphans)} trace(s) in the index had no trajectory "
                               "rows; they are regrouped")
            for key, text in self._pending_notes.items():
                conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, _clean(text)))
            self._pending_notes.clear()

    def _note(self, text: str) -> None:
        """A notice for the problems banner (kept in the index once it is open)."""
        _logger.warning("otel_verl.ui index: %s", text)
        self._pending_notes[f"notice:{time.time_ns()}"] = text

    def _discard(self, why: str) -> None:
        """Delete the index file (and its journal) and start a new one."""
        self._note(why)
        self.close()
        self._epoch += 1
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                os.unlink(f"{self.path}{suffix}")
            except FileNotFoundError:
                pass
        self._lines.clear()

    def _heal(self, error: BaseException, epoch: int) -> None:
        """Rebuild a damaged index (once per damage: a thread that failed on a file another
        thread already replaced only retries)."""
        with self._write_lock:
            if epoch == self._epoch:
                self._discard(f"the index was damaged ({type(error).__name__}: {error}); it "
                              "was deleted and rebuilt from the store")
                self._prepare()
                self._update()

    def _clear(self, conn: sqlite3.Connection) -> None:
        for table in ("files", "spans", "trace_lines", "trajectories", "reports", "meta"):
            conn.execute(f"DELETE FROM {table}")
        conn.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
        self._lines.clear()

    # -- building ----------------------------------------------------------------------------
    @_healed
    def update(self) -> IndexStats:
        """Read what was appended to the store since the last update; regroup touched traces.

        Never raises for bad content: undecodable lines and spans are counted per file (see
        :meth:`problems`); a last line without its newline is left for the next update. A file
        renamed (a collector's rotation) keeps its rows; a file that vanished, shrank or was
        rewritten in place makes the update rebuild the index; so does a damaged index file.
        """
        return self._update()

    def _update(self) -> IndexStats:
        with self._write_lock:
            started = time.perf_counter()
            stats = IndexStats()
            conn = self._conn()
            try:
                paths = list_files(self.trace_dir)
            except FileNotFoundError:
                paths = []
            seen: dict[str, os.stat_result] = {}
            for path in paths:
                try:
                    seen[path] = os.stat(path)
                except OSError:
                    continue
            known = {row[0]: _FileState(*row) for row in conn.execute(
                f"SELECT {_FILE_COLUMNS} FROM files")}
            known, why = self._follow(conn, known, seen)
            if why is not None:
                _logger.info("otel_verl.ui index: rebuilding: %s", why)
                with conn:
                    self._clear(conn)
                known = {}
                stats.rebuilt = True
            next_id = max((s.file_id for s in known.values()), default=0) + 1
            dirty, self._orphans = (set() if stats.rebuilt else self._orphans), set()
            for path, st in seen.items():
                state = known.get(path)
                if state is None:
                    state = _FileState(path, next_id)
                    next_id += 1
                stats.files += 1
                if (path in known and st.st_size == state.offset + state.pending_bytes
                        and st.st_mtime_ns == state.mtime_ns):
                    continue
                state.dev, state.ino, state.mtime_ns = st.st_dev, st.st_ino, st.st_mtime_ns
                self._read_file(conn, state, st.st_size, stats, dirty)
            stats.traces_updated = self._regroup(conn, dirty)
            if dirty:
                self.generation += 1
            stats.seconds = time.perf_counter() - started
            return stats

    def _follow(self, conn: sqlite3.Connection, known: dict[str, _FileState],
                seen: dict[str, os.stat_result]) -> tuple[dict[str, _FileState], str | None]:
        """Match the indexed files to the store's: by path and inode, following renames.

        Returns the states by (new) path, or why the index must be rebuilt: a file vanished,
        shrank, or its bytes before the indexed offset changed (rewritten or regrown in place;
        a store file only ever grows at its end).
        """
        by_inode = {(st.st_dev, st.st_ino): path for path, st in seen.items()}
        moved: dict[str, _FileState] = {}
        for path, state in known.items():
            st = seen.get(path)
            if st is None or (st.st_dev, st.st_ino) != (state.dev, state.ino):
                target = by_inode.get((state.dev, state.ino))
                if target is None:
                    return known, f"{path} vanished or was replaced"
                st = seen[target]
                path = target
            if path in moved:
                return known, f"two indexed files are now {path}"
            if st.st_size < state.offset:
                return known, f"{path} shrank"
            if (path != state.path or st.st_size != state.offset + state.pending_bytes
                    or st.st_mtime_ns != state.mtime_ns):
                head, tail = _fingerprints(path, state.offset)
                if (head, tail) != (state.head, state.tail):
                    return known, f"{path} was rewritten since it was indexed"
            moved[path] = state
        renamed = [(state, path) for path, state in moved.items() if state.path != path]
        if renamed:
            with conn:
                for state, _ in renamed:
                    conn.execute("DELETE FROM files WHERE path = ?", (state.path,))
                for state, path in renamed:
                    _logger.info("otel_verl.ui index: %s is now %s", state.path, path)
                    conn.execute("UPDATE meta SET key = ? WHERE key = ?",
                                 (f"problem:{path}", f"problem:{state.path}"))
                    state.path = path
                    conn.execute(f"INSERT OR REPLACE INTO files VALUES ({_marks(13)})",
                                 state.row())
        return moved, None

    def _read_file(self, conn: sqlite3.Connection, state: _FileState, size: int,
                   stats: IndexStats, dirty: set[str]) -> None:
        try:
            handle = open(state.path, "rb")  # noqa: SIM115 - closed below
        except OSError as error:
            state.bad_lines += 1
            self._save_file(conn, state, size, f"{state.path}: {error}")
            return
        problem = None
        with handle:
            handle.seek(state.offset)
            carry = b""
            offset = state.offset
            while True:
                block = handle.read(_READ_BLOCK)
                if not block:
                    break
                data = carry + block
                end = data.rfind(b"\n")
                if end < 0:
                    carry = data
                    continue
                carry = data[end + 1:]
                line_start = offset
                rows: list[tuple[Any, ...]] = []
                lines: list[tuple[str, int, int]] = []
                reports: list[tuple[str, str, str]] = []
                for raw in data[: end + 1].split(b"\n")[:-1]:
                    here = line_start
                    line_start += len(raw) + 1
                    stats.new_lines += 1
                    state.lines += 1
                    if not raw.strip():
                        continue
                    try:
                        why = self._index_line(raw, here, state, rows, lines, reports, dirty)
                    except Exception as error:  # noqa: BLE001 - one line must not stop the rest
                        why = f"{type(error).__name__}: {error}"[:200]
                        state.bad_lines += 1
                    if why is not None:
                        problem = problem or f"{state.path}: line {state.lines}: {why}"
                offset = line_start
                stats.new_bytes += offset - state.offset
                state.offset = offset
                state.pending_bytes = len(carry)
                with conn:
                    bad = _insert(conn, "INSERT OR IGNORE INTO spans VALUES (?,?,?,?,?,?,?,?,?)",
                                  rows)
                    _insert(conn, "INSERT OR IGNORE INTO trace_lines VALUES (?,?,?)", lines)
                    _insert(conn, "INSERT OR IGNORE INTO reports VALUES (?,?,?)", reports)
                    if bad:
                        state.bad_spans += len(bad)
                        problem = problem or f"{state.path}: {bad[0]}"
                    stats.new_spans += len(rows) - len(bad)
                    if reports:
                        self.generation += 1
                    self._save_file(conn, state, size, problem)
            state.pending_bytes = len(carry)
            self._save_file(conn, state, size, problem)
            conn.commit()

    def _index_line(self, raw: bytes, here: int, state: _FileState,
                    rows: list[tuple[Any, ...]], lines: list[tuple[str, int, int]],
                    reports: list[tuple[str, str, str]], dirty: set[str]) -> str | None:
        """Add one line's spans to the pending rows; what was wrong with it, if anything."""
        spans, bad, why = _decode_line(raw)
        if why is not None:
            state.bad_lines += 1
            return why
        first = f"{bad} bad span(s)" if bad else None
        seen: set[str] = set()
        for span in spans:
            try:
                if is_sampling_report(span):  # a sampler's per-step counts, not a trajectory
                    reports.append((span["trace_id"], span["span_id"],
                                    _dumps(span["attributes"])))
                    continue
                rows.append(_compact(span))
            except Exception as error:  # noqa: BLE001 - a span this reader cannot use
                bad += 1
                first = first or f"span {span.get('span_id')}: {type(error).__name__}: {error}"
                continue
            if span["trace_id"] not in seen:
                seen.add(span["trace_id"])
                lines.append((span["trace_id"], state.file_id, here))
        dirty.update(seen)
        state.bad_spans += bad
        return first[:300] if first else None

    def _save_file(self, conn: sqlite3.Connection, state: _FileState, size: int,
                   problem: str | None) -> None:
        state.size = size
        state.head, state.tail = _fingerprints(state.path, state.offset)
        conn.execute(f"INSERT OR REPLACE INTO files VALUES ({_marks(13)})", state.row())
        if problem:
            conn.execute("INSERT OR IGNORE INTO meta VALUES (?, ?)",
                         (f"problem:{state.path}", _clean(problem)))

    def _regroup(self, conn: sqlite3.Connection, dirty: set[str]) -> int:
        """Recompute the trajectory rows of the traces that received spans. A trace this reader
        cannot group, or a trajectory whose row cannot be computed, is listed as unreadable (and
        counted in :meth:`problems`); the other traces of the batch are not held back."""
        ordered = sorted(dirty)
        for start in range(0, len(ordered), 400):
            batch = ordered[start: start + 400]
            marks = _marks(len(batch))
            rows = conn.execute(
                f"SELECT * FROM spans WHERE trace_id IN ({marks})", batch).fetchall()
            out: list[tuple[Any, ...]] = []
            failed: dict[str, str] = {}
            try:
                trajectories = group_trajectories(_span_of_row(r) for r in rows)
            except Exception:  # noqa: BLE001 - one trace at a time, to find the one that fails
                trajectories = []
                by_trace: dict[str, list[tuple[Any, ...]]] = {}
                for r in rows:
                    by_trace.setdefault(r[0], []).append(r)
                for trace_id, trace_rows in by_trace.items():
                    try:
                        trajectories.extend(group_trajectories(_span_of_row(r)
                                                               for r in trace_rows))
                    except Exception as error:  # noqa: BLE001
                        failed[trace_id] = f"trace {trace_id}: {type(error).__name__}: {error}"
                        out.append(_unreadable_row(trace_id, None, "", error))
            for t in trajectories:
                try:
                    out.append(_row_of_trajectory(t))
                except Exception as error:  # noqa: BLE001 - marked, not hidden
                    failed[t.trace_id] = (f"trajectory {t.trace_id}:{t.span_id or ''}: "
                                          f"{type(error).__name__}: {error}")
                    out.append(_unreadable_row(t.trace_id, t.span_id, t.name, error))
            with conn:
                conn.execute(f"DELETE FROM trajectories WHERE trace_id IN ({marks})", batch)
                conn.execute(f"DELETE FROM meta WHERE key IN ({marks})",
                             [f"problem:trace:{t}" for t in batch])
                for trace_id, why in _insert(
                        conn, f"INSERT OR REPLACE INTO trajectories VALUES ({_marks(31)})", out,
                        keyed=True):
                    failed[trace_id] = why
                conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                 [(f"problem:trace:{t}", _clean(why)[:300])
                                  for t, why in failed.items()])
        return len(ordered)

    # -- queries -----------------------------------------------------------------------------
    @_healed
    def problems(self) -> dict[str, Any]:
        """What the index skipped or could only show in part.

        ``bad_lines`` / ``bad_spans``: what could not be decoded or indexed; ``bad_trajectories``:
        trajectories listed but whose row could not be computed (shown as errors, "not indexed");
        ``notices``: what happened to the index itself (a damaged file rebuilt);
        ``examples``: the first few problems, as text.
        """
        conn = self._conn()
        files = conn.execute(
            "SELECT count(*), coalesce(sum(lines),0), coalesce(sum(bad_lines),0), "
            "coalesce(sum(bad_spans),0), coalesce(sum(pending_bytes > 0),0), "
            "coalesce(sum(offset),0) FROM files").fetchone()
        partial = conn.execute(
            "SELECT count(*) FROM trajectories WHERE span_id = ''").fetchone()[0]
        total = conn.execute("SELECT count(*) FROM trajectories").fetchone()[0]
        spans = conn.execute("SELECT count(*) FROM spans").fetchone()[0]
        first = [r[0] for r in conn.execute(
            "SELECT value FROM meta WHERE key LIKE 'problem:%' LIMIT 5")]
        bad_trajectories = conn.execute(
            "SELECT count(*) FROM meta WHERE key LIKE 'problem:trace:%'").fetchone()[0]
        notices = [r[0] for r in conn.execute(
            "SELECT value FROM meta WHERE key LIKE 'notice:%' ORDER BY key DESC LIMIT 3")]
        return {
            "files": files[0], "lines": files[1], "bad_lines": files[2], "bad_spans": files[3],
            "files_with_incomplete_last_line": files[4], "bytes": files[5],
            "trajectories": total, "partial_trajectories": partial, "spans": spans,
            "bad_trajectories": bad_trajectories, "notices": notices,
            "examples": [*notices, *first][:8],
        }

    @_healed
    def experiments(self) -> list[str]:
        return [r[0] for r in self._conn().execute(
            "SELECT DISTINCT experiment FROM trajectories WHERE experiment IS NOT NULL "
            "ORDER BY experiment")]

    @_healed
    def overview(self, experiment: str | None = None) -> list[dict[str, Any]]:
        """Per (experiment, validate, step): weighted reward mean / pass rate / spread, counts."""
        where, params = ("WHERE experiment IS ?", [experiment]) if experiment else ("", [])
        sql = f"""
            SELECT experiment, validate, step, count(*), sum(weight),
                   sum(weight * reward) / nullif(sum(CASE WHEN reward IS NOT NULL
                                                      THEN weight END), 0),
                   sum(weight * reward * reward) / nullif(sum(CASE WHEN reward IS NOT NULL
                                                              THEN weight END), 0),
                   sum(CASE WHEN reward > 0 THEN weight ELSE 0 END)
                       / nullif(sum(CASE WHEN reward IS NOT NULL THEN weight END), 0),
                   min(reward), max(reward), avg(turns), sum(weight * tokens_in) / sum(weight),
                   sum(weight * tokens_out) / sum(weight), sum(tool_calls), sum(tool_errors),
                   avg(duration_ns), max(duration_ns), sum(errors > 0), avg(llm_ns),
                   count(DISTINCT sample_index), sum(span_id = ''),
                   sum(CASE WHEN errors > 0 THEN weight ELSE 0 END) / nullif(sum(weight), 0),
                   group_concat(DISTINCT sampling_reason)
            FROM trajectories {where}
            GROUP BY experiment, validate, step ORDER BY experiment, validate, step"""
        out = []
        for r in self._conn().execute(sql, params):
            mean, mean_sq = r[5], r[6]
            std = math.sqrt(max(mean_sq - mean * mean, 0.0)) if mean is not None else None
            out.append({
                "experiment": r[0], "validate": None if r[1] is None else bool(r[1]),
                "step": r[2], "trajectories": r[3], "weight": r[4], "reward_mean": mean,
                "reward_std": std, "pass_rate": r[7], "reward_min": r[8], "reward_max": r[9],
                "turns_mean": r[10], "tokens_in_mean": r[11], "tokens_out_mean": r[12],
                "tool_calls": r[13], "tool_errors": r[14], "duration_mean_ns": r[15],
                "duration_max_ns": r[16], "with_errors": r[17], "llm_mean_ns": r[18],
                "prompts": r[19], "partial": r[20], "error_rate": r[21],
                "sampling_reasons": sorted((r[22] or "").split(",")) if r[22] else [],
                "ran": None, "dropped": None,
            })
        reports = self.sampling_reports()
        for row in out:
            counts = reports.pop((row["experiment"], row["validate"], row["step"]), None)
            if counts is not None:
                row["ran"], row["dropped"] = counts.get("ran", 0), counts.get("dropped", 0)
        for (exp, validate, step), counts in reports.items():  # steps where nothing was kept
            if experiment and exp != experiment:
                continue
            out.append({"experiment": exp, "validate": validate, "step": step, "trajectories": 0,
                        "weight": 0.0, "ran": counts.get("ran", 0),
                        "dropped": counts.get("dropped", 0)})
        out.sort(key=lambda r: (str(r["experiment"]), bool(r["validate"]), r["step"] or 0))
        return out

    @_healed
    def sampling_reports(self) -> dict[tuple[Any, Any, Any], dict[str, int]]:
        """The samplers' per-step reports summed (the store's ``sampling_reports``)."""
        spans = ({"name": semconv.SAMPLING_REPORT_SPAN, "parent_span_id": None,
                  "trace_id": trace_id, "span_id": span_id, "attributes": json.loads(attributes)}
                 for trace_id, span_id, attributes in self._conn().execute(
                     "SELECT trace_id, span_id, attributes FROM reports"))
        return sampling_reports(spans)

    @_healed
    def flat_groups(self, experiment: str | None = None) -> list[dict[str, Any]]:
        """Per (experiment, validate, step): GRPO groups whose rollouts all got the same reward
        (zero advantage: no learning signal)."""
        where, params = ("AND experiment IS ?", [experiment]) if experiment else ("", [])
        sql = f"""
            SELECT experiment, validate, step, count(*), sum(lo = hi) FROM (
                SELECT experiment, validate, step, sample_index, min(reward) lo, max(reward) hi
                FROM trajectories WHERE reward IS NOT NULL AND sample_index IS NOT NULL {where}
                GROUP BY experiment, validate, step, sample_index HAVING count(*) > 1)
            GROUP BY experiment, validate, step"""
        return [{"experiment": r[0], "validate": None if r[1] is None else bool(r[1]),
                 "step": r[2], "groups": r[3], "flat_groups": r[4]}
                for r in self._conn().execute(sql, params)]

    @_healed
    def trajectories(
        self,
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
        order: str = "start_ns",
        descending: bool = False,
        page: int = 0,
        page_size: int = 50,
        with_search: bool = False,
        max_page_size: int = 5000,
    ) -> dict[str, Any]:
        """One page of trajectory rows matching every given filter, and the total count.

        ``with_search`` adds each row's lower-cased search text (``search``: prompt, answer, tool
        calls, error; what ``text`` matches), for the offline report's own filtering.
        """
        found = filter_clauses(
            SQLITE, experiment=experiment, step=step, sample_index=sample_index,
            rollout_n=rollout_n, validate=validate, reward_min=reward_min,
            reward_max=reward_max, errors_only=errors_only, text=text, trace_id=trace_id)
        where, params = found.where, list(found.params)
        order = sort_column(order)
        direction = "DESC" if descending else "ASC"
        page, page_size = page_window(page, page_size, max_page_size)
        columns = [*TRAJECTORY_COLUMNS, *(("search",) if with_search else ())]
        conn = self._conn()
        total = conn.execute(f"SELECT count(*) FROM trajectories {where}", params).fetchone()[0]
        rows = conn.execute(
            f"SELECT {', '.join(columns)} FROM trajectories {where} "
            f"ORDER BY {order} IS NULL, {order} {direction}, step, sample_index, rollout_n, key "
            "LIMIT ? OFFSET ?",
            [*params, page_size, page * page_size]).fetchall()
        return {"total": total, "page": page, "page_size": page_size,
                "rows": [_row_dict(r, columns) for r in rows]}

    @_healed
    def trajectory_row(self, key: str) -> dict[str, Any] | None:
        row = self._conn().execute(
            f"SELECT {', '.join(TRAJECTORY_COLUMNS)} FROM trajectories WHERE key = ?",
            (_clean(str(key)),)).fetchone()
        return _row_dict(row) if row else None

    @_healed
    def trace_spans(self, trace_id: str) -> list[dict[str, Any]]:
        """Every stored span of one trace, fully decoded (re-read from the lines that hold it).

        Raises:
            _Damaged: (internal; the index rebuilds itself and answers again) a line the index
            names does not start where it says or does not hold the trace.
        """
        conn = self._conn()
        files = {r[0]: r[1] for r in conn.execute("SELECT file_id, path FROM files")}
        spans: list[dict[str, Any]] = []
        for file_id, offset in conn.execute(
                "SELECT file_id, offset FROM trace_lines WHERE trace_id = ? ORDER BY file_id, "
                "offset", (_clean(str(trace_id)),)).fetchall():
            path = files.get(file_id)
            if path is None:
                raise _Damaged(f"trace {trace_id}: file {file_id} is not in the index")
            found = [s for s in self._line(path, offset) if s["trace_id"] == trace_id]
            if not found and os.path.exists(path):
                raise _Damaged(f"{path} at byte {offset} does not hold trace {trace_id}")
            spans.extend(found)
        return spans

    def _line(self, path: str, offset: int) -> list[dict[str, Any]]:
        """The decoded spans of one stored line; the last few are kept (the rollouts of a group
        share their lines). Lines never change once complete: the store only appends."""
        cached = self._lines.get(path, offset)
        if cached is not None:
            return cached
        raw = line_at(path, offset)
        if raw is None:  # unreadable, or not the start of a line: the index's offsets are wrong
            return []
        try:
            decoded, _, _ = _decode_line(raw)
        except Exception:  # noqa: BLE001 - the indexer read it; a page must not fail on it
            decoded = []
        self._lines.put(path, offset, decoded)
        return decoded


def _row_dict(row: Iterable[Any], columns: Iterable[str] = TRAJECTORY_COLUMNS) -> dict[str, Any]:
    out = dict(zip(columns, row, strict=True))
    if out["validate"] is not None:
        out["validate"] = bool(out["validate"])
    return out


def _decode_line(raw: bytes) -> tuple[list[dict[str, Any]], int, str | None]:
    """(spans, bad spans, why the line is bad) for one store line, with the store's decoder."""
    try:
        request = json.loads(raw)
    except RecursionError:
        return [], 0, "nested too deeply"
    except (ValueError, UnicodeDecodeError) as error:
        return [], 0, str(error)[:200]
    if not isinstance(request, dict):
        return [], 0, "not an OTLP request"
    resource_spans = request.get("resourceSpans", request.get("resource_spans"))
    if not isinstance(resource_spans, list):
        return [], 0, "no resourceSpans list"
    spans = _quiet_decode(request)
    return spans, max(_raw_span_count(resource_spans) - len(spans), 0), None


def _raw_span_count(resource_spans: list[Any]) -> int:
    """How many spans a request says it holds (an entry of the wrong shape counts as one)."""
    count = 0
    for rs in resource_spans:
        if not isinstance(rs, dict):
            count += 1
            continue
        scopes = rs.get("scopeSpans", rs.get("scope_spans", rs.get("instrumentationLibrarySpans")))
        if not isinstance(scopes, list):
            count += scopes is not None
            continue
        for ss in scopes:
            spans = ss.get("spans") if isinstance(ss, dict) else None
            count += len(spans) if isinstance(spans, list) else 1
    return count


def iter_stats(stats: IndexStats) -> Iterator[tuple[str, Any]]:
    yield from asdict(stats).items()
