"""Attributes validated once: the per-span fast path of the rollout's thread.

The SDK re-validates every attribute each time it is set (``_clean_attribute_value``: a chain
of ``isinstance`` checks, ``Mapping``/``Sequence`` ABC dispatch, then one locked insert per key).
The trajectory attributes are the same for every span of a trajectory, so they are validated
once, when the trajectory starts (``clean_attributes``, with the SDK's own cleaner), and put on
each span in one step (``merge_clean``).

``merge_clean`` writes into the SDK span's attribute dict (private SDK structure:
``Span._attributes`` is a ``BoundedAttributes`` holding ``_dict``). It does so only where the
result is exactly what ``span.set_attributes`` would store: the span is the SDK's own, not
ended, its attributes are a ``BoundedAttributes`` with no value-length limit and room for every
key (no eviction), and the values are already clean. Anything else takes ``set_attributes``.
``SDK_SHAPE_OK`` is checked once at import against the installed SDK; when the SDK changes
shape the fast path turns itself off (and ``tests/unit/test_hotpath.py`` fails, so we notice).

``start_span`` starts otel_verl's own spans (ops, trajectories) as a ``LightSpan``: the SDK's
span class, started without the SDK's per-span allocations (3 objects the cyclic GC tracks while
it is open instead of 12) and without the sampler's and ``isinstance`` dispatch, where the SDK
is one it was checked on (``LIGHT_SPAN_OK``; ``tests/unit/test_light_span.py``) and the tracer's
sampler is the default one; anything else takes the tracer's own ``start_span``.
"""

from __future__ import annotations

import contextvars
import inspect
import os
import threading
import weakref
from collections.abc import Mapping
from time import time_ns
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context.context import Context
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace import ReadableSpan, sampling
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

#: attribute value types the SDK stores unchanged (no value-length limit): no cleaning needed
_PLAIN = (str, bool, int, float)
_PLAIN_TYPES = frozenset(_PLAIN)


def _sdk_shape_ok() -> bool:
    """The installed SDK stores span attributes as ``Span._attributes`` = ``BoundedAttributes``
    with ``_dict``, ``_lock``, ``maxlen``, ``max_value_len``, ``_immutable``; and a span's
    ``_end_time`` and ``_lock`` exist (what ``merge_clean`` relies on)."""
    try:
        probe = BoundedAttributes(4, {"k": "v"}, immutable=False)
        ok = (type(getattr(probe, "_dict", None)) is dict and probe._dict == {"k": "v"}
              and hasattr(probe, "_lock") and probe.maxlen == 4
              and probe.max_value_len is None and probe._immutable is False)
        init = SdkSpan.__init__.__code__.co_names
        end = SdkSpan.end.__code__.co_names
        return ok and "_attributes" in init and "_lock" in init and "_end_time" in end
    except Exception:  # noqa: BLE001 - any surprise: the fast path stays off
        return False


SDK_SHAPE_OK = _sdk_shape_ok()


