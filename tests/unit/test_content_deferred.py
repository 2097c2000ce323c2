"""A long whole prompt (turn 1 of a 32k-token context) is encoded and hashed off the event loop
(``PendingStep``, ``otel_verl._content.defer``): the span gets its id when the call ends, and
every turn still rebuilds token for token from the store, also when the agent loop extends the
prompt list in place, when a call fails, when the prompt is not plain ints, and when the
content-hash thread never came by (the chain resolves it itself)."""

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

LONG = 5000  # over DEFER_MIN_ITEMS and content_inline_bytes / 2


@otel_verl.rollout_trace_op
async def generate(request_id: str, *, prompt_ids: list[int], sampling_params: dict) -> dict:
    await asyncio.sleep(0.01)
    if sampling_params.get("fail"):
        raise RuntimeError("engine down")
    prompt_ids.append(-7)  # an agent loop that extends the caller's list in place
    return {"token_ids": list(sampling_params["answer"])}


def _record(span: Any) -> dict:
    parent = span.parent
    return {"span_id": format(span.context.span_id, "016x"), "name": span.name,
            "trace_id": format(span.context.trace_id, "032x"),
            "parent_span_id": format(parent.span_id, "016x") if parent else None,
            "start_ns": span.start_time, "attributes": dict(span.attributes)}


def _run(scripts: list[list[dict]], monkeypatch: pytest.MonkeyPatch
         ) -> tuple[dict[str, list[int]], list[dict], ContentIndex, list[int]]:
    """Trajectories on one loop, interleaved; each turn appends its answer and a tool result
    (or, with ``edit``, changes a token of the head). Returns what each call was sent, the
    spans, the store, and the sizes of the token lists encoded on the loop's thread."""
    on_loop: list[int] = []
    encode = _content.token_bytes
    main = threading.current_thread()

    def watched(ids: Any) -> Any:
        if threading.current_thread() is main:
            on_loop.append(len(ids))
        return encode(ids)

    monkeypatch.setattr(_content, "token_bytes", watched)
    sent: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory() as trace_dir:
        with capture_spans(trace_dir=trace_dir) as exporter:

            async def one(i: int, script: list[dict]) -> None:
                prompt = [i] + list(range(LONG))
                with rollout_trace_attr(step=1, sample_index=i):
                    for n, turn in enumerate(script):
                        if turn.get("edit"):
                            prompt = list(prompt)
                            prompt[3] = -1 - n
                        key = f"{i}/{n}"
                        sent[key] = list(prompt)
                        try:
                            out = await generate("r", prompt_ids=prompt, sampling_params={
                                "answer": turn["answer"], "n": key, "fail": turn.get("fail")})
                        except RuntimeError:
                            continue
                        prompt = prompt + out["token_ids"] + [900 + n]

            async def main_() -> None:
                await asyncio.gather(*(one(i, s) for i, s in enumerate(scripts)))

            asyncio.run(main_())
            RolloutTraceConfig.flush(10.0)
            spans = [_record(s) for s in exporter.get_finished_spans()]
        index = ContentIndex.load(trace_dir)
    return sent, spans, index, on_loop


def test_a_long_whole_prompt_is_hashed_off_the_loop_and_every_turn_rebuilds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    scripts = [
        [{"answer": [1, 2]}, {"answer": [3]}, {"answer": [4, 5]}],
        [{"answer": [6]}, {"answer": [7], "edit": True}, {"answer": [8]}],  # recorded whole again
        [{"answer": [9], "fail": True}, {"answer": [10]}, {"answer": [11]}],
    ]
    sent, spans, index, on_loop = _run(scripts, monkeypatch)
    # the loop encoded heads and deltas only, never a whole long prompt
    assert on_loop and max(on_loop) <= 1024, sorted(on_loop)[-5:]  # DEFER_HEAD
    calls = [s for s in spans if s["name"].endswith("generate")]
    assert len(calls) == len(sent) == 9
    prompts = {p["span_id"]: p for p in turn_prompts(spans, index)}
    for span in calls:
        attrs = span["attributes"]
        key = json.loads(attrs[semconv.INPUT_VALUE])["sampling_params"]["n"]
        # the id is of the prompt as sent (not of the list the engine extended afterwards)
        assert attrs[semconv.CONTENT_ID] == _content.token_content_id(sent[key]), key
        assert attrs[semconv.CONTENT_STORED] == "stored"
        assert attrs[semconv.CONTENT_LEN] == len(sent[key])
        assert prompts[span["span_id"]]["prompt"] == sent[key], key
    roots = [s for s in spans if semconv.CONTENT_PROMPT_ID in s["attributes"]]
    assert sorted(r["attributes"][semconv.CONTENT_PROMPT_ID] for r in roots) == sorted(
        _content.token_content_id(sent[f"{i}/0"]) for i in range(3))


def test_a_pending_prompt_resolves_where_needed_and_a_bad_one_is_not_recorded() -> None:
    chain = _content.DeltaChain(_content.KIND_TOKENS)
    prompt = list(range(LONG))
    step = chain.begin(prompt, defer_over=1)
    assert step is not None and step.pending and step.id is None
    prompt.append(5)  # the caller's list changes; the step encodes the chain's copy
    # no content-hash thread came by: the next call resolves it on its own thread
    after = chain.begin(list(range(LONG)) + [1, 2], defer_over=1)
    assert after is not None and not after.pending
    assert after.base_id == _content.token_content_id(list(range(LONG)))
    assert after.base_len == LONG and after.delta == [1, 2]
    assert after.id == _content.token_content_id(list(range(LONG)) + [1, 2])
    # a float deep inside (past the head checked at once): resolves to nothing, and the
    # chain records the next call whole
    odd: list[Any] = list(range(LONG))
    odd[LONG // 2] = 1.5
    bad = _content.DeltaChain(_content.KIND_TOKENS)
    pending = bad.begin(odd, defer_over=1)
    assert pending is not None and pending.pending
    assert pending.resolve() is False and pending.id is None
    fresh = bad.begin(list(range(LONG)) + [3], defer_over=0)
    assert fresh is not None and fresh.base_id is None
    assert fresh.id == _content.token_content_id(list(range(LONG)) + [3])


def test_a_long_prompt_outside_a_trajectory_still_carries_its_id() -> None:
    """No trajectory to settle it at the call's end: hashed at once, as before."""
    prompt = list(range(LONG))
    with tempfile.TemporaryDirectory() as trace_dir:
        with capture_spans(trace_dir=trace_dir) as exporter:
            asyncio.run(generate("r", prompt_ids=prompt, sampling_params={"answer": [1]}))
            RolloutTraceConfig.flush(10.0)
            (span,) = [s for s in exporter.get_finished_spans() if s.name.endswith("generate")]
    assert span.attributes[semconv.CONTENT_ID] == _content.token_content_id(list(range(LONG)))
    assert span.attributes[semconv.CONTENT_STORED] == "stored"
