"""A long dataset prompt in an op's inputs (verl's ``raw_prompt`` at 32k-128k tokens) is
encoded and hashed off the event loop when the op is a plain function or coroutine (issue 18:
nothing proportional to the context on the loop). Its reference names a placeholder until the
op ends; the op's end puts the content id in its place, on the op's span and on the
trajectory's input, before the op's caller goes on. Where the content cannot be stored (a store
over its budget, messages that are not JSON), the input is recorded as without deferring: the
list stays in it, capped, never a dead link nor a placeholder."""

from __future__ import annotations

import asyncio
import json
import pathlib
import threading
from typing import Any

import pytest

import otel_verl
from otel_verl import RolloutTraceConfig, _capture, _content, rollout_trace_attr, semconv
from otel_verl.store._content import ContentIndex
from otel_verl.testing import capture_spans

LONG_TEXT = "Consider the following worked examples of arithmetic carefully. " * 600


@otel_verl.rollout_trace_op
async def run(sampling_params: dict, **kwargs: Any) -> dict:
    await asyncio.sleep(0.01)
    return {"answer": "84"}


@otel_verl.rollout_trace_op
def run_sync(sampling_params: dict, **kwargs: Any) -> dict:
    return {"answer": "84"}


@otel_verl.rollout_trace_op
async def run_stream(sampling_params: dict, **kwargs: Any):
    yield {"answer": "84"}


def _messages(i: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": LONG_TEXT},
            {"role": "user", "content": f"What is 12*7? ({i})"}]


