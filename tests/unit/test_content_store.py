"""The content store's files (otel_verl._content_store; docs/content.md, "The content store"):
one gzip member per node, read back by every reader (ContentIndex, the Weave exporter's
NodeReader, ``zcat``) token for token, and damage that costs the damaged node only, never a
wrong prompt."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
import zlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otel_verl
from otel_verl import RolloutTraceConfig, _content, rollout_trace_attr, semconv
from otel_verl._content_store import GZIP_SUFFIX, iter_members
from otel_verl.store import read_spans
from otel_verl.store._content import ContentError, ContentIndex, turn_prompts
from otel_weave_exporter._content_objects import NodeReader


@otel_verl.rollout_trace_op
async def generate(request_id, *, prompt_ids, sampling_params):
    await asyncio.sleep(0)
    return {"token_ids": sampling_params["answer"]}


def _rollouts(trace_dir: str, n: int, context: int) -> list[list[int]]:
    """``n`` interleaved 4-turn trajectories of a ``context``-token prompt (ids spread like a
    real vocabulary's), on the file backend; the prompts the engine received."""
    sent: list[list[int]] = []
    rng = random.Random(7)
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("p", "e", "file", trace_dir=trace_dir)

    async def one(i: int) -> None:
        with rollout_trace_attr(step=1, sample_index=i, rollout_n=0, name="agent_loop"):
            ids = [rng.randrange(151_646) for _ in range(context)]
            for turn in range(4):
                sent.append(list(ids))
                answer = [rng.randrange(151_646) for _ in range(20 + turn)]
                await generate(f"r{i}", prompt_ids=ids, sampling_params={"answer": answer})
                ids = ids + answer + [rng.randrange(151_646) for _ in range(7)]  # + a tool turn

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(n)))

    asyncio.run(main())
    RolloutTraceConfig.shutdown(10.0)
    return sent


def test_every_reader_rebuilds_every_turn_from_the_gzip_store(tmp_path):
    sent = _rollouts(str(tmp_path), 3, 3000)
    folder = tmp_path / "content"
    names = os.listdir(folder)
    assert names and all(name.endswith(GZIP_SUFFIX) for name in names), names
    raw = b"".join((folder / name).read_bytes() for name in names)
    inflated = gzip.decompress(raw)  # what zcat prints: the node lines
    lines = inflated.splitlines()
    assert len(raw) < len(inflated) / 1.5  # uniformly random ids of a 151k vocabulary: ~1.9x
    nodes = [json.loads(line) for line in lines]
    assert {n["kind"] for n in nodes} == {"tokens"}
    # every LLM call's whole prompt, as the engine received it, from the store alone
    spans = list(read_spans(str(tmp_path), warn=False))
    prompts = [p for p in turn_prompts(spans, ContentIndex.load(tmp_path))]
    assert len(prompts) == len(sent) == 12
    assert sorted(map(tuple, (p["prompt"] for p in prompts))) == sorted(map(tuple, sent))
    # no span carried a delta whole here that the store lacks: the store alone rebuilds them
    index = ContentIndex.load(tmp_path)
    assert index.bad_lines == 0
    by_id = {tuple(p): _content.token_content_id(p) for p in sent}
    for prompt, content_id in by_id.items():
        assert index.rebuild(content_id) == list(prompt)
    # the Weave exporter's reader: each node from its own member, by offset
    reader = NodeReader(str(folder))
    for node in nodes:
        assert reader.node(node["id"]) == node
    calls = [s for s in spans if semconv.CONTENT_ID in s["attributes"]]
    assert {s["attributes"][semconv.CONTENT_STORED] for s in calls} == {"stored"}


