"""The content store's bounds (issue 18): what the tail sampler drops leaves no content behind,
a kept trajectory always rebuilds token for token (whoever stored a shared node first), the ids
remembered for dedup are bounded, and a store that fills its budget says so.

``ContentStore.put(kind, step, owner)`` with an explicit owner drives the store alone (property
tests over interleaved trajectories); the pipeline tests run the real ``tail_keep`` processor
into a file backend and read the store back with ``ContentIndex``.
"""

from __future__ import annotations

import asyncio
import gzip
import logging

from hypothesis import given, settings
from hypothesis import strategies as st

import otel_verl
from otel_verl import RolloutTraceConfig, _content, _content_store, semconv
from otel_verl._content import KIND_TOKENS, DeltaChain
from otel_verl.store import read_spans
from otel_verl.store._content import ContentIndex, turn_prompts


def _decide(store: _content_store.ContentStore, owner: int, keep: bool) -> None:
    """``release`` as the tail processor calls it, for a store made here (not ``store_for``'s,
    which ``release`` reaches by itself)."""
    _content_store.release(owner, keep)
    store.release(owner, keep)


def _inflated(trace_dir) -> int:
    folder = trace_dir / "content"
    if not folder.exists():
        return 0
    return sum(len(gzip.decompress(p.read_bytes())) for p in folder.iterdir())


class _Owner:
    """One trajectory driving its own chain: turn ``t`` sends the group's prompt plus what the
    trajectory appended so far (its responses and tool results)."""

    def __init__(self, number: int, group: list[int], held: bool, keep: bool) -> None:
        self.number, self.held, self.keep = number, held, keep
        self.chain = DeltaChain(KIND_TOKENS)
        self.prompt = list(group)
        self.turns = 0
        #: (content id, the content it must rebuild to) of every node it was told is stored
        self.refs: list[tuple[str, list[int]]] = []

    def turn(self, store: _content_store.ContentStore) -> None:
        owner = self.number if self.held else None
        step = self.chain.begin(list(self.prompt))
        assert step is not None
        assert store.put(KIND_TOKENS, step, owner) == "stored"
        self.refs.append((step.id, list(self.prompt)))
        response = [7000 + self.number * 100 + self.turns, 1, 2]
        node = self.chain.finish(step.id, step.length, response, None)
        assert node is not None
        assert store.put(KIND_TOKENS, node, owner) == "stored"
        self.refs.append((node.id, self.prompt + response))
        self.prompt = self.prompt + response + [9000 + self.number, self.turns]  # a tool result
        self.turns += 1


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_kept_trajectory_rebuilds_and_a_dropped_one_leaves_nothing(tmp_path_factory, data):
    """Interleaved trajectories sharing group prompts, some held (provisional) and some not,
    decided in any order: every node a kept (or never held) trajectory was told is stored
    rebuilds exactly, and the store holds no node that only dropped trajectories put."""
    directory = tmp_path_factory.mktemp("store")
    store = _content_store.ContentStore(str(directory / "content"), 1 << 30, False)
    groups = [list(range(g * 1000, g * 1000 + 40)) for g in range(2)]
    count = data.draw(st.integers(2, 8), label="trajectories")
    owners = [_Owner(n, groups[data.draw(st.integers(0, 1), label="group")],
                     held=data.draw(st.booleans(), label="held"),
                     keep=data.draw(st.booleans(), label="keep")) for n in range(count)]
    turns = [data.draw(st.integers(1, 3), label="turns") for _ in owners]
    for owner in owners:
        if owner.held:
            _content_store.hold(owner.number)
    schedule = data.draw(st.permutations([n for n, t in enumerate(turns) for _ in range(t + 1)]),
                         label="schedule")
    try:
        for n in schedule:  # each trajectory's turns, then its decision, interleaved
            owner = owners[n]
            if owner.turns < turns[n]:
                owner.turn(store)
            elif owner.held:
                _decide(store, owner.number, owner.keep)
    finally:
        for owner in owners:
            _decide(store, owner.number, False)  # a no-op once decided
        store.close()
    index = ContentIndex.load(directory)
    needed = {cid for o in owners if o.keep or not o.held for cid, _ in o.refs}
    for owner in owners:
        if owner.keep or not owner.held:
            for content_id, content in owner.refs:
                assert index.rebuild(content_id) == content
    assert set(index.nodes) == needed  # nothing of the dropped ones (except what others need)
    assert store.held() == (0, 0)
    stats = store.stats()
    assert stats["content_nodes"] == len(needed)
    if any(o.held and not o.keep for o in owners) and not needed:
        assert stats["content_discarded"] >= 1