def clean_attributes(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """``attrs`` as the SDK would store them (keys non-empty str, values cleaned): plain values
    and tuples of them pass as they are, anything else goes through the SDK's own cleaner once."""
    for key, value in attrs.items():  # a plain loop: no generator frame per call
        kind = type(value)
        if type(key) is not str or not key or kind not in _PLAIN_TYPES and (
                kind is not tuple or not all(type(x) in _PLAIN_TYPES for x in value)):
            return BoundedAttributes(None, attrs).copy()  # type: ignore[return-value]
    return dict(attrs)


def cleaned(attrs: dict[str, Any]) -> dict[str, Any]:
    """``clean_attributes(attrs)`` for a dict the caller made and hands over: the dict itself
    where it is clean already (no copy), else the cleaned copy."""
    for key, value in attrs.items():
        kind = type(value)
        if type(key) is not str or not key or kind not in _PLAIN_TYPES and (
                kind is not tuple or not all(type(x) in _PLAIN_TYPES for x in value)):
            return clean_attributes(attrs)
    return attrs


def merge_clean(span: Any, attrs: Mapping[str, Any]) -> None:
    """Put already-clean attributes (from ``clean_attributes``) on a started span, in one step
    where that stores exactly what ``span.set_attributes(attrs)`` would, else through it."""
    if SDK_SHAPE_OK and type(span) in _SPAN_TYPES:
        bounded = span._attributes
        if type(bounded) is BoundedAttributes and bounded.max_value_len is None \
                and not bounded._immutable:
            with span._lock:
                if span._end_time is None:
                    store = bounded._dict
                    if bounded.maxlen is None or len(store) + len(attrs) <= bounded.maxlen:
                        store.update(attrs)
                        return
    span.set_attributes(attrs)


def attribute_map(span: Any) -> Mapping[str, Any]:
    """A span's attributes for reading (the plain dict where the SDK holds one; no copy)."""
    bounded = getattr(span, "_attributes", None)
    if SDK_SHAPE_OK:
        if type(bounded) is BoundedAttributes:
            return bounded._dict
        if type(bounded) is dict:  # a compacted span (``compact``)
            return bounded
    return getattr(span, "attributes", None) or {}  # a non-recording span has none


def is_current(span: Any) -> bool:
    """``span`` is the current span (``trace.get_current_span() is span`` for a real span,
    without its ``isinstance`` check through the ``Span`` ABC)."""
    if context_api._RUNTIME_CONTEXT is _RUNTIME:
        return _CURRENT.get().get(_SPAN_KEY) is span
    return context_api.get_value(_SPAN_KEY) is span


# -- the current span: ``attach(set_span_in_context(span))`` in one step ---------------------------
#
# With the API's default runtime context (a ``ContextVar`` holding an immutable ``Context`` dict),
# ``attach_span`` makes the same new ``Context`` (a copy of the current one with the span under
# the API's key) and sets it on the same variable: the token is the one ``otel_context.attach``
# returns, so either ``detach`` resets it. Three Python frames and a temporary dict fewer than
# the API's path per call. With any other runtime context (``OTEL_PYTHON_CONTEXT``), or an API of
# another shape (``CONTEXT_FAST_OK``), both are the API's own calls.


def _context_fast_ok() -> bool:
    """The API's runtime context is the contextvars one, and ``attach``/``detach``/``set_value``/
    ``set_span_in_context`` do exactly what ``attach_span``/``detach`` redo."""
    try:
        from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

        runtime = context_api._RUNTIME_CONTEXT
        return (type(runtime) is ContextVarsRuntimeContext
                and type(getattr(runtime, "_current_context", None)) is contextvars.ContextVar
                and set(context_api.attach.__code__.co_names) == {"_RUNTIME_CONTEXT", "attach"}
                and set(context_api.detach.__code__.co_names) >= {"_RUNTIME_CONTEXT", "detach"}
                and set(ContextVarsRuntimeContext.attach.__code__.co_names)
                == {"_current_context", "set"}
                and set(ContextVarsRuntimeContext.detach.__code__.co_names)
                == {"_current_context", "reset"}
                and set(context_api.set_value.__code__.co_names)
                == {"get_current", "copy", "Context"}
                and set(trace_api.set_span_in_context.__code__.co_names)
                == {"set_value", "_SPAN_KEY"}
                and Context.__init__ is dict.__init__)
    except Exception:  # noqa: BLE001 - any surprise: the API's own calls
        return False


CONTEXT_FAST_OK = _context_fast_ok()
#: the runtime context the fast path was checked on (None: never the fast path)
_RUNTIME: Any = context_api._RUNTIME_CONTEXT if CONTEXT_FAST_OK else None
_CURRENT: Any = getattr(_RUNTIME, "_current_context", None)
_dict_set = dict.__setitem__


def attach_span(span: Any) -> Any:
    """``otel_context.attach(trace.set_span_in_context(span))``: ``span`` current from now on;
    returns the token for ``detach``."""
    if context_api._RUNTIME_CONTEXT is _RUNTIME:
        context = Context(_CURRENT.get())
        _dict_set(context, _SPAN_KEY, span)
        return _CURRENT.set(context)
    return context_api.attach(trace_api.set_span_in_context(span))


def detach(token: Any) -> None:
    """``otel_context.detach(token)`` (never raises: a token that cannot be reset here is
    logged by the API, as its own ``detach`` does)."""
    if context_api._RUNTIME_CONTEXT is _RUNTIME:
        try:
            _CURRENT.reset(token)
            return
        except Exception:  # noqa: BLE001, S110 - the API's detach logs it, as it would have
            pass
    context_api.detach(token)


def compact(span: ReadableSpan) -> ReadableSpan:
    """The same finished span held by fewer objects the cyclic GC tracks, for a queue that keeps
    it up to the schedule delay: a finished SDK span holds about 12 (its attribute table, two
    bounded lists with their deques and three locks, ...), and every span that waits in the
    queue counts towards the next young collection, which also scans the rollout's fresh
    token lists. The copy holds the attribute dict itself and tuples of events and links.

    The span itself is returned where the copy could differ from it: not a plain SDK
    ``ReadableSpan``, something dropped by the span limits (the counts live on the bounded
    containers), or an SDK of unknown shape.
    """
    if not SDK_SHAPE_OK or type(span) is not ReadableSpan:
        return span
    try:
        bounded = span._attributes
        if (bounded is None or type(bounded) is dict) and type(span._events) is tuple \
                and type(span._links) is tuple:
            return span  # compact already (the tail buffer's copy): a copy would be the same
        if type(bounded) is BoundedAttributes:
            attributes: Any = bounded._dict
        elif bounded is None or type(bounded) is dict:
            attributes = bounded
        else:
            return span
        if span.dropped_attributes or span.dropped_events or span.dropped_links:
            return span
        return ReadableSpan(
            name=span.name, context=span.context, parent=span.parent, resource=span.resource,
            attributes=attributes, events=span.events, links=span.links, kind=span.kind,
            instrumentation_info=getattr(span, "_instrumentation_info", None),
            status=span.status, start_time=span.start_time, end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope)
    except Exception:  # noqa: BLE001 - an SDK that changed shape: keep the span as it is
        return span


def _sdk_span_type() -> type:
    """The SDK's concrete span class (``opentelemetry.sdk.trace._Span``)."""
    return getattr(sdk_trace, "_Span", SdkSpan)


_SDK_SPAN_TYPE: Any = _sdk_span_type()


# -- the light span: the SDK's own span, started without the SDK's per-span allocations -----------
#
# An open SDK span holds 12 objects the cyclic GC tracks (the span, its context and trace flags,
# the attribute table, two bounded lists for events and links with a deque each, four locks).
# Every young collection scans what is alive, the rollout's 32k-element token lists included, and
# each span's objects count towards the next one. ``LightSpan`` is the SDK's ``_Span`` (so a real
# ``ReadableSpan`` reaches every processor and exporter) started by ``start_span`` with:
# - the trace flags shared (an immutable int), the attribute table filled with attributes that
#   are already clean, one process-wide reentrant lock for the span and its attribute table (re-
#   initialised after a fork);
# - no event or link list until one is added (an empty tuple, which readers treat as the SDK's
#   empty list);
# - the sampler's decision taken here where the provider's sampler is the SDK default
#   (parent-based always-on) or always-on, with the same id generator calls in the same order;
# - at its end, the compact finished span (``compact``) made directly.
# It is used only where the installed SDK has exactly the shape this was written against
# (``LIGHT_SPAN_OK``: the versions in ``_CHECKED_SDK``, the span's fields, the methods touching
# them), else ``start_span`` is the tracer's own ``start_span``.

#: SDK versions (major, minor) the light span was checked on, both ends included
_CHECKED_SDK = ((1, 45), (1, 45))

#: the fields an SDK span has after ``Tracer.start_span`` (``LightSpan`` sets exactly these)
_SPAN_FIELDS = frozenset({
    "_name", "_context", "_kind", "_instrumentation_info", "_instrumentation_scope", "_parent",
    "_start_time", "_end_time", "_attributes", "_events", "_links", "_resource", "_status",
    "_sampler", "_trace_config", "_record_exception", "_set_status_on_exception",
    "_span_processor", "_limits", "_lock", "_record_end_metrics"})
_ATTRIBUTE_FIELDS = frozenset({"_dict", "maxlen", "dropped", "max_value_len", "_lock",
                               "_immutable"})
#: the SDK methods that touch a span's event and link lists: ``LightSpan`` replaces the writers
#: (``_add_event``, ``_add_link``, ``_readable_span``); the others read any sequence
_EVENT_USERS = frozenset({"ReadableSpan.__init__", "ReadableSpan.dropped_events",
                          "ReadableSpan.events", "ReadableSpan.to_json", "Span.__init__",
                          "Span._add_event", "Span._readable_span"})
_LINK_USERS = frozenset({"ReadableSpan.__init__", "ReadableSpan.dropped_links",
                         "ReadableSpan.links", "ReadableSpan.to_json", "Span.__init__",
                         "Span._add_link", "Span._readable_span"})
#: what ``Tracer.start_span`` and ``Span.start`` do (names they use), as ``start_span`` redoes it
_START_SPAN_NAMES = frozenset({
    "DEFAULT", "NonRecordingSpan", "RANDOM_TRACE_ID", "SAMPLED", "SpanContext", "TraceFlags",
    "TypeError", "_Span", "_instrumentation_scope", "_is_enabled", "_span_limits",
    "_tracer_metrics", "attributes", "decision", "generate_span_id", "generate_trace_id",
    "get_current_span", "get_span_context", "id_generator", "instrumentation_info",
    "is_recording", "is_sampled", "is_trace_id_random", "is_valid", "isinstance",
    "random_trace_id", "resource", "sampler", "should_sample", "span_processor", "start",
    "start_span", "trace_api", "trace_flags", "trace_id", "trace_state"})
#: what ``Span.end`` does (names it uses), as ``LightSpan.end`` redoes it
_SPAN_END_NAMES = frozenset({
    "RuntimeError", "_attributes", "_end_time", "_immutable", "_lock", "_on_ending",
    "_readable_span", "_record_end_metrics", "_span_processor", "_start_time", "logger",
    "on_end", "time_ns", "warning"})
_SPAN_START_NAMES = frozenset({"_lock", "_span_processor", "_start_time", "logger", "on_start",
                               "time_ns", "warning"})

_sdk_log = sdk_trace.logger  # the SDK's own logger: the same warnings from the same place

#: one lock for every light span and its attribute table (reentrant: the SDK takes the span's,
#: then the table's, and a finaliser run by the GC inside either may end another span)
_LOCK = threading.RLock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_LOCK._at_fork_reinit)  # type: ignore[attr-defined]

