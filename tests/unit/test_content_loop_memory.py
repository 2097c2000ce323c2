"""After a trajectory's first call, what its chain does on the event loop per turn allocates
O(what the turn adds), not O(the context): the chain's own copy of the prompt has room for the
next turns (no regrowth, which copies the whole context), and a prefix check compares in place
instead of slicing the context (issue 18). Measured with tracemalloc at a 128k-token context;
plus the prefix check's answers against the plain definition (hypothesis)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_verl import _content
from otel_verl._content import DeltaChain, _is_prefix, token_content_id

N = 128 * 1024
SMALL = 64 * 1024  # bytes: a turn's few hundred tokens and their encoding, far from N's ~1 MB


def _peak(fn: Callable[[], Any]) -> tuple[int, Any]:
    tracemalloc.start()
    try:
        result = fn()
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def test_each_turn_after_the_first_allocates_what_it_adds() -> None:
    prompt = [1000 + i % 50_000 for i in range(N)]
    chain = DeltaChain(_content.KIND_TOKENS)
    step = chain.begin(prompt, defer_over=2048)
    assert step is not None and step.pending and step.resolve()
    context = list(prompt)  # the agent loop's list, extended in place
    peaks = {}
    for turn in range(1, 4):
        answer = [7 + turn + i for i in range(200)]
        peaks[f"finish {turn}"], node = _peak(
            lambda a=answer, s=step, t=turn: chain.finish(s.id, s.length, a, f"{t:016x}"))
        assert node is not None and node.base_len == len(context)
        context += answer + [11] * 50  # the answer, then a tool turn
        peaks[f"begin {turn + 1}"], step = _peak(
            lambda c=context: chain.begin(c, defer_over=2048))
        assert step is not None and not step.pending and step.base_id == node.id
        assert step.id == token_content_id(context) and step.delta == context[node.length:]
    # the loop's own output at the end: its prompt and its response point into the chain
    peaks["reference prompt"], ref = _peak(lambda: chain.reference(prompt))
    assert ref == {"$content": token_content_id(prompt), "len": N, "delta": []}
    response = context[N:]
    peaks["reference response"], run = _peak(lambda: chain.reference(response))
    assert run is not None and run["start"] == N and run["len"] == len(response)
    assert max(peaks.values()) < SMALL, peaks  # before: ~1.1 MB for the first finish, reference


def test_a_replaced_answer_bases_on_the_prompt_and_an_edit_is_recorded_whole() -> None:
    prompt = list(range(5000, 5000 + 4096))
    chain = DeltaChain(_content.KIND_TOKENS)
    first = chain.begin(prompt)
    assert first is not None
    node = chain.finish(first.id, first.length, [1, 2, 3], "a" * 16)
    assert node is not None
    # the answer replaced: the prompt alone is extended (the in-place prefix check)
    replaced = prompt + [4, 5]
    step = chain.begin(replaced)
    assert step is not None and step.base_id == first.id and step.base_len == len(prompt)
    assert step.delta == [4, 5] and step.id == token_content_id(replaced)
    assert chain.reference(replaced) == {"$content": step.id, "len": len(replaced), "delta": []}
    # a changed middle with the same ends: extends nothing, recorded whole
    edited = replaced + [6]
    edited[3] = -1
    whole = chain.begin(edited)
    assert whole is not None and whole.base_id is None and whole.id == token_content_id(edited)


_ITEMS = st.lists(st.integers(0, 3), max_size=12)


@settings(max_examples=400, deadline=None)
@given(items=_ITEMS, new=_ITEMS, n=st.integers(0, 14))
def test_the_prefix_check_is_the_plain_one_and_changes_nothing(items: list[int], new: list[int],
                                                               n: int) -> None:
    expected = len(new) >= n and len(items) >= n and new[:n] == items[:n]
    items_before, new_before = list(items), list(new)
    held = list(items)
    objects = [id(x) for x in held]
    assert _is_prefix(held, new, n) is expected
    assert held == items_before and [id(x) for x in held] == objects  # put back as it was
    assert new == new_before
