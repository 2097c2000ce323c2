"""Read the local store: OTLP/JSON lines back into plain span dicts, filtered and grouped.

The store is what ``backend="file"`` writes (see :class:`otel_verl.exporters._file_exporter.FileSpanExporter`):
one ``ExportTraceServiceRequest`` per line in the OTLP/JSON encoding, the OpenTelemetry
Collector's ``file`` exporter format — so files written by a collector can be read too.

Usage::

    from otel_verl.store import read_spans, filter_spans, group_trajectories

    spans = list(read_spans("otel_verl_traces"))            # a directory or one file
    for trajectory in group_trajectories(filter_spans(spans, step=3)):
        print(trajectory.trace_id, trajectory.sample_index, trajectory.reward)
        for depth, span in trajectory.walk():
            print("  " * depth, span["name"])

A span dict has the keys ``name``, ``trace_id`` and ``span_id`` (lowercase hex),
``parent_span_id`` (hex or None), ``start_ns``, ``end_ns`` (int), ``kind`` (``"INTERNAL"``,
``"SERVER"``, ``"CLIENT"``, ``"PRODUCER"``, ``"CONSUMER"``), ``attributes`` (dict of decoded
values: str, int, float, bool, bytes, None, list, dict), ``status`` (``{"code": "UNSET"|"OK"|
"ERROR", "message": str}``), ``events`` (``[{"name", "time_ns", "attributes"}]``), ``links``
(``[{"trace_id", "span_id", "attributes"}]``), ``resource`` (dict) and ``scope``
(``{"name", "version"}``).

Reading never crashes on a bad line: a last line cut short (a writer that crashed or is still
writing) and undecodable lines are skipped, counted in :class:`ReadStats` and reported in one
warning.

The rest of the read side is here too, loaded on first use, so that importing this package
stays cheap and pulls neither DuckDB nor pyarrow (the ``lake`` extra) until one is used:
:class:`Lake` (the query layer, and the one engine of the statistics: the weighted step
statistics are :meth:`Lake.steps`), :func:`compact` (Parquet compaction),
:func:`filter_clauses` (the trajectory filters as SQL), :func:`live_board`,
:func:`export_file`, :class:`ContentIndex` and the span-meaning helpers the viewer shows
(:func:`is_llm_span`, :func:`first_error`, ...); :func:`lake_available` says whether the extra is
installed. The whole list is ``_LAZY`` below. ``StoreIndex``, ``IndexStats``,
``default_index_path``, ``step_statistics`` and ``StepStatistics`` were removed with the SQLite
index and the whole-store statistics (``_REMOVED`` says what replaces each).
"""

from __future__ import annotations

import importlib
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from otel_verl import semconv
from otel_verl._otlp_json import decode_line, iter_spans, spans_from_otlp_json

__all__ = [
    "ReadStats",
    "SpanNode",
    "Trajectory",
    "filter_spans",
    "filter_trajectories",
    "group_trajectories",
    "lake_available",
    "list_files",
    "read_spans",
    "sampling_reports",
    "spans_from_otlp_json",
]

_logger = logging.getLogger(__name__)

#: file name endings the reader picks up in a directory (ours: .jsonl; the collector's: any)
FILE_SUFFIXES = (".jsonl", ".json")
#: what the statistics and read paths (``otel-verl ui`` / ``report`` / ``traces list`` / ``sql``
#: / ``compact``, :class:`Lake`) say without DuckDB: they have no other engine
LAKE_EXTRA = "this needs the lake extra: pip install 'otel-verl[lake]'"


