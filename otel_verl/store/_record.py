"""The typed span record the codec hands out (as Logfire's ``ReadableSpanDict``).

:func:`otel_verl._otlp_json.iter_spans` (and so :func:`otel_verl.store.read_spans`) yields plain
dicts of this shape; these ``TypedDict`` types name the keys and their value types so readers
(the query layer, the CLI, the viewer) are checked by mypy instead of indexing untyped dicts.
They are types only: nothing is converted at run time.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import orjson

if TYPE_CHECKING:
    from otel_verl.store import Trajectory

__all__ = ["LLM_OPERATIONS", "EventRecord", "LinkRecord", "ScopeRecord", "SpanLike", "SpanRecord",
           "StatusRecord", "evaluation", "exception_text", "first_exception_text", "first_label",
           "is_llm_span", "is_sampling_report", "is_tool_error", "is_tool_span",
           "is_trajectory_span", "answer_text", "decode_quietly", "first_error", "json_or_none",
           "prompt_and_response", "reward_label", "snippet"]

SpanKindText = Literal["INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER"]
StatusCodeText = Literal["UNSET", "OK", "ERROR"]


class StatusRecord(TypedDict):
    code: str  # "UNSET" | "OK" | "ERROR" (another text from a foreign writer is kept as is)
    message: str


class EventRecord(TypedDict):
    name: str
    time_ns: int | None
    attributes: dict[str, Any]


class LinkRecord(TypedDict):
    trace_id: str | None
    span_id: str | None
    attributes: dict[str, Any]


class ScopeRecord(TypedDict):
    name: str
    version: str


class SpanRecord(TypedDict):
    """One decoded span: ids as lowercase hex, times in ns since the epoch, attribute values
    decoded (str, int, float, bool, bytes, None, list, dict)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_ns: int | None
    end_ns: int | None
    kind: str
    attributes: dict[str, Any]
    status: StatusRecord
    events: list[EventRecord]
    links: list[LinkRecord]
    resource: dict[str, Any]
    scope: ScopeRecord
    parent_is_remote: bool | None


#: a decoded span, or a reduced copy of one (the same keys, fewer attributes): what the
#: predicates below read
SpanLike = SpanRecord | Mapping[str, Any]

# --- what a span means (the one place; the lake's columns, the CLI and the viewer ask here; ------
# --- compaction's row builders inline the same tests, checked equal by --------------------------
# --- tests/unit/test_record_meaning.py) ----------------------------------------------------------

from otel_verl import semconv  # noqa: E402 - the types above stand alone
from otel_verl._otlp_json import spans_from_otlp_json  # noqa: E402

#: the ``gen_ai.operation.name`` values of a model call (``semconv.LLM_OPERATIONS``)
LLM_OPERATIONS = semconv.LLM_OPERATIONS
_LLM_OPERATIONS = LLM_OPERATIONS
_EXECUTE_TOOL = semconv.GenAIOperation.EXECUTE_TOOL
_EXCEPTION_TYPE = "exception.type"
_EXCEPTION_MESSAGE = "exception.message"
#: attributes holding content (prompts, answers, tool arguments): kept out of the narrow columns
PAYLOAD_KEYS = frozenset({
    semconv.INPUT_VALUE, semconv.OUTPUT_VALUE, semconv.GEN_AI_INPUT_MESSAGES,
    semconv.GEN_AI_OUTPUT_MESSAGES, semconv.GEN_AI_TOOL_CALL_ARGUMENTS,
    semconv.GEN_AI_TOOL_CALL_RESULT, "gen_ai.system_instructions", "gen_ai.tool.definitions",
})


def is_trajectory_span(span: SpanLike) -> bool:
    """The span ``rollout_trace_attr`` opens (``otel_verl.trajectory=True``)."""
    return span["attributes"].get(semconv.OTEL_VERL_TRAJECTORY) is True


def is_sampling_report(span: SpanLike) -> bool:
    """A worker's per-step sampling counts, not part of any trajectory."""
    return bool(span["name"] == semconv.SAMPLING_REPORT_SPAN and span["parent_span_id"] is None)