_tuple_new = tuple.__new__
_TRACE_ID_MAX = 2**128 - 1
_SPAN_ID_MAX = 2**64 - 1


def _context_tuple_ok() -> bool:
    """``SpanContext.__new__`` is the one ``start_span`` redoes (the same tuple, and the same
    names used), so a context built as that tuple equals the constructor's, field by field."""
    try:
        names = set(SpanContext.__new__.__code__.co_names)
        if names != {"DEFAULT_TRACE_OPTIONS", "DEFAULT_TRACE_STATE", "INVALID_TRACE_ID",
                     "INVALID_SPAN_ID", "_TRACE_ID_MAX_VALUE", "_SPAN_ID_MAX_VALUE", "tuple",
                     "__new__"}:
            return False
        flags = TraceFlags(TraceFlags.SAMPLED)
        for trace_id, span_id in ((1, 2), (2**128 - 1, 2**64 - 1), (0, 5), (2**128, 3)):
            theirs = SpanContext(trace_id, span_id, False, flags, None)
            ours = _tuple_new(SpanContext, (trace_id, span_id, False, flags, theirs.trace_state,
                                            0 < trace_id <= _TRACE_ID_MAX
                                            and 0 < span_id <= _SPAN_ID_MAX))
            if tuple(ours) != tuple(theirs) or ours.is_valid is not theirs.is_valid:
                return False
        return True
    except Exception:  # noqa: BLE001 - any surprise: the constructor
        return False


