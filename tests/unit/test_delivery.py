"""Typed delivery outcomes (otel_verl.exporters._delivery): what an exporter says span by span,
checked; SUCCESS/FAILURE read as all-or-nothing for exporters that cannot say; and the real Weave
exporter saying which call its server refused for good."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _modules import load_file
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_verl.exporters._delivery import Delivery, DetailedExporter, deliver

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "exporters" / "weave" / "src"))
from otel_weave_exporter import WeaveSpanExporter  # noqa: E402

Recorder = load_file(Path(__file__).resolve().parents[1] / "weave" / "_recorder.py",
                     "_weave_recorder").Recorder


def _spans(names: Sequence[str]) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for name in names:
        attributes = {"rollout.step": 1}
        if name == "bad":  # declared JSON, is not: Weave's server refuses the call that holds it
            attributes.update({"output.value": "{oops", "output.mime_type": "application/json"})
        tracer.start_span(name, attributes=attributes).end()
    return list(memory.get_finished_spans())


class _Plain(SpanExporter):
    def __init__(self, result: SpanExportResult | None) -> None:
        self.result = result

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.result is None:
            raise RuntimeError("a broken exporter")
        return self.result


@pytest.mark.parametrize(("result", "expected"), [
    (SpanExportResult.SUCCESS, Delivery(accepted=(0, 1, 2))),
    (SpanExportResult.FAILURE, Delivery(retryable=(0, 1, 2))),
    (None, Delivery(retryable=(0, 1, 2))),  # raised: retried, never into the caller
])
def test_an_exporter_that_cannot_say_is_read_all_or_nothing(result, expected):
    assert deliver(_Plain(result), _spans("abc")) == expected


class _Says(SpanExporter):
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise AssertionError("export_detailed is used when there is one")

    def export_detailed(self, spans: Sequence[ReadableSpan]) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_a_detailed_answer_is_taken_as_said():
    answer = SimpleNamespace(accepted=[0, 2], rejected=[(1, "HTTP 400: not JSON")], retryable=[3])
    exporter = _Says(answer)
    assert isinstance(exporter, DetailedExporter)
    assert deliver(exporter, _spans("abcd")) == Delivery(
        accepted=(0, 2), rejected=((1, "HTTP 400: not JSON"),), retryable=(3,), detailed=True)


_index = st.integers(-2, 6) | st.booleans() | st.none() | st.text(max_size=1)


@settings(max_examples=200, deadline=None)
@given(st.lists(_index), st.lists(st.tuples(_index, st.text(max_size=3))), st.lists(_index))
def test_any_answer_accounts_for_every_span_exactly_once(accepted, rejected, retryable):
    """Whatever an exporter answers, each span ends in exactly one field; a span it did not
    account for, or also named retryable, is retried (never silently taken as delivered)."""
    got = deliver(_Says(SimpleNamespace(accepted=accepted, rejected=rejected,
                                        retryable=retryable)), _spans("abcde"))
    outcome = list(got.accepted) + [i for i, _ in got.rejected] + list(got.retryable)
    assert sorted(outcome) == [0, 1, 2, 3, 4]
    said = {i for i in accepted if type(i) is int} | {i for i, _ in rejected if type(i) is int}
    assert set(got.retryable) >= {i for i in range(5) if i not in said}
    assert set(got.accepted) <= set(accepted) and {i for i, _ in got.rejected} <= \
        {i for i, _ in rejected}


@pytest.mark.parametrize("answer", [RuntimeError("bug"), None, SimpleNamespace(accepted=[0])])
def test_an_answer_out_of_shape_retries_the_batch(answer):
    assert deliver(_Says(answer), _spans("ab")) == Delivery(retryable=(0, 1), detailed=True)


# --- the real Weave exporter ------------------------------------------------------------------------


def _weave(url: str, **options: Any) -> WeaveSpanExporter:
    options.setdefault("timeout_s", 5.0)
    return WeaveSpanExporter(project="entity/proj", api_key="k" * 40, base_url=url,
                             backoff_initial_s=0.05, shutdown_timeout_s=1.0, **options)


def _json_bodies(recorder: Any) -> list[Any]:
    out = []
    for request in recorder.requests:
        try:
            out.append(json.loads(request["body"]))
        except ValueError:
            continue  # the refused ones
    return out


def test_the_weave_exporter_says_which_span_its_server_refused_for_good(tmp_path):
    with Recorder() as recorder:
        recorder.validate_json = True  # 400 to a body that is not JSON: the call holding "{oops"
        exporter = _weave(recorder.url, spool_dir=str(tmp_path))
        spans = _spans(["a", "b", "bad", "c", "d", "e"])
        got = deliver(exporter, spans)
        assert got.detailed and got.retryable == ()
        assert got.accepted == (0, 1, 3, 4, 5)
        ((index, reason),) = got.rejected
        assert index == 2 and "400" in reason
        delivered = sorted(call["op_name"] for body in _json_bodies(recorder)
                           for call in body["batch"])
        assert delivered == ["a", "b", "c", "d", "e"]
        # the caller keeps what was not delivered: nothing in the exporter's own spool
        assert list(tmp_path.iterdir()) == []
        exporter.shutdown()


def test_the_weave_exporter_says_retryable_when_its_server_is_down():
    with Recorder() as recorder:
        recorder.statuses = [503] * 50
        exporter = _weave(recorder.url, timeout_s=0.5)
        got = deliver(exporter, _spans("abc"))
        assert got == Delivery(retryable=(0, 1, 2), detailed=True)
        exporter.shutdown()
        assert deliver(exporter, _spans("a")) == Delivery(retryable=(0,), detailed=True)


def test_a_delivery_settles_the_records_before_the_first_retryable_one():
    from otel_verl.exporters._delivery import settle

    # records 0..4; record 1 holds spans 1 and 2, record 3 has no span (damaged, kept aside)
    records = [0, 1, 1, 2, 4]
    got = settle(Delivery(accepted=(0, 1, 3), rejected=((2, "bad"),), retryable=(4,)), records, 5)
    assert (got.done, got.rejected, got.delivered, got.retry) == (4, ((1, "bad"),), 3, True)
    got = settle(Delivery(accepted=(0, 1, 2, 4), rejected=((3, "bad"),)), records, 5)
    assert (got.done, got.rejected, got.delivered, got.retry) == (5, ((2, "bad"),), 4, False)
    got = settle(Delivery(retryable=(0, 1, 2, 3, 4)), records, 5)
    assert (got.done, got.rejected, got.delivered, got.retry) == (0, (), 0, True)


# --- through the durable log --------------------------------------------------------------------


def _wait(predicate: Any, timeout_s: float = 20.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_the_durable_log_quarantines_what_the_weave_exporter_says_was_refused(tmp_path):
    """One export for the batch, the refused span in quarantine/ at once: no retry, no probe
    request (with strikes: a failed export, halving, a probe of the next span, three strikes
    with backoff between)."""
    from otel_verl.exporters import DurableSpanExporter
    from otel_verl.store import read_spans

    with Recorder() as recorder:
        recorder.validate_json = True
        weave = _weave(recorder.url)
        durable = DurableSpanExporter(weave, tmp_path / "log", export_delay_s=0.05,
                                      retry_initial_s=0.5, retry_max_s=0.5)
        try:
            spans = _spans(["a", "b", "c", "bad", "d", "e", "f", "g"])
            assert durable.export(spans) is SpanExportResult.SUCCESS
            assert _wait(lambda: durable.stats()["quarantined"] == 1)
            assert durable.force_flush(10_000)
            stats = durable.stats()
            assert stats["delivered"] == 7 and stats["retries"] == 0
            assert stats["spool_pending"] == 0
            names = sorted(c["op_name"] for b in _json_bodies(recorder) for c in b["batch"])
            assert names == ["a", "b", "c", "d", "e", "f", "g"]  # each once: no probe, no resend
            # the exporter's own halving only: 8 calls -> refused 8, 4, 2, 1 and accepted 4, 2, 1
            assert len(recorder.requests) == 7
            assert [s["name"] for s in read_spans(tmp_path / "log" / "quarantine")] == ["bad"]
        finally:
            durable.shutdown()
