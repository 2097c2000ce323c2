"""The light span (``otel_verl._hotpath.LightSpan``, started by ``_hotpath.start_span``): an open
span holds few objects the cyclic GC tracks, it is the SDK's span in every field a processor or
an exporter reads (ids, parent, flags, attributes, events, links, status, limits and their drop
counts, the OTLP encodings), and with an SDK of another shape, another sampler or a parent that
is not sampled, the SDK's own ``start_span`` runs instead."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from otel_verl import RolloutTraceConfig, _hotpath, rollout_trace_attr, rollout_trace_op
from otel_verl._hotpath import LightSpan, clean_attributes, merge_clean, start_span
from otel_verl._otlp_json import encode_request


@pytest.fixture(autouse=True)
def _fresh_starters():
    _hotpath._STARTERS.clear()
    yield
    _hotpath._STARTERS.clear()


def _tracer(limits: SpanLimits | None = None, **kwargs):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits, shutdown_on_exit=False, **kwargs)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("t", "1.0"), exporter


def test_the_installed_sdk_takes_the_light_span():
    # fails after an SDK upgrade the light span was not checked on: then look at _hotpath again
    assert _hotpath.LIGHT_SPAN_OK
    tracer, exporter = _tracer()
    span = start_span(tracer, "s")
    assert type(span) is LightSpan and isinstance(span, sdk_trace.Span)
    span.end()
    (finished,) = exporter.get_finished_spans()
    assert type(finished) is ReadableSpan


# --- the cyclic GC: objects an open span keeps tracked ---------------------------------------------

def _new_tracked(roots: list, old: list) -> int:
    """GC-tracked objects reachable from ``roots`` that did not exist in ``old`` (a list of
    every tracked object before, held so that no id is reused), ``roots`` itself left out:
    what other threads allocate meanwhile is not counted."""
    seen = {id(o) for o in old}
    seen.add(id(roots))
    count, todo = 0, list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or not gc.is_tracked(obj):
            continue
        seen.add(id(obj))
        count += 1
        todo.extend(gc.get_referents(obj))
    return count


def _tracked_per_open_span(start, n=200) -> float:
    gc.collect()
    old = gc.get_objects()
    spans = [start() for _ in range(n)]
    held = _new_tracked(spans, old)
    for span in spans:
        span.end()
    return held / n


def test_an_open_light_span_holds_few_gc_tracked_objects():
    tracer, _ = _tracer()
    root = tracer.start_span("root")
    token = context_api.attach(trace_api.set_span_in_context(root))
    try:
        sdk = _tracked_per_open_span(lambda: tracer.start_span("s", attributes={"a": 1}))
        light = _tracked_per_open_span(lambda: start_span(tracer, "s", attributes={"a": 1}))
    finally:
        context_api.detach(token)
    # the SDK's: the span, its context and flags, the attribute table, two bounded lists with
    # a deque each, four locks; light: the span, its context, its attribute table
    assert sdk >= 11, sdk
    assert light <= 3, light


@rollout_trace_op(capture_input=False, capture_output=False)
def _suspended(i):
    yield i
    yield i


def _held_per_open_op(trace: bool, n: int = 100) -> float:
    with rollout_trace_attr(step=1, sample_index=0, trace=trace):
        gc.collect()
        old = gc.get_objects()
        gens = [_suspended(i) for i in range(n)]
        for gen in gens:
            next(gen)  # the op's span is open while the generator waits
        held = _new_tracked(gens, old)
        for gen in gens:
            list(gen)
    return held / n


def test_an_open_traced_op_adds_few_gc_tracked_objects():
    exporter = InMemorySpanExporter()
    RolloutTraceConfig.init("p", "e", "console", exporter=exporter, processor="simple",
                            live=False)
    try:
        added = _held_per_open_op(True) - _held_per_open_op(False)
    finally:
        RolloutTraceConfig.shutdown()
    # with the SDK's span: 14 (its 12, the op's call record, the context token); now 5
    assert 0 < added <= 6, added
    assert len([s for s in exporter.get_finished_spans() if s.name.endswith("_suspended")]) == 100


# --- the same span in every exported field ---------------------------------------------------------

_keys = st.text(min_size=1, max_size=6)
_values = st.one_of(st.text(max_size=12), st.integers(-(2**63), 2**63 - 1), st.booleans(),
                    st.floats(allow_nan=False), st.none(), st.binary(max_size=4),
                    st.lists(st.integers(0, 9), max_size=3), st.tuples(st.text(max_size=3)),
                    st.lists(st.text(max_size=3), max_size=3))
_attrs = st.dictionaries(_keys, _values, max_size=8)
_limits = st.sampled_from([None, SpanLimits(max_span_attributes=3, max_events=2, max_links=1,
                                            max_event_attributes=2, max_link_attributes=1),
                           SpanLimits(max_span_attribute_length=4, max_attribute_length=3)])
_operations = st.lists(st.one_of(
    st.tuples(st.just("set_attribute"), _keys, _values),
    st.tuples(st.just("set_attributes"), _attrs),
    st.tuples(st.just("merge_clean"), _attrs),
    st.tuples(st.just("add_event"), st.text(max_size=5), _attrs),
    st.tuples(st.just("add_link"), _attrs),
    st.tuples(st.just("set_status"), st.sampled_from([StatusCode.OK, StatusCode.ERROR]),
              st.one_of(st.none(), st.text(max_size=5))),
    st.tuples(st.just("record_exception"), st.text(max_size=5)),
    st.tuples(st.just("update_name"), st.text(max_size=5))), max_size=8)


def _apply(span, operations, when: int) -> None:
    for i, operation in enumerate(operations):
        name, *args = operation
        if name == "set_attribute":
            span.set_attribute(*args)
        elif name == "set_attributes":
            span.set_attributes(args[0])
        elif name == "merge_clean":
            merge_clean(span, clean_attributes(args[0]))
        elif name == "add_event":
            span.add_event(args[0], args[1], timestamp=when + i)
        elif name == "add_link":
            span.add_link(SpanContext(7, 100 + i, True, TraceFlags(1)), args[0])
        elif name == "set_status":
            span.set_status(Status(args[0], args[1] if args[0] is StatusCode.ERROR else None))
        elif name == "record_exception":
            span.record_exception(ValueError(args[0]), {"k": 1}, timestamp=when + i)
        else:
            span.update_name(args[0])


def _fields(span: ReadableSpan) -> dict:
    """Everything a processor or an exporter can read of a finished span, ids and times left out
    (they differ between two spans); the parent's and the flags and state kept."""
    def event(e):
        return (e.name, e.timestamp, dict(e.attributes or {}), e.dropped_attributes)

    def link(k):
        return (k.context, dict(k.attributes or {}), k.dropped_attributes)

    return {
        "type": type(span), "name": span.name, "kind": span.kind, "parent": span.parent,
        "trace_flags": span.context.trace_flags, "trace_state": span.context.trace_state,
        "is_remote": span.context.is_remote, "attributes": dict(span.attributes),
        "attribute_order": list(span.attributes), "dropped_attributes": span.dropped_attributes,
        "events": [event(e) for e in span.events], "dropped_events": span.dropped_events,
        "links": [link(k) for k in span.links], "dropped_links": span.dropped_links,
        "status": (span.status.status_code, span.status.description),
        "resource": span.resource, "scope": span.instrumentation_scope,
        "timed": span.start_time is not None and span.end_time >= span.start_time}


