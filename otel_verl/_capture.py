"""Content capture: what a span records of the data it saw (payloads, exceptions, token text).

Every value that rollout code hands to a span goes through here: serialised without raising,
capped per field and per span (``max_field_bytes``, ``max_span_bytes``), redacted when
``redact`` is on, and skipped entirely when ``capture_payloads`` is off.

Usage::

    set_payload(span, input=request, output=answer)   # input.value / output.value
    span.set_attribute(key, payload_json(arguments))  # the same rules for another attribute
    span.set_attribute(key, scrub_text(message))      # free text
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.trace import Span, Status, StatusCode

from otel_verl import _content, _errors, _payload, semconv
from otel_verl._fork import register_after_in_child
from otel_verl._hotpath import attribute_map, clean_attributes, merge_clean
from otel_verl._payload import TRUNCATION_MARK, fast_json, redact_text, to_payload, walk_payload
from otel_verl._state import STATE, TRAJECTORY, Runtime

#: "argument not given" (``None`` is a value worth recording)
UNSET: Any = object()


def scrub_text(text: str, max_chars: int | None = None) -> str:
    """Redact key-like values (when redaction is on) and cap a free-text attribute value.

    For attributes outside ``input.value``/``output.value`` (tool arguments and results, error
    messages): the same rules, applied to plain text.
    """
    config = STATE.config
    if config.redact:
        text = redact_text(text)
    limit = max_chars if max_chars is not None else config.max_field_bytes
    if len(text) > limit:
        text = text[:limit] + TRUNCATION_MARK.format(n=len(text) - limit)
    return text


def cap_text(text: str, max_chars: int | None = None) -> str:
    """A free-text attribute value capped as ``scrub_text`` caps it, in O(cap) whatever its
    length, and left to the export thread's scrubber for its secrets (``redact``: every
    attribute of every span passes it there, before anything is written or sent). For text
    that can be context-long (a trajectory's question at 128k tokens: ~0.3 ms to scan on the
    event loop, and again at export). The cut never leaves part of a secret-shaped run, which
    the scrubber could no longer recognise (``_payload._cut_point``).

    With a custom span ``transform`` in place of the scrubber, that transform redacts.
    """
    limit = max_chars if max_chars is not None else STATE.config.max_field_bytes
    if len(text) > limit:
        cut = _payload._cut_point(text, limit)
        text = text[:cut] + TRUNCATION_MARK.format(n=len(text) - cut)
    return text


def payload_json(value: Any) -> str:
    """``value`` as capped, redacted JSON text (never raises), for attributes such as
    ``gen_ai.tool.call.arguments``; the rules of ``input.value``."""
    config = STATE.config
    return to_payload(value, max_bytes=config.max_field_bytes, redact=config.redact).json


def set_payload(span: Span, *, input: Any = UNSET, output: Any = UNSET) -> None:
    """Serialise (never raises), cap, redact and set ``input.value``/``output.value`` on a span."""
    runtime = STATE.runtime
    if runtime is None or not runtime.config.capture_payloads or not span.is_recording():
        return
    try:
        existing = attribute_map(span)  # input and output arrive separately (read, no copy)
        chained = output is not UNSET and semconv.CONTENT_FIELD in existing
        first = None
        if chained and _long_response(runtime, output):
            # the response joins the chain first, so the output's reference points at its
            # node: not a second node of its own (the same tokens stored twice, hashed again)
            first = content_outputs(span, output)
        attrs = payload_attrs(runtime, input, output, existing)
        if chained:
            attrs.update(first if first is not None else content_outputs(span, output))
        merge_clean(span, clean_attributes(attrs))  # validated once, one insert (``_hotpath``)
    except Exception as exc:
        _errors.internal_error(exc, "set_payload")


def payload_attrs(runtime: Runtime, input: Any, output: Any,
                  existing: Mapping[str, Any], lazy: bool = False,
                  pending: PendingRefs | None = None) -> dict[str, Any]:
    """The ``input.value``/``output.value`` attributes (and their markers) for one span.

    ``lazy``: the caller calls ``settle_inputs`` on the span when its call ends, before the
    call's caller goes on (``_OpCall``): the prompt's O(context) work is left to the content
    thread (``content_inputs``); with ``pending`` too, a dataset prompt's hash
    (``content_refs``, then ``settle_refs``)."""
    attrs, fields = _prepare(runtime, input, output, existing, lazy, pending)
    attrs.update(_render(runtime.config, fields, existing))
    return attrs


def _prepare(runtime: Runtime, input: Any, output: Any, existing: Mapping[str, Any],
             lazy: bool = False, pending: PendingRefs | None = None
             ) -> tuple[dict[str, Any], list[tuple[str, str, Any]]]:
    """What must happen on the calling thread, in call order: the per-turn content (a prompt
    recorded as what it adds, references into the content store); and the fields left to
    render, as (key, mime key, value)."""
    attrs: dict[str, Any] = {}
    coded_field = None
    options = _options(runtime.config)
    if type(input) is dict and options.dedup:  # an op's bound inputs: a prompt is recorded as
        coded = content_inputs(runtime, input, options, lazy)  # what it adds
        if coded is not None:
            input, content_attrs = coded
            attrs.update(content_attrs)
            coded_field = content_attrs[semconv.CONTENT_FIELD]
    refs = 0
    fields: list[tuple[str, str, Any]] = []
    if input is not UNSET:
        input, refs = content_refs(runtime, input, coded_field, options, pending)
        fields.append((semconv.INPUT_VALUE, semconv.INPUT_MIME_TYPE, input))
    if output is not UNSET:
        # a chained call's short response is not in the chain yet (``content_outputs`` comes
        # after) and is kept inline: no search for it (a long one joined the chain first)
        skip = _short_response_key(runtime, output) if semconv.CONTENT_FIELD in existing \
            else None
        output, found = content_refs(runtime, output, skip, options)
        refs += found
        fields.append((semconv.OUTPUT_VALUE, semconv.OUTPUT_MIME_TYPE, output))
    if refs:
        attrs[semconv.CONTENT_REFS] = existing.get(semconv.CONTENT_REFS, 0) + refs
    return attrs, fields


def _render(config: Any, fields: list[tuple[str, str, Any]],
            existing: Mapping[str, Any]) -> dict[str, Any]:
    """The rendered fields (capped, key-redacted JSON) and their markers, after ``existing``."""
    budget = config.max_span_bytes - len(existing.get(semconv.INPUT_VALUE, ""))
    max_field, redact = config.max_field_bytes, config.redact
    attrs: dict[str, Any] = {}
    truncated: list[str] = []
    redacted = 0
    errors: list[str] = []
    for key, mime, value in fields:
        limit = min(max_field, max(256, budget))
        text = fast_json(value, limit, redact)  # a small plain value: nothing cut or noted
        if text is None:
            payload = walk_payload(value, limit, redact)
            text = payload.json
            if payload.truncated:
                truncated.append(key)
            redacted += payload.redacted
            if payload.error:
                errors.append(payload.error)
        budget -= len(text)
        attrs[key] = text
        attrs[mime] = semconv.MIME_JSON
    if truncated:
        attrs[semconv.OTEL_VERL_TRUNCATED] = [*existing.get(semconv.OTEL_VERL_TRUNCATED, ()),
                                              *truncated]
    if redacted:
        attrs[semconv.OTEL_VERL_REDACTED] = existing.get(semconv.OTEL_VERL_REDACTED, 0) + redacted
    if errors:
        previous = existing.get(semconv.OTEL_VERL_PAYLOAD_ERROR)
        if previous:
            errors.insert(0, str(previous))
        attrs[semconv.OTEL_VERL_PAYLOAD_ERROR] = "; ".join(errors)[:1000]
    return attrs


# per-turn content: a prompt recorded as what it adds to the trajectory's previous call -------

#: input keys that carry a whole prompt, and their content kind
CONTENT_FIELDS = (("prompt_ids", _content.KIND_TOKENS), ("messages", _content.KIND_MESSAGES))
#: output keys that carry a call's response tokens
RESPONSE_FIELDS = ("token_ids", "response_ids")


class ContentOptions:
    """The content options of a configuration (read once per call from the frozen config)."""

    __slots__ = ("dedup", "inline_bytes", "store_bytes")

    def __init__(self, config: Any) -> None:
        self.dedup = bool(getattr(config, "content_dedup", True))
        self.inline_bytes = int(getattr(config, "content_inline_bytes", 4096))
        self.store_bytes = int(getattr(config, "content_store_bytes", 1 << 30))


#: (config, its options, its store or None): read once per configuration, not per call (the
#: config is frozen; a new ``init`` is a new config object). One tuple, replaced whole, so a
#: thread never pairs one config with another's store.
_CACHED: tuple[Any, ContentOptions | None, _content.ContentStore | None] = (None, None, None)


def _options(config: Any) -> ContentOptions:
    global _CACHED
    cached = _CACHED
    if cached[0] is config and cached[1] is not None:
        return cached[1]
    options = ContentOptions(config)
    _CACHED = (config, options, None)
    return options


def content_store(runtime: Runtime) -> _content.ContentStore:
    global _CACHED
    config = runtime.config
    cached = _CACHED
    store = cached[2] if cached[0] is config else None
    if store is not None and not store.retired:
        return store
    options = _options(config)
    store = _content.store_for(config.trace_dir, options.store_bytes, config.redact)
    _CACHED = (config, options, store)
    return store


def content_inputs(runtime: Runtime, inputs: dict[str, Any],
                   options: ContentOptions | None = None, lazy: bool = False
                   ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``inputs`` with its prompt field replaced by what this call appends to the trajectory's
    previous call, plus the reference attributes (``otel_verl.content.*``); None when nothing
    is delta-coded (no prompt field, ``content_dedup`` off, content that cannot be encoded).

    Work on the calling thread: one C-level prefix comparison, then O(what the call appended)
    (slice, encode, hash); the store write happens on the store's thread. ``lazy`` (inside a
    trajectory, for a caller that calls ``settle_inputs`` when the call ends): not even the
    comparison, nor the copy of a whole prompt (``DeltaChain.begin(lazy=True)``).
    """
    if options is None:
        options = _options(runtime.config)
    if not options.dedup:
        return None
    found: tuple[str, str, Sequence[Any]] | None = None
    for name, what in CONTENT_FIELDS:
        candidate = inputs.get(name)
        if (type(candidate) is list or type(candidate) is tuple) and candidate:
            found = name, what, candidate
            break
    if found is None:
        return None
    field, kind, value = found
    traj = TRAJECTORY.get()
    holder: dict[str, Any] = traj.content if traj is not None else {}
    chain = _content.chains_of(holder, field, kind)
    # a whole long prompt is hashed off the loop (its id goes on the span at its end, found
    # through the trajectory: outside one, it is hashed here)
    step = chain.begin(value, defer_over=options.inline_bytes // 2 if traj is not None else 0,
                       lazy=lazy and traj is not None)
    if step is None:
        return None
    if step.pending:
        return _pending_inputs(runtime, options, inputs, field, kind, step, traj, holder)
    if type(step) is _content.ExtendStep:  # its prefix is compared off the loop; the call's
        step.inputs = inputs  # end settles it (``settle_inputs``)
        holder[_EXTEND + step.id] = step
        _content.defer(step)
    return _step_inputs(runtime, options, inputs, field, kind, step, traj, holder)


