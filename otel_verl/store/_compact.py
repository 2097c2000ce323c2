"""Compaction: the store's OTLP/JSON lines into Parquet segments, crash-safe and incremental.

Layout, beside the store (``<trace_dir>/.otel_verl_lake/``)::

    manifest.v2                      which bytes of which store file are in which segments
    spans/experiment=<e>/step=<n>/part-<run>-<chunk>.parquet     one row per span (_schema)
    payload/experiment=<e>/step=<n>/part-<run>-<chunk>.parquet   the spans' payload content
    tmp/                             segments being written (removed by the next compaction)
    lock                             one compaction at a time (flock)

A store file is compacted up to its last complete line; the manifest records, per file, the
byte offset reached (``end``), a fingerprint of its first 4 KiB and a generation. Readers read
the segments the manifest names, and each store file's raw lines from its ``end`` on, so a span
is read from exactly one place. A file that shrank or whose head changed (replaced) gets a new
generation: its old rows are excluded (``source`` names the generation) and it is read again
from byte 0.

Crash safety: segments are written under ``tmp/``, synced and renamed into place; then the
manifest is rewritten (write, fsync, rename). A compaction killed at any point leaves either the
old manifest (the renamed segments are orphans, invisible to readers, deleted by the next run)
or the new one. The manifest is committed after every chunk, so the next run resumes where the
killed one stopped.

When: ``compact`` takes closed files whole (their writer process is gone: the file name holds
the pid and the host, see :mod:`otel_verl.exporters._file_exporter`; a foreign host's file once
it has not changed for ``idle_s``) and a live file only when its not-compacted part exceeds
``live_bytes``, so a live run's newest lines stay in the raw files, read directly.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gc
import hashlib
import itertools
import json
import os
import shutil
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_verl._otlp_json import iter_spans
from otel_verl.store import list_files
from otel_verl.store._arrowrows import add_parsed, parse_stretch
from otel_verl.store._fastrows import add_resource_spans
from otel_verl.store._record import SpanRecord
from otel_verl.store._schema import Columns
from otel_verl.store._writers import IDLE_S, LIVE_BYTES, is_closed

__all__ = ["SKIP_DIRS", "BackgroundCompactor", "CompactStats", "Manifest", "compact", "decode_range", "lake_dir",
           "pending_bytes"]

LAKE_DIR = ".otel_verl_lake"
#: the lake's layout version is its manifest's name. v2: the answer column via ``answer_text``
#: (store index schema 6; v1 lakes kept token2text's trailing ``<|im_end|>``). A lake of an
#: older layout is derived data: the next compaction removes it and compacts the store again;
#: until then readers find no manifest and read the raw files.
MANIFEST = "manifest.v2"
OLD_MANIFESTS = ("manifest.v1",)
#: directories under the store that hold no span lines: the lake itself, the content store
SKIP_DIRS = (LAKE_DIR + os.sep, "content" + os.sep, ".otel_verl_index" + os.sep)
NULL_PART = "__HIVE_DEFAULT_PARTITION__"
_HEAD = 4096
#: bytes read (and parsed by pyarrow.json) at once
STRETCH = 32 << 20
#: spans gathered before a chunk is written and committed
CHUNK_SPANS = 200_000
#: rows per Parquet row group (small, and lz4 for the span segments: a trajectory page reads
#: one row group; 256 x lz4 reads one in ~1 ms where 2048 x zstd took ~14 ms, for 3x the bytes;
#: 512 writes in 0.6x the time of 256, and the files are 0.7x the size)
ROW_GROUP = 512
#: the span columns with min/max statistics: those a reader's filter can prune row groups by
#: (the page's TraceId, an excluded source, the identity, time, kind and status). Random ids,
#: maps and long text get none (a statistic holds the whole min and max value; with 512-row
#: groups the statistics of every column were a fifth of the segments' encoding time)
_STATISTICS = ("TraceId", "Timestamp", "Duration", "SpanName", "SpanKind", "StatusCode",
               "ServiceName", "experiment", "project", "step", "sample_index", "rollout_n",
               "validate", "is_trajectory", "is_report", "is_llm", "is_tool", "tool_name",
               "tool_error", "reward", "source")
#: span columns dictionary-encoded in the segments: each span carries its resource's map, the
#: same few maps over and over (36 MB per 100k spans in memory, a few KB encoded so)
_DICTIONARY = ("ResourceAttributes.key_value.key", "ResourceAttributes.key_value.value")
#: threads encoding a chunk's segment files (Parquet's writer releases the GIL)
WRITE_THREADS = 4
#: whole stretches of lines go through pyarrow.json and Arrow compute (store/_arrowrows) when
#: they hold only what the writers produce; False: every line through store/_fastrows
ARROW_ROWS = True
#: the span columns the trajectories cache is built from: compaction keeps them of each chunk it
#: writes (zero-copy views of its columns) and builds the cache from them, not from the segments
#: read back (store/_query.write_trajectory_cache)
CACHE_COLUMNS = ("TraceId", "SpanId", "ParentSpanId", "SpanName", "Timestamp", "Duration",
                 "StatusCode", "experiment", "project", "step", "sample_index", "rollout_n",
                 "validate", "is_trajectory", "is_report", "is_llm", "is_tool", "tool_error",
                 "reward", "eval_score", "eval_label", "turns", "tokens_in", "tokens_out",
                 "termination", "sampling_reason", "sampling_weight", "error_text",
                 "finish_reason", "policy_version", "report_counts", "source", "text_prompt",
                 "text_response", "text_tool")
#: at most this many bytes of them are held; past it the cache reads the segments back
CACHE_KEEP_BYTES = 512 << 20


def lake_dir(trace_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(trace_dir), LAKE_DIR)


@dataclass
class Manifest:
    """What is compacted: ``sources`` {relative path: {end, head, gen, lines, bad_lines,
    bad_spans}}, the committed ``segments`` and ``payloads`` (relative to the lake directory),
    and ``excluded`` source generations."""

    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    segments: list[str] = field(default_factory=list)
    payloads: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    runs: int = 0
    rows: int = 0  # span rows in the segments

    @classmethod
    def load(cls, lake: str) -> Manifest:
        try:
            with open(os.path.join(lake, MANIFEST), "rb") as handle:
                data = orjson.loads(handle.read())
        except FileNotFoundError:
            return cls()
        return cls(data["sources"], data["segments"], data["payloads"], data["excluded"],
                   data["runs"], data.get("rows", 0))

    def save(self, lake: str) -> None:
        data = orjson.dumps({"version": 1, "sources": self.sources, "segments": self.segments,
                             "payloads": self.payloads, "excluded": self.excluded,
                             "runs": self.runs, "rows": self.rows})
        tmp = os.path.join(lake, f"{MANIFEST}.{os.getpid()}.tmp")
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, os.path.join(lake, MANIFEST))
        _sync_dir(lake)

    @staticmethod
    def path_of(trace_dir: str | os.PathLike[str]) -> str:
        """Where a store's manifest of this layout is (its name is the layout's version)."""
        return os.path.join(lake_dir(trace_dir), MANIFEST)

    @staticmethod
    def source_id(path: str, gen: int) -> str:
        return f"{path}#{gen}"


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fingerprint(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha1(handle.read(_HEAD)).hexdigest()


def raw_start(manifest: Manifest, rel: str, path: str, size: int) -> tuple[int, int]:
    """``(offset, generation)`` from which a store file's lines are not in the segments."""
    entry = manifest.sources.get(rel)
    if entry is None:
        return 0, 0
    try:
        same = size >= entry["end"] and fingerprint(path) == entry["head"]
    except OSError:
        same = False
    return (entry["end"], entry["gen"]) if same else (0, entry["gen"] + 1)