def _exported(root: pathlib.Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


def _encodings(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []
    encode = _content.message_bytes

    def counting(items: Any) -> Any:
        seen.append((threading.current_thread().name, len(items)))
        return encode(items)

    monkeypatch.setattr(_content, "message_bytes", counting)
    return seen


def test_a_dataset_prompt_is_hashed_off_the_loop_and_named_by_its_id(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    seen = _encodings(monkeypatch)
    _capture._ROOT_MESSAGES.clear()
    sent = [_messages(i) for i in range(3)]
    with capture_spans(trace_dir=str(tmp_path)) as exporter:

        async def main() -> None:
            async def one(i: int) -> None:
                with rollout_trace_attr(step=1, sample_index=i, name="agent_loop"):
                    await run({"n": 1}, raw_prompt=sent[i])
            await asyncio.gather(*(one(i) for i in range(3)))  # interleaved trajectories

        loop_thread = threading.current_thread().name
        asyncio.run(main())
        _content.wait_idle(10.0)
        in_rollouts = list(seen)
        # a plain function, outside a trajectory: the same placeholder and settling (its end
        # may come before the content thread does: then it hashes there itself)
        run_sync({"n": 1}, raw_prompt=_messages(9))
        RolloutTraceConfig.flush(10.0)
        spans = list(exporter.get_finished_spans())
    _content.flush_all(10.0)
    assert len(in_rollouts) == 3 and all(name != loop_thread for name, _ in in_rollouts), seen
    index = ContentIndex.load(str(tmp_path))
    runs = {json.loads(s.attributes[semconv.INPUT_VALUE])["kwargs"]["raw_prompt"]["$content"]: s
            for s in spans if s.name == "run"}
    assert set(runs) == {_content.message_content_id(m) for m in sent}
    for content_id in runs:
        assert index.rebuild(content_id) in sent
    # the trajectory's input (its agent op's, as no set_trajectory_input was called) names the id
    roots = [s for s in spans if s.name == "agent_loop"]
    assert len(roots) == 3
    for root in roots:
        ref = json.loads(root.attributes[semconv.INPUT_VALUE])["kwargs"]["raw_prompt"]
        assert ref["$content"] in runs
    plain = next(s for s in spans if s.name == "run_sync")
    ref = json.loads(plain.attributes[semconv.INPUT_VALUE])["kwargs"]["raw_prompt"]
    assert ref["$content"] == _content.message_content_id(_messages(9))
    assert _capture.PLACEHOLDER_PREFIX.encode() not in _exported(tmp_path)


def test_a_generator_op_hashes_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A generator's caller runs between its items: nothing is left pending for it."""
    seen = _encodings(monkeypatch)
    _capture._ROOT_MESSAGES.clear()
    with capture_spans(trace_dir=str(tmp_path)) as exporter:

        async def main() -> None:
            with rollout_trace_attr(step=1, sample_index=0):
                async for _ in run_stream({"n": 1}, raw_prompt=_messages(1)):
                    pass

        asyncio.run(main())
        RolloutTraceConfig.flush(10.0)
        span = next(s for s in exporter.get_finished_spans() if s.name == "run_stream")
    names = [name for name, _ in seen]
    assert names == [threading.current_thread().name]
    ref = json.loads(span.attributes[semconv.INPUT_VALUE])["kwargs"]["raw_prompt"]
    assert ref["$content"] == _content.message_content_id(_messages(1))


class _Opaque:
    """Not JSON, nor text: the content store cannot encode a message holding it."""

    def __str__(self) -> str:
        raise RuntimeError("no text")

    __repr__ = __str__


@pytest.mark.parametrize("case", ["over_budget", "not_json"])
def test_content_that_cannot_be_stored_stays_in_the_input(case: str, tmp_path) -> None:
    _capture._ROOT_MESSAGES.clear()
    messages: list[dict[str, Any]] = _messages(3)
    options: dict[str, Any] = {}
    if case == "over_budget":
        options["content_store_bytes"] = 1024  # far below the prompt's ~40 KB
    else:
        messages[1]["meta"] = _Opaque()
    with capture_spans(trace_dir=str(tmp_path), **options) as exporter:

        async def main() -> None:
            with rollout_trace_attr(step=1, sample_index=0, name="agent_loop"):
                await run({"n": 1}, raw_prompt=messages)

        asyncio.run(main())
        RolloutTraceConfig.flush(10.0)
        spans = list(exporter.get_finished_spans())
    _content.flush_all(10.0)
    span = next(s for s in spans if s.name == "run")
    recorded = json.loads(span.attributes[semconv.INPUT_VALUE])["kwargs"]["raw_prompt"]
    assert isinstance(recorded, list) and recorded[1]["content"] == messages[1]["content"]
    assert recorded[0]["content"].startswith(LONG_TEXT[:200])  # inline, capped
    assert semconv.CONTENT_REFS not in span.attributes
    root = next(s for s in spans if s.name == "agent_loop")
    assert _capture.PLACEHOLDER_PREFIX not in root.attributes[semconv.INPUT_VALUE]
    assert _capture.PLACEHOLDER_PREFIX.encode() not in _exported(tmp_path)


@otel_verl.rollout_trace_op
async def run_slow(sampling_params: dict, **kwargs: Any) -> dict:
    await asyncio.sleep(0.8)
    return {"answer": "84"}


@pytest.mark.parametrize("case", ["stored", "group", "over_budget"])
def test_a_stuck_op_is_sent_with_the_id_not_the_placeholder(case: str, tmp_path) -> None:
    """A stuck op's ``otel_verl.in_flight`` span carries the op's input as it is now (what
    Weave starts the op's call with): its dataset prompt is named by its content id, which the
    content thread has computed meanwhile, never by the placeholder the op's own span holds
    until it ends. Where the prompt cannot be stored (the store over its budget), the in-flight
    span goes without the input (the op's own span gets the list inline when it ends). In a
    GRPO group (``group``: the very same prompt object, hashed by the group's first rollout),
    the stuck rollout names the id the first one computed."""
    from otel_verl._state import STATE

    _capture._ROOT_MESSAGES.clear()
    sent = _messages(4)
    options: dict[str, Any] = {"content_store_bytes": 1024} if case == "over_budget" else {}
    with capture_spans(trace_dir=str(tmp_path), live=True, stuck_after_s=0.2,
                       **options) as exporter:

        async def main() -> None:
            async def watch() -> None:
                await asyncio.sleep(0.4)
                await asyncio.to_thread(STATE.runtime.live.tick)

            if case == "group":  # the group's first rollout, ended: its step is cached
                with rollout_trace_attr(step=1, sample_index=0, rollout_n=0, name="agent_loop"):
                    await run({"n": 1}, raw_prompt=sent)
            with rollout_trace_attr(step=1, sample_index=0, rollout_n=1, name="agent_loop"):
                await asyncio.gather(run_slow({"n": 1}, raw_prompt=sent), watch())

        asyncio.run(main())
        RolloutTraceConfig.flush(10.0)
        spans = list(exporter.get_finished_spans())
    _content.flush_all(10.0)
    flights = [s for s in spans if s.name == semconv.IN_FLIGHT_SPAN]
    assert [s.attributes[semconv.OTEL_VERL_LIVE_OP] for s in flights] == ["run_slow"]
    for span in spans:
        for value in span.attributes.values():
            assert _capture.PLACEHOLDER_PREFIX not in str(value), (span.name, value)
    if case == "over_budget":
        assert semconv.OTEL_VERL_LIVE_INPUT not in flights[0].attributes
        return
    live = json.loads(flights[0].attributes[semconv.OTEL_VERL_LIVE_INPUT])
    content_id = _content.message_content_id(sent)
    assert live["kwargs"]["raw_prompt"]["$content"] == content_id
    assert ContentIndex.load(str(tmp_path)).rebuild(content_id) == sent
    assert not _capture._IN_FLIGHT_REFS  # let go of when the op settled

