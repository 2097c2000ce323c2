"""Per-turn content through Weave: every turn's whole prompt, rebuilt from what the exporter sent.

otel_verl records each LLM call's prompt as what it adds to the trajectory's previous call
(``docs/content.md``); the Weave exporter shows each call's prompt as segments, each an object
stored once by digest, plus the call's own delta inline when small (``docs/weave.md``). Here a
GRPO group of rollouts with a shared long prompt (beyond the span cap: it reaches the exporter
through the content store), three tool turns each, two steps with the same prompt, turns of all
trajectories interleaved, one prompt edited mid-way and one that drops the last answer, runs
through otel_verl's ``backend="weave"`` into Weave's own server code. Read back through the
server's API (``calls_query``, ``refs_read_batch``, ``objs_query``), each call's prompt is rebuilt
and compared, token for token, with what the engine received.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from typing import Any

import pytest
from _common import API_KEY

otel_verl = pytest.importorskip("otel_verl", reason="needs the otel_verl core (pip install -e .)")

from otel_verl import SpanKindName, rollout_trace_attr, rollout_trace_op  # noqa: E402

PROJECT_ID = "ent/proj"
N = 3            # GRPO group size
STEPS = (1, 2)   # the same prompt in both steps
TURNS = 3
PROMPT_TOKENS = 1500  # ~7.5 KB of token text: beyond the inline size, so out of line


class Engine:
    """A token-in, token-out engine that remembers every prompt it received."""

    def __init__(self) -> None:
        self.received: dict[tuple[int, int, int], list[list[int]]] = defaultdict(list)

    async def complete(self, key: tuple[int, int, int], prompt_ids: list[int]) -> list[int]:
        self.received[key].append(list(prompt_ids))
        await asyncio.sleep(random.random() * 0.01)  # turns of all trajectories interleave
        rng = random.Random(hash((key, len(prompt_ids))))
        return [rng.randrange(5, 30000) for _ in range(20)]


class Server:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @rollout_trace_op(kind=SpanKindName.LLM)
    async def generate(self, request_id: str, *, prompt_ids: list[int], key: list[int]) -> dict:
        tokens = await self.engine.complete(tuple(key), prompt_ids)
        return {"token_ids": tokens, "stop_reason": "stop"}


class ToolAgentLoop:
    def __init__(self, engine: Engine) -> None:
        self.server = Server(engine)

    @rollout_trace_op(kind=SpanKindName.AGENT)
    async def run(self, prompt: list[int], key: tuple[int, int, int]) -> dict:
        step, sample, n = key
        ids = list(prompt)
        for turn in range(TURNS):
            out = await self.server.generate(f"req-{step}-{n}", prompt_ids=ids, key=list(key))
            previous = ids
            ids = ids + out["token_ids"] + [151644, 100 + turn, 7 * n + turn, 151645]  # tool
            if turn == 1 and n == 1:  # edited, not appended: a token in the middle changes
                ids = ids[:40] + [99999] + ids[41:]
            if turn == 1 and n == 2:  # the last answer dropped: extends the prompt only
                ids = previous + [151644, 555, 151645]
        return {"num_turns": TURNS * 2}


@pytest.fixture
def objects_server(tmp_path):
    pytest.importorskip("weave.trace_server.sqlite_trace_server")
    from _weave_objects import WeaveObjectsShim

    with WeaveObjectsShim(str(tmp_path / "weave.sqlite"), API_KEY) as shim:
        yield shim


@pytest.fixture
def rollouts(objects_server, monkeypatch, tmp_path):
    from otel_verl import RolloutTraceConfig

    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("proj", "exp-content", backend="weave", weave_entity="ent",
                            weave_base_url=objects_server.url,
                            trace_dir=str(tmp_path / "traces"))
    engine = Engine()
    rng = random.Random(7)
    prompt = [rng.randrange(5, 30000) for _ in range(PROMPT_TOKENS)]

    async def one(key: tuple[int, int, int]) -> None:
        step, sample, n = key
        with rollout_trace_attr(step=step, sample_index=sample, rollout_n=n):
            await ToolAgentLoop(engine).run(prompt, key)

    async def all_of_them() -> None:
        for step in STEPS:
            await asyncio.gather(*(one((step, 4, n)) for n in range(N)))

    try:
        asyncio.run(all_of_them())
        assert RolloutTraceConfig.shutdown(timeout_s=20)
    finally:
        RolloutTraceConfig.reset()
    return objects_server, engine, prompt


def test_every_turns_prompt_rebuilds_from_weave_token_for_token(rollouts):
    shim, engine, prompt = rollouts
    calls = [c for c in shim.calls(PROJECT_ID) if c.op_name.endswith("Server.generate")]
    assert len(calls) == len(STEPS) * N * TURNS
    per_trajectory: dict[tuple[int, int, int], list[Any]] = defaultdict(list)
    for c in calls:
        a = c.attributes
        per_trajectory[(a["step"], a["sample_index"], a["rollout_n"])].append(c)
    assert per_trajectory.keys() == engine.received.keys()
    for key, group in per_trajectory.items():
        group.sort(key=lambda c: c.started_at)
        rebuilt = [shim.prompt(c.inputs["prompt_ids"]) for c in group]
        assert rebuilt == engine.received[key], key
    # the edited prompt starts afresh; the one that dropped the answer extends the prompt only
    edited = sorted(per_trajectory[(1, 4, 1)], key=lambda c: c.started_at)[2]
    assert "extends" not in edited.inputs["prompt_ids"]
    dropped = sorted(per_trajectory[(1, 4, 2)], key=lambda c: c.started_at)
    assert dropped[2].inputs["prompt_ids"]["extends"]["length"] == \
        dropped[1].inputs["prompt_ids"]["length"]


def test_shared_content_is_one_object_however_many_calls_refer_to_it(rollouts):
    shim, engine, prompt = rollouts
    calls = [c for c in shim.calls(PROJECT_ID) if c.op_name.endswith("Server.generate")]
    first = [c for c in calls if "extends" not in c.inputs["prompt_ids"]
             and c.inputs["prompt_ids"]["length"] == PROMPT_TOKENS]
    assert len(first) == len(STEPS) * N  # the group's prompt, in both steps
    (shared,) = {c.inputs["prompt_ids"]["segments"][0] for c in first}
    assert isinstance(shared, str) and shared.startswith("weave:///ent/proj/object/")
    (value,) = shim.read_refs([shared])
    assert value["items"] == prompt
    # Weave's own index of refs: the calls that use the shared prompt, found by it
    users = Counter(c.op_name.rsplit(".", 1)[-1]
                    for c in shim.calls(PROJECT_ID, input_refs=[shared]))
    # every turn but the edited prompts' (one a step), and each agent loop's own prompt input
    # (its call and the trajectory's root call, named after it)
    assert users == {"generate": len(STEPS) * (N * TURNS - 1), "run": 2 * len(STEPS) * N}, users
    # stored once: one object row per distinct object, however many calls refer to it
    objects = shim.objects(PROJECT_ID)
    names = Counter(o.object_id for o in objects)
    assert names.most_common(1)[0][1] == 1, names.most_common(3)
    assert shim.object_rows() == len(objects)
    name = shared.rsplit("/", 1)[1].split(":")[0]
    assert names[name] == 1
    referenced = {s if isinstance(s, str) else s["ref"]
                  for c in calls for s in c.inputs["prompt_ids"]["segments"]
                  if not isinstance(s, list)}
    assert referenced <= {f"weave:///ent/proj/object/{o.object_id}:{o.digest}" for o in objects}
    # sent once per process too: one /obj/create per stored object
    creates = [r for r in shim.requests if r["path"] == "/obj/create"]
    assert all(r["status"] == 200 for r in creates)
    assert len(creates) == len(objects)
    # each call carries O(what it added): its own delta, and refs for the rest
    for c in calls:
        inline = [s for s in c.inputs["prompt_ids"]["segments"] if isinstance(s, list)]
        assert sum(len(s) for s in inline) <= 40, c.inputs["prompt_ids"]
