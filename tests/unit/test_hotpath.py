"""The per-span fast path (``otel_verl._hotpath``): attributes validated once, inserted in one step.

It writes into the SDK span's private attribute dict, so these tests pin both halves: the
installed SDK still has the shape it relies on (``SDK_SHAPE_OK``: fails when an SDK upgrade
changes it), and what it stores equals what ``span.set_attributes`` stores, on every path
(plain values, values that need cleaning, a value-length limit, a full attribute table, an
ended span).
"""

from __future__ import annotations

import logging

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_verl import _hotpath
from otel_verl._hotpath import attribute_map, clean_attributes, merge_clean
from otel_verl.exporters._spans import estimate_bytes


def _tracer(limits: SpanLimits | None = None):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits) if limits else TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("t"), exporter


def test_the_installed_sdk_has_the_shape_the_fast_path_relies_on():
    # fails after an SDK upgrade that moves span attributes: then look at _hotpath again
    assert _hotpath.SDK_SHAPE_OK
    tracer, _ = _tracer()
    span = tracer.start_span("s", attributes={"a": 1})
    assert type(span) is _hotpath._SDK_SPAN_TYPE
    assert span._attributes._dict == {"a": 1}  # what merge_clean writes into
    span.end()


def _both_ways(attrs, limits=None, before=None):
    """(attributes via merge_clean, via the SDK's set_attributes), on twin spans."""
    tracer, _ = _tracer(limits)
    ours, theirs = tracer.start_span("a", attributes=before), tracer.start_span("b",
                                                                                attributes=before)
    merge_clean(ours, clean_attributes(attrs))
    theirs.set_attributes(attrs)
    ours.end()
    theirs.end()
    return dict(ours.attributes), dict(theirs.attributes), ours, theirs


_values = st.one_of(st.text(max_size=20), st.integers(-(2**63), 2**63 - 1), st.booleans(),
                    st.floats(allow_nan=False), st.none(), st.binary(max_size=4),
                    st.lists(st.integers(0, 9), max_size=3), st.tuples(st.text(max_size=3)))


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=8), _values, max_size=12),
       st.dictionaries(st.text(min_size=1, max_size=3), st.integers(), max_size=4))
def test_merge_clean_stores_what_set_attributes_stores(attrs, before):
    ours, theirs, *_ = _both_ways(attrs, before=before)
    assert ours == theirs


def test_fast_path_is_taken_for_plain_values(monkeypatch):
    tracer, _ = _tracer()
    span = tracer.start_span("s")
    calls = []
    monkeypatch.setattr(span, "set_attributes", lambda a: calls.append(a))
    merge_clean(span, {"rollout.step": 3, "session.id": "e/step-3/sample-1"})
    assert calls == []  # one dict insert, no SDK re-validation
    assert dict(span.attributes) == {"rollout.step": 3, "session.id": "e/step-3/sample-1"}
    span.end()


def test_limits_and_ended_spans_take_the_sdk_path():
    # a value-length limit: truncated as the SDK truncates
    ours, theirs, *_ = _both_ways({"k": "x" * 50}, SpanLimits(max_span_attribute_length=8))
    assert ours == theirs == {"k": "x" * 8}
    # a full table: the SDK's eviction (oldest first), not an overflowing dict
    ours, theirs, a, b = _both_ways({f"n{i}": i for i in range(5)},
                                    SpanLimits(max_span_attributes=4),
                                    before={"old": 1, "older": 2})
    assert ours == theirs and len(ours) == 4
    assert a._attributes.dropped == b._attributes.dropped == 3


def test_an_ended_span_is_not_changed(caplog):
    tracer, _ = _tracer()
    span = tracer.start_span("s")
    span.end()
    with caplog.at_level(logging.WARNING):
        merge_clean(span, {"late": 1})
    assert "late" not in span.attributes
    assert "ended span" in caplog.text  # the SDK's own warning


def test_sdk_shape_off_falls_back(monkeypatch):
    monkeypatch.setattr(_hotpath, "SDK_SHAPE_OK", False)
    ours, theirs, *_ = _both_ways({"a": [1, 2], "b": "x"})
    assert ours == theirs == {"a": (1, 2), "b": "x"}


def test_clean_attributes_drops_and_converts_as_the_sdk_does():
    assert clean_attributes({"a": 1, "b": "x"}) == {"a": 1, "b": "x"}
    assert clean_attributes({"": 1, "l": [1, 2], "o": object}) == {"l": (1, 2), "o": str(object)}


def test_estimate_bytes_reads_the_plain_dict_and_events():
    tracer, exporter = _tracer()
    with tracer.start_as_current_span("name", attributes={"k": "v" * 100, "n": 1}) as span:
        span.add_event("ev", {"e": "x" * 10})
    (finished,) = exporter.get_finished_spans()
    assert attribute_map(finished) == {"k": "v" * 100, "n": 1}
    expected = 320 + 4 + (1 + 40 + 100) + (1 + 40 + 24) + 96 + 2 + (1 + 40 + 10)
    assert estimate_bytes(finished) == expected
