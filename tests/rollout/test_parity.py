"""Parity (issue 22, docs/parity.md): what a trace shows against what the trainer consumed, over
real rollouts — ``ToolAgentLoop`` -> ``VLLMCompletionsClient`` -> HTTP -> the engine stub (a tool
call three times, then the answer: 4 LLM calls per trajectory), the file backend writing a real
store, trajectories interleaved on one loop. The trainer's side is a dataset file written from
the loop's own ``AgentLoopOutput`` (what a trainer would batch).

Each drift kind is injected into one real rollout: a turn retokenized by the loop (a BPE-like
merge of the sampled "1", "2" into one token before the next turn), a changed response mask, a
changed reward, a turn served by older weights than the trainer recorded. Every one is caught,
and a clean run reports nothing.
"""

from __future__ import annotations

import asyncio
import json

import pytest

import otel_verl
from otel_verl import RolloutTraceConfig, _policy, rollout_trace_attr, semconv
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import TokenOutput, VLLMCompletionsClient
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool
from otel_verl.store import read_spans
from otel_verl.store._content import ContentIndex
from otel_verl.store._parity import check, load_consumed, summarize

from ._engine_stub import EngineStub
from ._scripted import CharTokenizer

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'
ANSWER = "The answer is #### 84"
STEP = 2  # trains the weights of 1 update: version 1 is on-policy
MERGED = 99  # the one token a re-encoding makes of "1" "2" (ids 149, 150 sampled)


class ToolEngine(EngineStub):
    def __init__(self, tokenizer: CharTokenizer, tool_turns: int = 3) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.tool_turns = tool_turns

    def handle(self, path, headers, body):
        if path != "/v1/completions":
            return super().handle(path, headers, body)
        self.requests.append(body)
        done = self.tokenizer.decode(body["prompt"]).count("<tool_response>")
        text = CALL if done < self.tool_turns else ANSWER
        ids = self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]
        return 200, {"id": "cmpl", "model": body["model"],
                     "choices": [{"index": 0, "text": text, "finish_reason": "stop",
                                  "token_ids": ids}],
                     "usage": {"prompt_tokens": len(body["prompt"]),
                               "completion_tokens": len(ids)}}


class MergingTokenizer(CharTokenizer):
    """The char tokenizer, plus the one merged token "12" of a re-encoding."""

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join("12" if tid == MERGED else super(MergingTokenizer, self).decode(
            [tid], skip_special_tokens) for tid in ids)


class RetokenizingClient:
    """What a text-level loop does on one trajectory's second turn: it keeps the sampled text
    re-encoded (one merged token for "12") instead of the tokens the engine sampled."""

    def __init__(self, client, tokenizer: CharTokenizer, sample: int, turn: int) -> None:
        self.client, self.tokenizer, self.sample, self.turn = client, tokenizer, sample, turn
        self.calls: dict[int, int] = {}

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        out = await self.client.generate(request_id, prompt_ids=prompt_ids,
                                          sampling_params=sampling_params)
        sample = sampling_params["sample"]
        self.calls[sample] = self.calls.get(sample, 0) + 1
        if sample != self.sample or self.calls[sample] != self.turn:
            return out
        ids, merged, i = list(out.token_ids), [], 0
        one, two = self.tokenizer.encode("12")
        while i < len(ids):
            if ids[i:i + 2] == [one, two]:
                merged.append(MERGED)
                i += 2
            else:
                merged.append(ids[i])
                i += 1
        assert merged != ids
        return TokenOutput(token_ids=merged, finish_reason=out.finish_reason)


def _row(index: int) -> dict:
    return {"raw_prompt": [{"role": "user", "content": f"What is 12*7? ({index})"}],
            "reward_model": {"ground_truth": "84"}, "index": index}