def is_llm_span(span: SpanLike) -> bool:
    """A model call made by the rollout (the GenAI client span), not the engine's own span."""
    attributes = span["attributes"]
    operation = attributes.get(semconv.GEN_AI_OPERATION_NAME)
    if operation is not None:
        return operation in _LLM_OPERATIONS
    return bool(attributes.get(semconv.OPENINFERENCE_SPAN_KIND) == semconv.SpanKindName.LLM)


def is_tool_span(span: SpanLike) -> bool:
    """A tool call (``gen_ai.operation.name = execute_tool``, or OpenInference's TOOL kind)."""
    attributes = span["attributes"]
    return bool(attributes.get(semconv.GEN_AI_OPERATION_NAME) == _EXECUTE_TOOL
                or attributes.get(semconv.OPENINFERENCE_SPAN_KIND) == semconv.SpanKindName.TOOL)


def is_tool_error(span: SpanLike) -> bool:
    """A tool call that failed: status ERROR, ``error.type``, or a result saying ``"ok": false``."""
    if not is_tool_span(span):
        return False
    attributes = span["attributes"]
    if span["status"]["code"] == "ERROR" or semconv.ERROR_TYPE in attributes:
        return True
    output = attributes.get(semconv.OUTPUT_VALUE)
    return isinstance(output, str) and '"ok":false' in output.replace(" ", "")


def evaluation(span: SpanLike) -> tuple[Any, Any]:
    """``(score, label)`` of the span's first ``gen_ai.evaluation.result`` event with a score
    (label: the first with a label, event or attribute)."""
    score = label = None
    for event in span["events"]:
        if event["name"] == semconv.GEN_AI_EVALUATION_RESULT:
            ev = event["attributes"]
            if score is None:
                score = ev.get(semconv.GEN_AI_EVALUATION_SCORE_VALUE)
            if label is None:
                label = ev.get(semconv.GEN_AI_EVALUATION_SCORE_LABEL)
    if label is None:
        label = span["attributes"].get(semconv.GEN_AI_EVALUATION_SCORE_LABEL)
    return score, label


def exception_text(span: SpanLike) -> str | None:
    """The span's first exception (``type: message``), else its error status message."""
    for event in span["events"]:
        ev = event["attributes"]
        if _EXCEPTION_TYPE in ev or _EXCEPTION_MESSAGE in ev:
            return f"{ev.get(_EXCEPTION_TYPE, 'exception')}: {ev.get(_EXCEPTION_MESSAGE, '')}"
    if span["status"]["code"] == "ERROR":
        return span["status"]["message"] or f"{span['name']} failed"
    return None


def first_label(spans: Iterable[SpanLike]) -> str | None:
    """A trajectory's reward label: the first span's with one (:func:`evaluation`)."""
    for span in spans:
        if span["events"] or semconv.GEN_AI_EVALUATION_SCORE_LABEL in span["attributes"]:
            label = evaluation(span)[1]
            if label is not None:
                return str(label)
    return None


def first_exception_text(spans: Iterable[SpanLike]) -> str | None:
    """A trajectory's first error: the first span's with one (:func:`exception_text`)."""
    for span in spans:
        text = exception_text(span)
        if text is not None:
            return text
    return None


# --- what a span shows: its prompt and answer, as the viewer's table and search text read them --

#: characters of a text snippet by default
SNIPPET = 400


def snippet(text: Any, limit: int = SNIPPET) -> str:
    """``text`` (a JSON value is dumped) cut to ``limit`` characters, ``…`` marking the cut."""
    if text is None:
        return ""
    if not isinstance(text, str):
        try:
            text = json.dumps(text, ensure_ascii=False, default=str)
        except (RecursionError, ValueError):  # nested too deeply, an integer too long
            text = f"<{type(text).__name__} not shown>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def json_or_none(text: Any) -> Any:
    """A payload's JSON value, None when it is not JSON (or nested past the parser's limit)."""
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