@dataclass
class ReadStats:
    """What a :func:`read_spans` pass saw; pass one in to have it filled."""

    files: int = 0
    lines: int = 0
    spans: int = 0
    bytes_read: int = 0
    #: a file's last line without its newline that does not parse (a crashed or active writer)
    truncated_lines: int = 0
    #: other lines that do not parse or do not have the OTLP shape
    bad_lines: int = 0
    #: spans inside otherwise good lines that could not be decoded
    bad_spans: int = 0
    #: the first few problems, as "file:line: what"
    problems: list[str] = field(default_factory=list)

    def _problem(self, text: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(text)

    @property
    def skipped(self) -> int:
        """Lines and spans left out."""
        return self.truncated_lines + self.bad_lines + self.bad_spans


def list_files(path: str | os.PathLike[str]) -> list[str]:
    """The store files under ``path`` (a file is returned as is), sorted by name.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    path = os.fspath(path)
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no trace file or directory at {path}")
    found: list[str] = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        found.extend(os.path.join(root, f) for f in files if f.endswith(FILE_SUFFIXES))
    return sorted(found)


def read_spans(
    path_or_dir: str | os.PathLike[str],
    *,
    stats: ReadStats | None = None,
    progress: Callable[[int], None] | None = None,
    warn: bool = True,
) -> Iterator[dict[str, Any]]:
    """Yield every span stored in a file or in the ``.jsonl``/``.json`` files under a directory.

    Args:
        path_or_dir: one store file, or a directory searched recursively.
        stats: filled in while reading (files, lines, spans, skipped lines).
        progress: called with the number of bytes consumed after each line.
        warn: log one warning at the end when lines or spans were skipped.

    Returns:
        An iterator of span dicts (see the module docstring), file by file, in file order.

    Raises:
        FileNotFoundError: ``path_or_dir`` does not exist. Nothing else: bad lines are skipped,
        counted in ``stats`` and reported in one warning at the end.
    """
    files = list_files(path_or_dir)  # raises here, not at the first next()
    return _read_files(
        files, os.fspath(path_or_dir), stats if stats is not None else ReadStats(), progress, warn
    )


def _read_files(
    files: list[str],
    where: str,
    stats: ReadStats,
    progress: Callable[[int], None] | None,
    warn: bool,
) -> Iterator[dict[str, Any]]:
    try:
        for path in files:
            yield from _read_file(path, stats, progress)
    finally:
        if warn and stats.skipped:
            _logger.warning(
                "otel_verl.store: skipped %d truncated line(s), %d bad line(s) and %d bad span(s) "
                "under %s (first: %s)",
                stats.truncated_lines,
                stats.bad_lines,
                stats.bad_spans,
                where,
                stats.problems[0] if stats.problems else "-",
            )


def _read_file(
    path: str, stats: ReadStats, progress: Callable[[int], None] | None
) -> Iterator[dict[str, Any]]:
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below, also when the caller stops early
    except OSError as error:
        stats.bad_lines += 1
        stats._problem(f"{path}: {error}")
        return
    stats.files += 1
    with handle:
        lineno = 0
        for raw in handle:
            lineno += 1
            stats.lines += 1
            stats.bytes_read += len(raw)
            if progress is not None:
                progress(len(raw))
            if not raw.strip():
                continue
            try:
                resource_spans = decode_line(raw)
            except ValueError as error:
                if not raw.endswith(b"\n"):
                    stats.truncated_lines += 1
                    stats._problem(f"{path}:{lineno}: truncated last line")
                else:
                    stats.bad_lines += 1
                    stats._problem(f"{path}:{lineno}: {str(error)[:200]}")
                continue

            def bad(what: str, where: str = f"{path}:{lineno}") -> None:
                stats.bad_spans += 1
                stats._problem(f"{where}: {what}")

            for span in iter_spans(resource_spans, bad):
                stats.spans += 1
                yield span


# --- filtering ----------------------------------------------------------------------------------

_UNSET: Any = object()


def _attr(span: dict[str, Any], key: str) -> Any:
    """A span attribute, falling back to the resource (where e.g. the experiment may live)."""
    value = span["attributes"].get(key, _UNSET)
    if value is _UNSET:
        value = span.get("resource", {}).get(key, _UNSET)
    return value


def _criteria(
    step: int | None,
    sample_index: int | None,
    rollout_n: int | None,
    experiment: str | None,
    validate: bool | None,
) -> list[tuple[str, Any]]:
    pairs = [
        (semconv.ROLLOUT_STEP, step),
        (semconv.ROLLOUT_SAMPLE_INDEX, sample_index),
        (semconv.ROLLOUT_ROLLOUT_N, rollout_n),
        (semconv.ROLLOUT_EXPERIMENT_NAME, experiment),
        (semconv.ROLLOUT_VALIDATE, validate),
    ]
    return [(key, wanted) for key, wanted in pairs if wanted is not None]


def _value_matches(value: Any, wanted: Any) -> bool:
    """Exact match, without letting True == 1 or False == 0 blur the two kinds of criteria."""
    if value is _UNSET:
        return False
    if isinstance(wanted, bool) or isinstance(value, bool):
        return value is wanted
    return bool(value == wanted)


def _matches(span: dict[str, Any], criteria: list[tuple[str, Any]]) -> bool:
    return all(_value_matches(_attr(span, key), wanted) for key, wanted in criteria)


def filter_spans(
    spans: Iterable[dict[str, Any]],
    *,
    step: int | None = None,
    sample_index: int | None = None,
    rollout_n: int | None = None,
    experiment: str | None = None,
    validate: bool | None = None,
) -> Iterator[dict[str, Any]]:
    """The spans whose own trajectory attributes match every given criterion.

    Every span inside a trajectory carries the trajectory attributes, so this works span by span.
    Spans that lack an attribute a criterion names do not match (e.g. an engine's spans from
    another process); use :func:`filter_trajectories` to keep whole trajectories.

    Args:
        spans: span dicts from :func:`read_spans`.
        step, sample_index, rollout_n, experiment, validate: ``None`` means any.
    """
    criteria = _criteria(step, sample_index, rollout_n, experiment, validate)
    if not criteria:
        yield from spans
        return
    for span in spans:
        if _matches(span, criteria):
            yield span


# --- trajectories -------------------------------------------------------------------------------


@dataclass
class SpanNode:
    """A span and its children (ordered by start time)."""

    span: dict[str, Any]
    children: list[SpanNode] = field(default_factory=list)


@dataclass
class Trajectory:
    """The spans of one trajectory: the subtree of a trajectory span, or a whole trace without one.

    Attributes:
        trace_id: the trace's id (hex).
        root: the trajectory span (``otel_verl.trajectory=True``), or None when it is missing
            (e.g. the process crashed before the trajectory ended, or the spans came from
            plain OTel instrumentation).
        tree: the top-level nodes: ``[SpanNode(root)]``, or the spans whose parent is absent.
        spans: every span of the trajectory, by start time.
    """

    trace_id: str
    root: dict[str, Any] | None
    tree: list[SpanNode]
    spans: list[dict[str, Any]]

    def walk(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(depth, span)`` pairs, depth first, children by start time."""
        stack = [(0, node) for node in reversed(self.tree)]
        while stack:
            depth, node = stack.pop()
            yield depth, node.span
            stack.extend((depth + 1, child) for child in reversed(node.children))

    def attribute(self, key: str, default: Any = None) -> Any:
        """``key`` from the trajectory span, else from the first span (by start) that has it."""
        if self.root is not None:
            value = _attr(self.root, key)
            if value is not _UNSET:
                return value
        for span in self.spans:
            value = _attr(span, key)
            if value is not _UNSET:
                return value
        return default

    @property
    def span_id(self) -> str | None:
        return self.root["span_id"] if self.root is not None else None

    @property
    def name(self) -> str:
        if self.root is not None:
            return str(self.root["name"])
        return str(self.tree[0].span["name"]) if self.tree else ""

    @property
    def step(self) -> Any:
        return self.attribute(semconv.ROLLOUT_STEP)

    @property
    def sample_index(self) -> Any:
        return self.attribute(semconv.ROLLOUT_SAMPLE_INDEX)

    @property
    def rollout_n(self) -> Any:
        return self.attribute(semconv.ROLLOUT_ROLLOUT_N)

    @property
    def validate(self) -> Any:
        return self.attribute(semconv.ROLLOUT_VALIDATE)

    @property
    def experiment(self) -> Any:
        return self.attribute(semconv.ROLLOUT_EXPERIMENT_NAME)

    @property
    def reward(self) -> Any:
        """``rollout.reward``, else the score of the first ``gen_ai.evaluation.result`` event."""
        value = self.attribute(semconv.ROLLOUT_REWARD)
        if value is not None:
            return value
        for span in self.spans:
            for event in span["events"]:
                if event["name"] == semconv.GEN_AI_EVALUATION_RESULT:
                    score = event["attributes"].get(semconv.GEN_AI_EVALUATION_SCORE_VALUE)
                    if score is not None:
                        return score
        return None

    @property
    def num_turns(self) -> Any:
        return self.attribute(semconv.ROLLOUT_NUM_TURNS)

    @property
    def sampling_reason(self) -> str | None:
        """Why it was exported (``rollout.sampling.reason``: head, error, group, ...), if said."""
        value = _attr(self.root, semconv.ROLLOUT_SAMPLING_REASON) if self.root else None
        return value if isinstance(value, str) else None

    @property
    def sampling_weight(self) -> float:
        """``rollout.sampling.weight``: how many trajectories this one stands for (1 / its
        inclusion probability); 1 when not recorded (everything was traced), 0 for overflow."""
        value = finite_number(_attr(self.root, semconv.ROLLOUT_SAMPLING_WEIGHT)) if self.root else None
        return value if value is not None and value >= 0 else 1.0

    @property
    def start_ns(self) -> int | None:
        if self.root is not None and self.root["start_ns"] is not None:
            return int(self.root["start_ns"])
        starts = [s["start_ns"] for s in self.spans if s["start_ns"] is not None]
        return min(starts) if starts else None

    @property
    def end_ns(self) -> int | None:
        if self.root is not None and self.root["end_ns"] is not None:
            return int(self.root["end_ns"])
        ends = [s["end_ns"] for s in self.spans if s["end_ns"] is not None]
        return max(ends) if ends else None

    @property
    def duration_ns(self) -> int | None:
        start, end = self.start_ns, self.end_ns
        return end - start if start is not None and end is not None else None

    @property
    def errors(self) -> list[dict[str, Any]]:
        """The spans with status ERROR."""
        return [s for s in self.spans if s["status"]["code"] == "ERROR"]

    @property
    def status(self) -> str:
        """``"error"`` when a span failed, ``"partial"`` without a trajectory span, else ``"ok"``."""
        if self.errors:
            return "error"
        return "partial" if self.root is None else "ok"

    def summary(self) -> dict[str, Any]:
        """A JSON-ready one-line description (what ``otel-verl traces list --json`` prints)."""
        return {
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "name": self.name,
            "experiment": self.experiment,
            "step": self.step,
            "sample_index": self.sample_index,
            "rollout_n": self.rollout_n,
            "validate": self.validate,
            "reward": self.reward,
            "turns": self.num_turns,
            "spans": len(self.spans),
            "start_ns": self.start_ns,
            "duration_ns": self.duration_ns,
            "status": self.status,
            "errors": len(self.errors),
            "sampling_reason": self.sampling_reason,
            "sampling_weight": self.sampling_weight,
        }


def finite_number(value: Any) -> float | None:
    """A number as a finite float; None for anything else (bools, NaN, infinities, integers
    too large for a float), so hostile values never poison a sum."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _start_key(span: dict[str, Any]) -> tuple[int, str]:
    return (span["start_ns"] or 0, span["span_id"])


def _build_tree(spans: list[dict[str, Any]], top: list[dict[str, Any]]) -> list[SpanNode]:
    """Nodes for ``top`` with their descendants among ``spans`` (ids are unique in ``spans``)."""
    children: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        parent = span["parent_span_id"]
        if parent is not None:
            children.setdefault(parent, []).append(span)
    seen: set[str] = set()

    def node(span: dict[str, Any]) -> SpanNode:
        root = SpanNode(span)
        stack = [root]
        seen.add(span["span_id"])
        while stack:  # iterative: deep traces must not hit the recursion limit
            current = stack.pop()
            for child in sorted(children.get(current.span["span_id"], ()), key=_start_key):
                if child["span_id"] in seen:  # a cycle in corrupt data
                    continue
                seen.add(child["span_id"])
                child_node = SpanNode(child)
                current.children.append(child_node)
                stack.append(child_node)
        return root

    return [node(span) for span in sorted(top, key=_start_key)]


def _trajectories_of_trace(trace_id: str, spans: list[dict[str, Any]]) -> list[Trajectory]:
    by_id = {s["span_id"]: s for s in spans}
    marked = [s for s in spans if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY) is True]
    if not marked:
        top = [s for s in spans if s["parent_span_id"] not in by_id]
        if not top:  # every span has a parent in the trace: a cycle in corrupt data
            top = [min(spans, key=_start_key)]
        tree = _build_tree(spans, top)
        return [Trajectory(trace_id, None, tree, sorted(spans, key=_start_key))]

    # a trace may hold several trajectories (e.g. under a step span): each is a subtree; a nested
    # trajectory span starts its own trajectory
    marked_ids = {s["span_id"] for s in marked}
    children: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        if span["parent_span_id"] is not None:
            children.setdefault(span["parent_span_id"], []).append(span)
    owner: dict[str, str] = {}
    result = []
    for traj_span in sorted(marked, key=_start_key):
        members = [traj_span]
        owner[traj_span["span_id"]] = traj_span["span_id"]
        stack = [traj_span["span_id"]]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child["span_id"] in marked_ids or child["span_id"] in owner:
                    continue
                owner[child["span_id"]] = traj_span["span_id"]
                members.append(child)
                stack.append(child["span_id"])
        tree = _build_tree(members, [traj_span])
        result.append(Trajectory(trace_id, traj_span, tree, sorted(members, key=_start_key)))

    # spans outside every trajectory: drop the ancestors of trajectory spans (e.g. a step span),
    # keep the rest (e.g. children of a trajectory span that never ended) as a partial trajectory
    ancestors: set[str] = set()
    for traj_span in marked:
        parent = traj_span["parent_span_id"]
        while parent is not None and parent in by_id and parent not in ancestors:
            ancestors.add(parent)
            parent = by_id[parent]["parent_span_id"]
    rest = [s for s in spans if s["span_id"] not in owner and s["span_id"] not in ancestors]
    if rest:
        rest_ids = {s["span_id"] for s in rest}
        top = [s for s in rest if s["parent_span_id"] not in rest_ids]
        if top:
            tree = _build_tree(rest, top)
            result.append(Trajectory(trace_id, None, tree, sorted(rest, key=_start_key)))
    return result


def group_trajectories(spans: Iterable[dict[str, Any]]) -> list[Trajectory]:
    """Group spans into trajectories, each with its span tree; ordered by start time.

    A trajectory is the subtree of a trajectory span (the span ``rollout_trace_attr`` opens),
    including spans from other processes that joined the trace (engines, Ray workers). A trace
    without a trajectory span is one trajectory whose tree starts at the spans without a parent.
    A span seen twice (same trace and span id) is kept once.
    """
    traces: dict[str, dict[str, dict[str, Any]]] = {}
    for span in spans:
        if _is_sampling_report(span):  # a worker's per-step counts, not a trajectory
            continue
        traces.setdefault(span["trace_id"], {}).setdefault(span["span_id"], span)
    result = []
    for trace_id, by_id in traces.items():
        result.extend(_trajectories_of_trace(trace_id, list(by_id.values())))
    result.sort(key=lambda t: (t.start_ns or 0, t.trace_id))
    return result


def filter_trajectories(
    trajectories: Iterable[Trajectory],
    *,
    step: int | None = None,
    sample_index: int | None = None,
    rollout_n: int | None = None,
    experiment: str | None = None,
    validate: bool | None = None,
) -> list[Trajectory]:
    """The trajectories whose attributes (see :meth:`Trajectory.attribute`) match every criterion."""
    criteria = _criteria(step, sample_index, rollout_n, experiment, validate)
    out = []
    for trajectory in trajectories:
        if all(_value_matches(trajectory.attribute(key, _UNSET), w) for key, w in criteria):
            out.append(trajectory)
    return out


# --- sampling: per-step statistics that use the weights -------------------------------------------

StepKey = tuple[Any, Any, Any]  # (experiment, validate, step)


def _is_sampling_report(span: dict[str, Any]) -> bool:
    return span["name"] == semconv.SAMPLING_REPORT_SPAN and span["parent_span_id"] is None


def sampling_reports(spans: Iterable[dict[str, Any]]) -> dict[StepKey, dict[str, int]]:
    """The workers' sampling reports (``otel_verl.sampling_report`` spans) summed per step.

    Returns:
        ``{(experiment, validate, step): {"ran": .., "dropped": .., "over_budget": ..,
        "kept.head": .., "kept.error": .., ...}}``; reports are increments, so they add up over
        workers and flushes.
    """
    totals: dict[StepKey, dict[str, int]] = {}
    seen: set[tuple[str, str]] = set()
    prefix = "rollout.sampling."
    for span in spans:
        if not _is_sampling_report(span) or (span["trace_id"], span["span_id"]) in seen:
            continue
        seen.add((span["trace_id"], span["span_id"]))
        attributes = span["attributes"]
        key = (attributes.get(semconv.ROLLOUT_EXPERIMENT_NAME),
               attributes.get(semconv.ROLLOUT_VALIDATE), attributes.get(semconv.ROLLOUT_STEP))
        counts = totals.setdefault(key, {})
        for name, value in attributes.items():
            if name.startswith(prefix) and isinstance(value, int) and not isinstance(value, bool):
                counts[name[len(prefix):]] = counts.get(name[len(prefix):], 0) + value
    return totals


# --- the rest of the read side, loaded on first use ---------------------------------------------

#: public name -> (private module of this package, its name there). Not in ``__all__``: a star
#: import would load DuckDB (and fail without the ``lake`` extra).
_LAZY: dict[str, tuple[str, str]] = {
    **{name: ("_query", name) for name in ("Lake", "LakeState")},
    **{name: ("_compact", name) for name in ("Manifest", "compact", "main_progress",
                                             "pending_bytes")},
    **{name: ("_record", name) for name in ("answer_text", "decode_quietly", "first_error",
                                            "is_llm_span", "is_tool_error", "is_tool_span",
                                            "json_or_none", "prompt_and_response",
                                            "reward_label")},
    **{name: ("_filters", name) for name in ("DUCKDB", "SQLITE", "TRAJECTORY_COLUMNS",
                                             "BadRequest", "clean_text", "filter_clauses",
                                             "page_window", "sort_column")},
    **{name: ("_live", name) for name in ("live_board", "live_workers")},
    **{name: ("_lines", name) for name in ("LineCache", "line_at")},
    "export_file": ("_export", "export_file"),
    **{name: ("_content", name) for name in ("ContentIndex", "turn_prompts")},
}

if TYPE_CHECKING:  # the same names, typed (at run time ``__getattr__`` loads them)
    from otel_verl.store._compact import Manifest as Manifest
    from otel_verl.store._compact import compact as compact
    from otel_verl.store._compact import main_progress as main_progress
    from otel_verl.store._compact import pending_bytes as pending_bytes
    from otel_verl.store._content import ContentIndex as ContentIndex
    from otel_verl.store._content import turn_prompts as turn_prompts
    from otel_verl.store._export import export_file as export_file
    from otel_verl.store._filters import DUCKDB as DUCKDB
    from otel_verl.store._filters import SQLITE as SQLITE
    from otel_verl.store._filters import TRAJECTORY_COLUMNS as TRAJECTORY_COLUMNS
    from otel_verl.store._filters import BadRequest as BadRequest
    from otel_verl.store._filters import clean_text as clean_text
    from otel_verl.store._filters import filter_clauses as filter_clauses
    from otel_verl.store._filters import page_window as page_window
    from otel_verl.store._filters import sort_column as sort_column
    from otel_verl.store._lines import LineCache as LineCache
    from otel_verl.store._lines import line_at as line_at
    from otel_verl.store._live import live_board as live_board
    from otel_verl.store._live import live_workers as live_workers
    from otel_verl.store._query import Lake as Lake
    from otel_verl.store._query import LakeState as LakeState
    from otel_verl.store._record import answer_text as answer_text
    from otel_verl.store._record import decode_quietly as decode_quietly
    from otel_verl.store._record import first_error as first_error
    from otel_verl.store._record import is_llm_span as is_llm_span
    from otel_verl.store._record import is_tool_error as is_tool_error
    from otel_verl.store._record import is_tool_span as is_tool_span
    from otel_verl.store._record import json_or_none as json_or_none
    from otel_verl.store._record import prompt_and_response as prompt_and_response
    from otel_verl.store._record import reward_label as reward_label


#: public names removed when the lake became the only statistics and read engine (issue 19),
#: and what replaces each: asking for one says so
_REMOVED: dict[str, str] = {
    "StoreIndex": "the SQLite index is gone: the viewer reads through the lake "
                  "(otel_verl.store.Lake; otel_verl.ui._lake.LakeSource)",
    "IndexStats": "the SQLite index is gone (otel_verl.store.Lake.state says what was read)",
    "default_index_path": "the SQLite index is gone: the lake lives in <trace_dir>/.otel_verl_lake",
    "step_statistics": "the step statistics have one implementation, the lake's: "
                       "otel_verl.store.Lake.open(trace_dir).steps()",
    "StepStatistics": "the step statistics are the rows of otel_verl.store.Lake.steps() (dicts)",
}


def __getattr__(name: str) -> Any:
    """A name of ``_LAZY``, from its module (imported now, once; not cached here, so a test that
    patches the module is seen)."""
    place = _LAZY.get(name)
    if place is None:
        if name in _REMOVED:
            raise AttributeError(f"otel_verl.store.{name} was removed: {_REMOVED[name]} "
                                 f"({LAKE_EXTRA.removeprefix('this needs ')})")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = place
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def lake_available() -> bool:
    """Whether the ``lake`` extra (DuckDB, pyarrow) is installed: :class:`Lake` and
    :func:`compact` can be used."""
    try:
        importlib.import_module(f"{__name__}._query")
    except ImportError:
        return False
    return True
