"""``otel-verl``: look at the local trace store from a terminal, and run the rollout demo.

Usage::

    otel-verl traces list [--dir D] [--step N] [--sample-index N] [--rollout-n N] [--flag NAME]
                          [--experiment NAME] [--validate | --no-validate] [--json]
    otel-verl traces show TRACE_ID_PREFIX [--dir D] [--json] [--full]
    otel-verl traces compare TRACE_A TRACE_B [--dir D] [--json] [--full] [--differences-only]
    otel-verl traces replay SPOOL_DIR [--to otlp|weave|console] [--endpoint URL]
                            [--protocol grpc|http/protobuf] [--project P]
                            [--max-request-bytes N] [--remove]
    otel-verl sql "SELECT step, avg(reward) FROM trajectories GROUP BY step" [--dir D] [--json]
    otel-verl compact [--dir D] [--live]      # the store into Parquet segments (docs/lakehouse.md)
    otel-verl demo [ARGS...]        # otel_verl.demo.run (needs the "rollout" extras)
    otel-verl ui [--dir D] [--host 127.0.0.1] [--port 8686]   # the web viewer (docs/ui.md)
    otel-verl report [--dir D] -o FILE.html [--experiment E] [--step N] [--validate]

Configuration: ``--dir`` (every command; ``--trace-dir`` is an alias) defaults to
``$OTEL_VERL_TRACE_DIR``, else ``./otel_verl_traces`` — the same directory ``backend="file"``
writes to. Reading shows progress on stderr for large stores
(tqdm when installed); ``--progress``/``--no-progress`` force it on or off.

With the ``lake`` extra (duckdb, pyarrow), ``traces list``, ``sql`` and ``compact`` read through
the query layer (:class:`otel_verl.store.Lake`): Parquet segments plus the raw lines not compacted
yet; a store with more than 32 MiB of closed, not compacted files is compacted first.

Exit status: 0 success, 1 nothing to show (no store, no matching trace), 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from opentelemetry.semconv.attributes import exception_attributes

from otel_verl import semconv
from otel_verl.exporters._file_exporter import ENV_TRACE_DIR, resolve_trace_dir
from otel_verl.store import (
    DUCKDB,
    LAKE_EXTRA,
    BadRequest,
    ContentIndex,
    ReadStats,
    SpanNode,
    Trajectory,
    filter_clauses,
    group_trajectories,
    lake_available,
    list_files,
    read_spans,
    sampling_reports,
    turn_prompts,
)
from otel_verl.store._data_cli import add_export_parser, add_parity_parser

__all__ = ["main"]

#: characters of an input/output value shown without --full
PREVIEW_CHARS = 200
#: stores at least this large show progress by default (when stderr is a terminal)
PROGRESS_MIN_BYTES = 32 * 1024 * 1024
_EXCEPTION_EVENT = "exception"


# --- reading with progress ----------------------------------------------------------------------


class _Progress:
    """Bytes read so far: a tqdm bar when tqdm is installed, else a counter on stderr."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self._stream = stream
        self._total = max(total, 1)
        self._done = 0
        self._shown = -1
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar = None
        else:
            self._bar = tqdm(
                total=total, unit="B", unit_scale=True, desc="reading traces", file=stream
            )

    def __call__(self, nbytes: int) -> None:
        self._done += nbytes
        if self._bar is not None:
            self._bar.update(nbytes)
            return
        percent = self._done * 100 // self._total
        if percent != self._shown:
            self._shown = percent
            self._stream.write(f"\rreading traces: {self._done >> 20} / {self._total >> 20} MiB "
                               f"({percent}%)")
            self._stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._shown >= 0:
            self._stream.write("\n")
            self._stream.flush()


def _load(args: argparse.Namespace, reports: dict[Any, Any] | None = None,
          ) -> tuple[list[Trajectory], ReadStats] | None:
    """All trajectories under ``args.dir``; None (after saying why) when there is no store.

    ``reports``, when given, is filled with the workers' per-step sampling reports."""
    directory = args.dir
    try:
        files = list_files(directory)
    except FileNotFoundError:
        _say_no_traces(directory)
        return None
    total = 0
    for path in files:
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    show = args.progress
    if show is None:
        show = total >= PROGRESS_MIN_BYTES and sys.stderr.isatty()
    progress = _Progress(total, sys.stderr) if show else None
    stats = ReadStats()
    try:
        spans = list(read_spans(directory, stats=stats, progress=progress, warn=False))
    finally:
        if progress is not None:
            progress.close()
    if stats.skipped:
        print(
            f"otel-verl: skipped {stats.truncated_lines} truncated line(s) (a writer crashed or is "
            f"still writing), {stats.bad_lines} bad line(s), {stats.bad_spans} bad span(s); "
            f"first: {stats.problems[0] if stats.problems else '-'}",
            file=sys.stderr,
        )
    if reports is not None:
        reports.update(sampling_reports(spans))
    return group_trajectories(spans), stats


