"""A chain's copy of a prompt goes, when the chain does, to the spares a later chain copies
into (issue 18: an old list is not scanned by the cyclic GC's young and middle collections, a
fresh context-long copy is), and that never changes what any step records: a copy a step not
yet hashed still encodes is not taken, and every id is the id of the prompt as it was sent."""

from __future__ import annotations

import gc
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl import _content
from otel_verl._content import DEFER_MIN_ITEMS, KIND_TOKENS, DeltaChain, token_content_id


def _in_generation(obj: object, generation: int) -> bool:
    return any(o is obj for o in gc.get_objects(generation))


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(300, 151_646) for _ in range(n)]


def test_a_later_chains_copy_is_a_list_the_collector_has_promoted():
    for defer in (0, 1):  # the copy at once, and the deferred (hashed off the loop) one
        first = DeltaChain(KIND_TOKENS)
        step = first.begin(_prompt(1, 5000), defer_over=defer)
        assert step is not None and step.resolve()
        gc.collect()  # what a long-lived copy meets: it is promoted to the oldest generation
        del first, step
        assert _content.wait_idle(10.0)  # a long copy is emptied on the content thread
        second = DeltaChain(KIND_TOKENS)
        prompt = _prompt(2, 6000)
        step = second.begin(prompt, defer_over=defer)
        assert step is not None and step.resolve()
        assert step.id == token_content_id(prompt)
        assert second._items == prompt
        assert not _in_generation(second._items, 0), "a fresh copy: the next young GC scans it"
        assert _in_generation(second._items, 2)
        turn = prompt + [7, 8, 9]
        nxt = second.begin(turn)
        assert nxt is not None and nxt.base_id == step.id and nxt.id == token_content_id(turn)


def test_a_chain_dropped_before_its_prompt_is_hashed_keeps_that_prompt():
    prompt = _prompt(3, DEFER_MIN_ITEMS * 2)
    chain = DeltaChain(KIND_TOKENS)
    step = chain.begin(prompt, defer_over=1)
    assert step is not None and step.pending
    del chain  # the step still encodes the chain's copy: it must not become a spare
    others = [DeltaChain(KIND_TOKENS) for _ in range(4)]
    for i, other in enumerate(others):  # each would take a spare and fill it with its prompt
        assert other.begin(_prompt(10 + i, 3000)) is not None
    assert step.resolve()
    assert step.id == token_content_id(prompt)


_OPS = st.lists(st.tuples(st.sampled_from(["new", "append", "edit", "whole", "drop", "answer"]),
                          st.integers(0, 3), st.integers(0, 10**6)), min_size=1, max_size=40)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=_OPS, defer=st.booleans())
def test_interleaved_chains_coming_and_going_record_every_prompt_exactly(ops, defer):
    chains: dict[int, tuple[DeltaChain, list[int]]] = {}
    pending = []
    for op, slot, seed in ops:
        rng = random.Random(seed)
        if op == "new" or slot not in chains:
            chains[slot] = (DeltaChain(KIND_TOKENS), _prompt(seed, rng.randrange(1, 3000)))
        chain, ids = chains[slot]
        if op == "drop":
            del chains[slot]
            continue
        if op == "append":  # the caller's list extended in place (an agent loop's context)
            ids.extend(rng.randrange(151_646) for _ in range(rng.randrange(1, 40)))
        elif op == "edit" and ids:  # edited in place, not appended: recorded whole
            ids[rng.randrange(len(ids))] = rng.randrange(151_646)
        elif op == "whole":
            ids[:] = _prompt(seed + 1, rng.randrange(1, 3000))
        step = chain.begin(ids, defer_over=1 if defer else 0)
        assert step is not None
        pending.append((step, list(ids)))
        if op == "answer":
            assert step.resolve()
            answer = [rng.randrange(151_646) for _ in range(rng.randrange(1, 20))]
            chain.finish(step.id, step.length, answer, f"{seed:016x}")
            ids.extend(answer)
    chains.clear()
    _content._SPARE.clear()
    for step, sent in pending:
        assert step.resolve()
        assert step.length == len(sent)
        assert step.id == token_content_id(sent)
