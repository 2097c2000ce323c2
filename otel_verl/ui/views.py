"""What each view of the viewer shows, as JSON-ready dicts (shared by the server and the report).

The trajectory page is built from the full spans of its trace (re-read from the store lines the
lake names) with the store's trajectory model: the conversation (messages in order, tool calls with
arguments and results, per-turn usage and latency), the reward and its label, the errors, and the
span waterfall (engine spans that joined the trace included).

Every view survives any decodable span: a value of the wrong type (a ``tool_calls`` that is a
number, a call id that is a list, a payload nested past the parser's limit) is shown as text or
left out, one section that still fails is replaced by a note in the view's ``problems`` list,
and the answer is always JSON the browser can take (text encodable as UTF-8, bounded depth).
Out-of-range inputs (an integer beyond 64 bits) raise :class:`BadRequest`, a ``ValueError``: the
caller's mistake, which the server answers with 400.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

from otel_verl import semconv
from otel_verl.store import (
    BadRequest,
    Trajectory,
    answer_text,
    first_error,
    group_trajectories,
    is_llm_span,
    is_tool_error,
    is_tool_span,
    prompt_and_response,
    reward_label,
)
from otel_verl.store import json_or_none as _json

__all__ = ["BadRequest", "Source", "group_view", "live_view", "overview_view", "prompt_view",
           "trajectory_view"]

_logger = logging.getLogger(__name__)

#: characters of one attribute value sent to the browser (payloads are capped at 64 KiB anyway)
MAX_VALUE_CHARS = 8000
_EXCEPTION = "exception"


#: nesting kept in a view's values; deeper values are shown as JSON text
_MAX_DEPTH = 24


class Source(Protocol):
    """What the views, the server and the report read: one row per trajectory, the per-step
    aggregates, and a trace's full spans.

    One implementation: the lakehouse (:class:`otel_verl.ui._lake.LakeSource`, DuckDB over the
    Parquet segments and the files not compacted yet; the ``lake`` extra). Its rows are
    ``TRAJECTORY_COLUMNS``, its step dicts :meth:`otel_verl.store.Lake.steps`'s (the one
    weighted step statistics the CLI and ``otel-verl sql`` read too).
    """

    @property
    def trace_dir(self) -> str: ...

    @property
    def generation(self) -> int: ...

    def update(self) -> Any: ...

    def problems(self) -> dict[str, Any]: ...

    def experiments(self) -> list[str]: ...

    def overview(self, experiment: str | None = None) -> list[dict[str, Any]]: ...

    def flat_groups(self, experiment: str | None = None) -> list[dict[str, Any]]: ...

    def trajectories(
        self, *, experiment: str | None = None, step: int | None = None,
        sample_index: int | None = None, rollout_n: int | None = None,
        validate: bool | None = None, reward_min: float | None = None,
        reward_max: float | None = None, errors_only: bool = False, text: str | None = None,
        trace_id: str | None = None, order: str = "start_ns", descending: bool = False,
        page: int = 0, page_size: int = 50, with_search: bool = False,
        max_page_size: int = 5000) -> dict[str, Any]: ...

    def trajectory_row(self, key: str) -> dict[str, Any] | None: ...

    def trace_spans(self, trace_id: str) -> list[dict[str, Any]]: ...


def _cap(value: Any, limit: int = MAX_VALUE_CHARS) -> Any:
    if isinstance(value, (bytes, bytearray)):
        value = value.hex()
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + f"… ({len(value)} chars)"
    if isinstance(value, (list, dict)):
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (RecursionError, ValueError):
            return f"<{type(value).__name__} nested too deeply to show>"
        return value if len(text) <= limit else text[:limit] + f"… ({len(text)} chars)"
    return value


def _scalar(value: Any) -> str | int | float | bool | None:
    """An id or a name as the browser can key on it: a list or an object becomes its text."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    capped = _cap(value, 200)
    return capped if isinstance(capped, str) else json.dumps(capped, default=str)


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON the browser takes: UTF-8 text (lone surrogates replaced), string keys,
    finite numbers, bounded depth (what lies deeper becomes JSON text)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "replace").decode("utf-8")
        return value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**63 else str(value)[:40]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple, dict)):
        if depth >= _MAX_DEPTH:
            return _plain(_cap(str(value), 2000), depth)
        if isinstance(value, dict):
            return {_plain(k if isinstance(k, str) else str(k), depth): _plain(v, depth + 1)
                    for k, v in value.items()}
        return [_plain(v, depth + 1) for v in value]
    return _plain(str(value), depth)


