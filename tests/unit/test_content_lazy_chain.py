"""The lazy delta chain (``DeltaChain.begin(lazy=True)``) against the eager one, property-based:
for any sequence of turns (appends, edits in place that keep a prompt's first and last tokens,
cuts, new prompts) with interleaved trajectories, whichever side does the deferred work first
(the content thread, the call's end, the chain's next use), the protocol a lazy op follows
(``_capture.settle_inputs``: the extension checked at the call's end, recorded again where it
fails) records every turn's prompt exactly as it was sent, with a real prefix as its base, and
leaves the chain where the eager chain would be: the next turn gets the same base."""

from __future__ import annotations

from typing import Any

import pytest
from _content_nodes import add_node
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl import _content
from otel_verl._content import KIND_TOKENS, DeltaChain, ExtendStep, token_content_id
from otel_verl.store._content import ContentIndex

#: one turn's change to the caller's list before its call
change = st.one_of(
    st.tuples(st.just("append"), st.lists(st.integers(0, 9), min_size=0, max_size=6)),
    st.tuples(st.just("edit_inside"), st.integers(0, 10_000)),  # same first and last items
    st.tuples(st.just("edit_near_end"), st.integers(1, 4)),  # inside the last answer, as a rule
    st.tuples(st.just("cut"), st.integers(0, 10_000)),
    st.tuples(st.just("new"), st.lists(st.integers(0, 9), min_size=2, max_size=12)),
)
#: who settles a pending step first: the content thread before the call's end, the end itself,
#: or the end after another chain method (a reference lookup) came by
settler = st.sampled_from(["thread", "end", "reference"])


def _apply(ids: list[int], op: tuple[str, Any]) -> list[int]:
    kind, arg = op
    if kind == "append":
        ids.extend(arg)
    elif kind == "edit_inside" and len(ids) > 2:
        ids[1 + arg % (len(ids) - 2)] += 1 + arg % 3  # in place, the ends kept
    elif kind == "edit_near_end" and len(ids) > arg + 1:
        ids[-1 - arg] += 1
    elif kind == "cut":
        del ids[arg % (len(ids) + 1):]
    elif kind == "new":
        ids[:] = arg
    return ids


def _lazy_call(chain: DeltaChain, ids: list[int], who: str) -> Any:
    """One call's prompt, the way a lazy op records and settles it."""
    step = chain.begin(ids, defer_over=1, lazy=True)
    if step is None:
        return None
    if who == "thread":
        step.resolve()  # (what the content thread calls)
    elif who == "reference":
        chain.reference(list(ids))  # another chain method settles it first
    if type(step) is ExtendStep:  # the call's end (``settle_inputs``)
        if not step.check():
            step = chain.redo(step)
    elif step.pending:
        assert step.resolve()
    return step


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.lists(st.lists(st.integers(0, 9), min_size=2, max_size=12), min_size=1,
                      max_size=3),
       turns=st.lists(st.tuples(st.integers(0, 2), st.lists(change, min_size=1, max_size=3),
                                st.lists(st.integers(0, 9), max_size=4), settler),
                      max_size=12))
def test_lazy_chains_record_what_was_sent_and_follow_the_eager_chain(first, turns) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_content, "VERIFY_MIN_ITEMS", 0)  # every extension checked lazily
        mp.setattr(_content, "DEFER_MIN_ITEMS", 0)  # every whole prompt hashed lazily
        mp.setattr(_content, "DEFER_CHUNK", 3)
        lazy = [DeltaChain(KIND_TOKENS) for _ in first]
        eager = [DeltaChain(KIND_TOKENS) for _ in first]
        lists = [list(ids) for ids in first]
        index = ContentIndex()
        script = [(i, [], [], "end") for i in range(len(first))] + turns
        for n, (who, ops, answer, settled_by) in enumerate(script):
            who %= len(first)
            ids = lists[who]
            for op in ops:
                _apply(ids, op)
            sent = list(ids)
            if not sent:  # (``content_inputs`` records an empty prompt as it is)
                continue
            step = _lazy_call(lazy[who], ids, settled_by)
            twin = eager[who].begin(list(sent))
            assert step is not None and twin is not None
            assert step.id == twin.id == token_content_id(sent)
            assert step.length == len(sent)
            assert (step.base_id, step.base_len) == (twin.base_id, twin.base_len)  # same base
            add_node(index, step)
            assert index.rebuild(step.id) == sent
            span_id = f"{n + 1:016x}"
            node = lazy[who].finish(step.id, step.length, answer, span_id)
            twin_node = eager[who].finish(twin.id, twin.length, list(answer), span_id)
            assert (node is None) == (twin_node is None)
            if node is not None:
                assert node.id == twin_node.id  # type: ignore[union-attr]
                add_node(index, node)
                assert index.rebuild(node.id) == sent + answer
            ids.extend(answer)  # the engine's answer joins the caller's list, after the call