# --- formatting ---------------------------------------------------------------------------------


def _duration(ns: int | None) -> str:
    if ns is None:
        return "-"
    if ns < 1_000_000:
        return f"{ns / 1_000:.0f}µs"
    if ns < 1_000_000_000:
        return f"{ns / 1_000_000:.1f}ms"
    seconds = ns / 1e9
    if seconds < 60:
        return f"{seconds:.2f}s"
    minutes, seconds = divmod(seconds, 60)
    return f"{int(minutes)}m{seconds:04.1f}s"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                  .rstrip() + "\n")


def _unique_prefix_length(ids: list[str], minimum: int = 12) -> int:
    """The shortest prefix length (at least ``minimum``) that tells the distinct ids apart."""
    distinct = sorted(set(ids))
    width = minimum
    for a, b in itertools.pairwise(distinct):
        common = len(os.path.commonprefix([a, b]))
        width = max(width, common + 1)
    return min(width, max((len(i) for i in distinct), default=minimum))


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return repr(value)


def _dump_json(obj: Any, out: TextIO) -> None:
    json.dump(obj, out, indent=2, ensure_ascii=False, default=_json_default)
    out.write("\n")


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _pretty(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (ValueError, TypeError):
        return text


_PAYLOADS = (
    ("input", semconv.INPUT_VALUE),
    ("output", semconv.OUTPUT_VALUE),
)
_HIDDEN_IN_FULL = {
    semconv.INPUT_VALUE,
    semconv.OUTPUT_VALUE,
    semconv.INPUT_MIME_TYPE,
    semconv.OUTPUT_MIME_TYPE,
    *semconv.TRAJECTORY_KEYS,
    semconv.OTEL_VERL_TRAJECTORY,
    semconv.OTEL_VERL_TRAJECTORY_CHILD,
}


def _span_lines(span: dict[str, Any], full: bool) -> list[str]:
    """The detail lines under a span's header line."""
    lines = []
    attributes = span["attributes"]
    for label, key in _PAYLOADS:
        value = attributes.get(key)
        if value is None:
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=_json_default)
        if full:
            pretty = _pretty(text).splitlines() or [""]
            lines.append(f"{label}: {pretty[0]}")
            lines.extend("  " + line for line in pretty[1:])
        else:
            lines.append(f"{label}: {_one_line(text, PREVIEW_CHARS)}")
    if full:
        for key in sorted(attributes):
            if key not in _HIDDEN_IN_FULL:
                lines.append(f"{key} = {json.dumps(attributes[key], default=_json_default)}")
    for event in span["events"]:
        ev_attributes = event["attributes"]
        if event["name"] == _EXCEPTION_EVENT or exception_attributes.EXCEPTION_TYPE in ev_attributes:
            exc_type = ev_attributes.get(exception_attributes.EXCEPTION_TYPE, "exception")
            message = ev_attributes.get(exception_attributes.EXCEPTION_MESSAGE, "")
            lines.append(f"!! {exc_type}: {message}")
            stacktrace = ev_attributes.get(exception_attributes.EXCEPTION_STACKTRACE)
            if full and stacktrace:
                lines.extend("   " + line for line in str(stacktrace).rstrip().splitlines())
        elif full or event["name"] == semconv.GEN_AI_EVALUATION_RESULT:
            shown = json.dumps(ev_attributes, ensure_ascii=False, default=_json_default)
            lines.append(f"event {event['name']} {_one_line(shown, PREVIEW_CHARS) if not full else shown}")
    status = span["status"]
    if status["code"] == "ERROR":
        message = status["message"]
        if not message or not any(line.startswith("!! ") and message in line for line in lines):
            lines.append(f"!! status ERROR{': ' + message if message else ''}")
    return lines


def _span_header(span: dict[str, Any]) -> str:
    parts = [span["name"] or "(unnamed)"]
    kind = span["attributes"].get(semconv.OPENINFERENCE_SPAN_KIND)
    if kind:
        parts.append(f"[{kind}]")
    if span["start_ns"] is not None and span["end_ns"] is not None:
        parts.append(_duration(span["end_ns"] - span["start_ns"]))
    if span["status"]["code"] == "ERROR":
        parts.append("ERROR")
    return "  ".join(parts)


def _print_tree(tree: list[SpanNode], full: bool, out: TextIO) -> None:
    stack: list[tuple[SpanNode, str, bool, bool]] = [
        (node, "", i == len(tree) - 1, True) for i, node in reversed(list(enumerate(tree)))
    ]
    while stack:
        node, prefix, last, top = stack.pop()
        branch = "" if top else ("└── " if last else "├── ")
        out.write(f"{prefix}{branch}{_span_header(node.span)}\n")
        child_prefix = prefix if top else prefix + ("    " if last else "│   ")
        detail_prefix = child_prefix + ("│   " if node.children else "    ")
        for line in _span_lines(node.span, full):
            out.write(f"{detail_prefix}{line}".rstrip() + "\n")
        count = len(node.children)
        for i, child in reversed(list(enumerate(node.children))):
            stack.append((child, child_prefix, i == count - 1, False))