CONTEXT_TUPLE_OK = _context_tuple_ok()
_DEFAULT_TRACE_STATE = SpanContext(1, 1, False).trace_state

_FLAGS = (TraceFlags(TraceFlags.SAMPLED),
          TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID))
_RECORD = sampling.Decision.RECORD_AND_SAMPLE


class LightSpan(_SDK_SPAN_TYPE):
    """The SDK's span, with no event or link list until one is added, and its finished span
    made compact (see the section comment above). Created by ``start_span`` only."""

    _events: Any
    _links: Any
    _end_time: Any

    def end(self, end_time: int | None = None) -> None:
        """The SDK's ``Span.end`` (same checks, warning, order of hooks), calling only the
        processors that do something at the end (``_hooks``)."""
        with self._lock:
            if self._start_time is None:
                raise RuntimeError("Calling end() on a not started span.")
            if self._end_time is not None:
                _sdk_log.warning("Calling end() on an ended span.")
                return
            self._end_time = end_time if end_time is not None else time_ns()
            self._attributes._immutable = True
        if self._record_end_metrics:
            self._record_end_metrics()
        processor = self._span_processor
        hooks = _hooks(processor)
        if hooks is None:
            processor._on_ending(self)
            processor.on_end(self._readable_span())
            return
        for each in hooks[2]:
            each._on_ending(self)
        if hooks[3]:
            readable = self._readable_span()
            for each in hooks[3]:
                each.on_end(readable)

    def _add_event(self, event: Any) -> None:
        with self._lock:
            if self._end_time is None:
                if type(self._events) is tuple:
                    self._events = BoundedList(self._limits.max_events)
                self._events.append(event)
                return
        _sdk_log.warning("Tried calling %s on an ended span.", "_add_event")

    def _add_link(self, link: Any) -> None:
        with self._lock:
            if self._end_time is None:
                if type(self._links) is tuple:
                    self._links = BoundedList(self._limits.max_links)
                self._links.append(link)
                return
        _sdk_log.warning("Tried calling %s on an ended span.", "_add_link")

    def _readable_span(self) -> ReadableSpan:
        bounded, events, links = self._attributes, self._events, self._links
        if type(bounded) is not BoundedAttributes or bounded.dropped or (
                type(events) is not tuple and events.dropped) or (
                type(links) is not tuple and links.dropped):
            return super()._readable_span()
        if not READABLE_FIELDS_OK:
            return ReadableSpan(
                name=self._name, context=self._context, parent=self._parent,
                resource=self._resource, attributes=bounded._dict,
                events=events if type(events) is tuple else tuple(events),
                links=links if type(links) is tuple else tuple(links), kind=self._kind,
                status=self._status, start_time=self._start_time, end_time=self._end_time,
                instrumentation_info=self._instrumentation_info,
                instrumentation_scope=self._instrumentation_scope)
        # ``ReadableSpan(...)`` without its keyword call: the same fields (``_readable_ok``)
        span: Any = _new_object(ReadableSpan)
        span._name = self._name
        span._context = self._context
        span._kind = self._kind
        span._instrumentation_info = self._instrumentation_info
        span._instrumentation_scope = self._instrumentation_scope
        span._parent = self._parent
        span._start_time = self._start_time
        span._end_time = self._end_time
        span._attributes = bounded._dict
        span._events = events if type(events) is tuple else tuple(events)
        span._links = links if type(links) is tuple else tuple(links)
        span._resource = self._resource
        span._status = self._status
        return span


