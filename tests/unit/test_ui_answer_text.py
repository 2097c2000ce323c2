"""The answer a trajectory row shows (the trajectory table, the prompt-through-training page, the
search text) is the answer the trajectory page's conversation shows: ``token2text``'s
``response_text`` ends with the end-of-turn token (it decodes every token), the agent loop's
messages do not; the row took the later span's raw text ("The answer is 3.<|im_end|>")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import _lake_store as S
import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_verl.store._compact import compact
from otel_verl.store._record import answer_text
from otel_verl.ui._lake import LakeSource
from otel_verl.ui.views import prompt_view, trajectory_view

_SPECIAL = st.sampled_from(["<|im_end|>", "<|eot_id|>", "<|endoftext|>", "</s>",
                            "<end_of_turn>", "<|im_end|>\n", "<|im_end|><|endoftext|>"])


@given(text=st.text(max_size=40), tokens=st.lists(_SPECIAL, min_size=1, max_size=3))
def test_the_trailing_special_tokens_go_and_nothing_else(text: str, tokens: list[str]) -> None:
    clean = answer_text(text)
    assert text.startswith(clean)  # only a tail is ever dropped
    assert answer_text(clean + "".join(tokens)) == clean
    assert answer_text(clean + "<|im_end|> more") == clean + "<|im_end|> more"


def _write(directory: Path, answers: list[str]) -> None:
    """One prompt at steps 0..n-1: the loop's run (its messages, clean) and a later token-level
    call whose ``response_text`` has the raw end-of-turn token."""
    lines = []
    for step, answer in enumerate(answers):
        trace, root = f"{step + 1:032x}", f"{step + 1:08x}00000001"
        ident = {"rollout.step": step, "rollout.sample_index": 0, "rollout.rollout_n": 0,
                 "rollout.validate": False}
        t0 = 10**18 + step * 10**9
        user = {"role": "user", "content": "What is 3 + 2?"}
        run = S._span(trace, f"{step + 1:08x}00000002", root, "ToolAgentLoop.run", t0 + 1, {
            **ident, "input.value": json.dumps({"raw_prompt": [user]}),
            "output.value": json.dumps({"extra_fields": {"messages": [
                user, {"role": "assistant", "content": answer}]}})})
        call = S._span(trace, f"{step + 1:08x}00000003", f"{step + 1:08x}00000002",
                       "AsyncTokenClient.generate", t0 + 2, {
                           **ident, "gen_ai.operation.name": "chat",
                           "output.value": json.dumps({"token_ids": [1, 2],
                                                       "response_text": answer + "<|im_end|>"})})
        top = S._span(trace, root, None, "agent_loop", t0, {**ident, "otel_verl.trajectory": True})
        lines.append(S._line([run, call, top], {"service.name": "rollout",
                                                "rollout.experiment_name": "exp"}))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "otel_verl-answers-1-20260101T000000000Z.jsonl").write_bytes(b"".join(lines))


def _conversation_answer(source: Any, key: str) -> str:
    view = trajectory_view(source, key)
    assert view is not None and view["messages"], view
    return str(view["messages"][-1]["content"])


@pytest.mark.parametrize("read", ["lake", "lake compacted"])
def test_the_prompt_page_shows_the_conversations_answer(tmp_path: Path, read: str) -> None:
    answers = ["The answer is 5.", "The answer is 22.", "The answer is 5."]
    _write(tmp_path / "store", answers)
    if read == "lake compacted":
        compact(tmp_path / "store", live_bytes=0)
    source: Any = LakeSource(tmp_path / "store", compact=False)
    try:
        rows = prompt_view(source, "exp", 0, None)["rows"]
        assert [r["response"] for r in rows] == answers
        assert [_conversation_answer(source, r["key"]) for r in rows] == answers
        found = source.trajectories(text="im_end")  # the token is not in the search text either
        assert found["total"] == 0
    finally:
        source.close()
