"""Hostile store content: a catalogue of poisoned lines and spans every reader must survive.

Shared by the unit tier (``tests/unit/test_hostile_store.py``) and the browser tier
(``tests/ui/test_bad_store.py``), both of which load this file by path. A poisoned line is built
from the real spans of one good trajectory (written by the project's own ToolAgentLoop), moved to
a fresh trace id so the good trajectories stay as they were, then damaged one way.

Each kind is ``KINDS[name](request, spans)``: it damages ``request`` (one OTLP/JSON request holding
every span of the moved trajectory; ``spans`` is its span list, the trajectory span first) in place,
or returns the raw bytes of the line (for damage JSON cannot express as a value).
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRAJECTORY_KEY = "otel_verl.trajectory"
INT64_MAX = 2**63 - 1


# --- a good store -----------------------------------------------------------------------------

def write_good_store(trace_dir: str | Path, trajectories: int = 6, *, step: int = 1,
                     experiment: str = "hostile") -> None:
    """``trajectories`` real ToolAgentLoop rollouts (a tool call and an answer each; GRPO groups
    of two) through the file backend."""
    sys.path.insert(0, str(ROOT / "tests" / "rollout"))
    from _scripted import CharTokenizer, ScriptedClient

    from otel_verl import RolloutTraceConfig, rollout_trace_attr
    from otel_verl.rollout.agent_loop import ToolAgentLoop
    from otel_verl.rollout.reward import Gsm8kReward
    from otel_verl.rollout.tools import CalculatorTool

    async def run() -> None:
        tok = CharTokenizer()
        for i in range(trajectories):
            call = ('<tool_call>{"name": "calculator", "arguments": {"expression": "'
                    f"{i}+1" '"}}</tool_call>')
            client = ScriptedClient(tok, [call, f"The answer is {i + 1}."])
            loop = ToolAgentLoop(client, tok, tools=[CalculatorTool()], reward_fn=Gsm8kReward())
            with rollout_trace_attr(step=step, sample_index=i // 2, rollout_n=i % 2,
                                    name="agent_loop"):
                await loop.run({"temperature": 1.0, "max_tokens": 200},
                               raw_prompt=[{"role": "user", "content": f"What is {i}+1?"}],
                               reward_model={"ground_truth": str(i + 1 - (i % 2))})

    RolloutTraceConfig.init("hostile-tests", experiment, "file", trace_dir=str(trace_dir))
    try:
        asyncio.run(run())
    finally:
        RolloutTraceConfig.shutdown()
        RolloutTraceConfig.reset()


def raw_traces(store: str | Path) -> dict[str, list[tuple[dict[str, Any], dict[str, Any],
                                                          dict[str, Any]]]]:
    """The raw OTLP spans of a store by trace id, each as (resource, scope, span)."""
    from otel_verl.store import list_files

    traces: dict[str, list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]] = {}
    for path in list_files(store):
        for line in Path(path).read_bytes().splitlines():
            if not line.strip():
                continue
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        traces.setdefault(span["traceId"], []).append(
                            (rs.get("resource", {}), ss.get("scope", {}), span))
    return traces


def _is_root(span: dict[str, Any]) -> bool:
    return any(a["key"] == TRAJECTORY_KEY for a in span.get("attributes", []))


def moved_request(trace: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]],
                  trace_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One request holding copies of every span of ``trace`` under ``trace_id`` (root first)."""
    resource, scope = copy.deepcopy(trace[0][0]), copy.deepcopy(trace[0][1])
    spans = [copy.deepcopy(s) for _, _, s in trace]
    spans.sort(key=lambda s: not _is_root(s))
    for span in spans:
        span["traceId"] = trace_id
    request = {"resourceSpans": [{"resource": resource,
                                  "scopeSpans": [{"scope": scope, "spans": spans}]}]}
    return request, spans


def line_of(request: dict[str, Any]) -> bytes:
    return (json.dumps(request, separators=(",", ":")) + "\n").encode()


# --- the damage -------------------------------------------------------------------------------

def _attr(span: dict[str, Any], key: str, value: dict[str, Any]) -> None:
    """Set (or add) ``key`` to the AnyValue ``value``."""
    for kv in span.setdefault("attributes", []):
        if kv.get("key") == key:
            kv["value"] = value
            return
    span["attributes"].append({"key": key, "value": value})


def _with(key: str, value: dict[str, Any], which: str = "root") -> Callable[..., None]:
    def damage(request: dict[str, Any], spans: list[dict[str, Any]]) -> None:
        for span in spans if which == "all" else spans[:1] if which == "root" else spans[1:]:
            _attr(span, key, value)
    return damage