def _section(problems: list[str], what: str, build: Callable[[], Any], default: Any) -> Any:
    """One part of a view; when it fails on what the spans hold, the rest is still shown."""
    try:
        return build()
    except Exception as error:  # noqa: BLE001 - a hostile span must not take the page down
        _logger.warning("ui: the %s of a trajectory could not be shown: %r", what, error)
        problems.append(f"{what} not shown: {type(error).__name__}: {error}"[:300])
        return default


def _duration(span: dict[str, Any]) -> int | None:
    if span["start_ns"] is None or span["end_ns"] is None:
        return None
    return span["end_ns"] - span["start_ns"]


def _span_errors(span: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for event in span["events"]:
        ev = event["attributes"]
        if event["name"] == _EXCEPTION or "exception.type" in ev:
            found.append({
                "span": span["name"], "span_id": span["span_id"],
                "type": str(ev.get("exception.type", "exception")),
                "message": _cap(str(ev.get("exception.message", ""))),
                "stacktrace": _cap(str(ev.get("exception.stacktrace", "")), 4000),
            })
    if span["status"]["code"] == "ERROR" and not found:
        found.append({"span": span["name"], "span_id": span["span_id"], "type": "ERROR",
                      "message": _cap(span["status"]["message"]), "stacktrace": ""})
    return found


def _messages(t: Trajectory) -> list[dict[str, Any]]:
    """The conversation: verl's ``extra_fields.messages`` when an output carries it, else the
    GenAI message attributes, else the prompt and each model call's text."""
    best: list[Any] = []
    for span in t.spans:
        value = _json(span["attributes"].get(semconv.OUTPUT_VALUE))
        if isinstance(value, dict):
            extra = value.get("extra_fields")
            messages = extra.get("messages") if isinstance(extra, dict) else value.get("messages")
            if isinstance(messages, list) and len(messages) > len(best):
                best = messages
    if not best:
        for span in t.spans:
            if not is_llm_span(span):
                continue
            inputs = _json(span["attributes"].get(semconv.GEN_AI_INPUT_MESSAGES))
            outputs = _json(span["attributes"].get(semconv.GEN_AI_OUTPUT_MESSAGES))
            if isinstance(inputs, list):
                best = inputs + (outputs if isinstance(outputs, list) else [])
    if not best:
        prompt = None
        for span in t.spans:
            prompt = prompt_and_response(span)[0]
            if prompt is not None:
                break
        if prompt is not None:
            best.append({"role": "user", "content": prompt})
        for span in t.spans:
            if is_llm_span(span):
                text = span["attributes"].get(semconv.OUTPUT_VALUE)
                value = _json(text)
                if isinstance(value, dict):
                    text = value.get("text") or value.get("content") or text
                # the answer as the trajectory table shows it (no trailing end-of-turn token)
                best.append({"role": "assistant",
                             "content": answer_text(text) if isinstance(text, str) else
                             "" if text is None else text})
    out = []
    for message in best:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", p.get("content", ""))) for p in content
                               if isinstance(p, dict))
        if content is None and isinstance(message.get("parts"), list):
            content = " ".join(str(p.get("content", "")) for p in message["parts"]
                               if isinstance(p, dict))
        calls = []
        listed = message.get("tool_calls")
        for call in listed if isinstance(listed, list) else ():
            if isinstance(call, dict):
                inner = call.get("function")
                function: dict[str, Any] = inner if isinstance(inner, dict) else call
                calls.append({"id": _scalar(call.get("id")), "name": _scalar(function.get("name")),
                              "arguments": _cap(function.get("arguments"))})
        role = message.get("role", "?")
        out.append({"role": role if isinstance(role, str) else str(_scalar(role)),
                    "content": _cap("" if content is None else str(content)),
                    "tool_calls": calls, "tool_call_id": _scalar(message.get("tool_call_id"))})
    return out


def _turn(span: dict[str, Any], index: int) -> dict[str, Any]:
    a = span["attributes"]
    return {
        "index": index, "span_id": span["span_id"], "name": span["name"],
        "model": a.get(semconv.GEN_AI_RESPONSE_MODEL) or a.get(semconv.GEN_AI_REQUEST_MODEL),
        "tokens_in": a.get(semconv.GEN_AI_USAGE_INPUT_TOKENS),
        "tokens_out": a.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS),
        "finish": _cap(a.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS)),
        "duration_ns": _duration(span), "status": span["status"]["code"],
    }