#: how long the compaction's memory pool keeps freed pages for the next allocation (ms)
POOL_DECAY_MS = 10_000
_pool_lock = threading.Lock()
_pool_users: list[Any] = [0, None]  # compactions running in this process, the pool before


@contextlib.contextmanager
def arrow_pool() -> Iterator[None]:
    """Arrow allocates from its jemalloc pool while compactions run, with freed pages kept
    :data:`POOL_DECAY_MS` (then handed back to the system at the end): pyarrow's default
    mimalloc pool returns freed pages to the system within milliseconds, and compaction frees
    and allocates hundreds of MB per stretch, so each was faulted in again (1.0-2.5 s of
    system CPU per 10k trajectories, against 0.6-1.1 s with this pool). The default pool is
    the process's (other threads allocate from this one meanwhile; every buffer is freed to
    its own pool); it is set back when the last compaction of the process ends. Without
    jemalloc (some platforms' wheels), nothing changes."""
    try:
        pool = pa.jemalloc_memory_pool()
    except (NotImplementedError, pa.ArrowNotImplementedError):
        yield
        return
    with _pool_lock:
        if not _pool_users[0]:
            _pool_users[1] = pa.default_memory_pool()
            pa.jemalloc_set_decay_ms(POOL_DECAY_MS)
            pa.set_memory_pool(pool)
        _pool_users[0] += 1
    try:
        yield
    finally:
        with _pool_lock:
            _pool_users[0] -= 1
            if not _pool_users[0]:
                pa.set_memory_pool(_pool_users[1])
                _pool_users[1] = None
                pa.jemalloc_set_decay_ms(1000)  # (Arrow's own setting)
                pool.release_unused()


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector paused: decoding allocates millions of dicts and lists that
    all stay alive, and each full collection walks all of them (compaction went quadratic:
    10k trajectories took 8x the time of 2k per line). Nothing decoded here forms cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def decode_range(path: str, start: int, stop: int | None, columns: Columns, source: str,
                 counts: dict[str, int] | None = None,
                 problems: list[str] | None = None, *, _legacy: bool = False,
                 _prefetch: _Prefetch | None = None, _file_stop: int | None = None) -> int:
    """Decode the whole lines of ``path`` in ``[start, stop)`` into ``columns``.

    ``counts`` gets ``lines``, ``bad_lines`` (not JSON, not OTLP), ``bad_spans`` and, when
    ``stop`` is None (to the end), ``truncated_lines`` (a last line without its newline);
    ``problems`` the first few as ``"file:offset: what"``. With ``_prefetch`` (compaction's
    loop), the next stretch of the file (up to ``_file_stop``) is read and parsed in its
    thread while this one's rows are built.

    Returns:
        The offset after the last complete line read (where the next read starts).
    """
    with no_gc():
        return _decode_range(path, start, stop, columns, source,
                             counts if counts is not None else {}, problems,
                             _add_line_legacy if _legacy else _add_line, _prefetch, _file_stop)


