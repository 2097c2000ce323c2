"""The delta chain's prefix check (``DeltaChain.begin``): the appended items are added to the
chain's copy before one comparison, so every way out must leave the chain as it was: a prompt
that matches at both ends but not in the middle, and a prompt that cannot be encoded."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_verl._content import KIND_TOKENS, DeltaChain, token_content_id


def _turn(chain: DeltaChain, prompt: list[Any], response: list[int]) -> Any:
    step = chain.begin(prompt)
    assert step is not None
    chain.finish(step.id, step.length, response, "00000000000000aa")
    return step


def test_a_failed_encoding_after_the_append_leaves_the_chain() -> None:
    chain = DeltaChain(KIND_TOKENS)
    prompt, response = list(range(100)), [7, 8]
    _turn(chain, prompt, response)
    full = prompt + response
    assert chain.begin(full + [1.5]) is None  # a float: not delta-coded
    step = chain.begin(full + [9])
    assert step is not None and step.base_len == len(full) and step.delta == [9]
    assert step.id == token_content_id(full + [9])


def test_ends_that_match_around_an_edit_then_a_failed_encoding_leave_the_chain() -> None:
    chain = DeltaChain(KIND_TOKENS)
    prompt, response = list(range(100)), [7, 8]
    _turn(chain, prompt, response)
    full = prompt + response
    edited = list(full)
    edited[50] = -1
    assert chain.begin(edited + [1.5]) is None  # same ends, edited middle, not encodable
    step = chain.begin(full + [9])
    assert step is not None and step.base_len == len(full) and step.delta == [9]
    assert step.id == token_content_id(full + [9])


@settings(max_examples=200, deadline=None)
@given(head=st.lists(st.integers(0, 5), min_size=2, max_size=30),
       response=st.lists(st.integers(0, 5), max_size=5),
       at=st.integers(0, 40), value=st.integers(6, 9), tail=st.lists(st.integers(0, 5),
                                                                      max_size=5))
def test_an_edited_prompt_is_recorded_as_it_is(head: list[int], response: list[int], at: int,
                                                value: int, tail: list[int]) -> None:
    """Whatever the edit, the step's id is the id of the prompt sent, and the next turn that
    appends to it extends it."""
    chain = DeltaChain(KIND_TOKENS)
    _turn(chain, head, response)
    sent = head + response + tail
    sent[at % len(sent)] = value
    step = chain.begin(sent)
    assert step is not None and step.id == token_content_id(sent)
    chain.finish(step.id, step.length, [1], "00000000000000bb")
    after = chain.begin(sent + [1, 2])
    assert after is not None and after.base_len == len(sent) + 1 and after.delta == [2]
    assert after.id == token_content_id(sent + [1, 2])