def _trajectory_label(trajectory: Trajectory) -> str:
    fields = [
        ("experiment", trajectory.experiment),
        ("step", trajectory.step),
        ("sample", trajectory.sample_index),
        ("rollout", trajectory.rollout_n),
        ("validate", trajectory.validate),
        ("reward", trajectory.reward),
        ("turns", trajectory.num_turns),
    ]
    shown = " ".join(f"{name}={_cell(value)}" for name, value in fields if value is not None)
    return (
        f"trajectory {trajectory.name!r} {shown}  {len(trajectory.spans)} spans  "
        f"{_duration(trajectory.duration_ns)}  {trajectory.status}"
    )


def _tree_json(node: SpanNode) -> dict[str, Any]:
    out = dict(node.span)
    out["children"] = [_tree_json(child) for child in node.children]
    return out


# --- commands -----------------------------------------------------------------------------------


def _say_no_traces(directory: str) -> None:
    print(f"otel-verl: no traces at {directory} (set --dir or ${ENV_TRACE_DIR})",
          file=sys.stderr)


def _lake_refusal(args: argparse.Namespace, command: str, *, file_ok: bool = False) -> int | None:
    """Why ``command`` cannot read ``args.dir`` through the lake, said on stderr, as its exit
    status (2: no lake extra, the only engine of the statistics and read paths; 1: no store
    directory, or no store file where ``file_ok``); None when it can."""
    if not lake_available():
        print(f"otel-verl {command}: {LAKE_EXTRA}", file=sys.stderr)
        return 2
    if not (os.path.isdir(args.dir) or file_ok and os.path.isfile(args.dir)):
        _say_no_traces(args.dir)
        return 1
    return None


def _open_lake(args: argparse.Namespace) -> Any:
    """The store through the query layer (call :func:`_lake_refusal` first). ``--dir`` may be
    one store file (read directly, through a link in a temporary directory).

    Compacts closed files first when more than ``PROGRESS_MIN_BYTES`` of them are not compacted
    yet and the store is writable (with progress on stderr)."""
    from otel_verl.store import compact, main_progress, pending_bytes
    from otel_verl.ui._lake import open_lake, store_directory

    directory, whole = store_directory(args.dir)
    try:
        closed, live = pending_bytes(directory)
    except Exception:  # noqa: BLE001 - a damaged lake: open_lake below sets it aside
        closed = live = 0
    wanted = getattr(args, "progress", None)
    if whole and closed >= PROGRESS_MIN_BYTES and os.access(directory, os.W_OK):
        show = wanted if wanted is not None else sys.stderr.isatty()
        stats = compact(directory, progress=main_progress(sys.stderr) if show else None)
        if stats.spans:
            print(f"otel-verl: compacted {stats.bytes >> 20} MiB ({stats.spans} spans) into "
                  f"{stats.segments} segment(s) in {stats.seconds:.1f}s", file=sys.stderr)
        closed, live = pending_bytes(directory)
    raw = closed + live
    show = wanted if wanted is not None else raw >= PROGRESS_MIN_BYTES and sys.stderr.isatty()
    progress = _Progress(raw, sys.stderr) if show else None
    try:
        lake, _ = open_lake(directory, progress,
                            say=lambda text: print(text, file=sys.stderr, flush=True))
    finally:
        if progress is not None:
            progress.close()
    state = lake.state
    if state.truncated_lines or state.bad_lines or state.bad_spans:
        print(f"otel-verl: skipped {state.truncated_lines} truncated line(s) (a writer crashed "
              f"or is still writing), {state.bad_lines} bad line(s), {state.bad_spans} bad "
              f"span(s); first: {state.problems[0] if state.problems else '-'}", file=sys.stderr)
    return lake


_LIST_SQL = """
SELECT trace_id, nullif(span_id, '') AS span_id, name, experiment, step, sample_index,
       rollout_n, validate, reward, turns, spans, start_ns, duration_ns, status, errors,
       sampling_reason, CASE WHEN span_id = '' THEN 1.0 ELSE weight END AS sampling_weight
FROM trajectories {where} ORDER BY coalesce(start_ns, 0), trace_id"""