def _read_stretch(path: str, start: int, stop: int | None, arrow: bool, threads: bool = True
                  ) -> tuple[bytes | bytearray, int, tuple[pa.Table, list[int]] | None]:
    """A stretch's bytes, the index of its last newline (-1: none) and, with ``arrow``, its
    parse (:func:`otel_verl.store._arrowrows.parse_stretch`; None: refused, or no line)."""
    data: bytes | bytearray
    with open(path, "rb") as handle:
        handle.seek(start)
        if stop is None:
            data = handle.read()
        else:  # into a buffer cut at its last line in place (a slice of bytes copied it all)
            data = bytearray(max(0, stop - start))
            del data[handle.readinto(data) or 0:]
    last = data.rfind(b"\n")
    parsed = None
    if arrow and last >= 0:
        if isinstance(data, bytearray):
            del data[last + 1:]
        parsed = parse_stretch(data[:last + 1] if last + 1 < len(data) else data, threads)
    return data, last, parsed


class _Prefetch:
    """One stretch read and parsed ahead, in a thread (``pyarrow.json``'s parse releases the
    GIL: it runs beside the building of the rows before it, and beside a chunk's writes)."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(1, thread_name_prefix="otel_verl-prefetch")
        self._next: tuple[tuple[str, int, int], Any] | None = None

    def submit(self, path: str, start: int, stop: int) -> None:
        self._next = ((path, start, stop),
                      # one thread: it runs beside the rows' building (pyarrow's threads
                      # took ~1.3x the CPU for the same parse)
                      self._pool.submit(_read_stretch, path, start, stop, ARROW_ROWS, False))

    def take(self, path: str, start: int, stop: int | None, arrow: bool
             ) -> tuple[bytes | bytearray, int, tuple[pa.Table, list[int]] | None] | None:
        """The stretch read ahead when it is this one (None: read it now)."""
        ahead, self._next = self._next, None
        if ahead is None or ahead[0] != (path, start, stop) or not arrow:
            return None
        return ahead[1].result()

    def close(self) -> None:
        self._next = None
        self._pool.shutdown(wait=True)


def _decode_range(path: str, start: int, stop: int | None, columns: Columns, source: str,
                  counts: dict[str, int], problems: list[str] | None,
                  add_line: Callable[[bytes, list[str], Columns, str, int], None] | None = None,
                  prefetch: _Prefetch | None = None, file_stop: int | None = None) -> int:
    add_line = add_line or _add_line
    arrow = add_line is _add_line and ARROW_ROWS
    got = prefetch.take(path, start, stop, arrow) if prefetch is not None else None
    data, last, parsed = got if got is not None else _read_stretch(path, start, stop, arrow)
    end = start + last + 1 if last >= 0 else start
    if prefetch is not None and file_stop is not None and start < end < file_stop:
        prefetch.submit(path, end, min(file_stop, end + STRETCH))
    if stop is None and data[last + 1:].strip():
        counts["truncated_lines"] = counts.get("truncated_lines", 0) + 1
        if problems is not None and len(problems) < 20:
            problems.append(f"{path}:{end}: truncated last line")
    pos = 0
    limit = last + 1
    if parsed is not None:
        lines = add_parsed(columns, parsed, start, source)
        if lines is not None:
            counts["lines"] = counts.get("lines", 0) + lines
            return end
    data = bytes(data)  # (the lines as bytes, as the per-line decoders have always had them)
    bad: list[str] = []
    while pos < limit:
        nl = data.index(b"\n", pos)
        raw = data[pos:nl]
        offset = start + pos
        pos = nl + 1
        counts["lines"] = counts.get("lines", 0) + 1
        if not raw or raw.isspace():  # (not raw.strip(): a copy of every line)
            continue
        added = len(columns)
        add_line(raw, bad, columns, source, offset)
        if bad:
            kind = "bad_lines" if bad[0].startswith("line:") and len(columns) == added \
                else "bad_spans"
            counts[kind] = counts.get(kind, 0) + (1 if kind == "bad_lines" else len(bad))
            if problems is not None and len(problems) < 20:
                problems.append(f"{path}:{offset}: {bad[0].removeprefix('line: ')}"[:300])
            bad.clear()
    return end


def _scrubbed(value: Any) -> Any:
    """``value`` with lone surrogates in its strings escaped (what Arrow and Parquet refuse)."""
    if isinstance(value, str):
        try:
            value.encode()
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    if isinstance(value, dict):
        return {_scrubbed(k): _scrubbed(v) for k, v in value.items()}
    return value


def _resource_spans_of_line(raw: bytes, bad: list[str]) -> list[Any] | None:
    try:
        request = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        try:  # the stdlib reads what orjson refuses (lone surrogates, deep nesting, big ints)
            request = _scrubbed(json.loads(raw))
        except (ValueError, RecursionError):
            bad.append(f"line: {error}")
            return None
    resource_spans = request.get("resourceSpans", request.get("resource_spans")) \
        if isinstance(request, dict) else None
    if not isinstance(resource_spans, list):
        bad.append("line: no resourceSpans list")
        return None
    return resource_spans


def _add_line(raw: bytes, bad: list[str], columns: Columns, source: str, offset: int) -> None:
    """One line's span rows into ``columns`` (:mod:`otel_verl.store._fastrows`)."""
    resource_spans = _resource_spans_of_line(raw, bad)
    if resource_spans is None:
        return
    try:
        add_resource_spans(columns, resource_spans, source, offset, bad.append)
    except RecursionError:
        bad.append("line: nested too deeply")


