"""Trajectories as data: a dataset file for SFT replay or a regression set (issue 22).

Usage::

    rows = export_rows(spans, ContentIndex.load(trace_dir), step=3, min_reward=1.0)
    write_jsonl(rows, "set.jsonl")      # datasets.load_dataset("json", data_files="set.jsonl")
    write_parquet(rows, "set.parquet")  # pyarrow / datasets.load_dataset("parquet", ...)

One row per trajectory, in the chat format Hugging Face ``datasets`` loads: ``messages`` (role,
content, tool_calls with JSON-string arguments, tool_call_id; the conversation as the agent loop
sent its last LLM call, plus that call's answer), and the token view the trainer trains on,
rebuilt from the content store: ``prompt_ids``, ``response_ids``, ``response_mask`` (1 = a
model's turn), ``reward``, ``num_turns``, ``policy_version_min``/``max`` and ``policy_versions``
(one per LLM call), ``staleness``; with the trajectory's identity (``trace_id``, ``experiment``,
``step``, ``sample_index``, ``rollout_n``, ``validate``). Every row has every key (None where the
trace lacks it), so the columns have one type. The file is also a source for ``otel-verl parity``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from otel_verl import _content, semconv
from otel_verl.store._content import ContentError, ContentIndex
from otel_verl.store._parity import TracedTrajectory, traced_trajectories

__all__ = ["FORMATS", "export_file", "export_rows", "write_dataset", "write_jsonl",
           "write_parquet"]

FORMATS = ("jsonl", "parquet")


def _message(raw: Any) -> dict[str, Any]:
    """A chat message with a fixed set of keys (one schema for the whole column)."""
    raw = raw if isinstance(raw, Mapping) else {"role": "user", "content": str(raw)}
    calls = []
    for call in raw.get("tool_calls") or ():
        if not isinstance(call, Mapping):
            continue
        inner = call.get("function")
        function: Mapping[str, Any] = inner if isinstance(inner, Mapping) else call
        arguments = function.get("arguments")
        calls.append({"id": None if call.get("id") is None else str(call.get("id")),
                      "type": "function",
                      "function": {"name": str(function.get("name")),
                                   "arguments": arguments if isinstance(arguments, str)
                                   else json.dumps(arguments, ensure_ascii=False)}})
    content = raw.get("content")
    return {"role": str(raw.get("role")),
            "content": content if content is None or isinstance(content, str)
            else json.dumps(content, ensure_ascii=False),
            "tool_calls": calls or None,
            "tool_call_id": None if raw.get("tool_call_id") is None else str(raw["tool_call_id"])}


def _answer(attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The chat message of an LLM call's ``gen_ai.output.messages`` (GenAI parts)."""
    text = attrs.get(semconv.GEN_AI_OUTPUT_MESSAGES)
    try:
        messages = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        return None
    parts = messages[0].get("parts") or []
    content = "".join(p.get("content", "") for p in parts
                      if isinstance(p, dict) and p.get("type") == "text")
    calls = [{"id": p.get("id"), "function": {"name": p.get("name"),
                                               "arguments": p.get("arguments")}}
             for p in parts if isinstance(p, dict) and p.get("type") == "tool_call"]
    return _message({"role": messages[0].get("role", "assistant"), "content": content,
                     "tool_calls": calls})


def _messages(traced: TracedTrajectory, spans_by_id: Mapping[str, Mapping[str, Any]],
              index: ContentIndex) -> list[dict[str, Any]]:
    """The conversation: the last LLM call's whole message list (from the content store) plus
    its answer; else the trajectory's input when it is a message list."""
    for turn in reversed(traced.turns):
        attrs = (spans_by_id.get(turn.span_id) or {}).get("attributes") or {}
        messages_id = attrs.get(semconv.CONTENT_MESSAGES_ID)
        if type(messages_id) is not str:
            continue
        try:
            sent = index.rebuild(messages_id)
        except ContentError:
            break
        out = [_message(m) for m in sent]
        answer = _answer(attrs)
        if answer is not None:
            out.append(answer)
        return out
    text = traced.attrs.get(semconv.INPUT_VALUE)
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value):
        return [_message(m) for m in value]
    return [_message({"role": "user", "content": text})] if isinstance(text, str) else []


def _matches(attrs: Mapping[str, Any], filters: Mapping[str, Any]) -> bool:
    for option, key in (("step", semconv.ROLLOUT_STEP),
                        ("sample_index", semconv.ROLLOUT_SAMPLE_INDEX),
                        ("rollout_n", semconv.ROLLOUT_ROLLOUT_N),
                        ("experiment", semconv.ROLLOUT_EXPERIMENT_NAME)):
        wanted = filters.get(option)
        if wanted is not None and attrs.get(key) != wanted:
            return False
    validate = filters.get("validate")
    if validate is not None and bool(attrs.get(semconv.ROLLOUT_VALIDATE)) != validate:
        return False
    reward = attrs.get(semconv.ROLLOUT_REWARD)
    low, high = filters.get("min_reward"), filters.get("max_reward")
    if (low is not None or high is not None) and not isinstance(reward, (int, float)):
        return False
    if low is not None and reward < low:
        return False
    return not (high is not None and reward > high)


