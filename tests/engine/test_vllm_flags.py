"""RL flags on a real vLLM (issue 21, docs/signals.md): the ``length_cap`` detector flags exactly
the trajectories the real engine cut off at ``max_tokens``.

otel_verl's ``ToolAgentLoop`` against the session's vLLM CPU server, ``detect_flags`` on, the
detectors on their own thread. Each turn is constrained (``ForcedToolPolicy``: a hermes calculator
call, then ``The answer is N.``), so with room to write it the model ends each turn itself
(``finish_reason`` ``stop``); the planted trajectories get ``max_tokens=4``, too few for the tool
call, and the engine stops them with ``finish_reason`` ``length``. Nothing is scripted: the finish
reasons are the engine's own, read by the client from its answers.
"""

from __future__ import annotations

import asyncio
import json
import uuid
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

from .conftest import MODEL

pytestmark = pytest.mark.timeout(600)

PLANTED = 10  # max_tokens=4: cut off by the engine
CLEAN = 10  # max_tokens=64: room for the constrained turn
FLAG = semconv.flag_key("length_cap")


async def _rollouts(vllm_server: Any, tokenizer: Any, caps: list[int]) -> None:
    """One trajectory per entry of ``caps`` (its per-turn ``max_tokens``), run concurrently."""
    client = VLLMCompletionsClient(vllm_server.base_url, MODEL, tokenizer=tokenizer)
    rows = make_rows(len(caps))

    async def one(n: int, cap: int) -> None:
        loop = ToolAgentLoop(client, tokenizer, tools=[CalculatorTool()],
                             reward_fn=Gsm8kReward(),
                             turn_sampling=ForcedToolPolicy(p_exact=1.0, seed=n),
                             max_response_length=256)
        with otel_verl.rollout_trace_attr(step=1, sample_index=n, rollout_n=0, name="agent_loop"):
            await loop.run({"temperature": 1.0, "max_tokens": cap}, **rows[n])

    try:
        await asyncio.wait_for(asyncio.gather(*(one(n, c) for n, c in enumerate(caps))), 300)
    finally:
        await client.aclose()


async def _run(vllm_server: Any, tokenizer: Any, tmp_path: Any, caps: list[int]
               ) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """The trajectory spans' attributes by sample index, and every span of the run."""
    experiment = f"flags-{uuid.uuid4().hex[:8]}"
    trace_dir = tmp_path / "traces"
    RolloutTraceConfig.init("engine-tests", experiment, backend="file", trace_dir=str(trace_dir),
                            detect_flags="all")
    try:
        await _rollouts(vllm_server, tokenizer, caps)
    finally:
        assert RolloutTraceConfig.shutdown(timeout_s=20)
    spans = [s for s in read_spans(trace_dir, warn=False)
             if s["attributes"].get(semconv.ROLLOUT_EXPERIMENT_NAME) == experiment]
    found = {s["attributes"][semconv.ROLLOUT_SAMPLE_INDEX]: s["attributes"] for s in spans
             if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY)}
    assert set(found) == set(range(len(caps)))
    return found, spans


def _finish_reasons(spans: list[dict[str, Any]]) -> dict[int, set[str]]:
    """The engine's finish reasons, per trajectory, as its LLM spans recorded them."""
    trace_of = {s["trace_id"]: s["attributes"][semconv.ROLLOUT_SAMPLE_INDEX] for s in spans
                if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY)}
    out: dict[int, set[str]] = {n: set() for n in trace_of.values()}
    for s in spans:
        reasons = s["attributes"].get(semconv.GEN_AI_RESPONSE_FINISH_REASONS)
        if reasons and s["trace_id"] in trace_of:
            out[trace_of[s["trace_id"]]].update(reasons)
    return out


async def test_length_cap_flags_the_trajectories_the_engine_cut_off(
        vllm_server, tokenizer, tmp_path):
    caps = [4 if n % 2 == 0 else 64 for n in range(PLANTED + CLEAN)]  # interleaved
    found, spans = await _run(vllm_server, tokenizer, tmp_path, caps)
    planted = {n for n, cap in enumerate(caps) if cap == 4}
    reasons = _finish_reasons(spans)
    # the planting worked on the engine's side: cut off there, and only there
    assert all("length" in reasons[n] for n in planted), reasons
    assert all(reasons[n] == {"stop"} for n in found if n not in planted), reasons
    flagged = {n for n, a in found.items() if a.get(FLAG)}
    recall = len(flagged & planted) / len(planted)
    false_positive = len(flagged - planted) / (len(caps) - len(planted))
    print(f"\nlength_cap on real vLLM: planted {len(planted)}, flagged {len(flagged)}, "
          f"recall {recall:.2f}, false positives {false_positive:.3f}; other flags "
          f"{sorted({f for a in found.values() for f in a.get(semconv.RL_FLAGS, ())})}")
    assert recall >= 0.9 and false_positive <= 0.01, (flagged, planted)
    for n in flagged:  # the evidence: the engine's own finish reason, on the turn it cut off
        evidence = json.loads(found[n][semconv.flag_evidence_key("length_cap")])
        assert evidence["finish_reason"] == "length" and evidence["turn"] == 0, evidence
        assert "length_cap" in found[n][semconv.RL_FLAGS]


async def test_a_clean_set_flags_no_length_cap(vllm_server, tokenizer, tmp_path):
    found, spans = await _run(vllm_server, tokenizer, tmp_path, [64] * CLEAN)
    assert all(r == {"stop"} for r in _finish_reasons(spans).values())
    assert not [n for n, a in found.items() if a.get(FLAG)]
    assert not [n for n, a in found.items() if "length_cap" in a.get(semconv.RL_FLAGS, ())]