def test_a_dropped_trajectory_gives_its_budget_back(tmp_path):
    """The budget counts what is written: held content of dropped trajectories is given back,
    so a kept trajectory after a hundred dropped ones is stored, not refused."""
    store = _content_store.ContentStore(str(tmp_path / "content"), 64 * 1024, False)
    try:
        for n in range(100):  # each ~20 KiB, three fit the budget
            _content_store.hold(n)
            step = _content.root_step(KIND_TOKENS, list(range(n * 10_000, n * 10_000 + 4000)))
            assert store.put(KIND_TOKENS, step, n) == "stored"
            _decide(store, n, False)
        kept = _content.root_step(KIND_TOKENS, list(range(5000)))
        assert store.put(KIND_TOKENS, kept, None) == "stored"
    finally:
        store.close()
    assert store.stats()["content_discarded"] == 100
    assert store.stats()["content_dropped"] == 0
    assert set(ContentIndex.load(tmp_path).nodes) == {kept.id}


def test_a_store_that_fills_its_budget_refuses_counts_and_says_it_once(tmp_path, caplog):
    """Full: ``missing`` (the span's signal), counted with its bytes, one warning; what was
    stored before still rebuilds; a held node past the budget is refused the same way."""
    caplog.set_level(logging.WARNING, logger="otel_verl")
    store = _content_store.ContentStore(str(tmp_path / "content"), 48 * 1024, False)
    steps = [_content.root_step(KIND_TOKENS, list(range(n * 10_000, n * 10_000 + 3000)))
             for n in range(6)]
    try:
        _content_store.hold(77)
        answers = [store.put(KIND_TOKENS, s, 77 if n % 2 else None) for n, s in enumerate(steps)]
        _decide(store, 77, True)
    finally:
        _decide(store, 77, False)
        store.close()
    assert answers[:2] == ["stored", "stored"] and "missing" in answers
    stored = [s for s, a in zip(steps, answers, strict=True) if a == "stored"]
    refused = [s for s, a in zip(steps, answers, strict=True) if a == "missing"]
    stats = store.stats()
    assert stats["content_dropped"] == len(refused)
    assert stats["content_dropped_bytes"] >= sum(len(s.delta_bytes) for s in refused)
    assert caplog.text.count("content store is full") == 1
    index = ContentIndex.load(tmp_path)
    for step in stored:
        assert index.rebuild(step.id) == step.delta
    for step in refused:
        assert step.id not in index.nodes


def test_the_ids_remembered_for_dedup_are_bounded_and_every_trajectory_still_rebuilds(tmp_path):
    """A long run of unique nodes keeps the dedup set at its cap; an id that fell out and comes
    back is written again (bytes, not a loss), and every turn rebuilds."""
    store = _content_store.ContentStore(str(tmp_path / "content"), 1 << 30, False, max_ids=64)
    system = list(range(100, 400))  # shared by every trajectory, far apart in time
    owners = []
    try:
        for n in range(200):
            owner = _Owner(n, system + [n], held=False, keep=True)
            for _ in range(3):
                owner.turn(store)
            owners.append(owner)
            assert len(store._seen) <= 64
        # a step that appends nothing to a base the LRU forgot: still "stored" (it is written)
        chain = owners[0].chain
        step = chain.begin(owners[0].refs[-1][1])
        assert step is not None and step.id == step.base_id
        assert store.put(KIND_TOKENS, step, None) == "stored"
    finally:
        store.close()
    stats = store.stats()
    assert stats["content_seen_evicted"] > 1000
    index = ContentIndex.load(tmp_path)
    for owner in owners:
        for content_id, content in owner.refs:
            assert index.rebuild(content_id) == content