def _spans_of_line(raw: bytes, bad: list[str]) -> Iterator[SpanRecord]:
    """One line's typed span records (the codec's path; :func:`_add_line` builds the same rows
    without them)."""
    resource_spans = _resource_spans_of_line(raw, bad)
    if resource_spans is None:
        return
    try:
        yield from iter_spans(resource_spans, bad.append)  # type: ignore[misc]
    except RecursionError:
        bad.append("line: nested too deeply")


def _add_line_legacy(raw: bytes, bad: list[str], columns: Columns, source: str,
                     offset: int) -> None:
    """:func:`_add_line` through the typed records and :meth:`Columns.add` (kept to check the
    fast path against)."""
    for span in _spans_of_line(raw, bad):
        columns.add(span, source, offset)


def _part_dir(experiment: Any, step: Any) -> str:
    exp = NULL_PART if experiment is None else urllib.parse.quote(str(experiment), safe="")
    return f"experiment={exp}/step={NULL_PART if step is None else int(step)}"


@dataclass
class CompactStats:
    """What one :func:`compact` call did."""

    files: int = 0
    bytes: int = 0
    spans: int = 0
    segments: int = 0
    skipped_live: int = 0
    seconds: float = 0.0
    busy: bool = False  # another compaction held the lock


def compact(trace_dir: str | os.PathLike[str], *, live_bytes: int = LIVE_BYTES,
            idle_s: float = IDLE_S, chunk_spans: int = CHUNK_SPANS,
            progress: Callable[[int, int], None] | None = None,
            _after_rename: Callable[[], None] | None = None) -> CompactStats:
    """Compact the store's closed files (and big live ones) into Parquet segments.

    Args:
        trace_dir: the store directory.
        live_bytes: compact a file still being written once this much of it is not compacted
            (0: every file, to its last complete line).
        idle_s: a foreign host's file is closed after this long unchanged.
        chunk_spans: spans per committed chunk.
        progress: called with ``(bytes done, bytes to do)``.

    Returns:
        What was done; ``busy`` when another compaction holds the lock (nothing done).
    """
    began = time.perf_counter()
    trace_dir = os.path.abspath(os.fspath(trace_dir))
    lake = lake_dir(trace_dir)
    stats = CompactStats()
    os.makedirs(os.path.join(lake, "tmp"), exist_ok=True)
    with arrow_pool(), open(os.path.join(lake, "lock"), "a+b") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            stats.busy = True
            return stats
        _retire_old_layout(lake)
        manifest = Manifest.load(lake)
        _remove_orphans(lake, manifest)
        before = (manifest.runs, len(manifest.segments), list(manifest.excluded))
        kept: list[pa.Table] | None = []  # this run's rows for the cache (None: too many)
        kept_bytes = 0
        trace_part: dict[str, tuple[Any, Any]] = {}
        work: list[tuple[str, str, int, int, int]] = []  # rel, path, start, stop, gen
        now = time.time()
        for path in list_files(trace_dir):
            rel = os.path.relpath(path, trace_dir)
            if rel.startswith(SKIP_DIRS):
                continue
            try:
                size = os.stat(path).st_size
            except OSError:
                continue
            start, gen = raw_start(manifest, rel, path, size)
            if size <= start:
                continue
            if not is_closed(path, now, idle_s) and size - start < live_bytes:
                stats.skipped_live += 1
                continue
            work.append((rel, path, start, size, gen))
        total = sum(stop - start for _, _, start, stop, _ in work)
        if work:
            trace_part.update(_known_partitions(lake, manifest.runs))
        done = 0
        run = f"{int(time.time())}-{uuid.uuid4().hex[:8]}"
        columns = Columns()
        pending: dict[str, dict[str, Any]] = {}
        chunk = 0

        def commit() -> None:
            nonlocal columns, chunk, kept, kept_bytes
            with no_gc():
                spans = columns.table()
                written = _write_chunk(lake, columns, f"{run}-{chunk}", trace_part, spans)
            if _after_rename is not None:
                _after_rename()
            manifest.segments.extend(written[0])
            manifest.payloads.extend(written[1])
            for rel, entry in pending.items():
                old = manifest.sources.get(rel)
                if old is not None and old["gen"] != entry["gen"]:
                    manifest.excluded.append(Manifest.source_id(rel, old["gen"]))
                manifest.sources[rel] = entry
            manifest.runs += 1
            manifest.rows += len(columns)
            manifest.save(lake)
            stats.segments += len(written[0])
            stats.spans += len(columns)
            if kept is not None:
                kept.append(spans.select(CACHE_COLUMNS))
                kept_bytes += kept[-1].nbytes  # (nbytes walks every buffer: once per chunk)
                if kept_bytes > CACHE_KEEP_BYTES:
                    kept = None
            del spans
            pending.clear()
            columns = Columns()
            chunk += 1
            if collect:  # the chunk's rows are gone: the young objects are few, and another
                gc.collect(1)  # thread's cyclic garbage need not wait for the whole run

        # the collector paused for the whole run, not per decoded stretch: re-enabled with
        # a chunk's rows alive, its first collection walked them all (9 % of the time)
        collect = gc.isenabled()
        with no_gc(), contextlib.closing(_Prefetch()) as prefetch:
            for rel, path, start, stop, gen in work:
                entry = dict(manifest.sources.get(rel) or {})
                if entry.get("gen", gen) != gen or not entry:
                    entry = {"gen": gen, "lines": 0, "bad_spans": 0}
                try:
                    entry["head"] = fingerprint(path)
                except OSError:
                    continue
                source = Manifest.source_id(rel, gen)
                pos = start
                while pos < stop:  # a chunk at most ~chunk_spans spans
                    step_stop = min(stop, pos + STRETCH)
                    counts: dict[str, int] = {}
                    end = decode_range(path, pos, step_stop, columns, source, counts,
                                       _prefetch=prefetch, _file_stop=stop)
                    if end == pos:  # no complete line in this stretch: a line > 32 MiB, or a torn end
                        if step_stop == stop:
                            break
                        found = _next_line(path, pos, stop)
                        if found is None:
                            break
                        end = decode_range(path, pos, found, columns, source, counts)
                    entry["lines"] += counts.get("lines", 0)
                    entry["bad_spans"] += counts.get("bad_spans", 0)
                    # kept apart (the viewer's banner counts lines and spans separately)
                    entry["bad_lines"] = entry.get("bad_lines", 0) + counts.get("bad_lines", 0)
                    entry["end"] = end
                    pending[rel] = dict(entry)
                    done += end - pos
                    stats.bytes += end - pos
                    pos = end
                    if progress is not None:
                        progress(done, total)
                    if len(columns) >= chunk_spans:
                        commit()
                stats.files += 1
            if pending or len(columns):
                commit()
        if stats.spans or not os.path.exists(_cache_of(lake, manifest.runs)):
            from otel_verl.store._query import write_trajectory_cache

            fresh = (pa.concat_tables(kept) if kept and stats.spans else None)
            kept = None
            write_trajectory_cache(lake, manifest, fresh, before if fresh is not None else None)
    stats.seconds = time.perf_counter() - began
    return stats


