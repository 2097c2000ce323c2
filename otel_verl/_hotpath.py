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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import Span as SdkSpan

#: attribute value types the SDK stores unchanged (no value-length limit): no cleaning needed
_PLAIN = (str, bool, int, float)


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
    if all(type(k) is str and k and (type(v) in _PLAIN or type(v) is tuple and all(
            type(x) in _PLAIN for x in v)) for k, v in attrs.items()):
        return dict(attrs)
    return BoundedAttributes(None, attrs).copy()  # type: ignore[return-value]


def merge_clean(span: Any, attrs: Mapping[str, Any]) -> None:
    """Put already-clean attributes (from ``clean_attributes``) on a started span, in one step
    where that stores exactly what ``span.set_attributes(attrs)`` would, else through it."""
    if SDK_SHAPE_OK and type(span) is _SDK_SPAN_TYPE:
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


def attribute_map(span: ReadableSpan) -> Mapping[str, Any]:
    """A span's attributes for reading (the plain dict where the SDK holds one; no copy)."""
    bounded = getattr(span, "_attributes", None)
    if SDK_SHAPE_OK:
        if type(bounded) is BoundedAttributes:
            return bounded._dict
        if type(bounded) is dict:  # a compacted span (``compact``)
            return bounded
    return span.attributes or {}


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
    from opentelemetry.sdk import trace as sdk_trace

    return getattr(sdk_trace, "_Span", SdkSpan)


_SDK_SPAN_TYPE: Any = _sdk_span_type()