#: brackets in a text past which :func:`_fast_json` leaves it to the stdlib: orjson reads 1,024
#: levels of nesting, the stdlib fewer (its recursion limit less the caller's depth), so a
#: text that may nest deeper gets the stdlib's answer (None when it cannot)
_FAST_BRACKETS = 512
#: the magnitude from which orjson's float may be an integer beyond 64 bits it rounded
_ROUNDED = float(2**63)


class _Inexact(Exception):  # noqa: N818 - a signal, not an error
    """A fast-decoded value's text would differ from the stdlib's: decode again with it."""


def _fast_json(text: Any) -> Any:
    """:func:`json_or_none` through orjson first (3-4x faster on payloads), the stdlib for
    what orjson refuses (NaN, an infinite number, lone surrogates, a BOM) and for texts that
    may nest deeper than the stdlib reads.

    The value equals the stdlib's but for one thing: an integer beyond 64 bits comes back as a
    float (orjson's reading) of magnitude >= 2**63. Its readers print leaves only through
    :func:`_exact_text`, which raises :class:`_Inexact` on such a float, and
    :func:`prompt_and_response` then decodes with the stdlib."""
    if not isinstance(text, str):
        return None
    if text.count("[") + text.count("{") > _FAST_BRACKETS:
        return json_or_none(text)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json_or_none(text)


def _maybe_rounded(value: Any) -> bool:
    """Whether ``value`` holds a float orjson may have made of a > 64-bit integer (a walk
    without recursion: a value nested as deep as the decoders read must not raise here)."""
    todo = [value]
    while todo:
        item = todo.pop()
        if item.__class__ is float:
            if not -_ROUNDED < item < _ROUNDED:
                return True
        elif isinstance(item, list):
            todo.extend(item)
        elif isinstance(item, dict):
            todo.extend(item.values())
    return False


def _exact_text(value: Any) -> str:
    """``str(value)`` of a :func:`_fast_json` leaf; :class:`_Inexact` where the stdlib's value
    could print otherwise."""
    if value.__class__ is str:
        return value
    if _maybe_rounded(value):
        raise _Inexact
    return str(value)