def _lake_list(args: argparse.Namespace, lake: Any) -> int:
    """``traces list`` through the query layer (the same rows as the trajectory model's)."""
    out = sys.stdout
    flag = getattr(args, "flag", None) or None  # a detector's flag (docs/signals.md)
    try:
        matching = filter_clauses(DUCKDB, step=args.step, sample_index=args.sample_index,
                                  rollout_n=args.rollout_n, experiment=args.experiment,
                                  validate=args.validate, flag=flag)
    except BadRequest as error:
        print(f"otel-verl: {error}", file=sys.stderr)
        return 2
    if args.steps:
        steps = [s for s in lake.steps(args.experiment)
                 if (args.validate is None or bool(s["validate"]) == args.validate)
                 and (args.step is None or s["step"] == args.step)]
        if args.json:
            _dump_json([{k: s.get(k) for k in _STEP_FIELDS} for s in steps], out)
            return 0
        _table(_step_rows([(s["experiment"], s["step"], s["validate"], s.get("traced", 0),
                            s.get("by_reason") or {}, s.get("estimated") or 0.0, s.get("ran"),
                            s.get("dropped"), s.get("reward_mean"),
                            s.get("reward_mean_unweighted"), s.get("error_rate"))
                           for s in steps]), out)
        return 0
    rows = lake.rows(_LIST_SQL.format(where=matching.where), list(matching.params),
                     spans=bool(flag) or not lake.state.cached)  # --flag reads spans
    if args.json:
        _dump_json(rows, out)
        return 0
    if not rows:
        total = lake.rows("SELECT count(*) AS n FROM trajectories")[0]["n"]
        print(f"otel-verl: no trajectories match under {args.dir} ({total} in the store)",
              file=sys.stderr)
        return 0
    table = [["TRACE", "EXPERIMENT", "STEP", "SAMPLE", "ROLLOUT", "VALIDATE", "REWARD", "TURNS",
              "SPANS", "DURATION", "STATUS"]]
    width = _unique_prefix_length([r["trace_id"] for r in rows])
    for r in rows:
        table.append([r["trace_id"][:width], _cell(r["experiment"]), _cell(r["step"]),
                      _cell(r["sample_index"]), _cell(r["rollout_n"]), _cell(r["validate"]),
                      _cell(r["reward"]), _cell(r["turns"]), str(r["spans"]),
                      _duration(r["duration_ns"]),
                      f"error({r['errors']})" if r["errors"] else r["status"]])
    _table(table, out)
    return 0


_STEP_FIELDS = ("experiment", "validate", "step", "traced", "by_reason", "estimated",
                "reward_mean", "reward_mean_unweighted", "error_rate", "ran", "dropped")


def _step_rows(steps: list[tuple[Any, ...]]) -> list[list[str]]:
    rows = [["EXPERIMENT", "STEP", "VALIDATE", "TRACED", "REASONS", "EST. RAN", "RAN",
             "DROPPED", "REWARD (WEIGHTED)", "REWARD (TRACED)", "ERRORS (WEIGHTED)"]]
    for (experiment, step, validate, traced, by_reason, estimated, ran, dropped, reward_mean,
         reward_mean_unweighted, error_rate) in steps:
        rows.append([
            _cell(experiment), _cell(step), _cell(validate), str(traced),
            ",".join(f"{k}={v}" for k, v in sorted(by_reason.items())) or "-",
            f"{estimated:.1f}", _cell(ran), _cell(dropped),
            "-" if reward_mean is None else f"{reward_mean:.4f}",
            "-" if reward_mean_unweighted is None else f"{reward_mean_unweighted:.4f}",
            "-" if error_rate is None else f"{error_rate:.1%}",
        ])
    return rows


def _cmd_sql(args: argparse.Namespace) -> int:
    refused = _lake_refusal(args, "sql")
    if refused is not None:
        return refused
    import duckdb

    lake = _open_lake(args)
    try:
        rows = lake.rows(args.query)
    except duckdb.Error as error:
        print(f"otel-verl sql: {error}", file=sys.stderr)
        return 2
    finally:
        lake.close()
    if args.json:
        _dump_json(rows, sys.stdout)
        return 0
    if not rows:
        print("(no rows)", file=sys.stderr)
        return 0
    names = list(rows[0])
    _table([names, *[[_cell(r[n]) for n in names] for r in rows]], sys.stdout)
    return 0


def _cmd_compact(args: argparse.Namespace) -> int:
    refused = _lake_refusal(args, "compact")
    if refused is not None:
        return refused
    from otel_verl.store import compact, main_progress

    show = args.progress if args.progress is not None else sys.stderr.isatty()
    stats = compact(args.dir, live_bytes=0 if args.live else 64 << 20,
                    progress=main_progress(sys.stderr) if show else None)
    if stats.busy:
        print("otel-verl compact: another compaction is running on this store", file=sys.stderr)
        return 1
    summary = {"files": stats.files, "bytes": stats.bytes, "spans": stats.spans,
               "segments": stats.segments, "live_files_left_raw": stats.skipped_live,
               "seconds": round(stats.seconds, 3)}
    if args.json:
        _dump_json(summary, sys.stdout)
    else:
        print(f"otel-verl compact: {stats.spans} span(s) from {stats.files} file(s) "
              f"({stats.bytes >> 20} MiB) into {stats.segments} segment(s) in "
              f"{stats.seconds:.1f}s; {stats.skipped_live} live file(s) left raw", file=sys.stderr)
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    """``traces list`` (and ``--steps``): the lake's rows and its one step statistics."""
    refused = _lake_refusal(args, "traces list", file_ok=True)
    if refused is not None:
        return refused
    lake = _open_lake(args)
    try:
        return _lake_list(args, lake)
    finally:
        lake.close()