_SPAN_TYPES = (_SDK_SPAN_TYPE, LightSpan)
_new_object = object.__new__
_READABLE_FIELDS = ("_name", "_context", "_kind", "_instrumentation_info",
                    "_instrumentation_scope", "_parent", "_start_time", "_end_time",
                    "_attributes", "_events", "_links", "_resource", "_status")


def _readable_ok() -> bool:
    """``ReadableSpan.__init__`` sets exactly ``_READABLE_FIELDS``, each from its argument (the
    resource too, when one is given), and nothing else."""
    try:
        probe = sdk_trace.Resource.create({})
        values: dict[str, Any] = {field: object() for field in _READABLE_FIELDS}
        made = ReadableSpan(
            name=values["_name"], context=values["_context"], parent=values["_parent"],
            resource=probe, attributes=values["_attributes"], events=values["_events"],
            links=values["_links"], kind=values["_kind"], status=values["_status"],
            start_time=values["_start_time"], end_time=values["_end_time"],
            instrumentation_info=values["_instrumentation_info"],
            instrumentation_scope=values["_instrumentation_scope"])
        values["_resource"] = probe
        return vars(made) == values and all(vars(made)[k] is v for k, v in values.items())
    except Exception:  # noqa: BLE001 - any surprise: the constructor
        return False


