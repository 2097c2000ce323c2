"""One finished OTel span -> one complete Weave call (a plain dict, the wire shape).

The mapping (``docs/weave.md`` has the table):

* ``id`` = span id (16 hex), ``trace_id`` = trace id (32 hex), ``parent_id`` = parent span id.
  otel_verl's trajectory span (``otel_verl.trajectory``) is a call like any other span, so each
  trajectory is exactly one root call carrying every ``rollout.*`` attribute (the reward
  included), whatever the export batches. With ``keep_trajectory_spans=False`` (verl's own tree
  shape) it is dropped instead and its direct children become roots; ``rollout.*`` attributes
  only it has are copied onto them when both are in the same export batch.
* ``op_name`` = the span name as a plain string (what Weave's own OTel ingestion does), shortened
  to 128 chars with a hash suffix when longer. A trajectory span that names its agent loop op
  (``otel_verl.trajectory_op``: set by otel_verl when nothing but the ops described the
  trajectory, i.e. verl's drop-in API) takes that op's name, so a roots-only filter on
  ``ToolAgentLoop.run`` finds each trajectory once, as with verl's own weave backend; the span's
  own name stays under ``attributes.otel.span_name``.
* ``inputs`` / ``output`` from ``input.value`` / ``output.value``: text declared
  ``application/json`` by its ``*.mime_type`` is passed through as raw JSON (spliced into the
  request body, never parsed and re-encoded; see ``_encode``), other text is parsed when it is
  JSON; falling back to ``gen_ai.input.messages`` / ``gen_ai.output.messages``.
* ``attributes``: every ``rollout.X`` span attribute as ``X`` (verl's names), plus the rest of the
  span under ``attributes.otel`` (kind, scope, attributes, resource) unless disabled.
* ``summary.usage[model]`` from ``gen_ai.usage.*`` and ``summary.status_counts``
  ({success, error}); both are rolled up from children into their parent's summary when the
  parent is exported later by the same exporter, as the weave client does for nested calls (the
  server derives "descendant error" from it).
* ``exception`` from the last ``exception`` event (or the ERROR status description).
* ``thread_id`` = the trajectory (:func:`thread_key`: experiment, step, sample, rollout), on
  every call of it; ``turn_id`` = the call's own id on each LLM turn (the innermost model call:
  a ``chat`` span inside a ``generate`` op is the turn, not both), so Weave's Threads view reads
  a trajectory as a conversation.
* ``wb_run_step`` = ``rollout.step``; ``wb_run_id`` = the configured run (``WANDB_RUN_ID``, as
  handed to every process of a training run), else the wandb run active in this process.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import sys
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from otel_weave_exporter import _conventions as c
from otel_weave_exporter._content_objects import ContentCalls

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_ROLLUP_MAX = 100_000


_last_second: tuple[int, str] = (-1, "")


def iso_time(ns: int | None) -> str:
    """Nanoseconds since the epoch -> ISO 8601 UTC with microseconds (exact, no float).

    The formatted second is cached: spans of one batch mostly share it.
    """
    global _last_second
    sec, usec = divmod((ns or 0) // 1000, 1_000_000)
    cached = _last_second
    if cached[0] != sec:
        t = _EPOCH + datetime.timedelta(seconds=sec)
        cached = _last_second = (sec, t.strftime("%Y-%m-%dT%H:%M:%S"))
    return f"{cached[1]}.{usec:06d}Z"


def _parse_payload(value: Any) -> Any:
    """A payload attribute as Python: JSON text parsed, anything else kept as it is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, tuple):
        return list(value)
    return value