def _tool(span: dict[str, Any]) -> dict[str, Any]:
    a = span["attributes"]
    arguments = a.get(semconv.GEN_AI_TOOL_CALL_ARGUMENTS)
    if arguments is None:
        value = _json(a.get(semconv.INPUT_VALUE))
        arguments = value.get("arguments", value) if isinstance(value, dict) else a.get(
            semconv.INPUT_VALUE)
    result = a.get(semconv.GEN_AI_TOOL_CALL_RESULT)
    output = _json(a.get(semconv.OUTPUT_VALUE))
    ok = not is_tool_error(span)  # the rule the trajectory's tool_errors count by
    if result is None:
        result = output.get("text", output) if isinstance(output, dict) else a.get(
            semconv.OUTPUT_VALUE)
    errors = _span_errors(span)
    if result is None and errors:
        result = f"{errors[0]['type']}: {errors[0]['message']}"
    return {
        "span_id": span["span_id"],
        "name": _scalar(a.get(semconv.GEN_AI_TOOL_NAME)) or span["name"],
        "call_id": _scalar(a.get(semconv.GEN_AI_TOOL_CALL_ID)), "arguments": _cap(arguments),
        "result": _cap(result), "ok": ok, "duration_ns": _duration(span),
    }


def _reward(t: Trajectory) -> dict[str, Any]:
    name = None
    for span in t.spans:
        for event in span["events"]:
            if event["name"] == semconv.GEN_AI_EVALUATION_RESULT:
                name = event["attributes"].get(semconv.GEN_AI_EVALUATION_NAME)
        name = name or span["attributes"].get(semconv.GEN_AI_EVALUATION_NAME)
    return {"score": t.reward, "label": reward_label(t), "name": name}


def _flags(t: Trajectory) -> list[dict[str, Any]]:
    """The detectors' flags on the trajectory span, each with its evidence (docs/signals.md)."""
    attributes = t.root["attributes"] if t.root is not None else {}
    names = attributes.get(semconv.RL_FLAGS) or []
    out = []
    for name in names if isinstance(names, (list, tuple)) else []:
        raw = attributes.get(semconv.flag_evidence_key(str(name)))
        try:
            evidence = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            evidence = raw
        out.append({"name": str(name), "evidence": evidence})
    return out


def _waterfall(t: Trajectory) -> list[dict[str, Any]]:
    origin = t.start_ns or 0
    rows = []
    for depth, span in t.walk():
        hidden = {semconv.INPUT_VALUE, semconv.OUTPUT_VALUE, semconv.INPUT_MIME_TYPE,
                  semconv.OUTPUT_MIME_TYPE}
        rows.append({
            "depth": depth, "span_id": span["span_id"], "name": span["name"],
            "service": span["resource"].get(semconv.SERVICE_NAME),
            "kind": span["attributes"].get(semconv.OPENINFERENCE_SPAN_KIND) or span["kind"],
            "offset_ns": (span["start_ns"] - origin) if span["start_ns"] is not None else None,
            "duration_ns": _duration(span), "status": span["status"]["code"],
            "status_message": _cap(span["status"]["message"], 2000),
            "input": _cap(span["attributes"].get(semconv.INPUT_VALUE)),
            "output": _cap(span["attributes"].get(semconv.OUTPUT_VALUE)),
            "attributes": {str(k): _cap(v, 2000) for k, v in sorted(
                span["attributes"].items(), key=lambda kv: str(kv[0])) if k not in hidden},
            "events": [{"name": e["name"], "attributes": {k: _cap(v, 4000) for k, v in
                                                         e["attributes"].items()}}
                       for e in span["events"]],
        })
    return rows


def _attach(messages: list[dict[str, Any]], turns: list[dict[str, Any]],
            tools: list[dict[str, Any]]) -> None:
    """Per-turn usage onto assistant messages (in order); tool spans onto tool messages (by call
    id, else in order)."""
    turn_iter = iter(turns)
    by_call = {tool["call_id"]: tool for tool in tools
               if tool["call_id"] and not isinstance(tool["call_id"], float)}
    tool_iter = iter(tools)
    for message in messages:
        if message["role"] == "assistant":
            message["turn"] = next(turn_iter, None)
        elif message["role"] == "tool":
            tool = by_call.get(message.get("tool_call_id")) if message.get("tool_call_id") else None
            message["tool"] = tool if tool is not None else next(tool_iter, None)


def _merge_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per distinct error: where it was raised (the innermost span, which starts last)
    and the spans it propagated through (``through``)."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for error in errors:  # spans by start time: outer ones first
        key = (error["type"], str(error["message"]))
        if key in merged:
            first = merged[key]
            first["through"].append(first["span"])
            first["span"], first["span_id"] = error["span"], error["span_id"]
            first["stacktrace"] = error["stacktrace"] or first["stacktrace"]
        else:
            merged[key] = {**error, "through": []}
    return list(merged.values())


