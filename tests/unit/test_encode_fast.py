"""The export thread's OTLP/JSON encoder: orjson where it writes the stdlib's bytes, else the stdlib.

The file format is ``json.dumps(encode_request(spans), ensure_ascii=False, separators=(",", ":"))``
as UTF-8 with lone surrogates as ``?`` (the reference, ``_otlp_json._dumps``). ``encode_line`` and
``encode_span_line`` must write exactly those bytes for any span, with or without orjson: the
store readers, the durable log's replay and the collector hop then read what they read before.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.span import TraceState

from otel_verl import _otlp_json
from otel_verl._otlp_json import (
    _SPAN_SENTINEL,
    decode_line,
    encode_line,
    encode_request,
    encode_span_line,
    iter_spans,
)


def _reference(spans) -> bytes:
    """The file format's definition: the stdlib's bytes of the whole request."""
    return _otlp_json._dumps(encode_request(spans)).encode("utf-8", "replace") + b"\n"


class _Float(float):
    """A float subclass (numpy's float64 is one): orjson refuses it, the stdlib writes its repr."""


_SPECIAL_TEXT = ("", "\ud800", "\udfff\ud800", "a\ud83d\ude00b", "\x00", "\x1f\x7f\u2028\u2029",
                 '"doubleValue":', '{"doubleValue":1e-05}', "é✓😀", "\\", '"', "\n\r\t\b\f",
                 _SPAN_SENTINEL, _SPAN_SENTINEL + "0", _SPAN_SENTINEL + "1", "}", "NaN")
# every code point, lone surrogates included
_text = st.one_of(st.sampled_from(_SPECIAL_TEXT),
                  st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF,
                                        exclude_categories=()), max_size=40))
_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
                    st.sampled_from([1e-05, 2.5e-07, 1e16, 1e22, 5e-324, -0.0, 0.1, 1e-4,
                                     1.2345678901234568e+16]),
                    st.floats(allow_nan=False).map(_Float))
_scalars = st.one_of(_text, st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                     st.integers(min_value=-(2**63), max_value=2**63 - 1), _floats,
                     st.binary(max_size=16), st.none())
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(_text, inner, max_size=3)),
    max_leaves=12)
_attrs = st.dictionaries(_text, _values, max_size=6)


@st.composite
def _spans(draw):
    resource = Resource(draw(_attrs), draw(st.sampled_from(["", "https://r/1", "\ud800"])))
    scopes = [InstrumentationScope(draw(_text), draw(st.one_of(st.none(), _text)),
                                   draw(st.one_of(st.none(), _text)), draw(_attrs))
              for _ in range(draw(st.integers(1, 2)))]
    spans = []
    for i in range(draw(st.integers(1, 4))):
        state = TraceState([("k", "v")]) if draw(st.booleans()) else None
        ctx = SpanContext(draw(st.integers(1, 2**128 - 1)), draw(st.integers(1, 2**64 - 1)),
                          is_remote=False, trace_state=state)
        parent = SpanContext(1, i + 1, is_remote=draw(st.booleans())) \
            if draw(st.booleans()) else None
        events = [Event(draw(_text), draw(_attrs), draw(st.integers(0, 2**63 - 1)))
                  for _ in range(draw(st.integers(0, 2)))]
        links = [Link(SpanContext(3, 4, is_remote=True), draw(_attrs))
                 for _ in range(draw(st.integers(0, 1)))]
        status = Status(draw(st.sampled_from(list(StatusCode))), draw(st.one_of(st.none(), _text)))
        if status.status_code is not StatusCode.ERROR:
            status = Status(status.status_code)
        spans.append(ReadableSpan(
            name=draw(_text), context=ctx, parent=parent, resource=resource,
            attributes=draw(_attrs), events=events, links=links,
            kind=draw(st.sampled_from(list(SpanKind))), status=status,
            start_time=draw(st.integers(0, 2**63 - 1)), end_time=draw(st.integers(0, 2**63 - 1)),
            instrumentation_scope=draw(st.sampled_from(scopes))))
    return spans