async def _rollouts(engine, n: int, *, retokenize: int | None = None,
                    stale: int | None = None) -> list:
    tokenizer = engine.tokenizer

    def turn_sampling(turn, messages, row):
        # the weights serving this call: the trajectory ``stale`` gets its 2nd turn from the
        # weights before the last sync (a late request on a replica not yet updated)
        otel_verl.set_policy_version(0 if row["index"] == stale and turn == 1 else 1)
        return {"sample": row["index"]}

    async with VLLMCompletionsClient(engine.url, model="stub") as client:
        used = client if retokenize is None else RetokenizingClient(client, tokenizer,
                                                                    retokenize, 2)
        loop = ToolAgentLoop(used, tokenizer, tools=[CalculatorTool()], reward_fn=Gsm8kReward(),
                             max_assistant_turns=4, max_user_turns=4, max_response_length=4096,
                             turn_sampling=turn_sampling)

        async def one(i: int):
            with rollout_trace_attr(step=STEP, sample_index=i, rollout_n=0, name="agent_loop"):
                return await loop.run({"temperature": 1.0, "max_tokens": 256}, **_row(i))

        return await asyncio.gather(*(one(i) for i in range(n)))


def _trained(outs, path, *, mask: int | None = None, reward: int | None = None) -> str:
    """The trainer's batch as a dataset file (the rows it trains on, drift injected)."""
    with open(path, "w") as f:
        for i, out in enumerate(outs):
            response_mask = list(out.response_mask)
            if i == mask:  # a bug in the mask: the first tool token trained on
                response_mask[response_mask.index(0)] = 1
            f.write(json.dumps({
                "step": STEP, "sample_index": i, "rollout_n": 0, "validate": False,
                "prompt_ids": out.prompt_ids, "response_ids": out.response_ids,
                "response_mask": response_mask,
                "reward": (1.0 - out.reward_score) if i == reward else out.reward_score,
                "num_turns": out.num_turns,
                "policy_version_min": 1, "policy_version_max": 1}) + "\n")
    return str(path)


def _run(tmp_path, n: int, **drift) -> tuple[list, list]:
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path / "traces"))
    try:
        with ToolEngine(MergingTokenizer()) as engine:
            outs = asyncio.run(_rollouts(engine, n, **drift))
    finally:
        _policy.set_policy_version(None)
    RolloutTraceConfig.shutdown(10.0)
    assert all(out.extra_fields["assistant_turns"] == 4 for out in outs)
    return outs, list(read_spans(str(tmp_path / "traces"), warn=False))


def _reports(tmp_path, spans, dataset, **options):
    reports = check(spans, ContentIndex.load(tmp_path / "traces"), load_consumed(dataset),
                    **options)
    return {r.traced.key[1]: r for r in reports}


def test_a_clean_run_is_equal_and_carries_its_policy_version(tmp_path):
    outs, spans = _run(tmp_path, 4)
    reports = _reports(tmp_path, spans, _trained(outs, tmp_path / "batch.jsonl"),
                       max_staleness=0)
    assert sorted(reports) == [0, 1, 2, 3]
    assert [r.differences for r in reports.values()] == [[], [], [], []]  # 0 false reports
    calls = [s for s in spans if s["attributes"].get(semconv.OPENINFERENCE_SPAN_KIND) == "LLM"]
    assert len(calls) == 16
    assert {s["attributes"][semconv.RL_POLICY_VERSION] for s in calls} == {1}
    roots = [s for s in spans if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY)]
    for root in roots:
        attrs = root["attributes"]
        assert (attrs[semconv.RL_POLICY_MIN_VERSION], attrs[semconv.RL_POLICY_MAX_VERSION],
                attrs[semconv.RL_POLICY_STALENESS]) == (1, 1, 0)
    # the trace's rebuilt conversation is the loop's own output, token for token
    for report in reports.values():
        prompt, response, mask, _ = report.traced.conversation()
        out = outs[report.traced.key[1]]
        assert (prompt, response, mask) == (out.prompt_ids, out.response_ids, out.response_mask)