def _resolve_trace(prefix: str, trajectories: list[Trajectory], where: str) -> str | int:
    """The one trace id starting with ``prefix``, or an exit status after saying why not."""
    prefix = prefix.strip().lower()
    if not prefix:
        print("otel-verl: give a trace id (or a prefix of one)", file=sys.stderr)
        return 2
    trace_ids = sorted({t.trace_id for t in trajectories if t.trace_id.startswith(prefix)})
    if not trace_ids:
        print(f"otel-verl: no trace id starts with {prefix!r} under {where}", file=sys.stderr)
        return 1
    if len(trace_ids) > 1:
        print(f"otel-verl: {prefix!r} is ambiguous; it starts {len(trace_ids)} trace ids:",
              file=sys.stderr)
        for trace_id in trace_ids[:20]:
            print(f"  {trace_id}", file=sys.stderr)
        return 2
    return trace_ids[0]


def _cmd_show(args: argparse.Namespace) -> int:
    if not args.trace_id.strip():
        return _resolve_trace(args.trace_id, [], args.dir)  # type: ignore[return-value]
    loaded = _load(args)
    if loaded is None:
        return 1
    trajectories, _ = loaded
    trace_id = _resolve_trace(args.trace_id, trajectories, args.dir)
    if isinstance(trace_id, int):
        return trace_id
    chosen = [t for t in trajectories if t.trace_id == trace_id]
    out = sys.stdout
    if args.json:
        content = ContentIndex.load(args.dir) if args.full else None
        _dump_json(
            {
                "trace_id": trace_id,
                "trajectories": [
                    {**t.summary(), "tree": [_tree_json(node) for node in t.tree],
                     # --full: every LLM call's whole prompt as sent (docs/content.md)
                     **({"prompts": turn_prompts(t.spans, content)} if content is not None else {})}
                    for t in chosen
                ],
            },
            out,
        )
        return 0
    out.write(f"trace {trace_id}\n")
    for trajectory in chosen:
        out.write(_trajectory_label(trajectory) + "\n")
        _print_tree(trajectory.tree, args.full, out)
    return 0


_COMPARED = ("experiment", "step", "sample_index", "rollout_n", "validate", "reward", "turns",
             "spans", "duration_ns", "status", "errors")


def _steps(trajectory: Trajectory) -> list[tuple[int, dict[str, Any]]]:
    """The trajectory's spans in order (the trajectory span itself left out)."""
    return [(depth, span) for depth, span in trajectory.walk() if span is not trajectory.root]


def _output_text(span: dict[str, Any]) -> str:
    attrs = span["attributes"]
    text = attrs.get(semconv.OUTPUT_VALUE)
    if text is None and span["status"].get("code") == "ERROR":
        text = "ERROR " + (span["status"].get("message") or "")
    return "" if text is None else str(text)


def _cmd_compare(args: argparse.Namespace) -> int:
    loaded = _load(args)
    if loaded is None:
        return 1
    trajectories, _ = loaded
    chosen: list[Trajectory] = []
    for prefix in (args.trace_a, args.trace_b):
        trace_id = _resolve_trace(prefix, trajectories, args.dir)
        if isinstance(trace_id, int):
            return trace_id
        chosen.append(next(t for t in trajectories if t.trace_id == trace_id))
    left, right = chosen
    summaries = [t.summary() for t in chosen]
    steps = [_steps(t) for t in chosen]
    if args.json:
        _dump_json({
            "a": summaries[0], "b": summaries[1],
            "steps": [
                {side: (None if pair is None else {"name": pair[1]["name"],
                                                     "output": _output_text(pair[1])})
                 for side, pair in zip(("a", "b"), pairs, strict=True)}
                for pairs in itertools.zip_longest(*steps)
            ],
        }, sys.stdout)
        return 0
    out = sys.stdout
    width = max(24, (shutil.get_terminal_size((160, 24)).columns - 8) // 2)
    rows = [["", f"A {left.trace_id[:12]}", f"B {right.trace_id[:12]}", ""]]
    for key in _COMPARED:
        a, b = (summary.get(key) for summary in summaries)
        shown = (_duration(a), _duration(b)) if key == "duration_ns" else (_cell(a), _cell(b))
        rows.append(["duration" if key == "duration_ns" else key, *shown, "" if a == b else "≠"])
    _table(rows, out)
    out.write("\n")
    differing = 0
    for index, pairs in enumerate(itertools.zip_longest(*steps), start=1):
        cells = []
        for pair in pairs:
            if pair is None:
                cells.append(("", "—"))
                continue
            depth, span = pair
            cells.append(("  " * (depth - 1) + span["name"], _output_text(span)))
        same = cells[0] == cells[1]
        differing += not same
        if args.differences_only and same:
            continue
        mark = "  " if same else "≠ "
        for part, limit in ((0, width), (1, width)):
            a, b = cells[0][part], cells[1][part]
            if part == 1 and not a and not b:
                continue  # no output on either side (e.g. an engine span)
            if part == 1 and not args.full:
                a, b = _one_line(a, limit), _one_line(b, limit)
            a_lines, b_lines = (a.splitlines() or [""]), (b.splitlines() or [""])
            for a_line, b_line in itertools.zip_longest(a_lines, b_lines, fillvalue=""):
                prefix = f"{mark}{index:3d} " if part == 0 and a_line is a_lines[0] else " " * 6
                out.write(f"{prefix}{a_line:<{width}.{width}} │ {b_line}\n")
                mark = "  " if same else "≠ "
    out.write(f"\n{differing} of {max(len(steps[0]), len(steps[1]))} steps differ "
              "(name or output)\n")
    return 0


def _replay_exporter(args: argparse.Namespace) -> Any:
    if args.to == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stdout)
    from otel_verl._config import resolve_config
    from otel_verl._provider import _otlp_exporter, _weave_exporter

    # the bare backend exporter (durable=False): a replay must not write a log of its own
    explicit: dict[str, Any] = {"backend": args.to, "durable": False}
    if args.to == "weave":
        if args.project is not None:
            explicit["project_name"] = args.project
        if args.endpoint is not None:
            explicit["weave_base_url"] = args.endpoint
        return _weave_exporter(resolve_config(explicit))
    if args.endpoint is not None:
        explicit["otlp_endpoint"] = args.endpoint
    if args.protocol is not None:
        explicit["otlp_protocol"] = args.protocol
    return _otlp_exporter(resolve_config(explicit))