class RawJSON:
    """JSON text declared as such by its producer, to be spliced into the wire body as it is."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"RawJSON({self.text[:60]!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RawJSON) and other.text == self.text

    __hash__ = None  # type: ignore[assignment]


def _payload(value: Any, mime: Any, need_object: bool) -> Any:
    """The payload as RawJSON when its producer says it is JSON (and it has the needed shape),
    else parsed."""
    if mime == c.MIME_JSON and isinstance(value, str) and (not need_object or value[:1] == "{"):
        return RawJSON(value)
    return _parse_payload(value)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def shorten(name: str, limit: int) -> str:
    """``name`` cut to ``limit`` chars, with a 4-hex hash so different long names stay apart."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:4]
    return name[: limit - 6] + "…:" + digest  # 1-char ellipsis + ':' + 4 hex = 6 chars


def full_run_id(run_id: str, entity: str, project: str) -> str:
    """``entity/project/run`` as Weave stores ``wb_run_id`` (a bare run id is put in the
    exporter's project, as the weave client does)."""
    return run_id if run_id.count("/") == 2 else f"{entity}/{project}/{run_id.rsplit('/', 1)[-1]}"


def thread_key(attrs: Mapping[str, Any]) -> str | None:
    """The Weave ``thread_id`` of a span: its trajectory, named by otel_verl's ``rollout.*``
    identity (``exp/step=3/sample=7/n=0``, ``/validate`` for validation rollouts), which every
    span of a trajectory carries in any batch and any process; else the span's
    ``gen_ai.conversation.id``; else None."""
    step = attrs.get(c.ROLLOUT_STEP)
    sample = attrs.get(c.ROLLOUT_SAMPLE_INDEX)
    rollout_n = attrs.get(c.ROLLOUT_ROLLOUT_N)
    if step is None and sample is None and rollout_n is None:
        conv = attrs.get(c.GEN_AI_CONVERSATION_ID)
        return str(conv)[:256] if conv else None
    parts = [str(attrs.get(c.ROLLOUT_EXPERIMENT_NAME) or "")]
    for label, value in (("step", step), ("sample", sample), ("n", rollout_n)):
        if value is not None:
            parts.append(f"{label}={value}")
    if attrs.get(c.ROLLOUT_VALIDATE):
        parts.append("validate")
    return "/".join(parts)[:256]


def is_llm_span(attrs: Mapping[str, Any]) -> bool:
    """A model call: OpenInference kind LLM, or a GenAI ``chat``/completion operation."""
    return (
        attrs.get(c.OPENINFERENCE_SPAN_KIND) == c.OPENINFERENCE_KIND_LLM
        or attrs.get(c.GEN_AI_OPERATION_NAME) in c.GEN_AI_LLM_OPERATIONS
    )


class TurnTracker:
    """Which spans are LLM turns: model calls with no model call below them.

    Children end (and reach the exporter) before their parents, so when a span arrives we know
    whether a model call ran inside it. A ``chat`` span inside a ``generate`` op is the turn, not
    both. Bounded; not thread-safe (the exporter calls it under its lock).
    """

    def __init__(self, max_entries: int = _ROLLUP_MAX) -> None:
        self._llm_below: OrderedDict[int, None] = OrderedDict()
        self._max = max_entries

    def is_turn(self, span: ReadableSpan, attrs: Mapping[str, Any]) -> bool:
        below = False
        span_id = span.context.span_id
        if self._llm_below and span_id in self._llm_below:
            del self._llm_below[span_id]
            below = True
        llm = is_llm_span(attrs)
        parent = span.parent
        if (llm or below) and parent is not None and not parent.is_remote:
            self._llm_below[parent.span_id] = None
            if len(self._llm_below) > self._max:
                self._llm_below.popitem(last=False)
        return llm and not below


def current_wandb_run_id() -> str | None:
    """The id of the wandb run active in this process, without importing wandb."""
    wandb = sys.modules.get("wandb")
    if wandb is None:
        return None
    try:
        run = getattr(wandb, "run", None)
        run_id = getattr(run, "id", None) if run is not None else None
    except Exception:  # a half-torn-down wandb must not break export
        return None
    return str(run_id) if run_id else None