READABLE_FIELDS_OK = _readable_ok()

# -- the processors' hooks, without the SDK's no-ops ---------------------------------------------
#
# The tracer's processor is the SDK's ``SynchronousMultiSpanProcessor``: it calls ``on_start``,
# ``_on_ending`` and ``on_end`` of each processor in turn, most of them the SDK's no-ops (the
# trajectory processor has no end, the batch processor no start). A light span calls the same
# processors in the same order, leaving out those whose hook is the SDK base class's own.

_MULTI: Any = getattr(sdk_trace, "SynchronousMultiSpanProcessor", None)
_BASE_HOOKS = {name: getattr(sdk_trace.SpanProcessor, name, None)
               for name in ("on_start", "_on_ending", "on_end")}


def _multi_ok() -> bool:
    """The SDK's multi processor loops over ``_span_processors`` calling each hook."""
    try:
        return all(set(getattr(_MULTI, name).__code__.co_names) == {"_span_processors", name}
                   for name in _BASE_HOOKS) and all(_BASE_HOOKS.values())
    except Exception:  # noqa: BLE001 - any surprise: the multi processor's own loop
        return False


_MULTI_OK = _multi_ok()
#: id(multi processor) -> (its processors tuple, then those with a start, an ending, an end)
_HOOKS: dict[int, tuple[Any, tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]] = {}


def _hooks(processor: Any) -> tuple[Any, tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]] | None:
    """The processors behind the tracer's multi processor that have each hook (the tuple the
    SDK replaces when a processor is added is the cache's key); None for another processor."""
    if type(processor) is not _MULTI or not _MULTI_OK:
        return None
    processors = processor._span_processors
    entry = _HOOKS.get(id(processor))
    if entry is not None and entry[0] is processors:
        return entry

    def having(name: str) -> tuple[Any, ...]:
        return tuple(p for p in processors if getattr(type(p), name, None) is not
                     _BASE_HOOKS[name] or name in getattr(p, "__dict__", ()))

    entry = (processors, having("on_start"), having("_on_ending"), having("on_end"))
    if len(_HOOKS) > 64:  # providers come and go (tests): keep a few
        _HOOKS.clear()
    _HOOKS[id(processor)] = entry
    return entry


class _Starter:
    """What ``start_span`` knows of one SDK tracer (checked once; what may change per span, the
    sampler and whether the tracer is enabled, is checked per span)."""

    __slots__ = ("parent_based", "sampler")

    def __init__(self, tracer: Any) -> None:
        self.sampler = tracer.sampler
        #: the parent's decision stands (the default sampler), else always on
        self.parent_based = self.sampler is not sampling.ALWAYS_ON


def _known_sampler(sampler: Any) -> bool:
    """The SDK's default sampler (parent-based, always on, with the default delegates) or
    always-on: the decision is 'record and sample' unless the parent is not sampled."""
    if sampler is sampling.ALWAYS_ON:
        return True
    return type(sampler) in (sampling.ParentBased, sampling._ParentBasedAlwaysOn) and \
        getattr(sampler, "_root", None) is sampling.ALWAYS_ON and \
        getattr(sampler, "_remote_parent_sampled", None) is sampling.ALWAYS_ON and \
        getattr(sampler, "_local_parent_sampled", None) is sampling.ALWAYS_ON and \
        getattr(sampler, "_remote_parent_not_sampled", None) is sampling.ALWAYS_OFF and \
        getattr(sampler, "_local_parent_not_sampled", None) is sampling.ALWAYS_OFF


#: id(tracer) -> (a weak reference to it, its starter or None): the tracer is not kept alive
_STARTERS: dict[int, tuple[Any, _Starter | None]] = {}


