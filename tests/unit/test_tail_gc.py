"""What a provisional trajectory costs the cyclic GC while it waits: every object a buffered span
keeps tracked counts towards the next young collection (which also scans the rollout's fresh
token lists), so a buffered span is held by a few tracked objects, not by the SDK's ~11."""

from __future__ import annotations

import gc

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

from otel_verl import semconv
from otel_verl.exporters._tail import TailSamplingProcessor

CHILDREN = 60


def _trajectory(tracer, *, fail: bool = False):
    """A provisional trajectory span with ``CHILDREN`` ended LLM-like children; returns the open
    trajectory span (its children wait in the tail buffer)."""
    root = tracer.start_span("agent_loop", attributes={
        semconv.OTEL_VERL_TRAJECTORY: True, semconv.OTEL_VERL_PROVISIONAL: True,
        semconv.ROLLOUT_STEP: 1, semconv.ROLLOUT_SAMPLE_INDEX: 0})
    parent = set_span_in_context(root)
    for i in range(CHILDREN):
        child = tracer.start_span(f"chat {i}", context=parent, kind=SpanKind.CLIENT, attributes={
            "gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 32768 + i,
            semconv.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",), "otel_verl.op": "generate"})
        if fail and i == CHILDREN - 1:
            child.add_event("exception", {"exception.type": "ValueError"})
            child.set_status(Status(StatusCode.ERROR, "boom"))
        child.end()
    return root


def _setup():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(TailSamplingProcessor(SimpleSpanProcessor(exporter),
                                                      keep=("errors",)))
    return provider, exporter


def test_a_buffered_span_keeps_few_gc_tracked_objects():
    provider, exporter = _setup()
    root = _trajectory(provider.get_tracer("t"))
    gc.collect()
    gc.disable()
    try:
        held = len(gc.get_objects())
        root.end()  # no rule keeps it: the buffered children are dropped
        del root
        gc.collect()
        freed = held - len(gc.get_objects())
    finally:
        gc.enable()
    assert exporter.get_finished_spans() == ()
    # the SDK's finished span: ~11 (a ReadableSpan, its context and flags, the attribute table,
    # two bounded lists with their deques, three locks); compacted: ~3
    assert 0 < freed / CHILDREN <= 4.5, freed / CHILDREN
    provider.shutdown()


def test_a_kept_trajectory_exports_its_buffered_spans_unchanged():
    provider, exporter = _setup()
    _trajectory(provider.get_tracer("t"), fail=True).end()
    spans = exporter.get_finished_spans()
    children = sorted((s for s in spans if s.name.startswith("chat ")),
                      key=lambda s: int(s.name.split()[1]))
    root = next(s for s in spans if s.name == "agent_loop")
    assert len(children) == CHILDREN
    for i, span in enumerate(children):
        assert dict(span.attributes) == {
            "gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 32768 + i,
            semconv.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",), "otel_verl.op": "generate"}
        assert span.parent.span_id == root.context.span_id and span.kind is SpanKind.CLIENT
        assert span.start_time <= span.end_time
    last = children[-1]
    assert last.status.status_code is StatusCode.ERROR and last.status.description == "boom"
    assert [(e.name, dict(e.attributes)) for e in last.events] == [
        ("exception", {"exception.type": "ValueError"})]
    assert root.attributes[semconv.ROLLOUT_SAMPLING_REASON] == semconv.SamplingReason.ERROR
    assert root.attributes[semconv.ROLLOUT_SAMPLING_WEIGHT] == 1.0
    provider.shutdown()


def test_a_compact_span_is_not_copied_again():
    """The tail buffer compacts a span; the batch processor's ``compact`` then keeps it as is."""
    from otel_verl._hotpath import compact

    provider, _ = _setup()
    seen = []
    provider.add_span_processor(SimpleSpanProcessor(type("Sink", (InMemorySpanExporter,), {
        "export": lambda self, spans: seen.extend(spans) or 0})()))
    provider.get_tracer("t").start_span("s", attributes={"a": 1}).end()
    small = compact(seen[0])
    assert small is not seen[0] and compact(small) is small
    assert dict(small.attributes) == {"a": 1} and small.events == () and small.links == ()
    provider.shutdown()
