"""A synthetic GRPO store for the lake's tests (unit and faults tiers load this file by path):
trajectory spans with weights, reasons and rewards, LLM and tool children, engine spans without
identity, partial trajectories, errors, duplicated lines and sampling reports."""

from __future__ import annotations

import collections
import json
import random
from pathlib import Path
from typing import Any

# --- a synthetic GRPO store: weights, rewards, errors, partial trajectories, reports ---------


def _kv(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _span(trace: str, span: str, parent: str | None, name: str, start: int, attrs: dict[str, Any],
          error: bool = False, events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"traceId": trace, "spanId": span, "name": name, "kind": 1,
                           "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 1000),
                           "attributes": [_kv(k, v) for k, v in attrs.items()],
                           "status": {"code": 2, "message": "boom"} if error else {}}
    if parent:
        out["parentSpanId"] = parent
    if events:
        out["events"] = events
    return out


def _line(spans: list[dict[str, Any]], resource: dict[str, Any]) -> bytes:
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": [_kv(k, v) for k, v in resource.items()]},
        "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}]}).encode() + b"\n"


def write_store(directory: Path, seed: int, steps: int = 3, prompts: int = 3, n: int = 3,
                files: int = 2, base: int = 0) -> None:
    """Trajectory spans (weights, reasons, rewards), LLM and tool children in the same or a later
    line (children end first), an engine span without identity, partial trajectories, errors,
    duplicates and sampling reports; lines spread over ``files`` files."""
    rng = random.Random(seed)
    lines: list[bytes] = []
    resource = {"service.name": "rollout", "rollout.experiment_name": "exp",
                "rollout.project_name": "proj"}
    counter = base
    for step in range(steps):
        for prompt in range(prompts):
            for r in range(n):
                counter += 1
                trace = f"{counter:032x}"
                root = f"{counter:08x}00000001"
                ident = {"rollout.step": step, "rollout.sample_index": prompt,
                         "rollout.rollout_n": r, "rollout.validate": step == steps - 1}
                t0 = 10**18 + counter * 10**6
                llm = _span(trace, f"{counter:08x}00000002", root, "chat", t0 + 10, {
                    **ident, "gen_ai.operation.name": "chat",
                    "gen_ai.usage.input_tokens": rng.randint(1, 100),
                    "gen_ai.usage.output_tokens": rng.randint(1, 50)},
                    error=rng.random() < 0.1)
                tool = _span(trace, f"{counter:08x}00000003", root, "calc", t0 + 20, {
                    **ident, "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calc",
                    "output.value": '{"ok": false}' if rng.random() < 0.3 else '{"ok": true}'})
                engine = _span(trace, f"{counter:08x}00000004", f"{counter:08x}00000002",
                               "llm_request", t0 + 11, {}, error=rng.random() < 0.05)
                attrs = {**ident, "otel_verl.trajectory": True, "rollout.num_turns": 2}
                if rng.random() < 0.8:
                    attrs["rollout.reward"] = rng.choice([0.0, 1.0, 0.5, rng.random()])
                if rng.random() < 0.5:
                    attrs["rollout.sampling.weight"] = rng.choice([1.0, 2.0, 4.0, 0.0])
                    attrs["rollout.sampling.reason"] = rng.choice(["head", "error", "group"])
                events = None
                if "rollout.reward" not in attrs and rng.random() < 0.5:
                    events = [{"name": "gen_ai.evaluation.result", "timeUnixNano": str(t0 + 30),
                               "attributes": [_kv("gen_ai.evaluation.score.value", 0.25)]}]
                top = _span(trace, root, None, "agent_loop", t0, attrs, events=events)
                kids = [llm, tool]
                if rng.random() < 0.1:  # the trajectory span never arrived: partial
                    lines.append(_line(kids, resource))
                    continue
                if rng.random() < 0.5:
                    lines.append(_line([*kids, top], resource))
                else:
                    lines.append(_line(kids, resource))
                    lines.append(_line([top], resource))
                lines.append(_line([engine], {"service.name": "vllm"}))
                if rng.random() < 0.1:  # at-least-once delivery: the same line twice
                    lines.append(lines[-2])
        report = _span(f"{0xfeed0000 + base + step:032x}", f"{0xfeed0000 + base + step:016x}", None,
                       "otel_verl.sampling_report", 10**18, {
                           "rollout.step": step, "rollout.validate": step == steps - 1,
                           "rollout.experiment_name": "exp", "rollout.sampling.ran": 50,
                           "rollout.sampling.dropped": 7})
        lines.append(_line([report], resource))
    directory.mkdir(parents=True, exist_ok=True)
    handles = [open(directory / f"otel_verl-elsewhere-{i + 1}-20260101T000000000Z.jsonl", "ab")
               for i in range(files)]
    try:
        for i, raw in enumerate(lines):
            handles[i % files].write(raw)
    finally:
        for h in handles:
            h.close()


def spans_in_lake(store: Path) -> collections.Counter[tuple[str, str]]:
    """Each (trace id, span id) the lake's ``spans`` view reads, with how often it reads it."""
    from otel_verl.store._query import Lake

    with Lake.open(store) as lake:
        return collections.Counter(
            tuple(r) for r in lake.sql("SELECT TraceId, SpanId FROM spans").fetchall())


def spans_in_files(store: Path) -> collections.Counter[tuple[str, str]]:
    """Each (trace id, span id) in the store's raw files, with how often it is there."""
    from otel_verl.store import read_spans

    return collections.Counter((s["trace_id"], s["span_id"]) for s in read_spans(store))