def _message_text(message: Any, text: Callable[[Any], str] = str) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts
        content = " ".join(text(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else text(content)


#: the special tokens a decoded answer ends with (ChatML's ``<|im_end|>``, Llama 3's
#: ``<|eot_id|>``, ``<|endoftext|>``, ``</s>``, Gemma's ``<end_of_turn>``), one or several, with
#: the white space after them
_TRAILING_SPECIAL = re.compile(
    r"(?:<\|[A-Za-z0-9_.:-]{1,40}\|>|</s>|<eos>|<end_of_turn>)"
    r"(?:\s*(?:<\|[A-Za-z0-9_.:-]{1,40}\|>|</s>|<eos>|<end_of_turn>))*\s*\Z")


def answer_text(text: str) -> str:
    """A decoded answer as the conversation shows it: without the special tokens it ends with.

    ``token2text`` decodes every token (``skip_special_tokens=False``, so the trace shows what the
    model produced), and its ``response_text`` ends with the end-of-turn token; the agent loop's
    messages (the trajectory page's conversation) were decoded without them. The trajectory
    table, the prompt-through-training page and the search text take the answer through here, as
    the conversation does, so they show the same words. Tokens inside the text are kept.
    """
    if not text.rstrip().endswith(">"):
        return text
    return _TRAILING_SPECIAL.sub("", text)


def prompt_and_response(span: dict[str, Any]) -> tuple[str | None, str | None]:
    """The user prompt and final answer a span's payloads show, when they show one.

    Inputs with verl's row keys (``raw_prompt``) or a ``messages`` list give the prompt; outputs
    with verl's ``extra_fields.messages`` (the whole conversation), token2text's
    ``response_text``, or GenAI ``gen_ai.input/output.messages`` give the answer.

    The payloads are decoded by orjson (:func:`_fast_json`); the answer is the stdlib decoder's
    (a value whose text could differ is decoded again by it).
    """
    try:
        return _prompt_and_response(span, _fast_json, _exact_text)
    except _Inexact:
        return _prompt_and_response(span, json_or_none, str)


def _prompt_and_response(span: dict[str, Any], loads: Callable[[Any], Any],
                         text: Callable[[Any], str]) -> tuple[str | None, str | None]:
    attributes = span["attributes"]
    prompt = response = None
    raw_in = attributes.get(semconv.INPUT_VALUE)
    if isinstance(raw_in, str) and ('"raw_prompt"' in raw_in or '"messages"' in raw_in
                                    or '"prompt"' in raw_in):
        value = loads(raw_in)
        if isinstance(value, dict):
            inner = value.get("kwargs")
            kwargs: dict[str, Any] = inner if isinstance(inner, dict) else value
            messages = kwargs.get("raw_prompt") or kwargs.get("messages")
            if isinstance(messages, list):
                users = [_message_text(m, text) for m in messages
                         if isinstance(m, dict) and m.get("role") == "user"]
                if users:
                    prompt = users[-1]
            elif isinstance(kwargs.get("prompt"), str):
                prompt = kwargs["prompt"]
    raw_out = attributes.get(semconv.OUTPUT_VALUE)
    if isinstance(raw_out, str) and ('"messages"' in raw_out or '"response_text"' in raw_out):
        value = loads(raw_out)
        if isinstance(value, dict):
            messages = (value.get("extra_fields") or {}).get("messages") if isinstance(
                value.get("extra_fields"), dict) else value.get("messages")
            if isinstance(messages, list):
                answers = [_message_text(m, text) for m in messages
                           if isinstance(m, dict) and m.get("role") == "assistant"]
                if answers:
                    response = answers[-1]
            if response is None and isinstance(value.get("response_text"), str):
                response = answer_text(value["response_text"])
    for key, is_input in ((semconv.GEN_AI_INPUT_MESSAGES, True),
                          (semconv.GEN_AI_OUTPUT_MESSAGES, False)):
        raw = attributes.get(key)
        if raw is None or (prompt if is_input else response) is not None:
            continue
        messages = loads(raw) if isinstance(raw, str) else raw
        if isinstance(messages, list):
            role = "user" if is_input else "assistant"
            texts = [_message_text(m, text) or _parts_text(m, text) for m in messages
                     if isinstance(m, dict) and m.get("role") == role]
            if texts:
                if is_input:
                    prompt = texts[-1]
                else:
                    response = texts[-1]
    return prompt, response


def _parts_text(message: dict[str, Any], text: Callable[[Any], str] = str) -> str:
    parts = message.get("parts")
    if isinstance(parts, list):
        return " ".join(text(p.get("content", "")) for p in parts if isinstance(p, dict))
    return ""


def reward_label(trajectory: Trajectory) -> str | None:
    """The trajectory's reward label (:func:`first_label`)."""
    return first_label(trajectory.spans)


def first_error(trajectory: Trajectory) -> str | None:
    """The first error's message: an exception event, else an error status
    (:func:`first_exception_text`)."""
    return first_exception_text(trajectory.spans)


# --- decoding a request without the decoder's own warning ---------------------------------------


class _QuietDecode(logging.Filter):
    """Drops the decoder's per-request "bad span(s)" warning in threads that count bad spans
    themselves (the viewer reports them per store); other threads' warnings pass."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        return threading.get_ident() not in self.threads or "bad span" not in str(record.msg)


_QUIET = _QuietDecode()
for _name in ("otel_verl", "otel_verl.store"):  # the decoder's logger (it moved once)
    logging.getLogger(_name).addFilter(_QUIET)


def decode_quietly(request: dict[str, Any]) -> list[dict[str, Any]]:
    """:func:`otel_verl.store.spans_from_otlp_json` without its per-request "bad span(s)"
    warning (the caller counts and reports bad spans itself)."""
    me = threading.get_ident()
    _QUIET.threads.add(me)
    try:
        return spans_from_otlp_json(request)
    finally:
        _QUIET.threads.discard(me)