def export_rows(spans: Iterable[Mapping[str, Any]], index: ContentIndex,
                **filters: Any) -> list[dict[str, Any]]:
    """One dataset row per traced trajectory matching ``filters`` (``step``, ``sample_index``,
    ``rollout_n``, ``experiment``, ``validate``, ``min_reward``, ``max_reward``). A trajectory
    whose turns cannot be rebuilt from the content store is left out (its ids would be wrong).
    """
    spans = list(spans)
    by_id = {str(s.get("span_id")): s for s in spans}
    rows = []
    for traced in traced_trajectories(spans, index):
        attrs = traced.attrs
        if not _matches(attrs, filters):
            continue
        conversation = traced.conversation() if not any(t.error for t in traced.turns) else None
        if conversation is None:
            continue
        prompt, response, mask, _ = conversation
        versions = [t.version for t in traced.turns]
        known = [v for v in versions if v is not None]
        step = attrs.get(semconv.ROLLOUT_STEP)
        rows.append({
            "trace_id": traced.trace_id,
            "experiment": attrs.get(semconv.ROLLOUT_EXPERIMENT_NAME),
            "step": step,
            "sample_index": attrs.get(semconv.ROLLOUT_SAMPLE_INDEX),
            "rollout_n": attrs.get(semconv.ROLLOUT_ROLLOUT_N),
            "validate": bool(attrs.get(semconv.ROLLOUT_VALIDATE)),
            "messages": _messages(traced, by_id, index),
            "prompt_ids": prompt,
            "response_ids": response,
            "response_mask": mask,
            "prompt_content_id": _content.token_content_id(prompt),
            "reward": attrs.get(semconv.ROLLOUT_REWARD),
            "num_turns": attrs.get(semconv.ROLLOUT_NUM_TURNS),
            "policy_versions": versions,
            "policy_version_min": min(known) if known else None,
            "policy_version_max": max(known) if known else None,
            "staleness": attrs.get(semconv.RL_POLICY_STALENESS),
        })
    return rows


def write_jsonl(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike[str]) -> int:
    """One JSON object per line; returns the number of rows."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
            n += 1
    return n


def write_parquet(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike[str]) -> int:
    """A Parquet file (needs pyarrow: the ``lake`` extra); returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = list(rows)
    table = pa.Table.from_pylist([dict(r) for r in rows])
    pq.write_table(table, os.fspath(path))
    return len(rows)


def write_dataset(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike[str],
                  fmt: str | None = None) -> int:
    """``write_jsonl`` or ``write_parquet`` by ``fmt`` (default: from the file's suffix)."""
    fmt = fmt or ("parquet" if os.fspath(path).endswith(".parquet") else "jsonl")
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    return write_parquet(rows, path) if fmt == "parquet" else write_jsonl(rows, path)


def _query_filters(query: Mapping[str, str]) -> dict[str, Any]:
    """The viewer's table filters (``step``, ``sample_index``, ``rollout_n``, ``experiment``,
    ``validate``, ``reward_min``, ``reward_max``; empty = any) as ``export_rows`` filters.

    Raises:
        ValueError: a filter that is not a number (or a boolean) where one is needed.
    """
    def get(name: str) -> str | None:
        value = query.get(name)
        return value if value not in (None, "") else None

    out: dict[str, Any] = {}
    for name in ("step", "sample_index", "rollout_n"):
        value = get(name)
        if value is not None:
            out[name] = int(value)
    for name, key in (("reward_min", "min_reward"), ("reward_max", "max_reward")):
        value = get(name)
        if value is not None:
            out[key] = float(value)
    if get("experiment") is not None:
        out["experiment"] = get("experiment")
    validate = get("validate")
    if validate is not None:
        if validate not in ("true", "false"):
            raise ValueError(f"validate={validate!r}: true or false")
        out["validate"] = validate == "true"
    return out


def export_file(trace_dir: str | os.PathLike[str], query: Mapping[str, str], fmt: str
                ) -> tuple[bytes, int]:
    """The viewer's export of its filtered table: (the file's bytes, rows) for ``fmt``."""
    import io

    from otel_verl.store import read_spans

    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    rows = export_rows(read_spans(trace_dir, warn=False), ContentIndex.load(trace_dir),
                       **_query_filters(query))
    if fmt == "jsonl":
        body = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n"
                       for r in rows)
        return body.encode("utf-8"), len(rows)
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([dict(r) for r in rows]), buffer)
    return buffer.getvalue(), len(rows)