def _cache_of(lake: str, runs: int) -> str:
    return os.path.join(lake, "trajectories", f"cache-{runs}.parquet")


def _next_line(path: str, start: int, stop: int) -> int | None:
    with open(path, "rb") as handle:
        handle.seek(start)
        pos = start
        while pos < stop:
            block = handle.read(min(8 << 20, stop - pos))
            if not block:
                return None
            nl = block.find(b"\n")
            if nl >= 0:
                return pos + nl + 1
            pos += len(block)
    return None


def _write_chunk(lake: str, columns: Columns, name: str,
                 trace_part: dict[str, tuple[Any, Any]] | None = None,
                 spans: pa.Table | None = None) -> tuple[list[str], list[str]]:
    """Write one chunk's segments (one file per partition) and rename them into place.

    A span without experiment and step (an engine's) goes to its trace's partition when
    ``trace_part`` knows it (``{trace id: (experiment, step)}``, filled here as well), so a
    trajectory's spans sit together. ``spans``: ``columns.table()`` when the caller has it."""
    out: tuple[list[str], list[str]] = ([], [])
    if not len(columns):
        return out
    trace_part = trace_part if trace_part is not None else {}
    tmp_dir = os.path.join(lake, "tmp")
    moves: list[tuple[str, str]] = []
    # each segment is encoded and synced in a few threads (Parquet's encoding and the fsyncs
    # release the GIL); all of them finish before any rename, so the crash-safety order is
    # the same
    syncs = _Syncs()
    writers = _Syncs(WRITE_THREADS)
    spans = columns.table() if spans is None else spans
    _learn_partitions(spans, trace_part)
    for kind, table, keep in (("spans", spans, out[0]),
                              ("payload", columns.payload_table(), out[1])):
        if table.num_rows == 0:
            continue
        part_column = _partition_dirs(table, trace_part)
        # by partition, then trace (a stable sort, as sorted() on (part, trace) was); the take
        # across the chunks (pyarrow >= 16 gathers from them: a combine_chunks first copied
        # everything once more, 4x the take's time; an older pyarrow concatenates inside)
        order = pc.sort_indices(pa.table({"part": part_column, "trace": table.column("TraceId")}),
                                sort_keys=[("part", "ascending"), ("trace", "ascending")])
        table = table.take(order)
        part_column = part_column.take(order)
        statistics: bool | list[str] = True if kind != "spans" else list(_STATISTICS)
        cuts = pc.indices_nonzero(pc.not_equal(part_column.slice(1),
                                               part_column.slice(0, len(part_column) - 1)))
        bounds = [0, *(i + 1 for i in cuts.to_pylist()), len(part_column)]
        for begin, end in itertools.pairwise(bounds):
            part = part_column[begin].as_py()
            rel = f"{kind}/{part}/part-{name}.parquet"
            tmp = os.path.join(tmp_dir, f"{uuid.uuid4().hex}.parquet")
            writers.submit(functools.partial(_write_segment, table.slice(begin, end - begin),
                                             kind, statistics), tmp)
            moves.append((tmp, os.path.join(lake, rel)))
            keep.append(rel)
    writers.wait()
    for tmp, final in moves:
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.replace(tmp, final)
    for directory in {os.path.dirname(final) for _, final in moves}:
        syncs.submit(_sync_dir, directory)
    syncs.wait()
    return out