@pytest.mark.parametrize("kind", ["retokenized", "mask", "reward", "policy_version"])
def test_every_injected_drift_is_caught_and_nothing_else(tmp_path, kind):
    drifted = 1
    rollout_drift = {"retokenized": {"retokenize": drifted},
                     "policy_version": {"stale": drifted}}.get(kind, {})
    outs, spans = _run(tmp_path, 3, **rollout_drift)
    batch = _trained(outs, tmp_path / "batch.jsonl", mask=drifted if kind == "mask" else None,
                     reward=drifted if kind == "reward" else None)
    reports = _reports(tmp_path, spans, batch)
    assert sorted(reports) == [0, 1, 2]
    for sample, report in reports.items():
        if sample != drifted:
            assert report.differences == []  # no false report beside a drifted trajectory
            continue
        kinds = {d.kind for d in report.differences}
        assert kind in kinds, report.differences
        text = " | ".join(map(str, report.differences))
        if kind == "retokenized":
            # inside the trace: turn 3's prompt holds other tokens than turn 2 sampled; the
            # trainer holds the re-encoded ones, one token fewer where the trace's turn 2 is
            assert "turn 3: 2 of" in text and "retokenized differently" in text
            assert kinds == {"retokenized", "mask"}
        elif kind == "mask":
            assert kinds == {"mask"} and "masked tokens differ: 1 tokens" in text
        elif kind == "reward":
            assert kinds == {"reward"} and "reward differs" in text
        else:
            assert kinds == {"policy_version"}
            assert "stale policy version: turn 2 was sampled by version 0" in text


def test_staleness_over_a_limit_is_reported(tmp_path):
    outs, spans = _run(tmp_path, 2, stale=0)
    roots = {s["attributes"][semconv.ROLLOUT_SAMPLE_INDEX]: s["attributes"] for s in spans
             if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY)}
    assert roots[0][semconv.RL_POLICY_STALENESS] == 1 and roots[1][semconv.RL_POLICY_STALENESS] == 0
    assert (roots[0][semconv.RL_POLICY_MIN_VERSION], roots[0][semconv.RL_POLICY_MAX_VERSION]) == (0, 1)
    rows = tmp_path / "batch.jsonl"
    with open(rows, "w") as f:  # a trainer that records nothing about versions
        for i, out in enumerate(outs):
            f.write(json.dumps({"step": STEP, "sample_index": i, "rollout_n": 0,
                                "prompt_ids": out.prompt_ids, "response_ids": out.response_ids,
                                "response_mask": out.response_mask,
                                "reward": out.reward_score}) + "\n")
    assert all(r.equal for r in _reports(tmp_path, spans, str(rows)).values())
    reports = _reports(tmp_path, spans, str(rows), max_staleness=0)
    assert reports[1].equal
    assert [d.kind for d in reports[0].differences] == ["stale"]


def test_summary_ids_are_the_trainers_token_content_ids():
    from otel_verl._content import token_content_id

    summary = summarize([1, 2], [5, 6, 7, 8], [1, 1, 0, 1], reward=1, num_turns=3)
    assert summary["prompt"] == {"id": token_content_id([1, 2]), "len": 2}
    assert summary["response"]["segments"] == [[1, 2, token_content_id([5, 6])],
                                               [0, 1, token_content_id([7])],
                                               [1, 1, token_content_id([8])]]
    with pytest.raises(ValueError):
        summarize([1], [2, 3], [1])


def test_set_policy_version_takes_an_int_or_none():
    for bad in ("3", 3.0, True):
        with pytest.raises(TypeError):
            otel_verl.set_policy_version(bad)
    otel_verl.set_policy_version(5)
    assert _policy.policy_version() == 5
    attrs: dict = {}
    _policy.start_attributes(attrs)  # outside a trajectory: the call's span only
    assert attrs == {semconv.RL_POLICY_VERSION: 5}
    otel_verl.set_policy_version(None)
    attrs = {}
    _policy.start_attributes(attrs)
    assert attrs == {}