def _otlp(span: ReadableSpan, *, root: bool) -> tuple:
    """The span's OTLP/JSON (otel_verl's codec) and OTLP protobuf (the SDK exporters' encoder),
    span id and times cleared (and the trace id of a root span)."""
    request = encode_request([span])
    (json_span,) = request["resourceSpans"][0]["scopeSpans"][0]["spans"]
    for key in ("spanId", "startTimeUnixNano", "endTimeUnixNano") + (("traceId",) if root else ()):
        json_span.pop(key, None)
    proto = encode_spans([span])
    (proto_span,) = proto.resource_spans[0].scope_spans[0].spans
    for key in ("span_id", "start_time_unix_nano", "end_time_unix_nano") + (
            ("trace_id",) if root else ()):
        proto_span.ClearField(key)
    return request, proto.SerializeToString(deterministic=True)


@settings(max_examples=150, deadline=None)
@given(attrs=_attrs, limits=_limits, operations=_operations,
       kind=st.sampled_from(list(SpanKind)), parent=st.sampled_from(["none", "local", "remote"]))
def test_the_light_span_is_the_sdk_span_in_every_exported_field(attrs, limits, operations, kind,
                                                                parent):
    tracer, exporter = _tracer(limits)
    token = None
    if parent == "local":
        root = tracer.start_span("root")
        token = context_api.attach(trace_api.set_span_in_context(root))
    elif parent == "remote":
        remote = SpanContext(0xABC, 0xDEF, True, TraceFlags(TraceFlags.SAMPLED),
                             TraceState([("vendor", "x")]))
        token = context_api.attach(trace_api.set_span_in_context(NonRecordingSpan(remote)))
    try:
        clean = clean_attributes(attrs)
        light = start_span(tracer, "op", kind, clean)
        sdk = tracer.start_span("op", kind=kind, attributes=clean)
    finally:
        if token is not None:
            context_api.detach(token)
    assert type(light) is LightSpan and type(sdk) is sdk_trace._Span
    assert light.is_recording() and light.get_span_context().is_valid
    for span in (light, sdk):
        _apply(span, operations, when=1_000)
        span.end()
        span.set_attribute("after.end", 1)  # ignored (and warned about) by both
    ours, theirs = (s for s in exporter.get_finished_spans() if s.name != "root")
    assert _fields(ours) == _fields(theirs)
    assert _otlp(ours, root=parent == "none") == _otlp(theirs, root=parent == "none")
    if parent != "none":
        assert ours.context.trace_id == theirs.context.trace_id == ours.parent.trace_id
    assert ours.context.span_id != theirs.context.span_id