def _field(name: str, value: Any, which: str = "root") -> Callable[..., None]:
    def damage(request: dict[str, Any], spans: list[dict[str, Any]]) -> None:
        for span in spans[:1] if which == "root" else spans:
            span[name] = value
    return damage


def _messages(messages: list[Any]) -> Callable[..., None]:
    """An agent loop whose output carries these messages (verl's ``extra_fields.messages``)."""
    padded = [*messages, *({"role": "user", "content": f"pad {i}"} for i in range(30))]
    text = json.dumps({"response_text": "x", "extra_fields": {"messages": padded}})
    return _with("output.value", {"stringValue": text}, "all")


def _deep_line(request: dict[str, Any], spans: list[dict[str, Any]]) -> bytes:
    return b"[" * 200_000 + b"]" * 200_000 + b"\n"


def _deep_attribute(request: dict[str, Any], spans: list[dict[str, Any]]) -> bytes:
    """An attribute 3000 arrays deep: within the parser's limit, past the decoder's."""
    _attr(spans[0], "deep", {"stringValue": "@deep@"})
    depth = 3000
    deep = ('{"arrayValue":{"values":[' * depth + '{"stringValue":"leaf"}' + "]}}" * depth)
    return line_of(request).replace(b'{"stringValue":"@deep@"}', deep.encode())


def _deep_input(request: dict[str, Any], spans: list[dict[str, Any]]) -> None:
    deep = '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
    for span in spans:
        _attr(span, "input.value", {"stringValue": deep})
        _attr(span, "output.value", {"stringValue": deep})


def _shapes(request: dict[str, Any], spans: list[dict[str, Any]]) -> None:
    request["resourceSpans"].extend([5, {"scopeSpans": 7}, {"scopeSpans": [3, {"spans": 9}]},
                                     {"scopeSpans": [{"spans": {"not": "a list"}}]}])


def _cycle(request: dict[str, Any], spans: list[dict[str, Any]]) -> None:
    spans[0]["parentSpanId"] = spans[0]["spanId"]
    if len(spans) > 2:
        spans[1]["parentSpanId"], spans[2]["parentSpanId"] = spans[2]["spanId"], spans[1]["spanId"]


def _events(request: dict[str, Any], spans: list[dict[str, Any]]) -> None:
    spans[0]["events"] = [
        {"name": 5, "timeUnixNano": "1" + "0" * 30,
         "attributes": [{"key": "exception.message", "value": {"intValue": "5"}},
                        {"key": "exception.type", "value": {"arrayValue": {"values": []}}}]},
        {"name": "gen_ai.evaluation.result", "timeUnixNano": "-1",
         "attributes": [{"key": "gen_ai.evaluation.score.value",
                         "value": {"intValue": str(10**30)}}]}]
    if len(spans) > 1:
        spans[1]["events"] = "not a list"


def _overflowing_sums(request: dict[str, Any], spans: list[dict[str, Any]]) -> None:
    for span in spans:
        _attr(span, "gen_ai.usage.input_tokens", {"intValue": str(INT64_MAX)})
        _attr(span, "gen_ai.usage.output_tokens", {"intValue": str(INT64_MAX)})
        _attr(span, "gen_ai.operation.name", {"stringValue": "chat"})
        span["startTimeUnixNano"], span["endTimeUnixNano"] = "0", str(INT64_MAX)


def _duplicate_ids(request: dict[str, Any], spans: list[dict[str, Any]]) -> None:
    clone = copy.deepcopy(spans[0])
    clone["name"] = {"a": 1}
    clone["attributes"] = [{"key": TRAJECTORY_KEY, "value": {"stringValue": "yes"}}]
    spans.append(clone)
    if len(spans) > 2:
        spans[1]["spanId"] = spans[0]["spanId"]


