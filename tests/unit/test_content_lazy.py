"""An LLM call's prompt with no O(context) work on the event loop (issue 18): the copy of a whole
long prompt and the check that a turn's prompt extends the previous call are left to the
content thread while the call runs (``DeltaChain.begin(lazy=True)``, ``ExtendStep``), and
settled when the call ends, before its caller goes on. Checked here:

- the loop's thread copies and compares nothing context-long, and every turn rebuilds token for
  token from the store;
- a prompt edited in place of a long context, with its first and last tokens kept (what the
  O(1) test cannot see), is recorded again as it was sent: whether the content thread found the
  mismatch first or the call's end did;
- the content thread never coming by: the call's end does the work, before the caller edits its
  list;
- a generator op (its caller runs between its items) is never lazy.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
from typing import Any

import pytest

import otel_verl
from otel_verl import RolloutTraceConfig, _content, rollout_trace_attr, semconv
from otel_verl.store._content import ContentIndex, turn_prompts
from otel_verl.testing import capture_spans

LONG = 6000  # over VERIFY_MIN_ITEMS, DEFER_MIN_ITEMS and content_inline_bytes / 2


@otel_verl.rollout_trace_op
async def generate(request_id: str, *, prompt_ids: list[int], sampling_params: dict) -> dict:
    if sampling_params.get("drain"):  # the content thread has done its part before the end
        assert await asyncio.to_thread(_content.wait_idle, 10.0)
    await asyncio.sleep(0.005)
    return {"token_ids": list(sampling_params["answer"])}


def _record(span: Any) -> dict:
    return {"span_id": format(span.context.span_id, "016x"), "name": span.name,
            "trace_id": format(span.context.trace_id, "032x"),
            "parent_span_id": format(span.parent.span_id, "016x") if span.parent else None,
            "start_ns": span.start_time, "attributes": dict(span.attributes)}


class _Watch:
    """Context-long copies and comparisons, by thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.main = threading.current_thread()
        self.copies: list[tuple[bool, int]] = []
        self.checks: list[bool] = []
        own_copy, check = _content._own_copy, _content.ExtendStep.check

        def watched_copy(items: list[Any]) -> list[Any]:
            self.copies.append((threading.current_thread() is self.main, len(items)))
            return own_copy(items)

        def watched_check(step: Any) -> bool:
            if not step._checked:
                self.checks.append(threading.current_thread() is self.main)
            return check(step)

        monkeypatch.setattr(_content, "_own_copy", watched_copy)
        monkeypatch.setattr(_content.ExtendStep, "check", watched_check)