def test_held_content_is_bounded_in_bytes_and_spills_to_the_store_not_away(tmp_path):
    """Past ``held_max_bytes`` the oldest held nodes are written before their decision: memory
    stays bounded, a kept trajectory is complete, a dropped one costs bytes, never a loss."""
    store = _content_store.ContentStore(str(tmp_path / "content"), 1 << 30, False,
                                        held_max_bytes=40 * 1024)
    steps = {}
    try:
        for n in range(10):
            _content_store.hold(n)
            steps[n] = _content.root_step(KIND_TOKENS, list(range(n * 10_000, n * 10_000 + 3000)))
            assert store.put(KIND_TOKENS, steps[n], n) == "stored"
            assert store.held()[1] <= 40 * 1024
        for n in range(10):
            _decide(store, n, n == 0)  # the oldest, spilled already, is kept
    finally:
        store.close()
    stats = store.stats()
    assert stats["content_held_spilled"] >= 1
    index = ContentIndex.load(tmp_path)
    assert index.rebuild(steps[0].id) == steps[0].delta
    assert stats["content_nodes"] + stats["content_discarded"] == 10


# --- the pipeline: tail_keep into the file backend ----------------------------------------------

SHARED = list(range(1000, 21000))  # a GRPO group's prompt, hashed off the loop (turn 1)
OTHER = list(range(30_000, 50_000))  # another, never stored before


@otel_verl.rollout_trace_op
def generate(request_id, *, prompt_ids, sampling_params):
    return {"token_ids": [7, 8, 9]}


@otel_verl.rollout_trace_op
async def agenerate(request_id, *, prompt_ids, sampling_params):
    await asyncio.sleep(0.01)
    return {"token_ids": [7, 8, 9]}


def _group(n_rollouts: int, kept: set[int], step: int = 1,
           fail: set[int] | None = None) -> list[list[int]]:
    """One step's group, its rollouts interleaved on one loop: every rollout sends the shared
    prompt, then its own long tool result; the rollouts in ``fail`` (default: ``kept``) fail
    (``error.type``: the ``errors`` rule keeps them). Returns what the rollouts in ``kept``
    sent, in order."""
    fail = kept if fail is None else fail
    sent: dict[int, list[list[int]]] = {}

    async def one(n: int) -> None:
        with otel_verl.rollout_trace_attr(step=step, sample_index=0, rollout_n=n, trace=False):
            await asyncio.sleep(0.001 * n)  # rollout 0 puts the shared prompt first
            ids = list(SHARED)
            await agenerate("r", prompt_ids=ids, sampling_params={})
            ids = ids + [7, 8, 9] + list(range(50_000 + n * 6000, 56_000 + n * 6000))
            await agenerate("r", prompt_ids=ids, sampling_params={})
            if n in kept:
                sent[n] = [list(SHARED), ids]
            if n in fail:
                otel_verl.set_trajectory_attribute(semconv.ERROR_TYPE, "tool_error")

    async def run() -> None:
        await asyncio.gather(*(one(n) for n in range(n_rollouts)))

    asyncio.run(run())
    return [prompt for n in sorted(sent) for prompt in sent[n]]


def _live(tmp_path) -> tuple[list, list, int]:
    """Flushed, while the run goes on (a live reader, as the Weave exporter reads the store;
    the content a kept trajectory needs must not wait for the shutdown): (spans, the turns
    rebuilt from the store, the store's bytes inflated)."""
    assert RolloutTraceConfig.flush(10.0)
    spans = list(read_spans(str(tmp_path), warn=False))
    prompts = turn_prompts(spans, ContentIndex.load(tmp_path))
    return spans, sorted(p.get("prompt") or [] for p in prompts), _inflated(tmp_path)


