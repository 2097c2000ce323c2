"""A GRPO group's shared dataset prompt is encoded and hashed once (issue 18: content shared
wider than one trajectory). verl hands the n rollouts of a group the very same row objects
(its batch's object arrays are repeated), so a long ``raw_prompt`` that an op input carries is
stored by its id once and every rollout's span refers to it; the id is computed once for the
same list object while its messages hold the very same values, and again after any change.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import otel_verl
from otel_verl import RolloutTraceConfig, _capture, _content, rollout_trace_attr, semconv
from otel_verl.store._content import ContentIndex
from otel_verl.testing import capture_spans

LONG_TEXT = "Solve the problem step by step and show the arithmetic. " * 300


@otel_verl.rollout_trace_op
async def run(sampling_params: dict, **kwargs: Any) -> dict:
    await asyncio.sleep(0)
    return {"answer": "19"}


def _rollouts(rows: list[Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
              ) -> tuple[list[dict], list[int], ContentIndex]:
    """Each row run as one trajectory; returns the run spans' recorded raw_prompt, the sizes of
    the message lists hashed, and the store."""
    hashed: list[int] = []
    encode = _content.message_bytes

    def counting(items: Any) -> Any:  # every encoding of a message list (to hash it), on
        hashed.append(len(items))  # the loop or on the content thread
        return encode(items)

    monkeypatch.setattr(_content, "message_bytes", counting)
    _capture._ROOT_MESSAGES.clear()
    with capture_spans(trace_dir=str(tmp_path)) as exporter:

        async def main() -> None:
            for i, row in enumerate(rows):
                with rollout_trace_attr(step=1, sample_index=i // 4, rollout_n=i % 4):
                    await run({"n": 1}, **row)

        asyncio.run(main())
        RolloutTraceConfig.flush(10.0)
        recorded = [json.loads(s.attributes[semconv.INPUT_VALUE])["kwargs"]["raw_prompt"]
                    for s in exporter.get_finished_spans() if s.name == "run"]
    _content.flush_all(10.0)
    return recorded, hashed, ContentIndex.load(str(tmp_path))


def test_a_group_shares_one_hash_and_one_node(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    messages = [{"role": "system", "content": LONG_TEXT},
                {"role": "user", "content": "What is (2+3)*4-1?"}]
    row = {"raw_prompt": messages, "extra_info": {"index": 7}}
    recorded, hashed, index = _rollouts([row] * 4, monkeypatch, tmp_path)  # one group, n=4
    assert len(recorded) == 4 and len(hashed) == 1  # hashed once for the group
    ids = {r["$content"] for r in recorded}
    assert ids == {_content.message_content_id(messages)}
    assert index.rebuild(ids.pop()) == messages  # the store has it, exactly


def test_any_change_to_the_shared_prompt_is_hashed_again(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The same list object each time, its messages changed between rollouts: a new content
    string, a key added, a message replaced, a message appended; then values that could change
    in place (a multimodal parts list) are never taken from the cache."""
    messages: list[Any] = [{"role": "system", "content": LONG_TEXT},
                           {"role": "user", "content": "What is 2+3?"}]
    row = {"raw_prompt": messages}
    sent: list[list[dict]] = []

    class Edits(list):  # rows that edit the shared list just before each rollout reads it
        pass

    edits = [
        lambda: None,
        lambda: messages[1].__setitem__("content", "What is 2+4?"),
        lambda: messages[1].__setitem__("name", "alice"),
        lambda: messages.__setitem__(0, {"role": "system", "content": LONG_TEXT + "!"}),
        lambda: messages.append({"role": "user", "content": "And 3+3?"}),
        lambda: messages[1].__setitem__("content", [{"type": "text", "text": "parts"}]),
        lambda: None,  # (unchanged, but a mutable value: hashed again)
    ]

    async def edited_rollouts() -> None:
        for i, edit in enumerate(edits):
            edit()
            sent.append(json.loads(json.dumps(messages)))
            with rollout_trace_attr(step=1, sample_index=0, rollout_n=i):
                await run({"n": 1}, **row)

    hashed: list[int] = []
    encode = _content.message_bytes
    monkeypatch.setattr(_content, "message_bytes",
                        lambda items: hashed.append(len(items)) or encode(items))
    _capture._ROOT_MESSAGES.clear()
    with capture_spans(trace_dir=str(tmp_path)) as exporter:
        asyncio.run(edited_rollouts())
        RolloutTraceConfig.flush(10.0)
        recorded = [json.loads(s.attributes[semconv.INPUT_VALUE])["kwargs"]["raw_prompt"]
                    for s in sorted(exporter.get_finished_spans(), key=lambda s: s.start_time)
                    if s.name == "run"]
    _content.flush_all(10.0)
    index = ContentIndex.load(str(tmp_path))
    assert len(hashed) == len(edits)  # every rollout hashed: each one saw a change
    for got, want in zip(recorded, sent, strict=True):
        assert got["$content"] == _content.message_content_id(want)
        assert index.rebuild(got["$content"]) == want