class Translator:
    """Stateful span -> call translation for one project.

    State: the usage rollup (children's token usage waiting for their parent), bounded.
    Not thread-safe: the exporter calls it under its lock.
    """

    def __init__(
        self,
        entity: str,
        project: str,
        *,
        keep_trajectory_spans: bool = True,
        include_otel_attributes: bool = True,
        summary_rollup: bool = True,
        threads: bool = True,
        wandb_run_id: str | None = None,
        content: ContentCalls | None = None,
    ) -> None:
        self.entity = entity
        #: otel_verl's delta-coded LLM inputs -> segments of Weave objects (None: as they are)
        self.content = content
        self.project = project
        self.project_id = f"{entity}/{project}"
        self.keep_trajectory_spans = keep_trajectory_spans
        self.include_otel_attributes = include_otel_attributes
        self.summary_rollup = summary_rollup
        self.threads = threads
        self.wandb_run_id = full_run_id(wandb_run_id, entity, project) if wandb_run_id else None
        self._turns = TurnTracker()
        # span id -> (usage by model, status counts) left by its finished children
        self._pending: OrderedDict[str, tuple[dict[str, dict[str, int]], dict[str, int]]] = (
            OrderedDict()
        )
        self._resource_cache: tuple[Any, dict[str, Any]] | None = None
        self._wb_run_id: str | None = None
        self._trajectory_extras: dict[int, dict[str, Any]] = {}

    def begin_batch(self, spans: Sequence[ReadableSpan] = ()) -> None:
        """Per-batch context, looked up once: the W&B run (configured, else active here), and
        in ``keep_trajectory_spans=False`` mode the ``rollout.*`` attributes of the trajectory
        spans in this batch (they are dropped, so what only they carry, e.g. ``rollout.reward``
        set after the run returned, goes onto their children)."""
        run_id = self.wandb_run_id
        if run_id is None:
            active = current_wandb_run_id()
            run_id = full_run_id(active, self.entity, self.project) if active else None
        self._wb_run_id = run_id
        self._trajectory_extras = {}
        if self.keep_trajectory_spans:
            return
        for span in spans:
            attrs = span.attributes
            if attrs and attrs.get(c.OTEL_VERL_TRAJECTORY):
                self._trajectory_extras[span.context.span_id] = {
                    k[len(c.ROLLOUT_PREFIX) :]: _plain(v)
                    for k, v in attrs.items()
                    if k.startswith(c.ROLLOUT_PREFIX)
                }

    # -- helpers ----------------------------------------------------------------------------------
    def _resource_dict(self, span: ReadableSpan) -> dict[str, Any]:
        res = span.resource
        cached = self._resource_cache
        if cached is not None and cached[0] is res:
            return cached[1]
        attrs = {
            k: _plain(v)
            for k, v in (res.attributes.items() if res is not None else ())
            if not k.startswith("telemetry.sdk.")
        }
        self._resource_cache = (res, attrs)
        return attrs

    def _take_rollup(self, span_id: str) -> tuple[dict[str, dict[str, int]], dict[str, int]] | None:
        return self._pending.pop(span_id, None) if self._pending else None

    def _give_rollup(
        self, parent_id: str, usage: Mapping[str, Mapping[str, int]], counts: Mapping[str, int]
    ) -> None:
        pending = self._pending.get(parent_id)
        if pending is None:
            pending = ({}, {"success": 0, "error": 0})
            self._pending[parent_id] = pending
            if len(self._pending) > _ROLLUP_MAX:
                self._pending.popitem(last=False)
        _merge_usage(pending[0], usage)
        for k, v in counts.items():
            pending[1][k] = pending[1].get(k, 0) + v

    def _content_inputs(self, inputs: Any, output: Any, attrs: Mapping[str, Any]) -> Any:
        """A delta-coded LLM call's inputs with its field as object segments (``_content_objects``).

        Parses the call's own payloads (O(what the call added): its delta and its response)."""
        assert self.content is not None
        parsed = _materialised(inputs)
        if not isinstance(parsed, dict):
            return inputs
        self.content.rewrite(parsed, _materialised(output), attrs)
        return parsed

    # -- the mapping ------------------------------------------------------------------------------
    def translate(self, span: ReadableSpan) -> dict[str, Any] | None:
        """The complete call for ``span``, or None when the span is dropped (trajectory span)."""
        ctx = span.context
        span_id = format(ctx.span_id, "016x")
        parent = span.parent
        parent_id = format(parent.span_id, "016x") if parent is not None else None
        attrs = dict(span.attributes) if span.attributes else {}

        if attrs.get(c.OTEL_VERL_TRAJECTORY) and not self.keep_trajectory_spans:
            self._take_rollup(span_id)  # nobody will show it: the trajectory has no call
            return None
        call_attrs: dict[str, Any] = {}
        # a trajectory's direct child: marked by otel_verl's ops, or (any other span) recognised
        # by its parent being a trajectory span of this batch
        extras = self._trajectory_extras.get(parent.span_id) if parent is not None else None
        if (extras is not None or attrs.get(c.OTEL_VERL_TRAJECTORY_CHILD)) and (
            not self.keep_trajectory_spans
        ):
            parent_id = None
            if extras:
                call_attrs.update(extras)  # the span's own values (below) take precedence
        raw_in = attrs.get(c.INPUT_VALUE)
        raw_out = attrs.get(c.OUTPUT_VALUE)
        inputs: Any = None
        output: Any = None
        if raw_in is not None:
            inputs = _payload(raw_in, attrs.get(c.INPUT_MIME_TYPE), True)
        if raw_out is not None:
            output = _payload(raw_out, attrs.get(c.OUTPUT_MIME_TYPE), False)
        in_tok = attrs.get(c.GEN_AI_USAGE_INPUT_TOKENS)
        out_tok = attrs.get(c.GEN_AI_USAGE_OUTPUT_TOKENS)
        model = attrs.get(c.GEN_AI_RESPONSE_MODEL) or attrs.get(c.GEN_AI_REQUEST_MODEL)
        display = attrs.get(c.WANDB_DISPLAY_NAME)
        rest: dict[str, Any] = {}
        plen = len(c.ROLLOUT_PREFIX)
        consumed = c.CONSUMED_KEYS
        for key, value in attrs.items():
            # tuples (OTel sequence values) serialise as JSON arrays as they are
            if key[:plen] == c.ROLLOUT_PREFIX:
                call_attrs[key[plen:]] = value
            elif key not in consumed:
                rest[key] = value

        if inputs is None and c.GEN_AI_INPUT_MESSAGES in attrs:  # moved, not copied
            inputs = {"messages": _parse_payload(rest.pop(c.GEN_AI_INPUT_MESSAGES))}
        if not isinstance(inputs, (dict, RawJSON)):
            inputs = {} if inputs is None else {"input": inputs}
        if self.content is not None and c.CONTENT_FIELD in attrs:
            inputs = self._content_inputs(inputs, output, attrs)
        if self.content is not None:
            # references into the content store (counted on the span; a trajectory span's copy
            # of its agent loop's payloads holds them too)
            refs = bool(attrs.get(c.CONTENT_REFS))
            if refs or _has_refs(inputs):
                inputs = self.content.resolve(_materialised(inputs))
            if refs or _has_refs(output):
                output = self.content.resolve(_materialised(output))
        if output is None and c.GEN_AI_OUTPUT_MESSAGES in attrs:
            output = {"messages": _parse_payload(rest.pop(c.GEN_AI_OUTPUT_MESSAGES))}

        if self.include_otel_attributes:
            call_attrs["otel"] = {
                "span_kind": span.kind.name,
                "scope": span.instrumentation_scope.name if span.instrumentation_scope else None,
                "attributes": rest,
                "resource": self._resource_dict(span),
            }

        # usage: own + what finished children left for us; then hand the total to our parent
        usage: dict[str, dict[str, int]] = {}
        if in_tok is not None or out_tok is not None:
            p, q = _count_of(in_tok), _count_of(out_tok)
            usage[str(model or "unknown")] = {
                "prompt_tokens": p,
                "completion_tokens": q,
                "total_tokens": p + q,
                "requests": 1,
            }
        exception = _exception_text(span)
        counts = {"success": 0 if exception else 1, "error": 1 if exception else 0}
        if self.summary_rollup:
            children = self._take_rollup(span_id)
            if children:
                _merge_usage(usage, children[0])
                counts["success"] += children[1]["success"]
                counts["error"] += children[1]["error"]
            if parent is not None and not parent.is_remote:
                # rolls up through a dropped trajectory span too: its children are roots then,
                # and the trajectory span itself takes (and discards) the total
                self._give_rollup(format(parent.span_id, "016x"), usage, counts)
        summary: dict[str, Any] = {"status_counts": counts}
        if usage:
            summary["usage"] = usage

        thread_id = turn_id = None
        if self.threads:
            thread_id = thread_key(attrs)
            if self._turns.is_turn(span, attrs) and thread_id is not None:
                turn_id = span_id

        name = span.name
        agent_op = attrs.get(c.OTEL_VERL_TRAJECTORY_OP) if attrs.get(c.OTEL_VERL_TRAJECTORY) \
            else None
        if isinstance(agent_op, str) and agent_op:  # the trajectory's root call
            if self.include_otel_attributes:
                call_attrs["otel"]["span_name"] = name
            name = agent_op  # named after its agent loop, as verl's root call is
        op_name = shorten(name, c.MAX_OP_NAME_CHARS)
        if display is None and op_name != name:
            display = name
        step = call_attrs.get("step")

        return {
            "project_id": self.project_id,
            "id": span_id,
            "trace_id": format(ctx.trace_id, "032x"),
            "parent_id": parent_id,
            "op_name": op_name,
            "display_name": shorten(str(display), c.MAX_DISPLAY_NAME_CHARS) if display else None,
            "started_at": iso_time(span.start_time),
            "ended_at": iso_time(span.end_time or span.start_time),
            "attributes": call_attrs,
            "inputs": inputs,
            "output": output,
            "summary": summary,
            "exception": exception,
            "thread_id": thread_id,
            "turn_id": turn_id,
            "wb_run_id": self._wb_run_id,
            "wb_run_step": step if isinstance(step, int) and not isinstance(step, bool) else None,
        }


