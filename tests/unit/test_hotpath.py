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
    attrs = {"rollout.step": 3, "session.id": "e/step-3/sample-1", "reasons": ("stop",)}
    with monkeypatch.context() as patch:
        patch.setattr(_hotpath, "BoundedAttributes", None)  # the SDK cleaner is not reached
        clean = clean_attributes(attrs)
    merge_clean(span, clean)
    assert calls == []  # one dict insert, no SDK re-validation
    assert dict(span.attributes) == attrs
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


# --- the export thread's allocations: encode_line span by span --------------------------------

def _finished_spans(n: int, names=("a",), resources=1, values=("v",)):
    from opentelemetry.sdk.resources import Resource

    spans = []
    for r in range(resources):
        tracer_provider = TracerProvider(resource=Resource.create({"service.name": f"s{r}"}))
        exporter = InMemorySpanExporter()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        for scope in names:
            tracer = tracer_provider.get_tracer(scope)
            for i in range(n):
                with tracer.start_as_current_span(f"op{i}", attributes={
                        "k": values[i % len(values)], "n": i, "b": True, "t": (1, 2)}) as span:
                    span.add_event("e", {"x": i})
        spans += exporter.get_finished_spans()
    return spans


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3,
                                   unique=True), st.integers(1, 3),
       st.lists(st.text(max_size=12), min_size=1, max_size=4), st.randoms())
def test_encode_line_is_the_bytes_of_the_whole_request(n, names, resources, values, rnd):
    import json

    from otel_verl._otlp_json import _SPAN_SENTINEL, encode_line, encode_request

    values = [*values, _SPAN_SENTINEL + "0", "\ud800 lone", "]["]  # hostile look-alikes
    spans = _finished_spans(n, tuple(names), resources, tuple(values))
    rnd.shuffle(spans)  # groups interleaved in the batch
    whole = json.dumps(encode_request(spans), ensure_ascii=False, separators=(",", ":"))
    assert encode_line(spans) == whole.encode("utf-8", "replace") + b"\n"


def test_encode_line_does_not_feed_the_young_generation():
    """A 1024-span batch used to hold ~35 dicts per span at once (the whole request): dozens of
    young collections per batch on the export thread, each one also scanning the rollout's new
    token lists while holding the GIL. Span by span, it stays under one collection's threshold."""
    import gc
    import json

    from otel_verl._otlp_json import encode_line, encode_request

    spans = _finished_spans(1024)
    counts = []

    def count(phase, info):
        if phase == "start":
            counts.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        encode_line(spans)
        ours = len(counts)
        counts.clear()
        json.dumps(encode_request(spans))  # the whole request at once, as before
        whole = len(counts)
    finally:
        gc.callbacks.remove(count)
    assert ours <= 2 < 10 <= whole, (ours, whole)


# --- compact: a queued span held by fewer GC-tracked objects ----------------------------------

def _public(span):
    return (span.name, span.context, span.parent, span.resource, dict(span.attributes),
            [(e.name, dict(e.attributes), e.timestamp) for e in span.events],
            [(lk.context, dict(lk.attributes)) for lk in span.links], span.kind,
            span.status.status_code, span.status.description, span.start_time, span.end_time,
            span.instrumentation_scope, span.dropped_attributes, span.dropped_events,
            span.dropped_links, span.to_json())


