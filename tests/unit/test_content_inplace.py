"""The caller's own prompt list edited in place between turns (the same list object an agent
loop extends), in trajectories interleaved turn by turn, through the deferred path an agent
loop's calls take: every turn's prompt rebuilds token for token, an extension is found against a
real prefix only, and the trajectory's lists point into its chain exactly (``reference``).
A guard of the chain's copy (issue 18's hostile cases): it holds on the chain as it is."""

from __future__ import annotations

from typing import Any

import pytest
from _content_nodes import add_node
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl import _content
from otel_verl._content import KIND_TOKENS, DeltaChain, token_content_id
from otel_verl.store._content import ContentIndex

#: one turn's change to the caller's list: append, edit in place (the same list object), edit
#: a copy, cut, the same again, or a new prompt
change = st.one_of(
    st.tuples(st.just("append"), st.lists(st.integers(-50, 50), min_size=0, max_size=9)),
    st.tuples(st.just("edit_in_place"), st.integers(0, 10_000)),
    st.tuples(st.just("edit_copy"), st.integers(0, 10_000)),
    st.tuples(st.just("cut"), st.integers(0, 10_000)),
    st.tuples(st.just("same"), st.none()),
    st.tuples(st.just("new"), st.lists(st.integers(-50, 50), min_size=2, max_size=20)),
)


def _apply(ids: list[int], op: tuple[str, Any]) -> list[int]:
    kind, arg = op
    if kind == "append":
        ids.extend(arg)  # in place, as an agent loop extends its context
        return ids
    if kind in ("edit_in_place", "edit_copy") and ids:
        out = ids if kind == "edit_in_place" else list(ids)
        out[arg % len(out)] += 1 + arg % 3
        return out
    if kind == "cut":
        return ids[: arg % (len(ids) + 1)]
    if kind == "new":
        return list(arg)
    return ids


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.lists(st.lists(st.integers(-50, 50), min_size=2, max_size=20), min_size=1,
                      max_size=3),
       turns=st.lists(st.tuples(st.integers(0, 2), st.lists(change, min_size=1, max_size=3),
                                st.lists(st.integers(-50, 50), max_size=5)), max_size=12))
def test_chains_rebuild_every_turn_when_the_caller_edits_its_list_in_place(first, turns) -> None:
    """Interleaved trajectories (one chain each) through the path an agent loop's calls take
    (``defer_over``: a whole prompt hashed off the loop, in tiny pieces so every boundary is
    crossed); each step checked after the content-hash thread's work."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_content, "DEFER_CHUNK", 4)
        mp.setattr(_content, "DEFER_MIN_ITEMS", 0)
        chains = [DeltaChain(KIND_TOKENS) for _ in first]
        lists = [list(ids) for ids in first]
        prev: list[tuple[list[int], list[int]] | None] = [None] * len(first)  # prompt, full
        index = ContentIndex()
        script = [(i, [("same", None)], []) for i in range(len(first))] + turns
        for who, ops, answer in script:
            who %= len(first)
            if prev[who] is not None:
                for op in ops:  # e.g. an edit inside, then an append: one turn's changes
                    lists[who] = _apply(lists[who], op)
            ids = lists[who]
            sent = list(ids)
            step = chains[who].begin(ids, defer_over=1)
            if step is None:  # an empty prompt: nothing to record
                assert not ids
                continue
            if step.pending:
                _content.defer(step)
                assert step.resolve()
            assert step.id == token_content_id(sent)
            assert step.length == len(sent)
            if step.base_id is not None:  # an extension is one: its base is a real prefix
                assert prev[who] is not None
                assert sent[: step.base_len] in prev[who]  # type: ignore[operator]
            before = prev[who]
            if before is not None and len(sent) >= len(before[1]) and \
                    sent[: len(before[1])] == before[1]:
                assert step.base_len == len(before[1])  # a real extension is always found
            add_node(index, step)
            assert index.rebuild(step.id) == sent
            node = chains[who].finish(step.id, step.length, answer, f"{who + 1:016x}")
            if node is not None:
                add_node(index, node)
                assert index.rebuild(node.id) == sent + answer
            ids.extend(answer)  # the engine's answer joins the caller's list
            prev[who] = (sent, sent + answer)
            # the trajectory's own lists point into its chain, exactly
            for value in (sent, answer, sent + answer):
                ref = chains[who].reference(value)
                if ref is None:
                    continue
                if "start" in ref:
                    whole = index.rebuild(ref["$content"])
                    assert whole[ref["start"]:ref["start"] + ref["len"]] == value
                else:
                    assert index.rebuild(ref["$content"])[: ref["len"]] + ref["delta"] == value
            assert chains[who].reference(sent) is not None  # its own prompt, always