def _cmd_replay(args: argparse.Namespace) -> int:
    from otel_verl._config import ConfigError, resolve_config
    from otel_verl.exporters import replay

    if not os.path.exists(args.spool_dir):
        print(f"otel-verl: nothing to replay at {args.spool_dir}", file=sys.stderr)
        return 1
    try:
        exporter = _replay_exporter(args)
        max_request_bytes = args.max_request_bytes or resolve_config({}).max_request_bytes
    except (ConfigError, ValueError) as error:
        print(f"otel-verl: {error}", file=sys.stderr)
        return 2
    try:
        sent, failed = replay(args.spool_dir, exporter, remove=args.remove,
                              max_request_bytes=max_request_bytes)
    finally:
        exporter.shutdown()
    print(f"otel-verl: replayed {sent} span(s) to {args.to}; {failed} failed"
          + (" (they stay where they were; run replay again once the backend answers)"
             if failed else ""), file=sys.stderr)
    return 0 if failed == 0 else 1


def _cmd_demo(argv: Sequence[str]) -> int:
    try:
        demo = importlib.import_module("otel_verl.demo.run")
    except ImportError as error:
        missing = getattr(error, "name", None) or ""
        if missing.split(".")[0] == "otel_verl":
            hint = "this installation of otel-verl has no demo module"
        else:
            hint = "the demo needs the rollout extras: pip install 'otel-verl[rollout]'"
        print(f"otel-verl demo: cannot import otel_verl.demo.run ({error}); {hint}",
              file=sys.stderr)
        return 2
    result = demo.main(list(argv))
    return int(result or 0)