def _run(edits: dict[int, str], *, hold_thread: bool = False, turns: int = 4
         ) -> tuple[list[list[int]], list[dict], ContentIndex]:
    """One trajectory of ``turns`` calls, its prompt list extended in place by each answer (an
    agent loop's context). ``edits``: before turn n, ``"middle"`` changes a token inside
    (first and last kept), ``"after"`` changes one right after the call returned (the
    caller's own later edit; the sent prompt must not show it). ``hold_thread``: the content
    thread waits until the trajectory ends (the calls' ends do the work)."""
    sent: list[list[int]] = []
    gate = threading.Event()
    if hold_thread:
        _content._DEFERRED.submit(_Gate(gate))
    with tempfile.TemporaryDirectory() as trace_dir:
        with capture_spans(trace_dir=trace_dir) as exporter:

            async def one() -> None:
                prompt = list(range(1, LONG + 1))
                with rollout_trace_attr(step=1, sample_index=0):
                    for n in range(turns):
                        if edits.get(n) == "middle":
                            prompt[LONG // 2] = -1 - n
                        sent.append(list(prompt))
                        out = await generate("r", prompt_ids=prompt, sampling_params={
                            "answer": [7000 + n, 7100 + n], "drain": not hold_thread})
                        if edits.get(n) == "after":
                            prompt[LONG // 3] = -100 - n
                        prompt += out["token_ids"]

            asyncio.run(one())
            gate.set()
            assert _content.wait_idle(10.0)
            RolloutTraceConfig.flush(10.0)
            spans = [_record(s) for s in exporter.get_finished_spans()]
        index = ContentIndex.load(trace_dir)
    return sent, spans, index


class _Gate:
    """Holds the content thread until set (``_Deferred`` resolves anything with ``resolve``)."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def resolve(self) -> bool:
        self.event.wait(30)
        return True


def _check_calls(sent: list[list[int]], spans: list[dict], index: ContentIndex) -> list[dict]:
    calls = sorted((s for s in spans if s["name"].endswith("generate")),
                   key=lambda s: s["start_ns"])
    assert len(calls) == len(sent)
    prompts = {p["span_id"]: p["prompt"] for p in turn_prompts(spans, index)}
    for span, prompt in zip(calls, sent, strict=True):
        attrs = span["attributes"]
        assert attrs[semconv.CONTENT_ID] == _content.token_content_id(prompt)
        assert attrs[semconv.CONTENT_LEN] == len(prompt)
        assert attrs[semconv.CONTENT_STORED] == "stored"
        assert prompts[span["span_id"]] == prompt  # token for token, as sent
        if semconv.CONTENT_BASE_LEN in attrs:  # a base is a real prefix of what was sent
            base = index.rebuild(attrs[semconv.CONTENT_BASE_ID])
            assert base[: attrs[semconv.CONTENT_BASE_LEN]] == \
                prompt[: attrs[semconv.CONTENT_BASE_LEN]]
        shown = json.loads(attrs[semconv.INPUT_VALUE])["prompt_ids"]
        base_len = attrs.get(semconv.CONTENT_BASE_LEN, 0)
        if attrs[semconv.CONTENT_INLINE]:
            assert shown == prompt[base_len:]  # input.value shows exactly the delta
    return calls


def test_the_loop_copies_and_compares_nothing_context_long(
        monkeypatch: pytest.MonkeyPatch) -> None:
    watch = _Watch(monkeypatch)
    sent, spans, index = _run({})
    calls = _check_calls(sent, spans, index)
    # turn 1 is whole; turns 2-4 extend the previous call
    assert [semconv.CONTENT_BASE_ID in c["attributes"] for c in calls] == [False, True, True,
                                                                           True]
    assert not [n for on_loop, n in watch.copies if on_loop and n >= LONG], watch.copies
    assert [n for on_loop, n in watch.copies if not on_loop and n >= LONG]  # made off the loop
    assert len(watch.checks) == 3  # one prefix check per extension


@pytest.mark.parametrize("hold_thread", [False, True], ids=["thread-first", "end-first"])
def test_a_prompt_edited_inside_is_recorded_again_as_it_was_sent(
        monkeypatch: pytest.MonkeyPatch, hold_thread: bool) -> None:
    """Turn 3's prompt has a token changed in the middle of the context: the O(1) test passes,
    the prefix check does not; the span is recorded again (whole, its delta, its id) and the
    chain goes on from it (turn 4 extends turn 3)."""
    watch = _Watch(monkeypatch)
    sent, spans, index = _run({2: "middle"}, hold_thread=hold_thread)
    calls = _check_calls(sent, spans, index)
    edited = calls[2]["attributes"]
    assert semconv.CONTENT_BASE_ID not in edited and semconv.CONTENT_BASE_SPAN_ID not in edited
    assert edited[semconv.CONTENT_DELTA_LEN] == len(sent[2])
    following = calls[3]["attributes"]
    assert following[semconv.CONTENT_BASE_LEN] == len(sent[2]) + 2  # prompt 3 + its answer
    assert len(watch.checks) == 3
    assert all(watch.checks) if hold_thread else not any(watch.checks)  # who checked first


def test_the_callers_edit_after_the_call_never_reaches_what_was_sent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The content thread held: each call's end copies and checks its prompt before the caller
    goes on and edits its list (turn 1's whole prompt and turn 2's extension)."""
    watch = _Watch(monkeypatch)
    sent, spans, index = _run({0: "after", 1: "after"}, hold_thread=True)
    _check_calls(sent, spans, index)
    assert any(on_loop and n >= LONG for on_loop, n in watch.copies)  # the end made the copy


@otel_verl.rollout_trace_op
def stream(prompt_ids: list[int]) -> Any:
    yield len(prompt_ids)
    yield 0


def test_a_generator_op_is_not_lazy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its caller runs between items (and may change the list): the prompt is copied and
    compared while the generator starts, as before."""
    watch = _Watch(monkeypatch)
    with tempfile.TemporaryDirectory() as trace_dir, capture_spans(trace_dir=trace_dir):
        prompt = list(range(1, LONG + 1))
        with rollout_trace_attr(step=1, sample_index=0):
            for n in range(3):
                for _ in stream(prompt):
                    prompt[LONG // 2] = -n  # the caller edits between items
                prompt += [5000 + n]
    assert not watch.checks  # no ExtendStep
    assert any(on_loop and n >= LONG for on_loop, n in watch.copies)


def test_a_step_lock_held_at_fork_is_free_in_the_child() -> None:
    """Steps are computed once under one of a few shared locks (no lock object per LLM call):
    one that the parent's content thread holds at a fork must not stay held in the child."""
    import os

    lock = _content._step_lock(object())
    lock.acquire()
    try:
        pid = os.fork()
        if pid == 0:  # the child: every step lock can be taken
            os._exit(0 if all(each.acquire(timeout=2) for each in _content._STEP_LOCKS) else 3)
        _, status = os.waitpid(pid, 0)
    finally:
        lock.release()
    assert os.waitstatus_to_exitcode(status) == 0