def _starter(tracer: Any) -> _Starter | None:
    """The light path for ``tracer``, or None where it takes the SDK's ``start_span``."""
    entry = _STARTERS.get(id(tracer))
    if entry is not None and entry[0]() is tracer:
        return entry[1]
    ok = LIGHT_SPAN_OK and type(tracer) is sdk_trace.Tracer and _known_sampler(
        getattr(tracer, "sampler", None))
    starter = _Starter(tracer) if ok else None
    if len(_STARTERS) > 64:  # tracers come and go with runtimes (tests): keep a few
        _STARTERS.clear()
    _STARTERS[id(tracer)] = (weakref.ref(tracer), starter)
    return starter


def start_span(tracer: Any, name: str, kind: SpanKind = SpanKind.INTERNAL,
               attributes: Mapping[str, Any] | None = None) -> Any:
    """``tracer.start_span(name, kind=kind, attributes=attributes)`` in the current context,
    as a ``LightSpan`` where the SDK and the tracer allow it (same ids, flags, parent, start
    hooks, attributes). ``attributes`` must be clean (``clean_attributes``)."""
    starter = _starter(tracer)
    if starter is None or tracer.sampler is not starter.sampler or \
            not tracer._tracer_config.is_enabled:
        return tracer.start_span(name, kind=kind, attributes=attributes)
    current: Any = _CURRENT.get().get(_SPAN_KEY) if context_api._RUNTIME_CONTEXT is _RUNTIME \
        else context_api.get_value(_SPAN_KEY)
    if current is None:
        parent = None
    elif type(current) in _SPAN_TYPES:
        parent = current._context
    else:
        parent = trace_api.get_current_span().get_span_context()
        if parent is not None and type(parent) is not SpanContext:
            return tracer.start_span(name, kind=kind, attributes=attributes)
    id_generator = tracer.id_generator
    if type(parent) is SpanContext and parent[5]:  # (trace id, span id, remote, flags, state, valid)
        flags = parent[3]
        if starter.parent_based and not flags & TraceFlags.SAMPLED:
            return tracer.start_span(name, kind=kind, attributes=attributes)
        trace_id = parent[0]
        trace_state = parent[4]
        random_id = flags & TraceFlags.RANDOM_TRACE_ID
    elif parent is None or not parent.is_valid:
        parent = None
        trace_id = id_generator.generate_trace_id()
        trace_state = None
        random_id = id_generator.is_trace_id_random()
    else:  # a valid parent context of a subclass: through its properties
        flags = parent.trace_flags
        if starter.parent_based and not flags.sampled:
            return tracer.start_span(name, kind=kind, attributes=attributes)
        trace_id = parent.trace_id
        trace_state = parent.trace_state
        random_id = flags.random_trace_id
    span_id = id_generator.generate_span_id()
    if CONTEXT_TUPLE_OK:  # ``SpanContext(...)`` without its Python ``__new__`` frame
        context = _tuple_new(SpanContext, (
            trace_id, span_id, False, _FLAGS[1 if random_id else 0],
            _DEFAULT_TRACE_STATE if trace_state is None else trace_state,
            0 < trace_id <= _TRACE_ID_MAX and 0 < span_id <= _SPAN_ID_MAX))
    else:
        context = SpanContext(trace_id, span_id, False, _FLAGS[1 if random_id else 0],
                              trace_state)
    record_end_metrics = tracer._tracer_metrics.start_span(parent, _RECORD)
    limits = tracer._span_limits
    maxlen = limits.max_span_attributes
    max_value_len = limits.max_span_attribute_length
    if attributes and (max_value_len is not None or (maxlen is not None
                                                     and len(attributes) > maxlen)):
        bounded: Any = BoundedAttributes(maxlen, attributes, immutable=False,
                                    max_value_len=max_value_len)
    else:
        bounded = BoundedAttributes.__new__(BoundedAttributes)
        bounded._dict = dict(attributes) if attributes else {}
        bounded.maxlen = maxlen
        bounded.dropped = 0
        bounded.max_value_len = max_value_len
        bounded._lock = _LOCK
        bounded._immutable = False
    span: Any = object.__new__(LightSpan)
    span._name = name
    span._context = context
    span._kind = kind
    span._instrumentation_info = tracer.instrumentation_info
    span._instrumentation_scope = tracer._instrumentation_scope
    span._parent = parent
    span._start_time = None
    span._end_time = None
    span._attributes = bounded
    span._events = ()
    span._links = ()
    span._resource = tracer.resource
    span._status = _DEFAULT_STATUS
    span._sampler = tracer.sampler
    span._trace_config = None
    span._record_exception = True
    span._set_status_on_exception = True
    processor = tracer.span_processor
    span._span_processor = processor
    span._limits = limits
    span._lock = _LOCK
    span._record_end_metrics = record_end_metrics
    span._start_time = time_ns()
    hooks = _hooks(processor)
    if hooks is None:
        processor.on_start(span, parent_context=None)
    else:
        for each in hooks[1]:
            each.on_start(span, parent_context=None)
    return span