def _step_inputs(runtime: Runtime, options: ContentOptions, inputs: dict[str, Any], field: str,
                 kind: str, step: Any, traj: Any, holder: dict[str, Any]
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``content_inputs`` for a step whose id is known: the node stored, the attributes."""
    stored = content_store(runtime).put(kind, step)
    inline = len(step.delta_bytes) <= options.inline_bytes
    attrs: dict[str, Any] = {
        semconv.CONTENT_ID: step.id, semconv.CONTENT_LEN: step.length,
        semconv.CONTENT_KIND: kind, semconv.CONTENT_FIELD: field,
        semconv.CONTENT_DELTA_LEN: len(step.delta), semconv.CONTENT_INLINE: inline,
        semconv.CONTENT_STORED: stored,
    }
    if step.base_id is not None:
        attrs[semconv.CONTENT_BASE_ID] = step.base_id
        attrs[semconv.CONTENT_BASE_LEN] = step.base_len
        if step.base_span_id is not None:
            attrs[semconv.CONTENT_BASE_SPAN_ID] = step.base_span_id
    elif traj is not None and traj.span is not None and not holder.get("_prompt_id_set"):
        holder["_prompt_id_set"] = True  # the trajectory's prompt, once, on its root
        try:
            traj.span.set_attribute(semconv.CONTENT_PROMPT_ID, step.id)
        except Exception as exc:  # noqa: BLE001
            _errors.internal_error(exc, "content prompt id")
    shown = dict(inputs)
    # token ids are rendered from the bytes their hash was computed over (``TokenJSON``)
    shown[field] = _preview(kind, step, None if inline else options.inline_bytes)
    return shown, attrs


#: the key (in the trajectory's content dict) of a field's whole prompt hashed off the loop
_PENDING = "_pending:"
#: the key (in the trajectory's content dict) of a field's extension whose prefix is compared
#: off the loop (``_content.ExtendStep``)
_EXTEND = "_extend:"


def _pending_inputs(runtime: Runtime, options: ContentOptions, inputs: dict[str, Any],
                    field: str, kind: str, step: Any, traj: Any, holder: dict[str, Any]
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``content_inputs`` for a whole prompt whose id is computed off the loop: the span
    starts with its length and kind; ``settle_content`` adds the id and whether it is stored
    when the call ends (the content thread has hashed and stored it by then, as a rule)."""
    if traj is not None and traj.span is not None and not holder.get("_prompt_id_set"):
        holder["_prompt_id_set"] = True
        step.root_span = traj.span  # the trajectory's prompt, once, on its root
    holder[_PENDING + field] = step
    _content.defer(step, content_store(runtime).bound())  # held with its trajectory (tail)
    attrs: dict[str, Any] = {
        semconv.CONTENT_LEN: step.length, semconv.CONTENT_KIND: kind,
        semconv.CONTENT_FIELD: field, semconv.CONTENT_DELTA_LEN: step.length,
        semconv.CONTENT_INLINE: False,
    }
    shown = dict(inputs)
    shown[field] = _payload.token_json(step.delta, step.head_bytes, options.inline_bytes) \
        if kind == _content.KIND_TOKENS else step.delta[:0]
    return shown, attrs


def settle_content(span: Span, attrs_now: Mapping[str, Any]) -> dict[str, Any]:
    """At the end of a call whose whole prompt was hashed off the loop: its id and
    ``stored`` (set on the trajectory's root too, once). ``{}`` for any other call."""
    if semconv.CONTENT_ID in attrs_now:
        return {}
    field = attrs_now.get(semconv.CONTENT_FIELD)
    traj = TRAJECTORY.get()
    if traj is None or type(field) is not str:
        return {}
    key = _PENDING + field
    step = traj.content.get(key)
    if step is None or step.length != attrs_now.get(semconv.CONTENT_LEN):
        return {}
    del traj.content[key]
    if not step.resolve():
        return {semconv.CONTENT_STORED: "missing"}
    root = step.root_span
    if root is not None:
        step.root_span = None
        try:
            root.set_attribute(semconv.CONTENT_PROMPT_ID, step.id)
        except Exception as exc:  # noqa: BLE001
            _errors.internal_error(exc, "content prompt id")
    return {semconv.CONTENT_ID: step.id, semconv.CONTENT_STORED: step.stored or "missing"}


def settle_inputs(span: Span) -> None:
    """At the end (or failure) of a call whose inputs were captured ``lazy``: its prompt's
    work left to the content thread is settled before the call's caller goes on (and may
    change the list): a whole prompt's id (``settle_content``); an extension's prefix check
    (``ExtendStep``), and where it failed (a prompt edited in place), the call recorded again
    as it was sent: content attributes and ``input.value``. O(1) when nothing is pending (the
    content thread did the work meanwhile, as a rule). Never raises."""
    try:
        attrs_now = attribute_map(span)
        field = attrs_now.get(semconv.CONTENT_FIELD)
        if type(field) is not str:
            return
        traj = TRAJECTORY.get()
        if traj is None or not traj.content:
            return
        content_id = attrs_now.get(semconv.CONTENT_ID)
        if content_id is None:  # a whole prompt hashed off the loop: its id, now
            settled = settle_content(span, attrs_now)
            if settled:
                merge_clean(span, clean_attributes(settled))
            return
        ext = traj.content.pop(_EXTEND + content_id, None) if type(content_id) is str else None
        if ext is not None and not ext.check():
            _redo_inputs(span, ext, field, traj)
    except Exception as exc:  # noqa: BLE001 - the call's result stands
        _errors.internal_error(exc, "settling a prompt")


#: the content attributes of a prompt step (what a call recorded again replaces)
_STEP_KEYS = (semconv.CONTENT_ID, semconv.CONTENT_LEN, semconv.CONTENT_KIND,
              semconv.CONTENT_FIELD, semconv.CONTENT_DELTA_LEN, semconv.CONTENT_INLINE,
              semconv.CONTENT_STORED, semconv.CONTENT_BASE_ID, semconv.CONTENT_BASE_LEN,
              semconv.CONTENT_BASE_SPAN_ID)


def _redo_inputs(span: Span, ext: Any, field: str, traj: Any) -> None:
    """A call recorded as an extension whose prefix turned out edited: recorded again, on this
    thread (the rare path), as ``content_inputs`` records a prompt that extends nothing."""
    runtime = STATE.runtime
    chain = traj.content.get(field)
    inputs = ext.inputs
    ext.inputs = None
    if runtime is None or type(chain) is not _content.DeltaChain or type(inputs) is not dict:
        merge_clean(span, {semconv.CONTENT_STORED: "missing"})
        return
    options = _options(runtime.config)
    kind = chain.kind
    sent = ext.source
    step = chain.redo(ext)
    attrs: dict[str, Any]
    if step is None:  # not encodable: the prompt as it is, capped (as without content_dedup)
        attrs, shown, coded_field = {}, dict(inputs), None
        if sent is not None:
            shown[field] = sent[: ext.length]
    else:
        if step.pending:  # (``begin`` without ``defer_over``: computed at once, as a rule)
            step.resolve()
        shown, attrs = _step_inputs(runtime, options, inputs, field, kind, step, traj,
                                    traj.content)
        coded_field = field
    value, refs = content_refs(runtime, shown, coded_field, options)
    existing = attribute_map(span)
    if refs:
        attrs[semconv.CONTENT_REFS] = refs
    attrs.update(_render(runtime.config, [(semconv.INPUT_VALUE, semconv.INPUT_MIME_TYPE, value)],
                         {}))
    _drop_attributes(span, [key for key in _STEP_KEYS if key in existing and key not in attrs])
    merge_clean(span, clean_attributes(attrs))


def _drop_attributes(span: Span, keys: list[str]) -> None:
    """Remove attributes from a started span (the SDK has no API for it: its attribute dict,
    under the span's lock, where its shape is the known one; else the keys are left as they
    are and the span says its content is missing, so no reader rebuilds from them)."""
    if not keys:
        return
    bounded = getattr(span, "_attributes", None)
    lock = getattr(span, "_lock", None)
    store = attribute_map(span)
    if lock is not None and type(store) is dict and store is getattr(bounded, "_dict", None):
        with lock:
            for key in keys:
                store.pop(key, None)
        return
    merge_clean(span, {semconv.CONTENT_STORED: "missing"})


#: a list shorter than this is never replaced by a reference (it costs less than one)
REF_MIN_ITEMS = 64
#: the id a reference names while its content is hashed off the loop (``settle_refs`` puts the
#: content id in its place before the span ends; never a content id, so no reader could take
#: it for one)
PLACEHOLDER_PREFIX = "msg:pending:"
_PLACEHOLDERS = itertools.count(1)


class PendingRefs:
    """The references of one lazy call's inputs whose content is hashed off the loop (a dataset
    prompt). Each entry: the placeholder, the step, whether this call deferred the step (else
    it is another call's, put in the store for this one when it settles), and the list itself
    (what the input shows in the reference's place where the step cannot be stored). Nothing
    else of the inputs is kept: they may be let go of while the call runs (a trajectory's
    agent loop op runs as long as the trajectory)."""

    __slots__ = ("refs",)

    def __init__(self) -> None:
        self.refs: list[tuple[str, _content.Step, bool, list[Any]]] = []


#: the placeholders of the calls in flight, by their span's id: what a reader outside the call
#: (the live thread's in-flight span of a stuck op, ``live_input``) names them by meanwhile.
#: Set when a lazy call with placeholders starts (``track_refs``), removed when it settles.
_IN_FLIGHT_REFS: dict[int, PendingRefs] = {}
# a forked child has none of the parent's calls in flight (nor would it settle them)
register_after_in_child(_IN_FLIGHT_REFS.clear, "the references of calls in flight")


def track_refs(span: Span, pending: PendingRefs) -> None:
    """Remember ``pending`` for ``live_input`` until the call settles (``settle_refs``)."""
    _IN_FLIGHT_REFS[span.get_span_context().span_id] = pending


def live_input(span_id: int, text: str) -> str | None:
    """``input.value`` of a call in flight (``text``, read from its span) as a reader outside
    the call shows it: each placeholder named by its content id, once hashed and stored (by the
    content thread, as a rule; else here, on the reader's thread). None where one cannot be (its
    content not stored, the call settled meanwhile): never a placeholder, never a dead link.
    Never raises."""
    if PLACEHOLDER_PREFIX not in text:
        return text
    pending = _IN_FLIGHT_REFS.get(span_id)
    runtime = STATE.runtime
    if pending is None or runtime is None:
        return None
    try:
        for placeholder, step, fresh, _items in tuple(pending.refs):
            quoted = f'"{placeholder}"'
            if quoted not in text:
                continue
            if not _stored_for_call(step, fresh, content_store(runtime)):
                return None
            text = text.replace(quoted, f'"{step.id}"', 1)
    except Exception as exc:  # noqa: BLE001 - the live record goes without the input
        _errors.internal_error(exc, "naming a reference in flight")
        return None
    return None if PLACEHOLDER_PREFIX in text else text


def _stored_for_call(step: _content.Step, fresh: bool, store: Any) -> bool:
    """``step`` (a placeholder's) hashed and in the store for this call: as the call that
    deferred it stored it (``fresh``), else put now (another call's step, a GRPO group's
    prompt: the call that stored it may be dropped by tail sampling; or stored by nobody)."""
    if not step.resolve():
        return False
    put = getattr(step, "stored", None) if fresh else None
    if put is None:
        put = store.put(_content.KIND_MESSAGES, step)
    return put == "stored"


def settle_refs(span: Span, pending: PendingRefs, outcome: Any = None) -> None:
    """At the end (or failure) of a call whose inputs named placeholders (``content_refs`` with
    ``pending``): each content id in its placeholder's place in ``input.value`` (and in the
    trajectory's first input, ``outcome``), before the call's caller goes on. O(1) per step when
    the content thread has hashed it (as a rule) plus one pass over ``input.value``. Where a
    step cannot be stored (content that is not JSON, a store over its budget), the input is
    recorded again as without deferring: the list stays in it, capped, never a dead link.
    Never raises."""
    try:
        _IN_FLIGHT_REFS.pop(span.get_span_context().span_id, None)
        runtime = STATE.runtime
        if runtime is None:
            return
        store = content_store(runtime)
        ids: dict[str, str] = {}
        inline: dict[str, list[Any]] = {}
        for placeholder, step, fresh, items in pending.refs:
            if _stored_for_call(step, fresh, store):
                ids[placeholder] = str(step.id)
            else:
                inline[placeholder] = items
        attrs_now = attribute_map(span)
        text = attrs_now.get(semconv.INPUT_VALUE)
        if type(text) is not str:
            return
        # (a call recorded again meanwhile, ``settle_inputs``, named its references already)
        inline = {key: items for key, items in inline.items() if key in text}
        attrs: dict[str, Any]
        if not inline:
            new = text
            for placeholder, content_id in ids.items():
                new = new.replace(f'"{placeholder}"', f'"{content_id}"', 1)
            attrs = {semconv.INPUT_VALUE: new}
        else:  # the rare path: the list itself in its reference's place, rendered again
            value = _payload.loads_json(text)
            value = _swap_placeholders(value, ids, inline, 3)
            attrs = _render(runtime.config,
                            [(semconv.INPUT_VALUE, semconv.INPUT_MIME_TYPE, value)], {})
            refs = int(attrs_now.get(semconv.CONTENT_REFS, 0)) - len(inline)
            if refs > 0:
                attrs[semconv.CONTENT_REFS] = refs
            elif semconv.CONTENT_REFS in attrs_now:
                _drop_attributes(span, [semconv.CONTENT_REFS])
            new = attrs[semconv.INPUT_VALUE]
        if outcome is not None and text is not None and outcome.first_input == text:
            outcome.first_input = new
        merge_clean(span, clean_attributes(attrs))
    except Exception as exc:  # noqa: BLE001 - the call's result stands
        _errors.internal_error(exc, "settling a reference")


def _swap_placeholders(value: Any, ids: Mapping[str, str], inline: Mapping[str, list[Any]],
                       depth: int) -> Any:
    """``value`` (parsed ``input.value``) with each placeholder reference named by its id, or
    replaced by its list; as deep as ``content_refs`` puts references (and one more)."""
    if type(value) is dict:
        ref = value.get(_content.REF_KEY)
        if type(ref) is str and ref.startswith(PLACEHOLDER_PREFIX):
            if ref in inline:
                return inline[ref]
            if ref in ids:
                return {**value, _content.REF_KEY: ids[ref]}
        if depth:
            return {key: _swap_placeholders(item, ids, inline, depth - 1)
                    for key, item in value.items()}
    return value


def content_refs(runtime: Runtime, value: Any, skip: str | None = None,
                 options: ContentOptions | None = None, pending: PendingRefs | None = None
                 ) -> tuple[Any, int]:
    """``value`` with its large lists of content (token ids, messages) replaced by references
    into the content store, and how many were replaced: a list that repeats the trajectory's
    content (the agent loop's ``prompt_ids``/``response_ids``) points into its chain
    (``DeltaChain.reference``); any other list over ``content_inline_bytes`` (a dataset prompt)
    is stored once by its id (``{"$content": id, "len": n, "delta": []}``). With ``pending``
    (the inputs of a lazy call), such a list of messages is hashed off the loop and named by a
    placeholder until the call ends (``settle_refs``).

    Top-level fields of a mapping, a dataclass or a pydantic model, and one level below them
    (``skip``: a field left as it is). With ``content_dedup`` off or nothing to replace:
    ``value`` itself."""
    if options is None:
        options = _options(runtime.config)
    if not options.dedup or value is None or type(value) in (str, int, float, bool, list, tuple):
        return value, 0
    try:
        fields = value if type(value) is dict else as_dict(value)  # (read, never changed)
    except Exception:  # noqa: BLE001 - a user object: recorded as it is
        return value, 0
    if len(fields) == 1 and fields.get("output") is value:
        return value, 0
    chains: list[_content.DeltaChain] | None = None  # the trajectory's, once a list is met
    count = 0
    out: dict[str, Any] | None = None
    for key, item in fields.items():
        if key == skip:  # the delta-coded prompt (its head, when shown in part)
            continue
        kind = type(item)
        if kind is list or kind is tuple:  # (only a list or a tuple is ever replaced)
            if not _may_ref(item):
                continue
            if chains is None:
                chains = _chains()
            new = _ref(runtime, options, item, chains, pending)
            if new is not None:
                count += 1
        elif kind is dict:
            inner: dict[str, Any] | None = None
            for name, sub in item.items():
                if type(sub) is not list and type(sub) is not tuple or not _may_ref(sub):
                    continue
                if chains is None:
                    chains = _chains()
                ref = _ref(runtime, options, sub, chains, pending)
                if ref is not None:
                    inner = dict(item) if inner is None else inner
                    inner[name] = ref
                    count += 1
            new = inner
        else:
            continue
        if new is not None:
            out = dict(fields) if out is None else out
            out[key] = new
    if out is None:
        return value, 0
    return _with_model_class(value, out), count


def _may_ref(item: list[Any] | tuple[Any, ...]) -> bool:
    """A list or tuple that ``_ref`` may replace: long enough, or a list of messages."""
    return len(item) >= REF_MIN_ITEMS or bool(item) and type(item[0]) is dict


def _chains() -> list[_content.DeltaChain]:
    """The current trajectory's delta chains (what a list may repeat)."""
    traj = TRAJECTORY.get()
    return [c for c in traj.content.values() if type(c) is _content.DeltaChain] \
        if traj is not None and traj.content else []


def _with_model_class(value: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` of a pydantic model keep its class as the payload walker records it
    (``_type`` first, ``_class_name``/``_bases`` last: what Weave reads an object's class from)."""
    pydantic = sys.modules.get("pydantic")
    kind = type(value)
    if pydantic is None or not issubclass(kind, pydantic.BaseModel):
        return fields
    name, bases = _payload.class_record(kind)
    return {"_type": name, **fields, "_class_name": name, "_bases": bases}


def _ref(runtime: Runtime, options: ContentOptions, item: Any,
         chains: list[_content.DeltaChain], pending: PendingRefs | None = None
         ) -> dict[str, Any] | None:
    kind = type(item)
    if (kind is not list and kind is not tuple) or len(item) < REF_MIN_ITEMS and \
            type(item[0] if item else None) is not dict:
        return None
    head = type(item[0])
    if head is int:
        wanted = _content.KIND_TOKENS
        big = len(item) * 4 > options.inline_bytes
    elif head is dict:
        wanted = _content.KIND_MESSAGES
        big = sum(len(m.get("content") or "") if type(m) is dict and
                  type(m.get("content")) is str else 0 for m in item) > options.inline_bytes
    else:
        return None
    value = item if kind is list else list(item)
    if len(value) >= REF_MIN_ITEMS or big:
        for chain in chains:
            if chain.kind == wanted:
                ref = chain.reference(value)
                if ref is not None:
                    return ref
    if not big:
        return None
    if pending is not None and wanted == _content.KIND_MESSAGES:
        # a dataset prompt: encoded, hashed and stored off the loop; the reference names a
        # placeholder until the call ends (``settle_refs``)
        cached = _cached_root(item, value)
        fresh = cached is None  # (else another call's: stored for this one when it settles)
        step = cached if cached is not None else \
            _root_messages(item, value, content_store(runtime).bound())
        if step is None:
            return None
        placeholder = f"{PLACEHOLDER_PREFIX}{next(_PLACEHOLDERS):x}"
        pending.refs.append((placeholder, step, fresh, value))
        return {_content.REF_KEY: placeholder, "len": step.length, "delta": []}
    step = _root_messages(item, value) if wanted == _content.KIND_MESSAGES else \
        _content.root_step(wanted, value)
    if step is None or step.pending and not step.resolve():
        return None
    if content_store(runtime).put(wanted, step) != "stored":
        return None  # over budget: the list stays in the payload (capped), not a dead link
    return {_content.REF_KEY: step.id, "len": step.length, "delta": []}


#: message lists stored by their id lately (a dataset prompt), by ``id()`` of the list: the
#: n rollouts of a GRPO group get the very same row objects (verl repeats the batch's object
#: arrays), so the group's prompt is encoded and hashed once, not n times. Each entry holds
#: the list (its id stays its own), the identity of every message's values, and the step.
_ROOT_MESSAGES: collections.OrderedDict[int, tuple[Any, tuple[Any, ...], _content.Step]] = \
    collections.OrderedDict()
#: entries kept (a step holds its prompt's bytes: ~64 prompts in flight at 128k is ~8 MiB)
_ROOT_MESSAGES_KEPT = 64
#: message values whose identity says they did not change (immutable)
_IMMUTABLE = (str, int, float, bool, type(None))


def _root_messages(item: Any, value: list[Any], store: Any = None) -> _content.Step | None:
    """``_content.root_step`` of a message list, computed once for the same list object while
    its messages hold the very same (immutable) values: O(messages) identity checks instead of
    encoding and hashing O(characters) again.

    ``store`` (a call that settles its inputs when it ends, ``settle_refs``): a list not met
    before comes back as a ``PendingStep`` that the content thread encodes, hashes and puts in
    ``store`` (while the call runs: the store's thread writes it then, not when the
    trajectory's calls end together). A cached step may be pending either way (``resolve`` it
    before reading its id)."""
    cached = _cached_root(item, value)
    if cached is not None:
        return cached
    step: _content.Step | None
    if store is not None:  # the caller's list does not change while its call runs; copied
        copy = list(value)  # all the same (O(messages)), as the chain's deferred messages are
        step = _content.PendingStep(_content.KIND_MESSAGES, copy, len(copy), copy, b"")
        _content.defer(step, store)
    else:
        step = _content.root_step(_content.KIND_MESSAGES, value)
    if step is None:
        return None
    shape = _message_shape(value)
    if shape is not None:
        _ROOT_MESSAGES[id(item)] = (item, shape, step)
        while len(_ROOT_MESSAGES) > _ROOT_MESSAGES_KEPT:
            try:
                _ROOT_MESSAGES.popitem(last=False)
            except KeyError:
                break
    return step


def _cached_root(item: Any, value: list[Any]) -> _content.Step | None:
    """The step remembered for this very list while its messages hold the same values."""
    cached = _ROOT_MESSAGES.get(id(item))
    if cached is not None and cached[0] is item and _same_messages(value, cached[1]):
        try:
            _ROOT_MESSAGES.move_to_end(id(item))
        except KeyError:  # (another thread evicted it meanwhile)
            pass
        return cached[2]
    return None


def _message_shape(messages: list[Any]) -> tuple[Any, ...] | None:
    """Each message's (key, value) pairs, when every message is a plain dict of immutable
    values (else None: not cached)."""
    shape = []
    for message in messages:
        if type(message) is not dict:
            return None
        items = tuple(message.items())
        for key, val in items:
            if type(key) is not str or type(val) not in _IMMUTABLE:
                return None
        shape.append(items)
    return tuple(shape)


def _same_messages(messages: list[Any], shape: tuple[Any, ...]) -> bool:
    if len(messages) != len(shape):
        return False
    for message, items in zip(messages, shape, strict=True):
        if type(message) is not dict or len(message) != len(items):
            return False
        for key, val in items:
            if message.get(key, _MISSING) is not val:
                return False
    return True


_MISSING = object()


def _preview(kind: str, step: _content.Step, limit: int | None) -> Any:
    """A delta as a payload shows it: whole (``limit`` None), or a head of about ``limit``
    bytes of it when it is stored out of line. Token ids as the bytes they were hashed from
    (``_payload.TokenJSON``: not checked and encoded again)."""
    if kind == _content.KIND_TOKENS:
        return _payload.token_json(step.delta, step.delta_bytes, limit)
    if limit is None:
        return step.delta
    return to_payload(step.delta, max_bytes=max(256, limit), redact=False).json


#: the chain of ``gen_ai.input.messages`` (apart from an op input's ``messages``)
_GENAI_MESSAGES = "gen_ai.input.messages"


def input_messages_attrs(messages: Sequence[Mapping[str, Any]],
                         convert: Callable[[Sequence[Mapping[str, Any]]], Any]) -> dict[str, Any]:
    """``gen_ai.input.messages`` of an LLM call (capped, as ``payload_json``), as what the call
    appends to the trajectory's previous call: ``convert`` (e.g. to the GenAI message format)
    runs on the appended messages only, and ``otel_verl.content.messages_*`` say what they
    extend. With ``content_dedup`` off, or outside a trajectory: all of them, as before."""
    runtime = STATE.runtime
    traj = TRAJECTORY.get()
    if (runtime is None or traj is None or not _options(runtime.config).dedup
            or not messages):
        return {semconv.GEN_AI_INPUT_MESSAGES: payload_json(convert(messages))}
    chain = _content.chains_of(traj.content, _GENAI_MESSAGES, _content.KIND_MESSAGES)
    options = _options(runtime.config)
    # a long whole conversation (turn 1) is encoded and hashed off the loop: its id and
    # ``stored`` go on the span when the call ends (``settle_messages``)
    step = chain.begin(messages, defer_over=options.inline_bytes)
    if step is None:
        return {semconv.GEN_AI_INPUT_MESSAGES: payload_json(convert(messages))}
    config = runtime.config
    if isinstance(step, _content.PendingStep):
        span = otel_trace.get_current_span()  # the call's own span (``_llm_request``)
        traj.content[_pending_messages_key(span)] = step
        # a head of it goes on the span when the call ends (``settle_messages``; the whole is
        # in the store, as a rule), rendered with the hash, off the loop: the conversation's
        # O(cap) walk is not on the loop either
        step.after = _MessagesHead(convert, step.delta, options.inline_bytes, config.redact)
        _content.defer(step, content_store(runtime).bound())
        return {semconv.CONTENT_MESSAGES_LEN: step.length}
    chain.finish(step.id, step.length, None, None)  # the answer comes back in the next prompt
    stored = content_store(runtime).put(_content.KIND_MESSAGES, step)
    # a large delta is in the store: the span shows a head of it (``content_inline_bytes``)
    limit = _options(config).inline_bytes if stored == "stored" else config.max_field_bytes
    attrs: dict[str, Any] = {
        semconv.GEN_AI_INPUT_MESSAGES: to_payload(convert(step.delta), max_bytes=limit,
                                                  redact=config.redact).json,
        semconv.CONTENT_MESSAGES_ID: step.id, semconv.CONTENT_MESSAGES_LEN: step.length,
        semconv.CONTENT_MESSAGES_STORED: stored,
    }
    if step.base_id is not None:
        attrs[semconv.CONTENT_MESSAGES_BASE_ID] = step.base_id
        attrs[semconv.CONTENT_MESSAGES_BASE_LEN] = step.base_len
    return attrs


class _MessagesHead:
    """``gen_ai.input.messages`` of a call whose whole conversation is hashed off the loop: a
    head of it (``content_inline_bytes``), rendered where the hash is (``PendingStep.after``).
    Never raises (``to_payload`` does not; a failing ``convert`` leaves no attribute)."""

    __slots__ = ("convert", "delta", "limit", "redact")

    def __init__(self, convert: Callable[[Sequence[Mapping[str, Any]]], Any],
                 delta: list[Any], limit: int, redact: bool) -> None:
        self.convert = convert
        self.delta = delta
        self.limit = limit
        self.redact = redact

    def __call__(self) -> str | None:
        try:
            return to_payload(self.convert(self.delta), max_bytes=self.limit,
                              redact=self.redact).json
        except Exception as exc:  # noqa: BLE001 - the call's result stands
            _errors.internal_error(exc, "gen_ai.input.messages")
            return None


#: the key (in the trajectory's content dict) of a call's messages hashed off the loop
_PENDING_MESSAGES = "_pending_messages:"


def _pending_messages_key(span: Any) -> str:
    return _PENDING_MESSAGES + format(span.get_span_context().span_id, "016x")


def settle_messages(span: Span) -> dict[str, Any]:
    """At the end (or failure) of a call whose ``gen_ai.input.messages`` were hashed off the
    loop: a head of them (``gen_ai.input.messages``), ``otel_verl.content.messages_id`` and
    ``messages_stored``. ``{}`` for any other
    call (O(1): one dict lookup)."""
    traj = TRAJECTORY.get()
    if traj is None or not traj.content:
        return {}
    step = traj.content.pop(_pending_messages_key(span), None)
    if step is None:
        return {}
    resolved = step.resolve()
    attrs: dict[str, Any] = {}
    if type(step.after_value) is str:  # the head, rendered with the hash
        attrs[semconv.GEN_AI_INPUT_MESSAGES] = step.after_value
    if not resolved:
        attrs[semconv.CONTENT_MESSAGES_STORED] = "missing"
        return attrs
    attrs[semconv.CONTENT_MESSAGES_ID] = step.id
    attrs[semconv.CONTENT_MESSAGES_STORED] = step.stored or "missing"
    return attrs


def content_outputs(span: Span, output: Any) -> dict[str, Any]:
    """At the end of a call whose prompt was delta-coded: its response extends the chain (the
    next call's base) and is stored as a node; the ``otel_verl.content.output_*`` attributes."""
    attrs_now = attribute_map(span)
    settled = settle_content(span, attrs_now)
    content_id = settled.get(semconv.CONTENT_ID, attrs_now.get(semconv.CONTENT_ID))
    if content_id is None:
        return settled
    field = attrs_now.get(semconv.CONTENT_FIELD)
    traj = TRAJECTORY.get()
    chain = traj.content.get(field) if traj is not None and type(field) is str else None
    if chain is None:
        return settled
    response = None
    if attrs_now.get(semconv.CONTENT_KIND) == _content.KIND_TOKENS:
        found = _response_of(output)
        response = found[1] if found is not None else None
    span_id = format(span.get_span_context().span_id, "016x")
    node = chain.finish(content_id, int(attrs_now.get(semconv.CONTENT_LEN, -1)), response,
                        span_id)
    if node is None:
        return settled
    runtime = STATE.runtime
    if runtime is None:
        return settled
    stored = content_store(runtime).put(str(attrs_now.get(semconv.CONTENT_KIND)), node)
    return {**settled, semconv.CONTENT_OUTPUT_ID: node.id,
            semconv.CONTENT_OUTPUT_LEN: node.length, semconv.CONTENT_OUTPUT_STORED: stored}


def _long_response(runtime: Runtime, output: Any) -> bool:
    """The output's response tokens (``RESPONSE_FIELDS``) are over ``content_inline_bytes``: the
    payload refers to them rather than carrying them."""
    found = _response_of(output)
    return found is not None and len(found[1]) * 4 > _options(runtime.config).inline_bytes


def _short_response_key(runtime: Runtime, output: Any) -> str | None:
    """The output's field of response tokens (``RESPONSE_FIELDS``) when it is not long."""
    found = _response_of(output)
    if found is None or len(found[1]) * 4 > _options(runtime.config).inline_bytes:
        return None
    return found[0]


def _response_of(output: Any) -> tuple[str, list[Any] | tuple[Any, ...]] | None:
    """(field, tokens) of the output's first ``RESPONSE_FIELDS`` list, if any."""
    for key in RESPONSE_FIELDS:
        value = _field(output, key)
        if type(value) is list or type(value) is tuple:
            return key, value
    return None


def _field(output: Any, key: str) -> Any:
    """``as_dict(output).get(key)`` without the copy (a dict's key, a dataclass's field)."""
    kind = type(output)
    if kind is dict:
        return output.get(key)
    if dataclasses.is_dataclass(kind):
        return object.__getattribute__(output, key) if key in \
            _payload.dataclass_field_names(kind) else None
    return as_dict(output).get(key)


def _settle_pending(span: Span, attrs_now: Mapping[str, Any]) -> dict[str, Any]:
    """The ids (and ``stored``) of a call's prompt and messages hashed off the loop, for a call
    that ends without ``content_outputs`` (a failure): ``{}`` when neither is pending."""
    settled: dict[str, Any] = {}
    if semconv.CONTENT_FIELD in attrs_now:  # a prompt whose id is not on the span yet
        settled.update(settle_content(span, attrs_now))
    if semconv.CONTENT_MESSAGES_LEN in attrs_now and semconv.CONTENT_MESSAGES_ID not in attrs_now:
        settled.update(settle_messages(span))  # its messages', likewise
    return settled


def record_failure(span: Span, exc: BaseException) -> None:
    """``record_exception`` + status ERROR, with the message and traceback capped like payloads.

    Never raises, also for an exception whose ``__str__`` raises (the status is set first).
    Redaction of the message and stacktrace happens at span end, with everything else.
    """
    try:
        if not span.is_recording():
            return
        settled = _settle_pending(span, attribute_map(span))
        if settled:
            span.set_attributes(settled)
        kind = type(exc)
        type_name = kind.__qualname__ if kind.__module__ == "builtins" else \
            f"{kind.__module__}.{kind.__qualname__}"
        try:
            message = _cap(str(exc))
        except Exception:
            message = f"<{kind.__qualname__} whose __str__ raised>"
        span.set_status(Status(StatusCode.ERROR, f"{kind.__name__}: {message}"[:1024]))
        try:
            trace_text = "".join(traceback.format_exception(kind, exc, exc.__traceback__))
        except Exception:
            trace_text = f"{type_name}: {message}"
        span.add_event("exception", {
            "exception.type": type_name,
            "exception.message": message,
            "exception.stacktrace": _cap(trace_text),
            "exception.escaped": False,
        })
    except Exception as inner:
        _errors.internal_error(inner, "recording an exception")


def _cap(text: str) -> str:
    if type(text) is not str:
        text = str.__str__(text)
    limit = STATE.config.max_field_bytes
    if len(text) > limit:
        text = text[:limit] + TRUNCATION_MARK.format(n=len(text) - limit)
    return text


def as_dict(output: Any) -> dict[str, Any]:
    """A traced output as a dict (to add token2text fields to a copy of it).

    Only real mappings, dataclasses and pydantic models are unpacked (by ``type()``, nothing
    called on anything else); other outputs go under ``"output"``.
    """
    kind = type(output)
    if kind is dict:  # the common case, without the ABC check below
        return dict(output)
    if issubclass(kind, Mapping):
        return dict(output)
    if dataclasses.is_dataclass(kind):
        return {name: object.__getattribute__(output, name)
                for name in _payload.dataclass_field_names(kind)}
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and issubclass(kind, pydantic.BaseModel):
        values = object.__getattribute__(output, "__dict__")
        return {name: values[name] for name in kind.model_fields if name in values}
    return {"output": output}


# token2text: decoded text of prompt/response ids, added to a copy of the traced output ---------

_TEXT_FIELDS = (("prompt_ids", "prompt_text"), ("response_ids", "response_text"),
                ("token_ids", "response_text"))


def token_texts(owner: Any, kwargs: dict[str, Any], output: Any,
                span: Any = None) -> dict[str, str] | None:
    """``prompt_text``/``response_text`` decoded with ``owner.tokenizer`` (None without one).

    A call whose prompt was delta-coded (``otel_verl.content.base_len`` on ``span``) decodes
    only what it appended, as ``prompt_delta_text``: never the whole context again.
    """
    decode = getattr(getattr(owner, "tokenizer", None), "decode", None)
    if decode is None:
        return None
    texts: dict[str, str] = {}
    source = as_dict(output)
    if "prompt_ids" not in source and "prompt_ids" in kwargs:  # per-turn generate(prompt_ids=...)
        attrs = attribute_map(span) if span is not None else {}
        base_len = attrs.get(semconv.CONTENT_BASE_LEN)
        prompt = kwargs["prompt_ids"]
        if (type(base_len) is int and attrs.get(semconv.CONTENT_FIELD) == "prompt_ids"
                and type(prompt) in (list, tuple)):
            texts["prompt_delta_text"] = _decode(decode, list(prompt[base_len:]))
        else:
            source = dict(source, prompt_ids=prompt)
    for ids_key, text_key in _TEXT_FIELDS:
        ids = source.get(ids_key)
        if ids is not None and text_key not in texts:
            if hasattr(ids, "tolist"):
                ids = ids.tolist()
            texts[text_key] = _decode(decode, ids)
    return texts or None


def _decode(decode: Any, ids: Any) -> str:
    """``decode(ids, skip_special_tokens=False)`` (Hugging Face's default, said explicitly), or
    ``decode(ids)`` as verl calls it when ``decode`` takes no such keyword."""
    try:
        return decode(ids, skip_special_tokens=False)
    except TypeError as exc:
        if "skip_special_tokens" not in str(exc):
            raise
    return decode(ids)