def _has_refs(value: Any) -> bool:
    return isinstance(value, RawJSON) and '"$content"' in value.text


def _materialised(value: Any) -> Any:
    if isinstance(value, RawJSON):
        try:
            return json.loads(value.text)
        except ValueError:
            return value.text
    return value


def _count_of(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):  # a producer's odd value must not cost the whole call
        return 0


def _merge_usage(into: dict[str, dict[str, int]], other: Mapping[str, Mapping[str, int]]) -> None:
    for model, counts in other.items():
        mine = into.get(model)
        if mine is None:
            into[model] = dict(counts)
        else:
            for k, v in counts.items():
                mine[k] = mine.get(k, 0) + v


def _exception_text(span: ReadableSpan) -> str | None:
    """Weave's exception string (JSON with type/message) when the span failed, else None."""
    status = span.status
    failed = status.status_code is StatusCode.ERROR
    event_attrs = None
    for event in reversed(span.events or ()):
        if event.name == "exception":
            event_attrs = event.attributes or {}
            break
    if not failed and (event_attrs is None or status.status_code is StatusCode.OK):
        return None
    if event_attrs is not None:
        qualified = str(event_attrs.get("exception.type", "Exception"))
        doc = {
            # weave's clients write the class name; OTel records module.Class
            "type": qualified.rsplit(".", 1)[-1],
            "message": str(event_attrs.get("exception.message", "")),
        }
        stack = event_attrs.get("exception.stacktrace")
        if stack:
            doc["stacktrace"] = str(stack)
    else:
        doc = {"type": "Error", "message": status.description or ""}
    return json.dumps(doc, ensure_ascii=False)
