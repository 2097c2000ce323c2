"""What verl's trainer consumed for each traced trajectory, as content ids (issue 22).

After verl's ``AgentLoopWorker._compute_score`` (both trainers call it on the ``AgentLoopOutput``
they then batch: the legacy trainer pads it into its ``DataProto``, the v1 trainer puts it into
TransferQueue as it is), ``_agent_loop`` hands the output here. The rollout's loop only queues
a reference (the lists verl already built, no copy, O(1)); a thread computes the summary
(``store._parity.summarize``: the prompt's and response's ``token_content_id``, the response's
mask runs with an id each, reward, turns, verl's ``min_global_steps``/``max_global_steps``) and
appends it to ``<trace_dir>/parity/consumed-<pid>.parity`` (JSON lines) with the trajectory's trace id, which
``otel-verl parity`` matches against the trace. Hashes, never copies of the tokens. Bounded: past
``MAX_QUEUED`` records waiting, new ones are dropped and counted (``stats()``).
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import threading
from typing import Any

from otel_verl import _errors, _fork, semconv
from otel_verl._state import STATE, TRAJECTORY
from otel_verl.store import _parity as parity

_log = logging.getLogger("otel_verl")

MAX_QUEUED = 4096


class ConsumedLog:
    """One process's writer of consumed-sample summaries (a thread, a bounded queue)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, f"consumed-{os.getpid()}{parity.CONSUMED_SUFFIX}")
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self.written = self.dropped = self.errors = 0
        self._thread = threading.Thread(target=self._run, name="otel_verl-parity", daemon=True)
        self._thread.start()

    def put(self, item: dict[str, Any]) -> None:
        with self._cond:
            if self._closed or len(self._queue) >= MAX_QUEUED:
                self.dropped += 1
                return
            self._queue.append(item)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue and self._closed:
                    return
                items = list(self._queue)
                self._queue.clear()
                self._busy = True
            lines = []
            for item in items:
                try:
                    lines.append(json.dumps(_summary(item), separators=(",", ":")) + "\n")
                except Exception as exc:
                    self.errors += 1
                    _errors.internal_error(exc, "parity record")
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write("".join(lines))
                self.written += len(lines)
            except OSError as exc:
                self.dropped += len(lines)
                _log.warning("otel_verl: parity records not written to %s: %s", self.path, exc)
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def flush(self, timeout_s: float = 10.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)


def _summary(item: dict[str, Any]) -> dict[str, Any]:
    out = item["output"]
    extra = getattr(out, "extra_fields", None) or {}
    record = parity.summarize(out.prompt_ids, out.response_ids, out.response_mask,
                              reward=getattr(out, "reward_score", None),
                              num_turns=getattr(out, "num_turns", None),
                              min_version=extra.get("min_global_steps"),
                              max_version=extra.get("max_global_steps"))
    record.update(item["ids"])
    return record


_LOGS: dict[str, ConsumedLog] = {}
_LOCK = threading.Lock()


def _log_for(trace_dir: str) -> ConsumedLog:
    directory = os.path.join(os.path.abspath(trace_dir), parity.CONSUMED_DIR)
    log = _LOGS.get(directory)
    if log is None:
        with _LOCK:
            log = _LOGS.get(directory)
            if log is None:
                log = _LOGS[directory] = ConsumedLog(directory)
    return log


def record_consumed(output: Any) -> None:
    """Queue what the trainer consumes for the current traced trajectory (never raises; O(1))."""
    try:
        traj = TRAJECTORY.get()
        span = traj.span if traj is not None else None
        if span is None or not span.is_recording():
            return
        if not all(hasattr(output, k) for k in ("prompt_ids", "response_ids", "response_mask")):
            return
        ctx = span.get_span_context()
        attrs = traj.attrs  # type: ignore[union-attr]
        ids = {"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x"),
               "step": attrs.get(semconv.ROLLOUT_STEP),
               "sample_index": attrs.get(semconv.ROLLOUT_SAMPLE_INDEX),
               "rollout_n": attrs.get(semconv.ROLLOUT_ROLLOUT_N),
               "validate": bool(attrs.get(semconv.ROLLOUT_VALIDATE))}
        _log_for(STATE.config.trace_dir).put({"output": output, "ids": ids})
    except Exception as exc:
        _errors.internal_error(exc, "parity capture")


def flush_all(timeout_s: float = 10.0) -> bool:
    """Write out every queued record of this process."""
    return all([log.flush(timeout_s) for log in list(_LOGS.values())])


def stats() -> dict[str, int]:
    logs = list(_LOGS.values())
    return {"parity_written": sum(x.written for x in logs),
            "parity_dropped": sum(x.dropped for x in logs),
            "parity_errors": sum(x.errors for x in logs)}


def _close_all() -> None:
    with _LOCK:
        logs = list(_LOGS.values())
        _LOGS.clear()
    for log in logs:
        log.close()


def _after_fork_in_child() -> None:
    _LOGS.clear()  # the parent's thread is not the child's


_fork.register_after_in_child(_after_fork_in_child, "parity log")
atexit.register(_close_all)
