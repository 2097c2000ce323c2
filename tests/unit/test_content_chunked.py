"""A chunked chain (a trajectory whose first prompt is long: 32k-128k tokens) does O(1) plus
O(what the turn added) on the event loop per turn (issue 18): it keeps no list copy of the
context (its content is tuples of ``CMP_ITEMS`` tokens, built off the loop, which the cyclic
GC stops tracking after one look), and the prefix check, the encode and the hash of each turn
run on the content-hash thread (``PendingStep._compute_chunked``). Every turn still rebuilds
token for token; an edit (also one made in place in the caller's own list) is found and
recorded against a real prefix or whole, never as a wrong delta; chains of interleaved
trajectories stay apart; a full store says so (``stored=missing``, counted)."""

from __future__ import annotations

import gc
import tempfile
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl import _content
from otel_verl._content import KIND_TOKENS, DeltaChain, token_content_id
from otel_verl._content_store import ContentStore
from otel_verl.store._content import ContentIndex

N = 128 * 1024


def test_a_long_chain_keeps_no_list_of_the_context_and_checks_off_the_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    checked_on: list[str] = []
    real = _content._run_matches

    def watched(*args: Any) -> bool:
        checked_on.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(_content, "_run_matches", watched)
    context = [1000 + i % 50_000 for i in range(N)]  # the agent loop's list, extended in place
    chain = DeltaChain(KIND_TOKENS)
    step = chain.begin(context, defer_over=2048)
    assert step is not None and step.pending
    _content.defer(step)
    assert step.resolve()
    for turn in range(3):
        answer = [7 + turn + i for i in range(200)]
        node = chain.finish(step.id, step.length, answer, f"{turn + 1:016x}")
        assert node is not None
        context += answer + [11] * 50
        checked_on.clear()
        step = chain.begin(context, defer_over=2048)
        assert step is not None and step.pending and step.id is None
        assert checked_on == []  # the prefix is not compared on the calling thread
        assert step.delta == [11] * 50  # the loop copied what the turn added only (the answer
        # is the chain's already)
        _content.defer(step)  # the content-hash thread checks it against the chain
        _wait_done(step)
        assert step.resolve()
        assert checked_on and threading.main_thread().name not in checked_on
        assert step.base_id == node.id and step.base_len == node.length
        assert step.id == token_content_id(context)
    chain.begin(context, defer_over=2048)  # the chain takes the last step's chunks
    # the chain holds no context-long list (before: its own ~128k-item copy), and after one
    # collection none of its chunks is tracked by the cyclic GC (young scans skip them)
    chain._settle()
    held = [o for o in gc.get_referents(*[getattr(chain, s) for s in DeltaChain.__slots__
                                           if hasattr(chain, s)])
            if type(o) is list and len(o) > _content.CMP_ITEMS]
    assert held == []
    assert chain._chunks is not None and sum(map(len, chain._chunks)) == len(context)
    gc.collect()
    assert not any(gc.is_tracked(chunk) for chunk in chain._chunks)


def _wait_done(step: _content.PendingStep) -> None:
    for _ in range(1000):  # bounded: up to 10 s for the content-hash thread to come by
        if step._done:
            return
        time.sleep(0.01)


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
       turns=st.lists(st.tuples(st.integers(0, 2), change,
                                st.lists(st.integers(-50, 50), max_size=5)), max_size=12))
def test_chunked_chains_rebuild_every_turn_and_extend_only_real_prefixes(first, turns) -> None:
    """Interleaved trajectories (one chain each), tiny chunks and pieces so every boundary is
    crossed; each step checked after the content-hash thread's work."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_content, "CMP_ITEMS", 3)
        mp.setattr(_content, "DEFER_CHUNK", 4)
        mp.setattr(_content, "DEFER_MIN_ITEMS", 0)
        chains = [DeltaChain(KIND_TOKENS) for _ in first]
        lists = [list(ids) for ids in first]
        prev: list[tuple[list[int], list[int]] | None] = [None] * len(first)  # prompt, full
        index = ContentIndex()
        script = [(i, ("same", None), []) for i in range(len(first))] + turns
        for who, op, answer in script:
            who %= len(first)
            if prev[who] is not None:
                lists[who] = _apply(lists[who], op)
            ids = lists[who]
            sent = list(ids)
            step = chains[who].begin(ids, defer_over=1)
            if step is None:  # an empty prompt: nothing to record
                assert not ids
                continue
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
            _add(index, step)
            assert index.rebuild(step.id) == sent
            node = chains[who].finish(step.id, step.length, answer, f"{who + 1:016x}")
            if node is not None:
                _add(index, node)
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


def _add(index: ContentIndex, step: _content.Step) -> None:
    if step.id == step.base_id:  # appends nothing: the base's node is this content's
        return
    index.nodes.pop(step.id, None)
    with tempfile.NamedTemporaryFile("wb", suffix=".nodes", delete=False) as f:
        f.write(_content.node_line(KIND_TOKENS, step))
    index.read_file(f.name)


def test_a_full_store_says_missing_for_a_chunked_turn_and_counts_it(tmp_path) -> None:
    store = ContentStore(str(tmp_path / "content"), max_bytes=N * 8, redact=False)
    context = list(range(N))
    chain = DeltaChain(KIND_TOKENS)
    step = chain.begin(context, defer_over=2048)
    assert step is not None
    _content.defer(step, store)
    assert step.resolve() and step.stored == "stored"
    context += list(range(N))  # the next turn adds more than the budget has left
    later = chain.begin(context, defer_over=2048)
    assert later is not None
    _content.defer(later, store)
    assert later.resolve() and later.base_id == step.id
    assert later.stored == "missing"
    assert store.stats()["content_dropped"] == 1
    store.close()