#: every kind of damage, by name
KINDS: dict[str, Callable[[dict[str, Any], list[dict[str, Any]]], bytes | None]] = {
    "step beyond int64": _with("rollout.step", {"intValue": str(INT64_MAX + 1)}, "all"),
    "start time beyond int64": _field("startTimeUnixNano", str(INT64_MAX + 1), "all"),
    "end time beyond uint64": _field("endTimeUnixNano", "1" + "0" * 30),
    "negative and fractional times": _field("startTimeUnixNano", -5.5, "all"),
    "integer reward 10**400": _with("rollout.reward", {"intValue": str(10**400)}),
    "reward and weight near float max": lambda r, s: (
        _with("rollout.reward", {"doubleValue": 1.5e308})(r, s),
        _with("rollout.sampling.weight", {"doubleValue": 1.7e308})(r, s)) and None,
    "NaN reward, infinite weight": lambda r, s: (
        _with("rollout.reward", {"doubleValue": "NaN"})(r, s),
        _with("rollout.sampling.weight", {"doubleValue": "-Infinity"})(r, s)) and None,
    "span name a number": _field("name", 42, "all"),
    "span name an object": _field("name", {"a": [1, 2]}),
    "nesting past the parser's limit": _deep_line,
    "nesting past the decoder's limit": _deep_attribute,
    "payload JSON nested too deeply": _deep_input,
    "non-lists where lists belong": _shapes,
    "tool_calls a number": _messages([{"role": "user", "content": "q"},
                                      {"role": "assistant", "content": "a", "tool_calls": 7},
                                      {"role": "tool", "content": "r", "tool_call_id": 7}]),
    "tool call id a list": _messages([
        {"role": "assistant", "content": "a",
         "tool_calls": [{"id": [1, 2], "function": {"name": ["calc"], "arguments": {"x": 1}}}]},
        {"role": "tool", "content": "r", "tool_call_id": [1, 2]},
        {"role": ["tool"], "content": {"a": 1}, "tool_call_id": {"k": "v"}}]),
    "tool span call id a list": _with("gen_ai.tool.call.id",
                                      {"arrayValue": {"values": [{"intValue": "1"}]}}, "children"),
    "lone surrogates and NUL": lambda r, s: (
        _field("name", "bad\ud800name\x00", "all")(r, s),
        _with("rollout.experiment_name", {"stringValue": "exp\udfff"})(r, s),
        _messages([{"role": "user", "content": "\ud83d"},
                   {"role": "assistant", "content": "\x00\udc00"}])(r, s)) and None,
    "attribute key not a string": lambda r, s: s[0]["attributes"].append(
        {"key": 5, "value": {"stringValue": "five"}}),
    "stringValue not a string": lambda r, s: (
        _with("rollout.experiment_name", {"stringValue": {"a": 1}}, "all")(r, s),
        _with("gen_ai.tool.name", {"stringValue": [1]}, "children")(r, s),
        _with("rollout.sampling.reason", {"stringValue": 3})(r, s)) and None,
    "intValue and boolValue garbage": lambda r, s: (
        _with("rollout.sample_index", {"intValue": "twelve"})(r, s),
        _with("rollout.validate", {"boolValue": "no"}, "all")(r, s),
        _with("rollout.num_turns", {"intValue": 2.5})(r, s)) and None,
    "status garbage": _field("status", {"code": 99, "message": ["not", "text"]}, "all"),
    "events garbage": _events,
    "token and latency sums past int64": _overflowing_sums,
    "parent cycles": _cycle,
    "duplicate span ids that disagree": _duplicate_ids,
    "a line that is a JSON number": lambda r, s: b"12345678901234567890\n",
    "invalid UTF-8": lambda r, s: line_of(r).replace(b'"agent_loop"', b'"agent\xff\xfe_loop"'),
}


def poisoned_line(kind: str, trace: list[tuple[dict[str, Any], dict[str, Any],
                                               dict[str, Any]]], trace_id: str) -> bytes:
    """The line ``KINDS[kind]`` makes of a copy of ``trace`` moved to ``trace_id``."""
    request, spans = moved_request(trace, trace_id)
    raw = KINDS[kind](request, spans)
    return raw if isinstance(raw, bytes) else line_of(request)


def poison_store(store: str | Path, kinds: list[str] | None = None) -> list[str]:
    """Append one poisoned line per kind to a store, between its good lines (the first good line
    is written again after them, so good lines follow every poison). Returns the trace ids of
    the poisoned copies."""
    from otel_verl.store import list_files

    traces = raw_traces(store)
    template = next(t for t in traces.values() if any(_is_root(s) for _, _, s in t))
    path = Path(list_files(store)[0])
    lines = path.read_bytes().splitlines(keepends=True)
    poisoned, ids = [], []
    for i, kind in enumerate(kinds or list(KINDS)):
        trace_id = f"{0xbad00000 + i:08x}" + "0" * 23 + "1"
        ids.append(trace_id)
        poisoned.append(poisoned_line(kind, template, trace_id))
    middle = len(lines) // 2
    path.write_bytes(b"".join([*lines[:middle], *poisoned, *lines[middle:]]))
    return ids