def _light_span_ok() -> bool:
    """The installed SDK is one ``LightSpan`` was checked on, and has its shape: a span started
    by the SDK has exactly the fields ``start_span`` sets, of the same types, the methods that
    touch the event and link lists are the known ones, and ``Tracer.start_span`` and
    ``Span.start`` do what ``start_span`` redoes."""
    try:
        from opentelemetry.sdk.version import __version__

        version = tuple(int(part) for part in __version__.split(".")[:2])
        if not (_CHECKED_SDK[0] <= version <= _CHECKED_SDK[1]) or not SDK_SHAPE_OK:
            return False
        if set(sdk_trace.Tracer.start_span.__code__.co_names) != _START_SPAN_NAMES or \
                set(sdk_trace.Span.start.__code__.co_names) != _SPAN_START_NAMES:
            return False
        if _users("_events") != _EVENT_USERS or _users("_links") != _LINK_USERS:
            return False
        if set(sdk_trace.Span.end.__code__.co_names) != _SPAN_END_NAMES:
            return False
        # a private provider (no exit hook, no metrics; its own sampler: never the one
        # OTEL_TRACES_SAMPLER names, which may not record at all)
        provider = sdk_trace.TracerProvider(sampler=sampling.ALWAYS_ON, shutdown_on_exit=False,
                                            meter_provider=NoOpMeterProvider())
        tracer: Any = provider.get_tracer("otel_verl.probe")
        theirs: Any = tracer.start_span("probe", attributes={"k": "v"})
        fields = vars(theirs)
        attrs = vars(theirs._attributes)
        return (set(fields) == _SPAN_FIELDS and set(attrs) == _ATTRIBUTE_FIELDS
                and type(theirs._events) is BoundedList and type(theirs._links) is BoundedList
                and theirs._status is _DEFAULT_STATUS and theirs._trace_config is None
                and theirs._record_exception is True and theirs._set_status_on_exception is True
                and theirs._resource is tracer.resource and theirs._sampler is tracer.sampler
                and theirs._span_processor is tracer.span_processor
                and theirs._limits is tracer._span_limits
                and theirs._instrumentation_scope is tracer._instrumentation_scope)
    except Exception:  # noqa: BLE001 - any surprise: the light span stays off
        return False


def _users(field: str) -> set[str]:
    """``Class.method`` of every function of the SDK span's classes that names ``field``
    (decorated functions included, through their closure)."""
    found = set()
    for klass in _SDK_SPAN_TYPE.__mro__:
        for name, value in vars(klass).items():
            func = value.fget if isinstance(value, property) else value
            code = getattr(func, "__code__", None)
            if code is None:
                continue
            names = set(code.co_names)
            for cell in getattr(func, "__closure__", None) or ():
                inner = getattr(cell.cell_contents, "__code__", None)
                if inner is not None:
                    names |= set(inner.co_names)
            if field in names:
                found.add(f"{klass.__name__}.{name}")
    return found


def _default_status() -> Any:
    return inspect.signature(ReadableSpan.__init__).parameters["status"].default


_DEFAULT_STATUS = _default_status()
_SPAN_KEY = trace_api._SPAN_KEY

#: the light span is used (see ``_light_span_ok``); tests turn it off to check the SDK path
LIGHT_SPAN_OK = _light_span_ok()