def _write_segment(table: pa.Table, kind: str, statistics: bool | list[str], path: str) -> None:
    """One segment file, written and synced."""
    # span segments without dictionary pages but for the resource maps (_DICTIONARY): with
    # 256-row groups and lz4 they saved nothing on the other columns (2.50 MB without, 2.53 MB
    # with, for 30k spans) and cost 20 % of the writing
    pq.write_table(table, path, compression="lz4" if kind == "spans" else "zstd",
                   row_group_size=ROW_GROUP, write_statistics=statistics,
                   use_dictionary=list(_DICTIONARY) if kind == "spans" else True)
    _sync_file(path)


def _learn_partitions(spans: pa.Table, trace_part: dict[str, tuple[Any, Any]]) -> None:
    """``trace_part`` gets each trace's first ``(experiment, step)`` among the rows with a
    step (a trace already there keeps its own)."""
    keys = spans.select(["TraceId", "experiment", "step"])
    stepped = keys.filter(pc.is_valid(keys.column("step")))
    traces = stepped.column("TraceId").combine_chunks()
    unique = pc.unique(traces)
    first = pc.index_in(unique, value_set=traces)  # the first row of each trace
    for trace, exp, step in zip(unique.to_pylist(),
                                stepped.column("experiment").take(first).to_pylist(),
                                stepped.column("step").take(first).to_pylist(), strict=True):
        trace_part.setdefault(trace, (exp, step))


