"""In-flight records: what is running now, what is stuck, and which trajectories held a step back.

An OpenTelemetry span is exported when it ends, so a hung tool call or engine request is invisible
for as long as it hangs. ``LiveTracker`` (a span processor on otel_verl's provider, ``live=true``)
keeps a per-process registry of the spans in flight: ``on_start`` inserts the span into a dict
keyed by its span id, ``on_end`` removes it and queues the span with its trajectory (O(1) on the
loop: nothing is read or copied then; durations, dominant ops and step ends are worked out on the
live thread). A background thread snapshots the registry every ``INTERVAL_S`` to
``<trace_dir>/live/<host>-<pid>.json`` (temp file + rename, with a heartbeat), reading each span's
identity, op, kind, start time and engine request id from the span itself; the file is removed at
clean shutdown, so a file whose heartbeat stopped belongs to a lost worker (crashed, SIGKILLed)
and still says what it had in flight (``otel_verl.store._live`` reads them).

Also here:

- **Stuck ops.** An op in flight longer than its threshold is flagged ``stuck``, with its trajectory
  and what it waits on (the deepest op in flight below it: the tool, the engine request). The
  threshold is ``stuck_after_s``, or ``STUCK_P99_FACTOR`` x the step's running p99 for that op's
  name once ``P99_MIN_SAMPLES`` of them ended (never under ``MIN_STUCK_S``). Each op, when it
  first becomes stuck, is sent once as a short ``otel_verl.in_flight`` span (child of the stuck
  op, same trace, from the op's start to now): OTLP receivers (Jaeger, Phoenix) show it while the
  op is stuck.
- **Unsampled trajectories** (``trace=False``) are counted per step, numbers only
  (``unsampled_started``/``unsampled_ended``, called by ``rollout_trace_attr``).
- **Straggler report.** When the last trajectory of a step in flight in this process ends, an
  ``otel_verl.straggler_report`` span (a child of the slowest trajectory, at the step's end, so no
  reader takes it for a trajectory) names the slowest trajectories, the op that dominated
  each (the largest total time among its LLM/tool/... leaf ops) and how long the step waited on
  its tail (the last end minus the end of the trajectory that completed 90 % of the step; with
  fewer than 10, all but the slowest). Built and sent on the live thread, never on the loop.

Configuration: ``live`` (on/off), ``stuck_after_s`` (docs/configuration.md); docs/live.md.
"""

from __future__ import annotations

import collections
import json
import math
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_verl import _errors, semconv
from otel_verl._capture import live_input
from otel_verl._current import TRAJECTORY
from otel_verl._fork import LiveInstances
from otel_verl._hotpath import attribute_map

#: seconds between two snapshots (the heartbeat); a reader calls a worker lost after
#: ``LOST_AFTER_INTERVALS`` of them without one
INTERVAL_S = 1.0
LOST_AFTER_INTERVALS = 3
#: the p99 rule: stuck after this many times the step's running p99 for the op's name ...
STUCK_P99_FACTOR = 5.0
#: ... once this many of them ended in the step ...
P99_MIN_SAMPLES = 20
#: ... and never before this many seconds
MIN_STUCK_S = 1.0
#: durations kept per (step, op name) for the running p99
_DURATIONS_KEPT = 256
#: steps whose durations / unsampled counts are kept
_STEPS_KEPT = 4
#: straggler reports kept in the live file
_REPORTS_KEPT = 8
#: trajectories named in a straggler report
SLOWEST_KEPT = 3
LIVE_DIR = "live"
FORMAT_VERSION = 1

#: the kinds whose time counts towards a trajectory's dominant op (the leaves: what it waits on)
_LEAF_KINDS = frozenset({semconv.SpanKindName.LLM, semconv.SpanKindName.TOOL,
                         semconv.SpanKindName.EVALUATOR, "RETRIEVER", "EMBEDDING", "RERANKER",
                         "GUARDRAIL"})
_KIND = semconv.OPENINFERENCE_SPAN_KIND
_TRAJ = semconv.OTEL_VERL_TRAJECTORY
_STEP = semconv.ROLLOUT_STEP

StepKey = tuple[Any, Any, Any]  # (experiment, validate, step)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _step_key(attrs: Mapping[str, Any]) -> StepKey:
    return (attrs.get(semconv.ROLLOUT_EXPERIMENT_NAME), bool(attrs.get(semconv.ROLLOUT_VALIDATE)),
            attrs.get(_STEP))