def test_a_light_span_is_current_for_its_children_and_for_the_sdk():
    tracer, exporter = _tracer()
    parent = start_span(tracer, "parent")
    with trace_api.use_span(parent, end_on_exit=True):
        child = start_span(tracer, "child")
        with tracer.start_as_current_span("sdk child") as sdk_child:
            grandchild = start_span(tracer, "grandchild")
            grandchild.end()
        child.end()
    assert type(child) is LightSpan and type(sdk_child) is sdk_trace._Span
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["child"].parent == spans["sdk child"].parent == spans["parent"].context
    assert spans["grandchild"].parent == spans["sdk child"].context
    assert {s.context.trace_id for s in spans.values()} == {spans["parent"].context.trace_id}
    assert spans["parent"].parent is None


def test_a_span_used_as_a_context_manager_records_the_exception():
    tracer, exporter = _tracer()
    with pytest.raises(KeyError), start_span(tracer, "op"):  # the span's own __exit__
        raise KeyError("k")
    with pytest.raises(KeyError), trace_api.use_span(start_span(tracer, "op"),
                                                     end_on_exit=True):
        raise KeyError("k")
    for span in exporter.get_finished_spans():
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "KeyError: 'k'"
        assert [e.name for e in span.events] == ["exception"]
        assert span.events[0].attributes["exception.type"] == "KeyError"


# --- the SDK's own start_span wherever the light span does not apply -------------------------------