def _open_index(args: argparse.Namespace, command: str, background: bool = False) -> Any:
    """The viewer's source (the lake), brought up to date, or the exit status after saying why
    not (no lake extra: 2; no store: 1). ``background``: compact closed files and look for new
    lines on a thread (``ui``)."""
    refused = _lake_refusal(args, command, file_ok=True)
    if refused is not None:
        return refused
    if args.index is not None:
        print(f"otel-verl {command}: --index is ignored: the SQLite index is gone, the viewer "
              "reads through the lake (docs/ui.md)", file=sys.stderr)
    from otel_verl.ui._lake import open_source

    return open_source(args.dir, background=background, poll_s=getattr(args, "poll", 1.0),
                       say=lambda text: print(text, file=sys.stderr, flush=True))


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _cmd_ui(args: argparse.Namespace) -> int:
    from otel_verl.ui.server import serve

    index = _open_index(args, "ui", background=True)
    if isinstance(index, int):
        return index
    if args.host not in _LOOPBACK:
        print(f"otel-verl ui: warning: listening on {args.host}: anyone who can reach this "
              "address can read your traces (prompts, answers, tool calls)", file=sys.stderr)

    def ready(url: str) -> None:
        print(f"otel-verl ui: {url}  (store {args.dir}; Ctrl-C to stop)", file=sys.stderr,
              flush=True)

    try:
        serve(index, args.host, args.port, poll_s=args.poll, ready=ready,
              allowed_hosts=args.allow_host or ())
    except KeyboardInterrupt:
        pass
    except OSError as error:
        print(f"otel-verl ui: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 1
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from otel_verl.ui.report import write_report

    index = _open_index(args, "report")
    if isinstance(index, int):
        return index
    meta = write_report(index, args.output, experiment=args.experiment, step=args.step,
                        sample_index=args.sample_index, validate=args.validate,
                        max_details=args.max_details)
    size = os.path.getsize(args.output)
    print(f"otel-verl report: {args.output} ({size / 1e6:.1f} MB; {meta['rows']} trajectories, "
          f"{meta['details']} with their conversation and spans)", file=sys.stderr)
    return 0


def _cmd_live(args: argparse.Namespace) -> int:
    """``traces live``: the ops in flight now (:func:`otel_verl.store.live_workers`)."""
    from otel_verl.store import live_workers

    view = live_workers(args.dir)
    if args.json:
        for worker in view["workers"]:
            for op in worker["ops"]:
                print(json.dumps(op, default=str, sort_keys=True))
            if worker["lost"] and not worker["ops"]:
                print(json.dumps({"worker": worker["worker"], "lost": True, "ops": 0}))
        return 0
    if not view["workers"]:
        print("nothing in flight (no live files under "
              f"{os.path.join(args.dir, 'live')})")
    for worker in view["workers"]:
        state = "LOST" if worker["lost"] else "live"
        # a trajectory in flight is a row too (its own span): stuck rows = trajectories + ops
        stuck_traj = sum(1 for op in worker["ops"] if op["stuck"] and op.get("trajectory"))
        stuck_ops = sum(1 for op in worker["ops"] if op["stuck"] and not op.get("trajectory"))
        print(f"{worker['worker']}  {state}  heartbeat {worker['heartbeat_age_s']:.1f}s ago  "
              f"{worker['trajectories']} trajectories ({stuck_traj} stuck), "
              f"{stuck_ops} stuck ops")
        for op in worker["ops"]:
            flag = "STUCK " if op["stuck"] else "      "
            waits = op.get("waiting_on") or {}
            extra = f"  waits on {waits.get('name')}" if waits else ""
            print(f"  {flag}{op['elapsed_s']:8.1f}s  step={op.get('step')} "
                  f"sample={op.get('sample_index')} n={op.get('rollout_n')}  {op.get('name')}"
                  f"{extra}")
        for count in worker["unsampled"]:
            if count.get("in_flight"):
                print(f"  unsampled in flight: step={count.get('step')} {count['in_flight']}")
    return 0


# --- argument parsing ---------------------------------------------------------------------------


def _add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        "--trace-dir",
        dest="dir",
        default=None,
        help=f"trace store directory or file (default: ${ENV_TRACE_DIR} or ./otel_verl_traces)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show reading progress on stderr (default: for large stores on a terminal)",
    )