def _partition_dirs(table: pa.Table, trace_part: dict[str, tuple[Any, Any]]) -> pa.Array:
    """Each row's partition directory (:func:`_part_dir`): its own experiment and step, or,
    with neither, its trace's from ``trace_part``."""
    exp = table.column("experiment").combine_chunks()
    step = table.column("step").combine_chunks()
    own = pc.or_(pc.is_valid(exp), pc.is_valid(step))
    if not pc.all(own, min_count=0).as_py():
        traces = table.column("TraceId").combine_chunks()
        lone = pc.unique(traces.filter(pc.invert(own)))
        found = [trace_part.get(t, (None, None)) for t in lone.to_pylist()]
        at = pc.index_in(traces, value_set=lone)
        exp = pc.if_else(own, exp, pa.array([e for e, _ in found], pa.string()).take(at))
        step = pc.if_else(own, step, pa.array([s for _, s in found], pa.int64()).take(at))
    names = pc.unique(exp)
    quoted = pa.array([NULL_PART if e is None else urllib.parse.quote(str(e), safe="")
                       for e in names.to_pylist()], pa.string())
    exp_text = quoted.take(pc.index_in(exp, value_set=names, skip_nulls=False))
    step_text = pc.fill_null(step.cast(pa.string()), NULL_PART)
    return pc.binary_join_element_wise("experiment=", exp_text, "/step=", step_text, "")


def _sync_file(path: str) -> None:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


class _Syncs:
    """Calls on paths (fsyncs, segment writes) run by a few threads; :meth:`wait` returns when
    all are done (and raises the first error)."""

    def __init__(self, threads: int = 8) -> None:
        self._threads = threads
        self._pool: Any = None
        self._pending: list[Any] = []

    def submit(self, fn: Callable[[str], None], path: str) -> None:
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="otel_verl-fsync")
        self._pending.append(self._pool.submit(fn, path))

    def wait(self) -> None:
        pending, self._pending = self._pending, []
        try:
            for future in pending:
                future.result()
        finally:
            if self._pool is not None and not self._pending:
                self._pool.shutdown(wait=True)
                self._pool = None