def _store_file(tmp_path, count: int) -> tuple[bytes, list[list[int]], list[str]]:
    """A store file of ``count`` nodes, each extending the one before (one chain)."""
    store = _content.ContentStore(str(tmp_path / "content"), 1 << 30, False)
    chain = _content.DeltaChain(_content.KIND_TOKENS)
    prompt: list[int] = []
    prompts, ids = [], []
    for i in range(count):
        prompt = prompt + [i * 1000 + j for j in range(30 + i)]
        step = chain.begin(prompt)
        assert step is not None
        assert store.put(_content.KIND_TOKENS, step) == "stored"
        chain.finish(step.id, step.length, [], f"{i:016x}")
        prompts.append(list(prompt))
        ids.append(step.id)
    store.close()
    with open(store.path, "rb") as f:
        return f.read(), prompts, ids


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_damaged_member_costs_its_node_only_and_nothing_rebuilds_wrong(tmp_path_factory, data):
    tmp_path = tmp_path_factory.mktemp("store")
    raw, prompts, ids = _store_file(tmp_path, 6)
    members = list(iter_members(raw))
    assert [m[1] > 0 and m[2] is not None for m in members] == [True] * 6
    hit = data.draw(st.integers(min_value=0, max_value=5), label="member")
    offset, size, _ = members[hit]
    at = data.draw(st.integers(min_value=offset, max_value=offset + size - 1), label="byte")
    value = data.draw(st.integers(min_value=0, max_value=255).filter(lambda v: v != raw[at]))
    damaged = bytearray(raw)
    damaged[at] = value
    cut = data.draw(st.booleans(), label="tail cut short")
    if cut:  # and a last write killed halfway through a 7th member
        damaged += zlib.compress(b'{"id":"tok:sha256:' + b"0" * 64 + b'"}\n', 1, wbits=31)[:15]
    folder = tmp_path / "read" / "content"
    folder.mkdir(parents=True)
    (folder / f"1-1{GZIP_SUFFIX}").write_bytes(bytes(damaged))
    index = ContentIndex.load(tmp_path / "read")
    # every other node is found (the next member by its magic, checked whole)
    assert set(ids) - {ids[hit]} <= set(index.nodes)
    assert index.bad_lines <= 1 + cut
    assert index.bad_lines >= cut  # a cut-short tail is counted, not silently dropped
    for content_id, prompt in zip(ids, prompts, strict=True):
        try:
            rebuilt = index.rebuild(content_id)
        except ContentError:
            assert content_id not in index.nodes or hit < ids.index(content_id) or \
                content_id == ids[hit]
            continue
        assert rebuilt == prompt  # whatever survives rebuilds exactly, or not at all
    if ids[hit] not in index.nodes:
        for later in ids[hit:]:  # the chain through the lost node: an error, never shorter
            try:
                index.rebuild(later)
            except ContentError as exc:
                assert "missing" in str(exc)
            else:
                raise AssertionError("a chain through a damaged node rebuilt")


def test_the_live_weave_reader_waits_for_a_member_cut_short_and_skips_a_damaged_one(tmp_path):
    raw, _prompts, ids = _store_file(tmp_path, 4)
    members = list(iter_members(raw))
    folder = tmp_path / "live"
    folder.mkdir()
    path = folder / f"1-1{GZIP_SUFFIX}"
    # member 0 whole, member 1 damaged (a byte of its deflate data), member 2 half written
    first, second, third = members[0], members[1], members[2]
    damaged = bytearray(raw[second[0]:second[0] + second[1]])
    damaged[second[1] // 2] ^= 0xFF
    half = third[0] + third[1] // 2
    path.write_bytes(raw[:first[1]] + bytes(damaged) + raw[third[0]:half])
    reader = NodeReader(str(folder))
    assert reader.node(ids[0])["id"] == ids[0]
    assert reader.node(ids[2]) is None  # not whole yet
    with open(path, "ab") as f:  # the writer finishes it, and writes the fourth
        f.write(raw[half:])
    assert reader.node(ids[2])["id"] == ids[2]
    assert reader.node(ids[3])["id"] == ids[3]
    assert reader.node(ids[1]) is None  # damaged: not found, never a wrong node


def test_plain_nodes_files_of_older_stores_still_read(tmp_path):
    raw, prompts, ids = _store_file(tmp_path, 3)
    folder = tmp_path / "old" / "content"
    folder.mkdir(parents=True)
    (folder / "1-1.nodes").write_bytes(gzip.decompress(raw))
    index = ContentIndex.load(tmp_path / "old")
    assert [index.rebuild(i) for i in ids] == prompts
    reader = NodeReader(str(folder))
    assert [reader.node(i)["id"] for i in ids] == ids