def _add_viewer_parsers(commands: Any) -> None:
    def store(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--dir", "--trace-dir", dest="dir", default=None,
            help=f"the store: a directory (ours or a collector's file-exporter output) or a file "
                 f"(default: ${ENV_TRACE_DIR} or ./otel_verl_traces)")
        # the SQLite index's file: gone with the index (accepted, said to be ignored)
        parser.add_argument("--index", default=None, help=argparse.SUPPRESS)

    ui_p = commands.add_parser("ui", help="the web viewer over the store (steps, groups, rewards)")
    store(ui_p)
    ui_p.add_argument("--host", default="127.0.0.1",
                      help="address to listen on (default 127.0.0.1: this machine only)")
    ui_p.add_argument("--port", type=int, default=8686, help="port (default 8686; 0 = any free)")
    ui_p.add_argument("--poll", type=float, default=2.0,
                      help="seconds between looks for new spans while the page is open")
    ui_p.add_argument("--allow-host", action="append", metavar="NAME",
                      help="also answer requests whose Host header names NAME (e.g. the name a "
                           "reverse proxy forwards; repeatable; '*' = any name). Without it the "
                           "viewer answers only localhost, IP addresses, the --host name and, "
                           "beyond loopback, this machine's names")
    ui_p.set_defaults(handler=_cmd_ui)

    report_p = commands.add_parser(
        "report", help="the viewer's views as one self-contained offline HTML file")
    store(report_p)
    report_p.add_argument("-o", "--output", required=True, metavar="FILE.html")
    report_p.add_argument("--experiment")
    report_p.add_argument("--step", type=int)
    report_p.add_argument("--sample-index", type=int)
    report_p.add_argument("--validate", action=argparse.BooleanOptionalAction, default=None,
                          help="only validation (--validate) or training (--no-validate)")
    report_p.add_argument("--max-details", type=int, default=300,
                          help="trajectories whose conversation and spans are embedded "
                               "(errors first; default 300)")
    report_p.set_defaults(handler=_cmd_report)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otel-verl", description="OpenTelemetry tracing for RL rollouts: the local store."
    )
    commands = parser.add_subparsers(dest="command", metavar="{traces,ui,report,sql,compact,demo}")
    traces = commands.add_parser("traces", help="list and show trajectories in the local store")
    traces_commands = traces.add_subparsers(dest="traces_command", metavar="{list,show,compare,replay}")

    list_p = traces_commands.add_parser("list", help="one line per trajectory")
    _add_store_options(list_p)
    list_p.add_argument("--step", type=int)
    list_p.add_argument("--sample-index", type=int)
    list_p.add_argument("--rollout-n", type=int)
    list_p.add_argument("--experiment")
    list_p.add_argument(
        "--validate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only validation (--validate) or only training (--no-validate) trajectories",
    )
    list_p.add_argument("--flag", metavar="NAME",
                        help="only trajectories a detector flagged NAME (rl.flag.NAME, e.g. "
                             "length_cap; docs/signals.md)")
    list_p.add_argument(
        "--steps", action="store_true",
        help="one row per step: counts per sampling reason and statistics weighted by "
             "rollout.sampling.weight (unbiased under head and tail sampling)")
    list_p.set_defaults(handler=_cmd_list)

    show_p = traces_commands.add_parser("show", help="the span tree of one trace")
    show_p.add_argument("trace_id", metavar="TRACE_ID_PREFIX")
    _add_store_options(show_p)
    show_p.add_argument(
        "--full", action="store_true", help="untruncated inputs/outputs, all attributes, stacks"
    )
    show_p.set_defaults(handler=_cmd_show)

    compare_p = traces_commands.add_parser(
        "compare", help="two trajectories side by side: summary, then step by step"
    )
    compare_p.add_argument("trace_a", metavar="TRACE_A")
    compare_p.add_argument("trace_b", metavar="TRACE_B")
    _add_store_options(compare_p)
    compare_p.add_argument("--full", action="store_true", help="whole outputs, not one line")
    compare_p.add_argument(
        "--differences-only", action="store_true", help="only the steps that differ"
    )
    compare_p.set_defaults(handler=_cmd_compare)
    add_export_parser(traces_commands, _add_store_options)

    live_p = traces_commands.add_parser(
        "live", help="what runs now (the workers' live files): ops in flight, stuck first, lost "
        "workers (docs/live.md)")
    live_p.add_argument("--dir", "--trace-dir", dest="dir", default=None,
                        help=f"the trace dir (default: ${ENV_TRACE_DIR} or ./otel_verl_traces)")
    live_p.add_argument("--json", action="store_true",
                        help="one JSON object per op in flight (lost workers' ops included)")
    live_p.set_defaults(handler=_cmd_live)

    replay_p = traces_commands.add_parser(
        "replay", help="send what a durable log (or any store file) holds to a backend, from its "
        "delivery cursor, in requests under the byte cap"
    )
    replay_p.add_argument("spool_dir", metavar="SPOOL_DIR")
    replay_p.add_argument("--to", choices=("otlp", "weave", "console"), default="otlp")
    replay_p.add_argument(
        "--endpoint",
        help="OTLP endpoint (default: the OTEL_EXPORTER_OTLP_* variables), or the Weave server",
    )
    replay_p.add_argument("--project", help="Weave project (entity/project) for --to weave")
    replay_p.add_argument(
        "--max-request-bytes", type=int, default=None,
        help="bytes per request at most (default: the max_request_bytes setting, 3 MiB)",
    )
    replay_p.add_argument("--protocol", choices=("grpc", "http/protobuf"))
    replay_p.add_argument(
        "--remove", action="store_true",
        help="delete each log (or file) once all its spans were accepted",
    )
    replay_p.set_defaults(handler=_cmd_replay)

    _add_viewer_parsers(commands)

    sql_p = commands.add_parser(
        "sql", help="SQL over the store's spans / trajectories / steps (the lake extra; "
        "docs/lakehouse.md)")
    sql_p.add_argument("query", metavar="QUERY")
    _add_store_options(sql_p)
    sql_p.set_defaults(handler=_cmd_sql)
    compact_p = commands.add_parser(
        "compact", help="compact the store's closed files into Parquet segments (the lake extra)")
    _add_store_options(compact_p)
    compact_p.add_argument("--live", action="store_true",
                           help="also files still being written (up to their last whole line)")
    compact_p.set_defaults(handler=_cmd_compact)
    add_parity_parser(commands, _add_store_options)
    commands.add_parser(
        "demo", help="run the traced rollout demo (otel-verl demo --help for its options)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``otel-verl`` command line.

    Args:
        argv: the arguments after the program name; default ``sys.argv[1:]``.

    Returns:
        The exit status.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["demo"]:  # everything after "demo" belongs to the demo's own parser
        return _cmd_demo(args_list[1:])
    parser = _parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exit_:  # --help, or a usage error argparse already printed
        return int(exit_.code or 0) if not isinstance(exit_.code, str) else 2
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    if hasattr(args, "dir"):
        args.dir = resolve_trace_dir(args.dir)
    try:
        return handler(args)
    except BrokenPipeError:  # `otel-verl traces list | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
