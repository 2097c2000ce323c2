"""Running calls: a stuck op shows in Weave as a call started and not yet ended.

otel_verl (``live=true``) sends, for an op stuck past its threshold, one short span
``otel_verl.in_flight``: a child of the stuck op, carrying the op's identity
(``otel_verl.live.span_id``, ``.op``, ``.parent_span_id``, ``.start_ns``, ``.input``, the
trajectory's ``rollout.*``). The exporter turns it into a **call start** for the stuck op's own
call (id = the op's span id), not into a call of its own; when the op's span ends, its call is
**ended** (``call/end``) instead of being sent again as a complete call. Weave's own client does
the same for eager ops (``/v2/{entity}/{project}/call/start`` then ``.../call/end``).

Idempotent (the durable log sends at least once, a restart replays it), from what Weave's
servers do (weave 0.52.42, checked against its code; docs/weave.md "Running calls"):

* SQLite server: ``id`` is the calls table's primary key: a second start, or a complete call for
  an id that exists, raises (UNIQUE constraint); an end is an ``UPDATE ... WHERE id = ?``, so an
  end twice is harmless and an end for an id never started is lost without an error.
* ClickHouse server (hosted, ``calls_complete`` projects): a ``ReplacingMergeTree`` ordered by
  (project, started_at, id), newest row wins: a start twice, or a complete call after a start
  with the same ``started_at``, collapse to one call; an end is an UPDATE of the started row; a
  start *after* the complete call would replace it with a running one.

Hence the rules here: an end is sent only for an id whose start the server accepted in this
process (else the complete call is sent, as before); a start is not sent for an op whose span
already reached the exporter (in this batch, or ended earlier in this process); a start the
server answers with a conflict (409) is already done; a complete call answered with a conflict
(the id exists: started by an earlier process, or a replay of a delivered call) is sent as the
end of that id instead (``_deliver``).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

from opentelemetry.sdk.trace import ReadableSpan

from otel_weave_exporter import _conventions as c
from otel_weave_exporter._translate import (
    RawJSON,
    Translator,
    _has_refs,
    _materialised,
    _payload,
    iso_time,
    shorten,
    thread_key,
)

# otel_verl's keys (otel_verl/semconv.py; the exporter does not import otel_verl)
IN_FLIGHT_SPAN: Final = "otel_verl.in_flight"
LIVE_PREFIX: Final = "otel_verl.live."
LIVE_OP: Final = "otel_verl.live.op"
LIVE_SPAN_ID: Final = "otel_verl.live.span_id"
LIVE_PARENT_SPAN_ID: Final = "otel_verl.live.parent_span_id"
LIVE_START_NS: Final = "otel_verl.live.start_ns"
LIVE_INPUT: Final = "otel_verl.live.input"
LIVE_INPUT_MIME_TYPE: Final = "otel_verl.live.input_mime_type"
LIVE_TRAJECTORY_CHILD: Final = "otel_verl.live.trajectory_child"
LIVE_CONTENT: Final = "otel_verl.live.content"

#: ids remembered per registry (started / ended), oldest forgotten first
MAX_REMEMBERED: Final = 100_000
_HEX = frozenset("0123456789abcdef")


def _span_hex(value: Any, width: int) -> str | None:
    if isinstance(value, str) and len(value) == width and set(value) <= _HEX and value.strip("0"):
        return value
    return None


def in_flight_op_id(span: ReadableSpan) -> str | None:
    """The stuck op's span id (16 hex) when ``span`` is otel_verl's in-flight record, else None."""
    if span.name != IN_FLIGHT_SPAN or not span.attributes:
        return None
    return _span_hex(span.attributes.get(LIVE_SPAN_ID), 16)


def start_call(tr: Translator, span: ReadableSpan, op_id: str) -> dict[str, Any]:
    """The call start (``StartedCallSchemaForInsert``) of the stuck op an in-flight span names.

    What a start holds stays (Weave's servers update only the end fields at the end): the op's
    name, parent, start, input and the trajectory's attributes; the op's other attributes come
    with its complete call only where the server replaces the row (ClickHouse)."""
    attrs: Mapping[str, Any] = span.attributes or {}
    parent_id = _span_hex(attrs.get(LIVE_PARENT_SPAN_ID), 16)
    if attrs.get(LIVE_TRAJECTORY_CHILD) and not tr.keep_trajectory_spans:
        parent_id = None  # its trajectory span is no call then: a root, as its complete call
    start_ns = attrs.get(LIVE_START_NS)
    if not isinstance(start_ns, int) or isinstance(start_ns, bool) or start_ns <= 0:
        start_ns = span.start_time
    name = str(attrs.get(LIVE_OP) or "op")
    op_name = shorten(name, c.MAX_OP_NAME_CHARS)
    plen = len(c.ROLLOUT_PREFIX)
    call_attrs: dict[str, Any] = {
        k[plen:]: list(v) if isinstance(v, tuple) else v
        for k, v in attrs.items() if k.startswith(c.ROLLOUT_PREFIX)
    }
    if tr.include_otel_attributes:
        call_attrs["otel"] = {
            "started_by": IN_FLIGHT_SPAN,  # the op was stuck when Weave first saw it
            "live": {k[len(LIVE_PREFIX):]: v for k, v in attrs.items()
                     if k.startswith(LIVE_PREFIX) and k not in (LIVE_INPUT, LIVE_INPUT_MIME_TYPE)},
            "resource": tr._resource_dict(span),
        }
    raw_in = attrs.get(LIVE_INPUT)
    inputs: Any = _payload(raw_in, attrs.get(LIVE_INPUT_MIME_TYPE), True) if raw_in is not None \
        else None
    if not isinstance(inputs, (dict, RawJSON)):
        inputs = {} if inputs is None else {"input": inputs}
    inputs = _content(tr, inputs, attrs.get(LIVE_CONTENT))
    step = call_attrs.get("step")
    thread_id = thread_key(attrs) if tr.threads else None
    return {
        "project_id": tr.project_id,
        "id": op_id,
        "trace_id": format(span.context.trace_id, "032x"),
        "parent_id": parent_id,
        "op_name": op_name,
        "display_name": shorten(name, c.MAX_DISPLAY_NAME_CHARS) if op_name != name else None,
        "started_at": iso_time(start_ns),
        "attributes": call_attrs,
        "inputs": inputs,
        "thread_id": thread_id,
        "turn_id": None,
        "wb_run_id": tr._wb_run_id,
        "wb_run_step": step if isinstance(step, int) and not isinstance(step, bool) else None,
    }


def _content(tr: Translator, inputs: Any, content_json: Any) -> Any:
    """A delta-coded input read as the op's own span is (``Translator.translate``): its field
    as content object segments, references resolved; as it is when that cannot be done."""
    if tr.content is None or not isinstance(content_json, str):
        return inputs
    try:
        content_attrs = json.loads(content_json)
        if not isinstance(content_attrs, dict):
            return inputs
        out = inputs
        if c.CONTENT_FIELD in content_attrs:
            out = tr._content_inputs(out, None, content_attrs)
        if content_attrs.get(c.CONTENT_REFS) or _has_refs(out):
            out = tr.content.resolve(_materialised(out))
        return out
    except Exception:  # a producer's odd value: the input as it came
        return inputs


_END_FIELDS = ("project_id", "id", "ended_at", "started_at", "exception", "output", "summary")


def end_of(call: Mapping[str, Any]) -> dict[str, Any]:
    """The end (``EndedCallSchemaForInsert``) of a complete call: what the server updates."""
    end = {k: call.get(k) for k in _END_FIELDS}
    end["wb_run_step_end"] = call.get("wb_run_step")
    return end


def end_of_encoded(part: bytes) -> bytes:
    """The end body (``{"end": ...}``) of an encoded complete call (a rare path: a conflict)."""
    call = json.loads(part)
    return body("end", json.dumps(end_of(call), ensure_ascii=False,
                                  separators=(",", ":")).encode("utf-8", "surrogatepass"))


def body(kind: str, encoded: bytes) -> bytes:
    """``{"start": ...}`` / ``{"end": ...}``: the v2 eager request bodies."""
    return b'{"' + kind.encode() + b'":' + encoded + b"}"


def eager_path(complete_path: str, kind: str) -> str:
    """``/v2/{entity}/{project}/call/start`` (or ``/end``) next to ``.../calls/complete``."""
    return complete_path.rsplit("/calls/complete", 1)[0] + f"/call/{kind}"


class RunningCalls:
    """Which call ids this process started (server accepted) and ended. Bounded; the exporter
    uses it under its lock."""

    def __init__(self, max_ids: int = MAX_REMEMBERED) -> None:
        self._started: OrderedDict[str, None] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._max = max_ids
        #: starts the server accepted; of those, answered "already there" (409); ends accepted;
        #: in-flight spans that needed no start (their op had ended, or was started already)
        self.stats = {"started": 0, "start_conflicts": 0, "ended": 0, "starts_skipped": 0}

    @staticmethod
    def _add(table: OrderedDict[str, None], call_id: str, limit: int) -> None:
        table[call_id] = None
        table.move_to_end(call_id)
        if len(table) > limit:
            table.popitem(last=False)

    def is_started(self, call_id: str) -> bool:
        return call_id in self._started

    def is_ended(self, call_id: str) -> bool:
        return call_id in self._ended

    def started(self, call_id: str) -> None:
        self._add(self._started, call_id, self._max)

    def ended(self, call_id: str) -> None:
        self._add(self._ended, call_id, self._max)
