"""The typed span record the codec hands out (as Logfire's ``ReadableSpanDict``).

:func:`otel_verl._otlp_json.iter_spans` (and so :func:`otel_verl.store.read_spans`) yields plain
dicts of this shape; these ``TypedDict`` types name the keys and their value types so readers
(the query layer, the CLI, the viewer) are checked by mypy instead of indexing untyped dicts.
They are types only: nothing is converted at run time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypedDict

__all__ = ["LLM_OPERATIONS", "EventRecord", "LinkRecord", "ScopeRecord", "SpanLike", "SpanRecord",
           "StatusRecord", "evaluation", "exception_text", "first_exception_text", "first_label",
           "is_llm_span", "is_sampling_report", "is_tool_error", "is_tool_span",
           "is_trajectory_span"]

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


#: a decoded span, or the SQLite index's reduced copy of one (the same keys, fewer attributes):
#: what the predicates below read
SpanLike = SpanRecord | Mapping[str, Any]

# --- what a span means (the one place; the lake's columns, the SQLite index, the CLI and the ----
# --- viewer ask here; compaction's row builders inline the same tests, checked equal by ---------
# --- tests/unit/test_record_meaning.py) ----------------------------------------------------------

from otel_verl import semconv  # noqa: E402 - the types above stand alone

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
