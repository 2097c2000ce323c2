"""Helpers every stage of the write pipeline shares, one of each: copying a finished span, a
span's size estimate, calling an exporter (instrumentation suppressed, never raising), and
bounded shutdown (a timeout threading accepts; ``shutdown(timeout_millis=)`` where a component
takes one).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_verl import _errors
from otel_verl._hotpath import attribute_map


def copy_span(span: ReadableSpan, **changes: Any) -> ReadableSpan:
    """A copy of a finished span (which cannot be changed) with ``changes`` (``name``,
    ``attributes``, ``events``, ``links``, ``status``, ``resource``, ...) applied."""
    fields: dict[str, Any] = {
        "name": span.name, "context": span.context, "parent": span.parent,
        "resource": span.resource, "attributes": span.attributes, "events": span.events,
        "links": span.links, "kind": span.kind, "status": span.status,
        "start_time": span.start_time, "end_time": span.end_time,
        "instrumentation_scope": span.instrumentation_scope,
    }
    fields.update(changes)
    return ReadableSpan(**fields)


def estimate_bytes(span: ReadableSpan) -> int:
    """A cheap upper-ish estimate of a span's encoded size (strings by length, the rest flat)."""
    size = 320 + len(span.name)
    for key, value in attribute_map(span).items():  # the plain dict: no Mapping-ABC dispatch
        size += len(key) + 40 + (len(value) if type(value) is str else 24)
    if not getattr(span, "_events", True):  # no events: skip the SDK's copy into a tuple
        return size
    for event in span.events:
        size += 96 + len(event.name)
        for key, value in (event.attributes or {}).items():
            size += len(key) + 40 + (len(value) if type(value) is str else 24)
    return size


@contextlib.contextmanager
def suppressed_instrumentation() -> Iterator[None]:
    """Instrumentation (requests, urllib3, grpc, ...) records nothing inside (the SDK's key)."""
    token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
    try:
        yield
    finally:
        detach(token)


def call_export(exporter: SpanExporter, spans: Sequence[ReadableSpan]) -> bool:
    """``exporter.export(spans)`` with instrumentation suppressed; True on SUCCESS, never raises."""
    try:
        with suppressed_instrumentation():
            return exporter.export(spans) is SpanExportResult.SUCCESS
    except Exception as exc:  # noqa: BLE001  # an exporter must not raise; one that does fails this request
        _errors.internal_error(exc, "exporter.export raised")
        return False


def timeout_seconds(timeout_millis: float) -> float:
    """A timeout in seconds that threading accepts (inf, nan and negatives included)."""
    try:
        seconds = float(timeout_millis) / 1000.0
    except (TypeError, ValueError):
        return 30.0
    if math.isnan(seconds) or seconds < 0:
        return 0.0
    return min(seconds, threading.TIMEOUT_MAX)


def shutdown_within(component: Any, timeout_millis: float) -> None:
    """``component.shutdown(timeout_millis=...)`` where its ``shutdown`` takes a timeout (ours,
    processors), else ``component.shutdown()`` (the SDK's ``SpanExporter`` takes none). What it
    raises is raised."""
    stopper = component.shutdown
    try:
        takes_timeout = "timeout_millis" in inspect.signature(stopper).parameters
    except (TypeError, ValueError):  # a builtin or an odd callable: no signature to read
        takes_timeout = False
    if takes_timeout:
        stopper(timeout_millis=timeout_millis)
    else:
        stopper()