class _StepTally:
    __slots__ = ("done",)

    def __init__(self) -> None:
        #: (start ns, end ns, sample, rollout, trace id, span id, {leaf op: seconds})
        self.done: list[tuple[int, int, Any, Any, int, int, dict[str, float]]] = []


class LiveTracker(SpanProcessor):
    """The live registry (a span processor) and its snapshot thread; see the module docstring.

    Args:
        trace_dir: the live files go to ``<trace_dir>/live/``.
        tracer: sends ``otel_verl.in_flight`` and ``otel_verl.straggler_report`` spans (None:
            neither is sent).
        stuck_after_s: the configured threshold.
        experiment: the experiment name (for the unsampled counts).
        interval_s: seconds between snapshots.
    """

    def __init__(self, trace_dir: str, tracer: otel_trace.Tracer | None, stuck_after_s: float,
                 experiment: str | None = None, interval_s: float = INTERVAL_S) -> None:
        self.dir = os.path.join(os.path.abspath(trace_dir), LIVE_DIR)
        self.tracer = tracer
        self.stuck_after_s = float(stuck_after_s)
        self.experiment = experiment
        self.interval_s = float(interval_s)
        self._lock = threading.Lock()
        #: one tick at a time: a snapshot taken by the live thread must not be written over a
        #: newer one taken by an explicit tick (the file would go back in time)
        self._tick_lock = threading.Lock()
        self._reset()
        self._thread: threading.Thread | None = None
        self._start_thread()
        _AFTER_FORK.add(self)

    def _reset(self) -> None:
        #: span id -> the span, while it is in flight (the registry)
        self._ops: dict[int, Span] = {}
        #: (step, op name) -> recent durations (s), for the running p99
        self._durations: dict[tuple[Any, str], collections.deque[float]] = {}
        #: trajectory span id -> {leaf op name: seconds}
        self._leaf_time: dict[int, dict[str, float]] = {}
        #: (span, its trajectory) as they ended, for the live thread
        self._ended: collections.deque[tuple[ReadableSpan, Any]] = collections.deque()
        self._steps: dict[StepKey, _StepTally] = {}
        self._unsampled: dict[StepKey, list[int]] = {}
        self._pending_reports: list[tuple[StepKey, _StepTally]] = []
        self.reports: collections.deque[dict[str, Any]] = collections.deque(maxlen=_REPORTS_KEPT)
        self._reported_stuck: set[int] = set()
        #: spans that ended (accounted on the live thread)
        self.ended_total = 0
        self._next_due = self.interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.worker = worker_name()
        self.path = os.path.join(self.dir, f"{socket.gethostname()}-{os.getpid()}.json")
        self.started = time.time()
        self.closed = False

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._run, name="otel_verl-live", daemon=True)
        self._thread.start()

    # -- the loop's side: O(1) ----------------------------------------------------------------------
    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        self._ops[span.context.span_id] = span

    def on_end(self, span: ReadableSpan) -> None:
        # everything else (durations, dominant ops, step ends) happens on the live thread
        self._ops.pop(span.context.span_id, None)
        if not self.closed:  # (nothing accounts for them after close)
            self._ended.append((span, TRAJECTORY.get()))

    # -- the live thread: what ended since the last tick ------------------------------------------
    def _account(self) -> None:
        ended = self._ended
        while ended:
            span, traj = ended.popleft()
            self.ended_total += 1
            try:
                self._account_one(span, traj)
            except Exception as exc:
                _errors.internal_error(exc, "live tracking: accounting an ended span")
        self._close_steps()

    def _account_one(self, span: ReadableSpan, traj: Any) -> None:
        attrs = attribute_map(span)
        start, end = span.start_time, span.end_time
        if start is None or end is None:
            return
        seconds = (end - start) / 1e9
        key = (attrs.get(_STEP), span.name)
        kept = self._durations.get(key)
        if kept is None:
            kept = self._durations[key] = collections.deque(maxlen=_DURATIONS_KEPT)
        kept.append(seconds)
        if attrs.get(_TRAJ):
            self._trajectory_ended(span, span.context.span_id, attrs)
        elif attrs.get(_KIND) in _LEAF_KINDS and traj is not None and traj.span is not None:
            totals = self._leaf_time.setdefault(traj.span.get_span_context().span_id, {})
            totals[span.name] = totals.get(span.name, 0.0) + seconds

    def _trajectory_ended(self, span: ReadableSpan, span_id: int, attrs: Mapping[str, Any]) -> None:
        key = _step_key(attrs)
        tally = self._steps.get(key)
        if tally is None:
            tally = self._steps[key] = _StepTally()
        tally.done.append((span.start_time or 0, span.end_time or 0,
                           attrs.get(semconv.ROLLOUT_SAMPLE_INDEX),
                           attrs.get(semconv.ROLLOUT_ROLLOUT_N), span.context.trace_id, span_id,
                           self._leaf_time.pop(span_id, {})))

    def _close_steps(self) -> None:
        """A step with ended trajectories and none left in flight here is reported."""
        if not self._steps:
            return
        open_steps = set()
        for span in list(self._ops.values()):
            attrs = attribute_map(span)
            if attrs.get(_TRAJ):
                open_steps.add(_step_key(attrs))
        for key in [k for k in self._steps if k not in open_steps]:
            self._pending_reports.append((key, self._steps.pop(key)))

    def unsampled_started(self, step: Any, validate: bool) -> None:
        """An unsampled trajectory started (numbers only)."""
        counts = self._unsampled.get((self.experiment, validate, step))
        if counts is None:
            counts = self._unsampled[(self.experiment, validate, step)] = [0, 0]
        counts[0] += 1

    def unsampled_ended(self, step: Any, validate: bool) -> None:
        counts = self._unsampled.get((self.experiment, validate, step))
        if counts is not None:
            counts[1] += 1

    # -- the live thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:
                _errors.internal_error(exc, "live snapshot")
            # wake when the next op reaches its threshold, so it is sent as it becomes stuck
            self._wake.wait(min(self.interval_s, self._next_due))
            self._wake.clear()

    def tick(self) -> dict[str, Any]:
        """One snapshot: send due straggler reports and newly stuck ops, write the live file."""
        with self._tick_lock:
            return self._tick()

    def _tick(self) -> dict[str, Any]:
        self._send_reports()
        snapshot = self.snapshot()
        due = self.interval_s
        for op in snapshot["ops"]:
            # sent for the op that waits (the leaf): its callers are stuck because of it
            if op["stuck"] and op["waiting_on"] is None and op["_id"] not in self._reported_stuck:
                self._reported_stuck.add(op["_id"])
                self._send_in_flight(op)
            op["in_flight_sent"] = op["_id"] in self._reported_stuck
            if not op["stuck"] and op["threshold_s"] is not None:
                due = min(due, op["threshold_s"] - op["elapsed_s"] + 0.01)
        self._next_due = max(0.01, due)
        in_flight = {op["_id"] for op in snapshot["ops"]}
        self._reported_stuck &= in_flight
        for op in snapshot["ops"]:
            del op["_id"], op["_attrs"]
        if not self.closed:
            self._write(snapshot)
        return snapshot

    def threshold(self, step: Any, name: str, trajectory: bool) -> float | None:
        """Seconds after which an op named ``name`` in ``step`` counts as stuck (None: never; a
        trajectory span only by the p99 rule, its ops by either)."""
        configured = None if trajectory else self.stuck_after_s
        kept = self._durations.get((step, name))
        if kept is not None and len(kept) >= P99_MIN_SAMPLES:
            ordered = sorted(kept)
            p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
            by_p99 = max(MIN_STUCK_S, STUCK_P99_FACTOR * p99)
            return by_p99 if configured is None else min(configured, by_p99)
        return configured

    def snapshot(self) -> dict[str, Any]:
        now_ns = time.time_ns()
        spans = list(self._ops.values())
        records = []
        children: dict[int, list[dict[str, Any]]] = {}
        for span in spans:
            record = _record(span, now_ns)
            if record is None:
                continue
            record["threshold_s"] = self.threshold(record["step"], record["name"],
                                                   record["trajectory"])
            records.append(record)
            if record["_parent"] is not None:
                children.setdefault(record["_parent"], []).append(record)
        by_id = {r["_id"]: r for r in records}
        for record in records:
            threshold = record["threshold_s"]
            record["stuck"] = threshold is not None and record["elapsed_s"] >= threshold
        for record in records:  # what it waits on: the newest op in flight below it, down
            leaf, seen = record, 0
            while children.get(leaf["_id"]) and seen < 64:
                leaf = max(children[leaf["_id"]], key=lambda r: r["start"])
                seen += 1
            record["waiting_on"] = None if leaf is record else _brief(leaf)
            traj = record
            while traj["_parent"] in by_id and not traj["trajectory"]:
                traj = by_id[traj["_parent"]]
            record["trajectory_span_id"] = (format(traj["_id"], "016x")
                                            if traj["trajectory"] else None)
        for record in records:  # a trajectory is stuck when one of its ops is
            if not record["trajectory"] and record["stuck"]:
                tid = record["trajectory_span_id"]
                for other in records:
                    if other["trajectory"] and other["span_id"] == tid:
                        other["stuck"] = True
                        other["stuck_op"] = record["name"]
        for record in records:
            del record["_parent"]
        records.sort(key=lambda r: (not r["stuck"], r["start"]))
        self._prune()
        unsampled = [{"experiment": k[0], "validate": k[1], "step": k[2], "started": v[0],
                      "in_flight": max(0, v[0] - v[1])} for k, v in list(self._unsampled.items())]
        return {"version": FORMAT_VERSION, "worker": self.worker, "host": socket.gethostname(),
                "pid": os.getpid(), "heartbeat": now_ns / 1e9, "interval_s": self.interval_s,
                "started": self.started, "stuck_after_s": self.stuck_after_s, "ops": records,
                "unsampled": unsampled, "straggler_reports": list(self.reports)}

    def _prune(self) -> None:
        for table in (self._durations, self._unsampled):
            steps = sorted({k[0] if table is self._durations else k[2] for k in list(table)},
                           key=_order)
            if len(steps) > _STEPS_KEPT:
                old = set(steps[:-_STEPS_KEPT])
                for key in list(table):
                    if (key[0] if table is self._durations else key[2]) in old:
                        table.pop(key, None)
        if len(self._leaf_time) > 4 * len(self._ops) + 1024:  # ended out of order: drop orphans
            for span_id in list(self._leaf_time):
                if span_id not in self._ops:
                    self._leaf_time.pop(span_id, None)

    def _write(self, snapshot: dict[str, Any]) -> None:
        os.makedirs(self.dir, exist_ok=True)
        tmp = f"{self.path}.{threading.get_ident()}.tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            json.dump(snapshot, out, default=str, separators=(",", ":"))
        os.replace(tmp, self.path)

    # -- spans for receivers ------------------------------------------------------------------
    def _send_in_flight(self, op: dict[str, Any]) -> None:
        """The ``otel_verl.in_flight`` span of a newly stuck op: child of it, op start to now."""
        tracer = self.tracer
        if tracer is None:
            return
        parent = NonRecordingSpan(SpanContext(int(op["trace_id"], 16), op["_id"], False,
                                              TraceFlags(TraceFlags.SAMPLED)))
        attrs = {k: v for k, v in op.get("_attrs", {}).items() if k in semconv.TRAJECTORY_KEYS}
        attrs.update({
            semconv.OTEL_VERL_LIVE_OP: op["name"],
            semconv.OTEL_VERL_LIVE_SPAN_ID: op["span_id"],
            semconv.OTEL_VERL_LIVE_ELAPSED_S: op["elapsed_s"],
            semconv.OTEL_VERL_LIVE_WORKER: self.worker,
            semconv.OTEL_VERL_LIVE_STUCK: True,
        })
        if op["threshold_s"] is not None:
            attrs[semconv.OTEL_VERL_LIVE_THRESHOLD_S] = op["threshold_s"]
        if op.get("waiting_on"):
            attrs[semconv.OTEL_VERL_LIVE_WAITING_ON] = op["waiting_on"]["name"]
        if op.get("request_id"):
            attrs[semconv.OTEL_VERL_LIVE_REQUEST_ID] = op["request_id"]
        start_ns = int(op["start"] * 1e9)
        if op.get("parent_span_id"):  # for receivers that start the op's own call (Weave)
            attrs[semconv.OTEL_VERL_LIVE_PARENT_SPAN_ID] = op["parent_span_id"]
        live = self._ops.get(op["_id"])
        if live is not None and live.start_time:
            start_ns = live.start_time  # exact: the op's own span starts at this very ns
            attrs[semconv.OTEL_VERL_LIVE_START_NS] = start_ns
            op_attrs = attribute_map(live)
            if op_attrs.get(semconv.OTEL_VERL_TRAJECTORY_CHILD):
                attrs[semconv.OTEL_VERL_LIVE_TRAJECTORY_CHILD] = True
            content = {k: v for k, v in op_attrs.items() if k.startswith("otel_verl.content.")}
            if content:
                attrs[semconv.OTEL_VERL_LIVE_CONTENT] = json.dumps(content, default=str)
            value = op_attrs.get(semconv.INPUT_VALUE)
            if isinstance(value, str):  # a dataset prompt hashed meanwhile: named by its id
                value = live_input(op["_id"], value)
            if isinstance(value, str) and len(value) <= semconv.LIVE_INPUT_MAX:
                attrs[semconv.OTEL_VERL_LIVE_INPUT] = value
                mime = op_attrs.get(semconv.INPUT_MIME_TYPE)
                if isinstance(mime, str):
                    attrs[semconv.OTEL_VERL_LIVE_INPUT_MIME_TYPE] = mime
        span = tracer.start_span(semconv.IN_FLIGHT_SPAN,
                                 context=otel_trace.set_span_in_context(parent),
                                 start_time=start_ns, attributes=attrs)
        span.end()

    def _send_reports(self) -> None:
        self._account()
        due, self._pending_reports = self._pending_reports, []
        for key, tally in due:
            report = straggler_report(key, tally.done)
            if report is None:
                continue
            self.reports.append(report)
            if self.tracer is not None:
                _send_report(self.tracer, report, self.worker)

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Send what is due, stop the thread and remove the live file (a clean shutdown)."""
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        try:
            self._send_reports()
        except Exception as exc:
            _errors.internal_error(exc, "live: straggler report at shutdown")
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def shutdown(self) -> None:
        self.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._tick_lock = threading.Lock()
        closed = self.closed
        self._reset()
        self.closed = closed
        if not closed:
            self._start_thread()


def _order(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, (int, float)) and not isinstance(value, bool) else \
        (1, str(value))


def _record(span: Span, now_ns: int) -> dict[str, Any] | None:
    """What the live file says about one span in flight (read on the live thread; only single
    dict lookups on the span's attributes, which the loop may be changing meanwhile)."""
    context = span.get_span_context()
    start = span.start_time
    if start is None or context is None:
        return None
    attrs = attribute_map(span)
    parent = span.parent
    kind = attrs.get(_KIND)
    request = attrs.get(semconv.GEN_AI_RESPONSE_ID) or attrs.get(semconv.GEN_AI_CONVERSATION_ID)
    return {
        "_id": context.span_id, "_parent": parent.span_id if parent is not None else None,
        "_attrs": {k: attrs.get(k) for k in semconv.TRAJECTORY_KEYS if attrs.get(k) is not None},
        "span_id": format(context.span_id, "016x"), "trace_id": format(context.trace_id, "032x"),
        "parent_span_id": format(parent.span_id, "016x") if parent is not None else None,
        "name": span.name, "kind": kind, "trajectory": bool(attrs.get(_TRAJ)),
        "experiment": attrs.get(semconv.ROLLOUT_EXPERIMENT_NAME), "step": attrs.get(_STEP),
        "sample_index": attrs.get(semconv.ROLLOUT_SAMPLE_INDEX),
        "rollout_n": attrs.get(semconv.ROLLOUT_ROLLOUT_N),
        "validate": attrs.get(semconv.ROLLOUT_VALIDATE),
        "provisional": bool(attrs.get(semconv.OTEL_VERL_PROVISIONAL)),
        "request_id": str(request) if request is not None else None,
        "tool": attrs.get(semconv.GEN_AI_TOOL_NAME),
        "start": start / 1e9, "elapsed_s": round(max(0, now_ns - start) / 1e9, 3),
    }


def _brief(record: Mapping[str, Any]) -> dict[str, Any]:
    return {"span_id": record["span_id"], "name": record["name"], "kind": record["kind"],
            "request_id": record["request_id"], "tool": record["tool"],
            "elapsed_s": record["elapsed_s"]}


def straggler_report(key: StepKey,
                     done: list[tuple[int, int, Any, Any, int, int, dict[str, float]]]
                     ) -> dict[str, Any] | None:
    """A step's straggler report from its trajectories (see the module docstring)."""
    if not done:
        return None
    experiment, validate, step = key
    durations = sorted((end - start) / 1e9 for start, end, *_ in done)
    ends = sorted(end for _, end, *_ in done)
    n = len(done)
    median = durations[n // 2] if n % 2 else (durations[n // 2 - 1] + durations[n // 2]) / 2
    completed = n - max(1, n // 10)  # the trajectory that completed 90 % (all but the slowest)
    tail_wait = (ends[-1] - ends[completed - 1]) / 1e9 if n > 1 else 0.0
    slowest = []
    for start, end, sample, rollout, trace_id, span_id, leaf in sorted(
            done, key=lambda d: d[0] - d[1])[:SLOWEST_KEPT]:
        seconds = (end - start) / 1e9
        op, op_s = max(leaf.items(), key=lambda kv: kv[1]) if leaf else (None, 0.0)
        slowest.append({"sample_index": sample, "rollout_n": rollout,
                        "duration_s": round(seconds, 6), "dominant_op": op,
                        "dominant_op_s": round(op_s, 6),
                        "dominant_share": round(op_s / seconds, 4) if seconds > 0 else None,
                        "vs_median": round(seconds / median, 3) if median > 0 else None,
                        "trace_id": format(trace_id, "032x"), "span_id": format(span_id, "016x")})
    return {"experiment": experiment, "validate": validate, "step": step, "trajectories": n,
            "start": min(s for s, *_ in done) / 1e9, "end": ends[-1] / 1e9,
            "step_s": round((ends[-1] - min(s for s, *_ in done)) / 1e9, 6),
            "median_s": round(median, 6), "tail_wait_s": round(tail_wait, 6),
            "slowest": slowest}


def _send_report(tracer: otel_trace.Tracer, report: Mapping[str, Any], worker: str) -> None:
    attrs: dict[str, Any] = {
        semconv.ROLLOUT_VALIDATE: bool(report["validate"]),
        semconv.OTEL_VERL_STRAGGLER_TRAJECTORIES: report["trajectories"],
        semconv.OTEL_VERL_STRAGGLER_STEP_S: report["step_s"],
        semconv.OTEL_VERL_STRAGGLER_MEDIAN_S: report["median_s"],
        semconv.OTEL_VERL_STRAGGLER_TAIL_WAIT_S: report["tail_wait_s"],
        semconv.OTEL_VERL_STRAGGLER_SLOWEST: json.dumps(report["slowest"], default=str),
        semconv.OTEL_VERL_LIVE_WORKER: worker,
    }
    if report["experiment"] is not None:
        attrs[semconv.ROLLOUT_EXPERIMENT_NAME] = report["experiment"]
    if report["step"] is not None:
        attrs[semconv.ROLLOUT_STEP] = report["step"]
    first = report["slowest"][0] if report["slowest"] else None
    if first is not None and first["dominant_op"] is not None:
        attrs[semconv.OTEL_VERL_STRAGGLER_DOMINANT_OP] = first["dominant_op"]
    # a child of the slowest trajectory (its trace, its attributes), at the step's end: every
    # reader and backend shows it inside the straggler, none takes it for a trajectory of its own
    context = otel_context.Context()
    if first is not None:
        attrs[semconv.ROLLOUT_SAMPLE_INDEX] = first["sample_index"]
        if first["rollout_n"] is not None:
            attrs[semconv.ROLLOUT_ROLLOUT_N] = first["rollout_n"]
        parent = NonRecordingSpan(SpanContext(int(first["trace_id"], 16),
                                              int(first["span_id"], 16), False,
                                              TraceFlags(TraceFlags.SAMPLED)))
        context = otel_trace.set_span_in_context(parent)
    end = int(report["end"] * 1e9)
    span = tracer.start_span(semconv.STRAGGLER_REPORT_SPAN, context=context, start_time=end,
                             attributes={k: v for k, v in attrs.items() if v is not None})
    span.end(end_time=end)


def _reset_in_child(tracker: LiveTracker) -> None:
    tracker._after_fork_in_child()


_AFTER_FORK: LiveInstances[LiveTracker] = LiveInstances("live tracking", _reset_in_child)
