"""Reading the live files (``<trace_dir>/live/<host>-<pid>.json``, written by ``otel_verl._live``).

Usage::

    from otel_verl.store._live import live_ops, live_workers
    for op in live_ops("otel_verl_traces"):          # stuck first, then the longest running
        print(op["worker"], op["name"], op["elapsed_s"], op["stuck"], op["lost"])

Elapsed time and the stuck flag are computed at read time from each op's start and threshold, so
a reader sees an op turn stuck as soon as it passes its threshold, not one snapshot later. A
worker whose heartbeat is older than ``LOST_AFTER_INTERVALS`` intervals is ``lost`` (its process
died without a clean shutdown, which would have removed the file); its ops are what it had in
flight. Any file, however damaged, is skipped and counted (``unreadable``), never raised on.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from otel_verl import semconv

LIVE_DIR = "live"
LOST_AFTER_INTERVALS = 3


def _live_dir(trace_dir: str) -> str:
    path = os.path.abspath(trace_dir)
    if os.path.basename(path) == LIVE_DIR:
        return path
    return os.path.join(path, LIVE_DIR)


def live_workers(trace_dir: str, now: float | None = None) -> dict[str, Any]:
    """Every worker's live file: ``{"workers": [...], "unreadable": n}``; each worker with
    ``lost``, ``heartbeat_age_s`` and its ``ops`` (elapsed and stuck as of ``now``)."""
    now = time.time() if now is None else now
    directory = _live_dir(trace_dir)
    workers: list[dict[str, Any]] = []
    unreadable = 0
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        names = []
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                data = json.load(handle)
            workers.append(_worker(data, now))
        except Exception:  # noqa: BLE001 - every reader survives any file
            unreadable += 1
    workers.sort(key=lambda w: (not w["lost"], -w["stuck"], str(w["worker"])))
    return {"workers": workers, "unreadable": unreadable, "now": now}


def _number(value: Any, default: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
        return float(value)
    return default


def _worker(data: Mapping[str, Any], now: float) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError("not an object")
    interval = _number(data.get("interval_s"), 1.0) or 1.0
    heartbeat = _number(data.get("heartbeat"), 0.0)
    age = max(0.0, now - heartbeat)
    lost = age > LOST_AFTER_INTERVALS * interval
    worker = str(data.get("worker", "?"))
    ops = []
    for raw in data.get("ops") or ():
        if not isinstance(raw, Mapping):
            continue
        op = dict(raw)
        start = _number(op.get("start"), now)
        # a lost worker's ops stopped at its last heartbeat (nothing says they still run)
        op["elapsed_s"] = round(max(0.0, (heartbeat if lost else now) - start), 3)
        threshold = op.get("threshold_s")
        own = isinstance(threshold, (int, float)) and op["elapsed_s"] >= threshold
        op["stuck"] = bool(own or (op.get("trajectory") and op.get("stuck")))
        op["worker"], op["lost"] = worker, lost
        ops.append(op)
    by_id = {op.get("span_id"): op for op in ops}
    for op in ops:  # a trajectory is stuck as soon as one of its ops is
        if op["stuck"] and not op.get("trajectory"):
            traj = by_id.get(op.get("trajectory_span_id"))
            if traj is not None:
                traj["stuck"] = True
                traj.setdefault("stuck_op", op.get("name"))
    ops.sort(key=_board_order)
    return {"worker": worker, "host": data.get("host"), "pid": data.get("pid"), "lost": lost,
            "heartbeat": heartbeat, "heartbeat_age_s": round(age, 3), "interval_s": interval,
            "ops": ops, "stuck": sum(1 for o in ops if o["stuck"]),
            "trajectories": sum(1 for o in ops if o.get("trajectory")),
            "unsampled": [u for u in data.get("unsampled") or () if isinstance(u, Mapping)],
            "straggler_reports": [r for r in data.get("straggler_reports") or ()
                                  if isinstance(r, Mapping)]}


def _board_order(op: Mapping[str, Any]) -> tuple[bool, bool, bool, float]:
    """Stuck first, the op that waits (nothing in flight below it) before its callers, then the
    longest running."""
    return (not op["stuck"], op.get("waiting_on") is not None, bool(op.get("trajectory")),
            -op["elapsed_s"])


def live_ops(trace_dir: str, now: float | None = None) -> list[dict[str, Any]]:
    """One record per op in flight over all workers (lost ones included), stuck first."""
    ops = [op for w in live_workers(trace_dir, now)["workers"] for op in w["ops"]]
    ops.sort(key=_board_order)
    return ops


def live_board(trace_dir: str, now: float | None = None) -> dict[str, Any]:
    """What the viewer's Live board shows: workers, ops (stuck first), per-step counts of
    trajectories in flight (traced and unsampled), and the latest straggler reports."""
    view = live_workers(trace_dir, now)
    steps: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for worker in view["workers"]:
        for op in worker["ops"]:
            key = (op.get("experiment"), op.get("validate"), op.get("step"))
            row = steps.setdefault(key, _step_row(key))
            if op.get("trajectory"):
                row["traced"] += 1
                row["stuck"] += 1 if op["stuck"] else 0
        for count in worker["unsampled"]:
            key = (count.get("experiment"), count.get("validate"), count.get("step"))
            n = count.get("in_flight")
            if isinstance(n, int) and n > 0:
                steps.setdefault(key, _step_row(key))["unsampled"] += n
    reports = [r for w in view["workers"] for r in w["straggler_reports"]]
    reports.sort(key=lambda r: _number(r.get("end"), 0.0), reverse=True)
    ops = [op for w in view["workers"] for op in w["ops"]]
    ops.sort(key=_board_order)
    return {"now": view["now"], "unreadable": view["unreadable"],
            "workers": [{k: v for k, v in w.items() if k not in ("ops", "straggler_reports")}
                        for w in view["workers"]],
            "steps": sorted(steps.values(), key=lambda r: str(r["step"])), "ops": ops,
            "straggler_reports": reports[:8]}


def _step_row(key: tuple[Any, Any, Any]) -> dict[str, Any]:
    return {"experiment": key[0], "validate": key[1], "step": key[2], "traced": 0,
            "unsampled": 0, "stuck": 0}


def straggler_reports(spans: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``otel_verl.straggler_report`` spans of a store's spans, as reports (newest first);
    each is a child of its step's slowest trajectory."""
    out = []
    seen = set()
    for span in spans:
        if span.get("name") != semconv.STRAGGLER_REPORT_SPAN:
            continue
        ident = (span.get("trace_id"), span.get("span_id"))
        if ident in seen:
            continue
        seen.add(ident)
        attrs = span.get("attributes") or {}
        try:
            slowest = json.loads(attrs.get(semconv.OTEL_VERL_STRAGGLER_SLOWEST) or "[]")
        except (TypeError, ValueError):
            slowest = []
        out.append({"experiment": attrs.get(semconv.ROLLOUT_EXPERIMENT_NAME),
                    "validate": attrs.get(semconv.ROLLOUT_VALIDATE), "step": attrs.get(semconv.ROLLOUT_STEP),
                    "worker": attrs.get(semconv.OTEL_VERL_LIVE_WORKER),
                    "trajectories": attrs.get(semconv.OTEL_VERL_STRAGGLER_TRAJECTORIES),
                    "step_s": attrs.get(semconv.OTEL_VERL_STRAGGLER_STEP_S),
                    "median_s": attrs.get(semconv.OTEL_VERL_STRAGGLER_MEDIAN_S),
                    "tail_wait_s": attrs.get(semconv.OTEL_VERL_STRAGGLER_TAIL_WAIT_S),
                    "dominant_op": attrs.get(semconv.OTEL_VERL_STRAGGLER_DOMINANT_OP),
                    "slowest": slowest if isinstance(slowest, list) else [],
                    "end_ns": span.get("end_time_unix_nano") or span.get("end_ns")})
    out.sort(key=lambda r: str(r["end_ns"]), reverse=True)
    return out
