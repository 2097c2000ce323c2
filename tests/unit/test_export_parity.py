"""Parity's comparison and the export's row shape, pure (issue 22; store/_parity.py, _export.py).

A property over random multi-turn conversations: the trace's side (turns P_k, O_k = P_k + R_k,
tool tokens between them) against the trainer's summary of the same conversation is equal, and
each drift injected into the trainer's side (a token of a turn changed, a mask bit flipped, the
reward changed, another policy version, tokens retokenized in the next turn's prompt) is
reported with its kind, nothing else of another kind.
"""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_verl import semconv
from otel_verl.store._export import _message
from otel_verl.store._parity import TracedTrajectory, Turn, compare, mask_runs, summarize

tokens = st.lists(st.integers(0, 5000), min_size=1, max_size=12)


@st.composite
def conversations(draw):
    prompt = draw(tokens)
    turns, sequence = [], list(prompt)
    n = draw(st.integers(1, 4))
    for k in range(n):
        response = draw(tokens)
        turns.append((list(sequence), sequence + response, draw(st.integers(0, 3))))
        sequence = sequence + response
        if k < n - 1:
            sequence = sequence + draw(tokens)  # a tool's answer, a template
    return prompt, turns


def _traced(turns, versions=None, reward=1.0):
    attrs = {semconv.ROLLOUT_STEP: 4, semconv.ROLLOUT_REWARD: reward,
             semconv.ROLLOUT_NUM_TURNS: 2 * len(turns)}
    return TracedTrajectory("ab" * 16, "cd" * 8, attrs, [
        Turn(f"{k:016x}", list(p), list(o), v if versions is None else versions[k])
        for k, (p, o, v) in enumerate(turns)])


def _consumed(prompt, turns, **fields):
    full = turns[-1][1]
    mask = [0] * (len(full) - len(prompt))
    for p, o, _ in turns:
        for i in range(len(p), len(o)):
            mask[i - len(prompt)] = 1
    versions = [v for _, _, v in turns]
    args = {"reward": 1.0, "num_turns": 2 * len(turns), "min_version": min(versions),
            "max_version": max(versions), **fields}
    return full[len(prompt):], mask, summarize(prompt, full[len(prompt):], mask, **args)


@settings(max_examples=150, deadline=None)
@given(conversations(), st.sampled_from(["none", "response", "mask", "reward", "version",
                                          "retokenized"]), st.randoms(use_true_random=False))
def test_each_drift_is_reported_with_its_kind_and_a_clean_one_is_equal(conv, drift, rnd):
    prompt, turns = conv
    response, mask, _ = _consumed(prompt, turns)
    versions = [v for _, _, v in turns]
    traced_turns = turns
    consumed_fields: dict = {}
    if drift == "response":
        i = rnd.randrange(len(response))
        response = list(response)
        response[i] += 1
    elif drift == "mask":
        i = rnd.randrange(len(mask))
        mask = list(mask)
        mask[i] = 1 - mask[i]
    elif drift == "reward":
        consumed_fields["reward"] = 0.5
    elif drift == "version":
        consumed_fields["max_version"] = max(versions) + 1
    elif drift == "retokenized":
        if len(turns) < 2:
            return
        # the second turn's prompt holds one of the first turn's response tokens re-encoded
        k = len(turns[0][0])
        p1, o1, v1 = turns[1]
        p1 = list(p1)
        p1[k] += 1
        traced_turns = [turns[0], (p1, p1 + o1[len(turns[1][0]):], v1), *turns[2:]]
    full_consumed = summarize(prompt, response, mask, reward=1.0, num_turns=2 * len(turns),
                              min_version=min(versions), max_version=max(versions))
    full_consumed.update(consumed_fields)
    report = compare(_traced(traced_turns), full_consumed)
    kinds = {d.kind for d in report.differences}
    if drift == "none":
        assert report.equal, report.differences
    elif drift == "version":
        assert kinds == {"policy_version"}
    elif drift == "retokenized":
        assert "retokenized" in kinds
        text = " ".join(map(str, report.differences))
        assert "turn 2: 1 of" in text
    else:
        assert kinds == {drift}, (drift, report.differences)


@given(st.lists(st.sampled_from([0, 1, 2, True, False]), max_size=40))
def test_mask_runs_fast_path_matches_groupby(mask):
    slow = [(1 if v else 0, sum(1 for _ in g))
            for v, g in itertools.groupby(bool(x) for x in mask)]
    assert mask_runs(mask) == slow


def test_a_trailing_masked_out_tail_and_a_cut_response_are_notes_and_compared():
    prompt, turns = [1, 2], [([1, 2], [1, 2, 7, 8], 0)]
    traced = _traced(turns)
    tail = summarize(prompt, [7, 8, 9, 9], [1, 1, 0, 0], reward=1.0, num_turns=2,
                     min_version=0, max_version=0)
    report = compare(traced, tail)
    assert report.equal and "not in the trace" in report.notes[0]
    cut = summarize(prompt, [7], [1], reward=1.0, num_turns=2, min_version=0, max_version=0)
    report = compare(traced, cut)
    assert report.equal and "the first 1 of the 2" in report.notes[0]
    wrong_cut = summarize(prompt, [6], [1], reward=1.0, num_turns=2, min_version=0,
                          max_version=0)  # a cut, and the token it keeps is not the trace's
    assert [d.kind for d in compare(traced, wrong_cut).differences] == ["response"]
    masked_tail = summarize(prompt, [7, 8, 9], [1, 1, 1], reward=1.0, num_turns=2)
    assert [d.kind for d in compare(traced, masked_tail).differences] == ["mask"]


def test_no_record_and_no_content_are_said():
    assert [d.kind for d in compare(_traced([([1], [1, 2], 0)]), None).differences] == \
        ["unmatched"]
    empty = TracedTrajectory("ab" * 16, None, {}, [])
    assert [d.kind for d in compare(empty, {}).differences] == ["untraced"]


def test_exported_messages_have_one_shape():
    rows = [_message({"role": "user", "content": "hi"}),
            _message({"role": "assistant", "content": None, "tool_calls": [
                {"id": 3, "function": {"name": "calc", "arguments": {"x": 1}}}]}),
            _message({"role": "tool", "content": ["a"], "tool_call_id": "c1"}),
            _message("plain text")]
    assert all(set(m) == {"role", "content", "tool_calls", "tool_call_id"} for m in rows)
    assert rows[1]["tool_calls"] == [{"id": "3", "type": "function",
                                      "function": {"name": "calc", "arguments": '{"x": 1}'}}]
    assert rows[2]["content"] == json.dumps(["a"])
    assert rows[3] == {"role": "user", "content": "plain text", "tool_calls": None,
                       "tool_call_id": None}