def trajectory_view(index: Source, key: str) -> dict[str, Any] | None:
    """Everything the trajectory page shows; None when the key is unknown.

    Sections that cannot be built from the spans are left empty and named in ``problems``; a
    trajectory that cannot be rebuilt at all answers its row and ``missing`` (why)."""
    row = index.trajectory_row(key)
    if row is None:
        return None
    try:
        return _plain(_trajectory_view(index, row))
    except Exception as error:  # noqa: BLE001 - the page says why instead of failing
        _logger.warning("ui: trajectory %s could not be shown: %r", key, error)
        return _plain({"row": row, "missing": f"this trajectory could not be shown: "
                                              f"{type(error).__name__}: {error}"[:500]})


def _trajectory_view(index: Source, row: dict[str, Any]) -> dict[str, Any]:
    spans = index.trace_spans(row["trace_id"])
    chosen = None
    for t in group_trajectories(spans):
        if (t.span_id or "") == row["span_id"]:
            chosen = t
            break
    if chosen is None:
        return {"row": row, "missing": "the spans of this trajectory are no longer in the store"}
    t = chosen
    problems: list[str] = []
    llm = [s for s in t.spans if is_llm_span(s)]
    turns = _section(problems, "turns", lambda: [_turn(s, i + 1) for i, s in enumerate(llm)], [])
    tools = _section(problems, "tool calls",
                     lambda: [_tool(s) for s in t.spans if is_tool_span(s)], [])
    messages = _section(problems, "conversation", lambda: _messages(t), [])
    _section(problems, "per-turn usage", lambda: _attach(messages, turns, tools), None)
    errors = _section(problems, "errors",
                      lambda: _merge_errors([e for s in t.spans for e in _span_errors(s)]), [])
    return {
        "row": row, "messages": messages, "turns": turns, "tools": tools,
        "reward": _section(problems, "reward", lambda: _reward(t), {}),
        "flags": _section(problems, "flags", lambda: _flags(t), []),
        "errors": errors, "first_error": _section(problems, "first error",
                                                  lambda: first_error(t), None),
        "waterfall": _section(problems, "span waterfall", lambda: _waterfall(t), []),
        "problems": problems,
    }


def overview_view(index: Source, experiment: str | None = None) -> dict[str, Any]:
    return _plain({"steps": index.overview(experiment), "flat": index.flat_groups(experiment)})


def group_view(index: Source, experiment: str | None, step: int | None,
               sample_index: int | None, validate: bool | None,
               max_details: int = 64) -> dict[str, Any]:
    """The rollouts of one GRPO group (experiment, step, sample index) and their conversations."""
    page = index.trajectories(experiment=experiment, step=step, sample_index=sample_index,
                              validate=validate, order="rollout_n", page_size=max_details)
    details = {}
    for row in page["rows"]:
        view = trajectory_view(index, row["key"])
        if view is not None and "messages" in view:
            details[row["key"]] = {"messages": view["messages"], "reward": view["reward"],
                                   "errors": view["errors"]}
    return _plain({"rows": page["rows"], "total": page["total"], "details": details})


def prompt_view(index: Source, experiment: str | None, sample_index: int,
                validate: bool | None) -> dict[str, Any]:
    """One prompt (sample index) through training: its rollouts at every step."""
    page = index.trajectories(experiment=experiment, sample_index=sample_index,
                              validate=validate, order="step", page_size=5000)
    return _plain({"rows": page["rows"], "total": page["total"]})


def live_view(board: dict[str, Any]) -> dict[str, Any]:
    """The Live board (:func:`otel_verl.store.live_board`) with the counts its header and its
    workers' table show, counted from the same ops its table lists.

    A trajectory in flight is a row of the ops table too (its own span, in italics), stuck as
    soon as one of its ops is; the counts keep the two apart, so the STUCK rows are
    ``trajectories_stuck + ops_stuck``: ``counts`` for the whole board, and per worker
    ``stuck_trajectories`` and ``stuck_ops`` (the store's ``stuck`` counts both together).
    """
    ops = board.get("ops") or []
    counts = {"trajectories": 0, "trajectories_stuck": 0, "ops": 0, "ops_stuck": 0}
    per_worker: dict[Any, dict[str, int]] = {}
    for op in ops:
        what = "trajectories" if op.get("trajectory") else "ops"
        counts[what] += 1
        mine = per_worker.setdefault(op.get("worker"), {"stuck_trajectories": 0,
                                                        "stuck_ops": 0})
        if op.get("stuck"):
            counts[what + "_stuck"] += 1
            mine["stuck_" + what] += 1
    workers = [{**w, **per_worker.get(w.get("worker"), {"stuck_trajectories": 0,
                                                          "stuck_ops": 0})}
               for w in board.get("workers") or []]
    return _plain({**board, "workers": workers, "counts": counts})