def _known_partitions(lake: str, runs: int) -> dict[str, tuple[Any, Any]]:
    """``{trace id: (experiment, step)}`` of the trajectories compacted so far (their cache)."""
    path = _cache_of(lake, runs)
    if not os.path.exists(path):
        return {}
    try:
        table = pq.read_table(path, columns=["trace_id", "experiment", "step"])
    except (OSError, pa.ArrowException):
        return {}
    return {t: (e, s) for t, e, s in zip(table.column("trace_id").to_pylist(),
                                         table.column("experiment").to_pylist(),
                                         table.column("step").to_pylist(), strict=True)
            if s is not None}


def _retire_old_layout(lake: str) -> None:
    """A lake written by an older layout (its manifest has another name): remove its segments,
    payloads and caches, then its manifest (last: a compaction killed midway does it again).
    Called under the lake's lock."""
    old = [os.path.join(lake, name) for name in OLD_MANIFESTS]
    if os.path.exists(os.path.join(lake, MANIFEST)) or not any(map(os.path.exists, old)):
        return
    for kind in ("spans", "payload", "trajectories", "tmp"):
        shutil.rmtree(os.path.join(lake, kind), ignore_errors=True)
    os.makedirs(os.path.join(lake, "tmp"), exist_ok=True)
    for path in old:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    _sync_dir(lake)


def _remove_orphans(lake: str, manifest: Manifest) -> None:
    """Segments a killed compaction renamed but never committed, and its temp files."""
    known = set(manifest.segments) | set(manifest.payloads)
    for kind in ("spans", "payload", "tmp"):
        top = os.path.join(lake, kind)
        for root, _, files in os.walk(top):
            for name in files:
                path = os.path.join(root, name)
                if kind == "tmp" or os.path.relpath(path, lake) not in known:
                    with contextlib.suppress(OSError):
                        os.remove(path)


def main_progress(stream: Any = sys.stderr) -> Callable[[int, int], None]:
    """A simple stderr progress bar for long compactions."""
    last = [0.0]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] < 0.5 and done < total:
            return
        last[0] = now
        width = 30
        filled = int(width * done / total) if total else width
        stream.write(f"\rcompacting: [{'#' * filled}{'.' * (width - filled)}] "
                     f"{done >> 20}/{total >> 20} MiB")
        if done >= total:
            stream.write("\n")
        stream.flush()
    return show


def pending_bytes(trace_dir: str | os.PathLike[str], idle_s: float = IDLE_S) -> tuple[int, int]:
    """``(closed, live)``: bytes of the store not compacted yet, in closed and in live files."""
    trace_dir = os.path.abspath(os.fspath(trace_dir))
    manifest = Manifest.load(lake_dir(trace_dir))
    closed = live = 0
    now = time.time()
    for path in list_files(trace_dir):
        rel = os.path.relpath(path, trace_dir)
        if rel.startswith(SKIP_DIRS):
            continue
        try:
            size = os.stat(path).st_size
        except OSError:
            continue
        start, _ = raw_start(manifest, rel, path, size)
        if size > start:
            if is_closed(path, now, idle_s):
                closed += size - start
            else:
                live += size - start
    return closed, live


class BackgroundCompactor:
    """Compacts a store every ``interval_s`` in a daemon thread (what ``otel-verl ui`` runs).

    Usage::

        compactor = BackgroundCompactor(trace_dir, on_done=lambda stats: lake.refresh())
        compactor.start()
        ...
        compactor.stop()

    ``on_done`` is called after a compaction that wrote something; errors are logged, never
    raised (the next round tries again). ``last`` holds the last round's :class:`CompactStats`.
    """

    def __init__(self, trace_dir: str | os.PathLike[str], interval_s: float = 30.0,
                 on_done: Callable[[CompactStats], None] | None = None, **options: Any) -> None:
        import threading

        self.trace_dir = os.fspath(trace_dir)
        self.interval_s = interval_s
        self.on_done = on_done
        self.options = options
        self.last: CompactStats | None = None
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel_verl-compact", daemon=True)

    def start(self) -> BackgroundCompactor:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the thread to stop and wait (at most ``timeout``) for a running round."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        import logging

        while not self._stop.is_set():
            try:
                stats = compact(self.trace_dir, **self.options)
                self.last = stats
                self.rounds += 1
                if stats.spans and self.on_done is not None:
                    self.on_done(stats)
            except Exception:  # noqa: BLE001 - a background round must not end the viewer
                logging.getLogger(__name__).warning(
                    "otel_verl: background compaction of %s failed", self.trace_dir,
                    exc_info=True)
            self._stop.wait(self.interval_s)
