"""Op payloads rendered off the calling thread (``_capture.DeferredPayload``): the op's span
holds snapshots of its input and output, and the first reader of the finished span's attributes
renders them, once. What every reader sees is what the eager path gives (the same attributes in
the same order, the same markers), whatever the value; a value changed after the call does not
change the span; a value that cannot be read still gives the error marker; sensitive keys are
still redacted; and the batch processor queues such a span without rendering it."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl import RolloutTraceConfig, _capture, _hotpath, rollout_trace_op, semconv
from otel_verl._hotpath import DeferredReadableSpan, deferred_estimate
from otel_verl._state import STATE
from otel_verl.exporters._processor import BoundedBatchProcessor
from otel_verl.testing import capture_spans

#: a value the fast path leaves to the walk (so deferred, when deferral is on)
NAN = float("nan")


@pytest.fixture(autouse=True)
def _deferred_on():
    old = _capture.DEFER_PAYLOADS
    _capture.DEFER_PAYLOADS = True
    yield
    _capture.DEFER_PAYLOADS = old


@dataclasses.dataclass
class Point:
    x: Any
    y: Any = None


@dataclasses.dataclass
class Broken:
    a: int

    def __post_init__(self) -> None:
        object.__delattr__(self, "a")  # reading the field raises AttributeError


class _ItemsRaise(dict):  # type: ignore[type-arg]
    def items(self):  # type: ignore[override]
        raise RuntimeError("items exploded")


@rollout_trace_op
def op(x: Any, y: Any = None) -> Any:
    return y


@rollout_trace_op
def point(x: Any) -> tuple[str, Point]:
    return "p", Point([1, 2], NAN)


@rollout_trace_op
async def aop(x: Any, y: Any = None) -> Any:
    return y


_keys = st.sampled_from(["a", "b", "messages", "content", "api_key", "password", "token",
                         "x" * 300, "\ud800k", ""]) | st.text(max_size=8)
_leaves = (st.none() | st.booleans() | st.integers() | st.sampled_from([2**64, -(2**63) - 1,
                                                                       2**5000])
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF,
                                   blacklist_categories=()), max_size=40)
           | st.builds(lambda c, n: c * n, st.sampled_from(["a", "é", "sk-ABCDEF", "\ud83d"]),
                       st.integers(0, 3000))
           | st.binary(max_size=80)
           | st.builds(lambda n: list(range(n)), st.integers(0, 1500))
           | st.sampled_from([frozenset({1, 2}), {3, "a"}, object(), b"\xff" * 300,
                              bytearray(b"ab"), 1.5j])
           | st.builds(Broken, st.integers()) | st.builds(_ItemsRaise, a=st.integers()))
_values = st.recursive(
    _leaves,
    lambda inner: (st.lists(inner, max_size=6) | st.lists(inner, max_size=4).map(tuple)
                   | st.dictionaries(_keys, inner, max_size=6)
                   | st.builds(Point, inner, inner)),
    max_leaves=30)


def _run(defer: bool, x: Any, y: Any, **config: Any) -> list[tuple[str, Any]]:
    old = _capture.DEFER_PAYLOADS
    _capture.DEFER_PAYLOADS = defer
    try:
        with capture_spans(**config) as exporter:
            op(x, y=y)
            (span,) = exporter.get_finished_spans()
            return list(span.attributes.items())
    finally:
        _capture.DEFER_PAYLOADS = old


_CONFIGS = st.sampled_from([{}, {"max_field_bytes": 1024, "max_span_bytes": 1500},
                            {"max_field_bytes": 2000, "redact": False},
                            {"content_dedup": False, "max_field_bytes": 700}])


@settings(max_examples=120, suppress_health_check=[HealthCheck.too_slow])
@given(_values, _values, _CONFIGS)
def test_the_deferred_render_gives_what_the_eager_path_gives(x, y, config):
    assert _run(True, x, y, **config) == _run(False, x, y, **config)


def test_the_op_span_is_rendered_by_its_first_reader_not_by_the_call(monkeypatch):
    calls: list[int] = []
    real = _capture.to_payload

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(_capture, "to_payload", counted)
    main = threading.get_ident()
    with capture_spans(processor="batch", durable=False) as exporter:
        point({"messages": [{"role": "user", "content": "hi " * 50}], "at": Point(NAN)})
        assert calls == []  # nothing rendered by the call
        assert RolloutTraceConfig.flush(10.0)
        (span,) = exporter.get_finished_spans()
        assert len(calls) == 2 and main not in calls  # input and output, on the export thread
        assert span.attributes[semconv.OUTPUT_VALUE] == '["p",{"x":[1,2],"y":"nan"}]'
        dict(span.attributes)
        assert len(calls) == 2  # once


def test_a_value_changed_after_the_call_does_not_change_the_span():
    # (a NaN inside: not the fast path, so rendered after the edits)
    x = {"messages": [{"role": "user", "content": "before"}], "n": [1, 2, 3], "p": Point(NAN)}
    y = [{"k": "v"}, [0] * 20, Point([5], NAN)]
    # the batch processor: the span is rendered on the export thread, after the edits below
    with capture_spans(processor="batch", durable=False, schedule_delay_s=30) as exporter:
        op(x, y=y)
        x["messages"][0]["content"] = "after"  # a message edited
        x["messages"].append({"role": "tool", "content": "late"})  # a list appended
        x["n"].append(4)
        x["new"] = 1  # a key added
        y[0]["k"] = "changed"
        y[1].append(9)
        y[2].x.append(6)
        assert type(exporter.get_finished_spans()) is tuple  # (nothing exported yet)
        assert RolloutTraceConfig.flush(10.0)
        (span,) = exporter.get_finished_spans()
        attrs = span.attributes
    expected = _run(False, {"messages": [{"role": "user", "content": "before"}],
                            "n": [1, 2, 3], "p": Point(NAN)}, [{"k": "v"}, [0] * 20, Point([5], NAN)])
    assert list(attrs.items()) == expected
    assert "after" not in attrs[semconv.INPUT_VALUE] and "changed" not in \
        attrs[semconv.OUTPUT_VALUE]


def test_a_value_that_cannot_be_read_gives_the_error_marker():
    with capture_spans() as exporter:
        assert op(Broken(1), y=_ItemsRaise(a=1)) == {"a": 1}
        (span,) = exporter.get_finished_spans()
        attrs = dict(span.attributes)
    assert "AttributeError" in attrs[semconv.OTEL_VERL_PAYLOAD_ERROR]
    assert "items exploded" in attrs[semconv.OTEL_VERL_PAYLOAD_ERROR]


def test_sensitive_keys_are_redacted_in_the_deferred_render():
    secret = "hunter2-very-secret-value"
    with capture_spans() as exporter:
        op({"password": secret, "nested": [{"api_key": secret}]}, y={"token": secret})
        point({"secret": secret})
        spans = exporter.get_finished_spans()
        assert [type(span) for span in spans] == [DeferredReadableSpan] * 2
        attrs = dict(spans[0].attributes)
        assert secret not in repr(attrs) and secret not in repr(dict(spans[1].attributes))
    assert attrs[semconv.OTEL_VERL_REDACTED] == 4  # input x (2), input y, output


def test_async_ops_defer_too():
    import asyncio

    with capture_spans() as exporter:
        asyncio.run(aop([1, 2], y=(Point(NAN),)))
        (span,) = exporter.get_finished_spans()
        assert type(span) is DeferredReadableSpan
        assert span.attributes[semconv.INPUT_VALUE] == '{"x":[1,2],"y":[{"x":"nan","y":null}]}'


def test_the_batch_processor_queues_a_deferred_span_without_rendering_it():
    with capture_spans(processor="batch", durable=False, schedule_delay_s=30) as exporter:
        op({"a": "x" * 1000, "p": Point(NAN)}, y=(Point(NAN),))
        processor = STATE.runtime.processor
        assert type(processor) is BoundedBatchProcessor
        (queued,) = list(processor._queue)
        assert type(queued) is DeferredReadableSpan and queued._deferred  # not rendered
        estimate = deferred_estimate(queued)
        assert estimate is not None and 1000 < estimate < 5000
        assert processor._sizes[0] == estimate
        assert RolloutTraceConfig.flush(10.0)
        (span,) = exporter.get_finished_spans()
        assert not queued._deferred  # rendered on the way out
        assert '"a":"xxx' in span.attributes[semconv.INPUT_VALUE]


def test_outside_the_checked_sdk_the_eager_path_runs(monkeypatch):
    monkeypatch.setattr(_hotpath, "LIGHT_SPAN_OK", False)
    x, y = {"m": [{"password": "p", "c": "t" * 70000}]}, Point([1] * 30, None)
    with capture_spans() as exporter:
        op(x, y=y)
        (span,) = exporter.get_finished_spans()
        assert type(span) is not DeferredReadableSpan
        got = list(span.attributes.items())
    monkeypatch.setattr(_hotpath, "LIGHT_SPAN_OK", True)
    assert got == _run(False, x, y)
    assert dict(got)[semconv.OTEL_VERL_TRUNCATED] == (semconv.INPUT_VALUE,)


@pytest.mark.parametrize("defer", [True, False])
def test_a_live_read_of_the_span_renders_its_input(defer):
    from opentelemetry import trace

    seen: list[Any] = []

    @rollout_trace_op
    def reads(x: Any) -> None:
        seen.append(trace.get_current_span().attributes.get(semconv.INPUT_VALUE))

    _capture.DEFER_PAYLOADS = defer
    try:
        with capture_spans() as exporter:
            reads({"q": Point(NAN)})  # (not the fast path: deferred when deferral is on)
            (span,) = exporter.get_finished_spans()
            assert span.attributes[semconv.INPUT_VALUE] == seen[0] == \
                '{"x":{"q":{"x":"nan","y":null}}}'
    finally:
        _capture.DEFER_PAYLOADS = True