def test_an_sdk_of_another_shape_takes_the_sdk_path(monkeypatch):
    assert _hotpath._light_span_ok()
    with monkeypatch.context() as patch:  # an SDK whose span gained a field
        patch.setattr(_hotpath, "_SPAN_FIELDS", _hotpath._SPAN_FIELDS - {"_limits"})
        assert not _hotpath._light_span_ok()
    with monkeypatch.context() as patch:  # a new SDK method writing the event list
        patch.setattr(sdk_trace.Span, "_clear_events", lambda self: self._events.clear(),
                      raising=False)
        assert not _hotpath._light_span_ok()
    with monkeypatch.context() as patch:  # start_span does something new
        patch.setattr(_hotpath, "_START_SPAN_NAMES", _hotpath._START_SPAN_NAMES | {"new_step"})
        assert not _hotpath._light_span_ok()
    with monkeypatch.context() as patch:  # a version it was not checked on
        patch.setattr(_hotpath, "_CHECKED_SDK", ((1, 0), (1, 1)))
        assert not _hotpath._light_span_ok()
    monkeypatch.setattr(_hotpath, "LIGHT_SPAN_OK", False)
    tracer, exporter = _tracer()
    span = start_span(tracer, "op", SpanKind.CLIENT, {"a": 1})
    assert type(span) is sdk_trace._Span
    merge_clean(span, {"b": 2})
    span.end()
    (finished,) = exporter.get_finished_spans()
    assert dict(finished.attributes) == {"a": 1, "b": 2} and finished.kind is SpanKind.CLIENT


def test_the_shape_check_does_not_depend_on_the_environment_s_sampler(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    assert _hotpath._light_span_ok()
    tracer, exporter = _tracer()  # this provider's sampler is always_off: the SDK path
    assert type(start_span(tracer, "op")) is NonRecordingSpan


def test_the_traced_api_without_the_light_span(monkeypatch):
    monkeypatch.setattr(_hotpath, "LIGHT_SPAN_OK", False)
    exporter = InMemorySpanExporter()
    RolloutTraceConfig.init("p", "e", "console", exporter=exporter, processor="simple",
                            live=False)
    try:
        with rollout_trace_attr(step=2, sample_index=3):
            list(_suspended(1))
    finally:
        RolloutTraceConfig.shutdown()
    spans = {s.name.rsplit(".", 1)[-1]: s for s in exporter.get_finished_spans()}
    assert spans["_suspended"].parent == spans["rollout_trace"].context
    assert spans["_suspended"].attributes["rollout.step"] == 2


def test_another_sampler_takes_the_sdk_path():
    tracer, exporter = _tracer(sampler=TraceIdRatioBased(1.0))
    span = start_span(tracer, "op")
    assert type(span) is sdk_trace._Span
    span.end()
    assert len(exporter.get_finished_spans()) == 1


def test_a_parent_not_sampled_gives_the_sdk_non_recording_span():
    tracer, exporter = _tracer()
    unsampled = SpanContext(0xABC, 0xDEF, False, TraceFlags(TraceFlags.DEFAULT))
    token = context_api.attach(trace_api.set_span_in_context(NonRecordingSpan(unsampled)))
    try:
        span = start_span(tracer, "op")
    finally:
        context_api.detach(token)
    assert not span.is_recording() and type(span) is NonRecordingSpan
    assert span.get_span_context().trace_id == 0xABC
    span.end()
    assert exporter.get_finished_spans() == ()


def test_a_sampler_changed_later_is_honoured():
    tracer, exporter = _tracer()
    start_span(tracer, "light").end()
    tracer.sampler = TraceIdRatioBased(0.0)  # a provider's sampler can be swapped at run time
    span = start_span(tracer, "dropped")
    assert not span.is_recording()
    assert [s.name for s in exporter.get_finished_spans()] == ["light"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork: POSIX only")
def test_a_child_forked_while_another_thread_held_the_shared_lock_can_start_spans():
    tracer, _ = _tracer()
    held, release = threading.Event(), threading.Event()

    def hold():
        with _hotpath._LOCK:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: the holder thread does not exist here
        code = 1
        try:  # on the child's main thread (a new thread may get the holder's thread id)
            signal.signal(signal.SIGALRM, lambda *_: os._exit(4))
            signal.alarm(10)
            if not _hotpath._LOCK.acquire(timeout=5):
                os._exit(3)
            _hotpath._LOCK.release()
            span = start_span(tracer, "in child")
            span.set_attribute("k", 1)
            span.end()
            code = 0
        finally:
            os._exit(code)
    release.set()
    thread.join()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        waited, status = os.waitpid(pid, os.WNOHANG)
        if waited:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on the shared span lock")
    assert os.waitstatus_to_exitcode(status) == 0