@pytest.fixture(params=["orjson", "stdlib"])
def encoder(request, monkeypatch):
    if request.param == "stdlib":
        monkeypatch.setattr(_otlp_json, "_orjson", None)
    else:
        assert _otlp_json._orjson is not None  # a core dependency: installed in every tier
    _otlp_json._FRAMES.clear()
    return request.param


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.data_too_large])
@given(spans=_spans())
def test_encode_line_writes_the_reference_bytes_for_hostile_spans(spans):
    expected = _reference(spans)
    for fast in (True, False):  # with orjson, and with the stdlib alone (orjson not installed)
        saved = _otlp_json._orjson
        if not fast:
            _otlp_json._orjson = None
        try:
            assert encode_line(spans) == expected
            for span in spans:
                assert encode_span_line(span) == _reference([span])
        finally:
            _otlp_json._orjson = saved
            _otlp_json._FRAMES.clear()
    # and the line still reads back: every span, in order
    decoded = list(iter_spans(decode_line(expected)))
    assert len(decoded) == len(spans)


@settings(max_examples=200, deadline=None)
@given(value=_floats)
def test_doubles_keep_the_stdlib_notation(value):
    span = ReadableSpan("d", SpanContext(1, 2, is_remote=False), attributes={"x": value,
                                                                             "l": [value, 1.5]})
    line = encode_line([span])
    assert line == _reference([span])
    attrs = {kv["key"]: kv["value"] for kv in
             json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"]}
    got = attrs["x"]["doubleValue"]
    if math.isnan(value):
        assert got == "NaN"
    elif math.isinf(value):
        assert got == ("Infinity" if value > 0 else "-Infinity")
    else:
        assert got == value and repr(float(value)).encode() in line


def _plain_span(i: int, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    return ReadableSpan(f"op{i}", SpanContext(7, i + 1, is_remote=False), resource=resource,
                        instrumentation_scope=scope,
                        attributes={"input.value": '{"prompt_ids":[1,2,3]}', "t": 0.7,
                                    "tiny": 1e-05, "n": i, "ok": True, "l": ("a", "b")},
                        start_time=1, end_time=2)


def test_ordinary_spans_never_reach_the_stdlib_encoder(monkeypatch):
    """The point of the change: the export thread's encoding is orjson's (the stdlib's pure
    Python iterencode held the GIL ~15x longer), doubles included; the stdlib only for what
    orjson refuses, and then for that span alone."""
    _otlp_json._FRAMES.clear()
    resource, scope = Resource({"service.name": "svc"}), InstrumentationScope("s", "1")
    spans = [_plain_span(i, resource, scope) for i in range(5)]
    bad = ReadableSpan("bad\ud800", SpanContext(7, 99, is_remote=False), resource=resource,
                       instrumentation_scope=scope)
    expected = [_reference(spans), _reference([spans[0]]), _reference([*spans, bad])]
    calls = []
    real = json.dumps

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(json, "dumps", counting)
    assert encode_line(spans) == expected[0]
    assert encode_span_line(spans[0]) == expected[1]
    assert calls == []
    assert encode_line([*spans, bad]) == expected[2]
    assert [c.get("name") for c in calls] == ["bad\ud800"]


@pytest.mark.parametrize("where", ["resource", "scope"])
def test_an_attribute_spelling_the_placeholder_does_not_move_the_spans(where, encoder):
    """A resource or scope attribute equal to the placeholder used to be taken for it: the
    spans were written in the attribute's place and the scope's ``spans`` became a string."""
    hostile = {"x": _SPAN_SENTINEL + "0"}
    resource = Resource(hostile if where == "resource" else {"service.name": "svc"})
    scope = InstrumentationScope("s", "1", None, hostile if where == "scope" else None)
    spans = [_plain_span(i, resource, scope) for i in range(3)]
    line = encode_line(spans)
    assert line == _reference(spans)
    assert [s["name"] for s in iter_spans(decode_line(line))] == ["op0", "op1", "op2"]
    assert encode_span_line(spans[0]) == _reference([spans[0]])


def test_a_long_batch_lets_a_waiting_thread_take_the_gil(monkeypatch):
    """The export thread releases the GIL every ``_YIELD_EVERY`` spans while it encodes a
    batch, as it does between the spans it scrubs: a waking event loop waits for a few spans'
    work, not for the interpreter's 5 ms switch interval."""
    resource, scope = Resource({"service.name": "svc"}), InstrumentationScope("s", "1")
    spans = [_plain_span(i, resource, scope) for i in range(4 * _otlp_json._YIELD_EVERY)]
    expected = _reference(spans)
    sleeps = []
    monkeypatch.setattr(_otlp_json.time, "sleep", sleeps.append)
    assert encode_line(spans) == expected
    assert sleeps == [0] * 4