def _tracked_from(obj) -> int:
    import gc

    seen: set[int] = set()
    shared = {id(obj.resource), id(obj.instrumentation_scope)}
    stack = [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen or id(o) in shared or not gc.is_tracked(o) or isinstance(o, type):
            continue
        seen.add(id(o))
        stack.extend(gc.get_referents(o))
    return len(seen)


def test_compact_is_the_same_span_with_fewer_tracked_objects():
    from opentelemetry.trace import Link, Status, StatusCode

    from otel_verl._hotpath import compact

    tracer, exporter = _tracer()
    with tracer.start_as_current_span("p") as parent:
        pass
    with tracer.start_as_current_span("s", attributes={"a": "b", "t": (1, 2)},
                                      links=[Link(parent.get_span_context(), {"l": 1})]) as span:
        span.add_event("e", {"x": 1})
        span.set_status(Status(StatusCode.ERROR, "bad"))
    finished = exporter.get_finished_spans()[-1]
    small = compact(finished)
    assert small is not finished and _public(small) == _public(finished)
    assert _tracked_from(small) < _tracked_from(finished)
    bare = tracer.start_span("bare")
    bare.end()
    plain = exporter.get_finished_spans()[-1]
    assert _tracked_from(compact(plain)) <= _tracked_from(plain) - 6  # 12 -> about 4


def test_compact_keeps_a_span_whose_limits_dropped_something():
    from otel_verl._hotpath import compact

    tracer, exporter = _tracer(SpanLimits(max_span_attributes=1, max_events=1))
    with tracer.start_as_current_span("s", attributes={"a": 1, "b": 2}) as span:
        span.add_event("e1")
    with tracer.start_as_current_span("t") as span:
        span.add_event("e1")
        span.add_event("e2")
    for finished in exporter.get_finished_spans():
        assert compact(finished) is finished  # the dropped counts live on the SDK's containers
        assert finished.dropped_attributes or finished.dropped_events


def test_the_batch_processor_queues_compacted_spans():
    from otel_verl.exporters._processor import BoundedBatchProcessor

    got = []

    class Keep(InMemorySpanExporter):
        def export(self, spans):
            got.extend(spans)
            return super().export(spans)

    processor = BoundedBatchProcessor(Keep())
    provider = TracerProvider()
    provider.add_span_processor(processor)
    with provider.get_tracer("t").start_as_current_span("s", attributes={"k": "v"}) as span:
        span.add_event("e")
    assert processor.force_flush(5000)
    processor.shutdown()
    (exported,) = got
    assert type(exported._attributes) is dict  # compacted: the SDK's table is not kept alive
    assert dict(exported.attributes) == {"k": "v"} and [e.name for e in exported.events] == ["e"]


def test_a_queued_span_adds_no_pair_for_the_young_gc_and_exports_the_same():
    """Each object a queued span allocates counts towards the next young collection (which
    also scans the rollout's fresh 32k-token lists): the compact copy and nothing else (its
    size waits in a deque of ints, not in a (span, size) tuple); the span that reaches the
    exporter is the one that ended. (Packing the span into one tuple of ints retains fewer
    objects, but the export thread then makes a context, flags and a span again for each span
    of a batch, all alive at once: more collections in the rollout bench, not fewer.)"""
    import gc

    from otel_verl.exporters._processor import BoundedBatchProcessor

    exporter = InMemorySpanExporter()
    processor = BoundedBatchProcessor(exporter, schedule_delay_s=3600,
                                      max_export_batch_size=100_000)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")

    def end(n: int) -> None:
        for i in range(n):
            with tracer.start_as_current_span("parent") as parent:
                parent.set_attribute("i", i)
                with tracer.start_as_current_span("child", attributes={"k": "v", "i": i}):
                    pass

    end(5)
    gc.collect()
    before = len(gc.get_objects())
    end(200)
    gc.collect()
    per_span = (len(gc.get_objects()) - before) / 400
    # the copy, its SpanContext and TraceFlags (attribute dicts of atoms are untracked)
    assert per_span <= 3.2, per_span  # 4.0 with a (span, size) tuple each
    with tracer.start_as_current_span("parent") as parent:
        with tracer.start_as_current_span("child", attributes={"k": "v", "i": 199}) as span:
            span.add_event("e", {"n": 1})
    assert processor.force_flush(5000)
    processor.shutdown()
    spans = exporter.get_finished_spans()
    assert len(spans) == 412
    child, parent = spans[-2], spans[-1]
    assert (child.name, parent.name) == ("child", "parent")
    assert child.parent is not None and child.parent.span_id == parent.context.span_id
    assert child.parent.trace_id == parent.context.trace_id == child.context.trace_id
    assert child.context.trace_flags.sampled and child.parent.trace_flags.sampled
    assert dict(child.attributes) == {"k": "v", "i": 199} and child.events[0].name == "e"
    assert child.start_time <= child.end_time and child.resource is parent.resource
    assert child.instrumentation_scope is not None and child.instrumentation_scope.name == "t"
