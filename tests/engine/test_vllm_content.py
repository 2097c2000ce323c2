"""Per-turn content on a real vLLM: every turn's whole prompt, rebuilt from the local store and from
what the Weave exporter sent, equals token for token the prompt the engine says it received.

A GRPO group (the same question, ``n`` rollouts, run concurrently so their turns interleave) of
otel_verl's ``ToolAgentLoop`` against the session's vLLM CPU server (a real hermes tool call, then
the answer). Each LLM call records only what it appends (``docs/content.md``); the engine's own
view of each request is its answer's ``prompt_token_ids`` (``return_token_ids``), matched to the
call by the ``traceparent`` the request carried (the traced ``generate``, or the GenAI ``chat``
span inside it). ``content_inline_bytes`` is small, so deltas reach the readers through the content
store.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import otel_verl
from otel_verl import RolloutTraceConfig, semconv
from otel_verl.demo.run import ForcedToolPolicy, make_rows
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import VLLMCompletionsClient
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool
from otel_verl.store import read_spans
from otel_verl.store._content import ContentIndex, turn_prompts

from .conftest import MODEL

pytestmark = pytest.mark.timeout(600)

N = 3
GENERATE = "AsyncTokenClient.generate"


async def _group(vllm_server: Any, tokenizer: Any, experiment: str) -> dict[str, list[int]]:
    """One GRPO group; returns the engine's prompt token ids by the span they were sent under."""
    seen: dict[str, list[int]] = {}

    async def note(response: Any) -> None:
        if not str(response.request.url).endswith("/v1/completions"):
            return
        await response.aread()
        parent = response.request.headers["traceparent"].split("-")[2]
        seen[parent] = [int(t) for t in response.json()["choices"][0]["prompt_token_ids"]]

    client = VLLMCompletionsClient(vllm_server.base_url, MODEL, tokenizer=tokenizer)
    client.http.event_hooks["response"].append(note)
    row = make_rows(1)[0]

    async def one(n: int) -> None:
        loop = ToolAgentLoop(client, tokenizer, tools=[CalculatorTool()],
                             reward_fn=Gsm8kReward(),
                             turn_sampling=ForcedToolPolicy(p_exact=1.0, seed=n),
                             max_response_length=256)
        with otel_verl.rollout_trace_attr(step=1, sample_index=0, rollout_n=n, name="agent_loop"):
            await loop.run({"temperature": 1.0, "max_tokens": 64}, **row)

    try:
        await asyncio.wait_for(asyncio.gather(*(one(n) for n in range(N))), 300)
    finally:
        await client.aclose()
    return seen


def _by_generate(spans: list[dict[str, Any]], seen: dict[str, list[int]]
                 ) -> dict[str, list[int]]:
    """The engine's prompt by the traced ``generate`` span: the span the request's traceparent
    names, or its parent when that is the GenAI ``chat`` span inside the ``generate``."""
    by_id = {s["span_id"]: s for s in spans}
    out: dict[str, list[int]] = {}
    for sender, ids in seen.items():
        span = by_id.get(sender)
        if span is not None and span["name"] != GENERATE:
            span = by_id.get(span["parent_span_id"])
        if span is not None:
            out[span["span_id"]] = ids
    return out


async def test_every_turn_rebuilds_from_the_store_as_the_engine_received_it(
        vllm_server, tokenizer, tmp_path):
    trace_dir = tmp_path / "traces"
    experiment = f"content-{uuid.uuid4().hex[:8]}"
    RolloutTraceConfig.init("engine-tests", experiment, backend="file", trace_dir=str(trace_dir),
                            content_inline_bytes=64)
    try:
        seen = await _group(vllm_server, tokenizer, experiment)
    finally:
        assert RolloutTraceConfig.shutdown(timeout_s=20)
    spans = [s for s in read_spans(trace_dir)
             if s["attributes"].get(semconv.ROLLOUT_EXPERIMENT_NAME) == experiment]
    engine = _by_generate(spans, seen)
    generates = {s["span_id"]: s for s in spans if s["name"] == GENERATE}
    assert len(generates) >= 2 * N and engine.keys() == generates.keys()
    records = turn_prompts(spans, ContentIndex.load(trace_dir))
    assert {r["span_id"] for r in records} == generates.keys()
    for record in records:
        assert "error" not in record, record
        assert record["prompt"] == engine[record["span_id"]], record["span_id"]
    later = [s["attributes"] for s in generates.values()
             if semconv.CONTENT_BASE_ID in s["attributes"]]
    assert len(later) >= N  # every later turn extends the previous one and records the rest
    assert all(a[semconv.CONTENT_DELTA_LEN] < a[semconv.CONTENT_LEN] for a in later)
    # the group's shared question: one node, whatever the number of rollouts
    first = {s["attributes"][semconv.CONTENT_ID] for s in generates.values()
             if semconv.CONTENT_BASE_ID not in s["attributes"]}
    assert len(first) == 1


async def test_every_turn_rebuilds_from_weave_as_the_engine_received_it(
        vllm_server, tokenizer, tmp_path, monkeypatch):
    pytest.importorskip("otel_weave_exporter", reason="needs exporters/weave")
    pytest.importorskip("weave.trace_server.sqlite_trace_server",
                        reason="needs weave[trace-server]==0.52.42 (the stack venv has it)")
    sys.path.insert(0, str(Path(__file__).parents[1] / "weave"))
    from _common import API_KEY
    from _weave_objects import WeaveObjectsShim

    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    # the tiny model's prompts are small: a small inline size shows them as object segments
    monkeypatch.setenv("OTEL_EXPORTER_WEAVE_CONTENT_INLINE_BYTES", "64")
    experiment = f"content-{uuid.uuid4().hex[:8]}"
    with WeaveObjectsShim(str(tmp_path / "weave.sqlite"), API_KEY) as shim:
        RolloutTraceConfig.init("engine-tests", experiment, backend="weave", weave_entity="ent",
                                weave_base_url=shim.url, trace_dir=str(tmp_path / "traces"),
                                content_inline_bytes=64)
        try:
            seen = await _group(vllm_server, tokenizer, experiment)
        finally:
            assert RolloutTraceConfig.shutdown(timeout_s=20)
        calls = shim.calls("ent/engine-tests")
        engine = _by_generate([{"span_id": c.id, "parent_span_id": c.parent_id,
                                "name": c.op_name} for c in calls], seen)
        generates = [c for c in calls if c.op_name == GENERATE]
        assert len(generates) >= 2 * N and {c.id for c in generates} == engine.keys()
        for c in generates:
            assert shim.prompt(c.inputs["prompt_ids"]) == engine[c.id], c.id
        assert all(isinstance(c.inputs["prompt_ids"], dict) for c in generates)
        # the group's shared question: one object, referred to by every rollout's turns
        (first,) = {c.inputs["prompt_ids"]["segments"][0] for c in generates}
        assert len(shim.calls("ent/engine-tests", input_refs=[first])) >= 2 * N
        assert shim.object_rows() == len(shim.objects("ent/engine-tests"))
        assert all(r["status"] == 200 for r in shim.requests), shim.requests