def test_tail_mode_stores_the_kept_trajectory_only_and_it_rebuilds(tmp_path):
    """Four provisional rollouts share a prompt, interleaved; the first (which put it first)
    and two more are dropped, the last is kept: the store holds the kept one's content, about
    one trajectory's worth, and every turn of it rebuilds from the store exactly as sent."""
    RolloutTraceConfig.init("p", "e", "file", trace_dir=str(tmp_path), processor="simple",
                            tail_keep=["errors"])
    try:
        sent = _group(4, kept={3})
        spans, rebuilt, stored = _live(tmp_path)
        stats = RolloutTraceConfig.stats()
    finally:
        RolloutTraceConfig.shutdown(10.0)
    roots = [s for s in spans if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY)]
    assert [r["attributes"][semconv.ROLLOUT_ROLLOUT_N] for r in roots] == [3]
    assert rebuilt == sorted(sent)
    one = len(",".join(map(str, sent[-1]))) + 2  # the kept trajectory's whole content
    assert stored < 1.3 * one  # was ~1.75x: the dropped rollouts' tool results too
    assert _inflated(tmp_path) == stored  # nothing more at the shutdown
    assert stats["content_dedup_hits"] >= 3  # the shared prompt, put once while held
    assert stats["content_discarded"] >= 3  # the dropped rollouts' tool results


def test_a_kept_trajectory_after_the_dropped_first_is_complete_in_later_steps(tmp_path):
    """The shared prompt comes back in a later step (dedup across steps): the rollout that put
    it first was dropped in step 1; step 2's kept rollout still rebuilds, and a head-sampled
    trajectory that meets a held node writes it at once."""
    before = set(_content_store._HOLDING)  # another test's processor may never have decided
    RolloutTraceConfig.init("p", "e", "file", trace_dir=str(tmp_path), processor="simple",
                            tail_keep=["errors"])
    try:
        sent = _group(2, kept=set(), step=1)
        assert _live(tmp_path)[2] == 0  # both dropped: nothing stored (turn 1 hashed off the loop)
        sent += _group(2, kept={1}, step=2)

        async def step3(n: int, trace: bool) -> None:  # held first, then a head-sampled one
            with otel_verl.rollout_trace_attr(step=3, sample_index=1, rollout_n=n, trace=trace):
                await asyncio.sleep(0.001 * n)
                await agenerate("r", prompt_ids=list(OTHER), sampling_params={})

        async def both() -> None:
            await asyncio.gather(step3(0, False), step3(1, True))

        asyncio.run(both())
        sent.append(list(OTHER))
        _spans, rebuilt, _stored = _live(tmp_path)
        stats = RolloutTraceConfig.stats()
    finally:
        RolloutTraceConfig.shutdown(10.0)
    assert rebuilt == sorted(sent)
    assert stats["content_discarded"] >= 2
    assert set(_content_store._HOLDING) <= before  # each of its trajectories was decided


def test_a_group_kept_by_the_groups_rule_is_complete(tmp_path):
    """The ``groups`` rule keeps all four rollouts once one fails: each waited for its group
    with its content held, and each rebuilds (nothing of a kept group discarded)."""
    RolloutTraceConfig.init("p", "e", "file", trace_dir=str(tmp_path), processor="simple",
                            tail_keep=["errors", "groups"], group_size=4)
    try:
        sent = _group(4, kept={0, 1, 2, 3}, fail={2})
        _spans, rebuilt, _stored = _live(tmp_path)
        stats = RolloutTraceConfig.stats()
    finally:
        RolloutTraceConfig.shutdown(10.0)
    assert rebuilt == sorted(sent) and len(sent) == 8
    assert stats["content_discarded"] == 0


def test_trajectories_spilled_from_a_full_tail_buffer_are_complete(tmp_path):
    """A tail buffer too small for one trajectory exports each early (reason overflow): its
    content is written then, and what it puts afterwards at once; every turn rebuilds."""
    RolloutTraceConfig.init("p", "e", "file", trace_dir=str(tmp_path), processor="simple",
                            tail_keep=["errors"], tail_buffer_bytes=1024)
    try:
        sent = _group(3, kept={0, 1, 2}, fail=set())
        _spans, rebuilt, _stored = _live(tmp_path)
        stats = RolloutTraceConfig.stats()
    finally:
        RolloutTraceConfig.shutdown(10.0)
    assert stats["tail_spilled"] >= 3
    assert rebuilt == sorted(sent) and len(sent) == 6
