"""Tail sampling through the project's own agent loop (scripted model, real tools and reward) and
through an engine client over a real socket (the protocol stub)."""

from __future__ import annotations

import asyncio
import collections

import pytest

import otel_verl
from otel_verl import RolloutTraceConfig, semconv
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import VLLMGenerateClient
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool
from otel_verl.semconv import SamplingReason as R
from otel_verl.testing import capture_spans

from ._engine_stub import EngineStub
from .conftest import ScriptedClient

ROW = {"raw_prompt": [{"role": "user", "content": "What is 2 + 3?"}],
       "reward_model": {"ground_truth": "5"}}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
BAD_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2/0"}}</tool_call>'
RIGHT, WRONG = "#### 5", "#### 4"
N = 4


async def rollout(tokenizer, step, sample, n, script, traced):
    loop = ToolAgentLoop(ScriptedClient(tokenizer, script), tokenizer, tools=[CalculatorTool()],
                         reward_fn=Gsm8kReward(), max_response_length=400)
    with otel_verl.rollout_trace_attr(step=step, sample_index=sample, rollout_n=n,
                                      name="agent_loop", trace=traced):
        return await loop.run({"temperature": 1.0}, **ROW)


async def test_agent_loop_head_sample_plus_errors_plus_mixed_groups(tokenizer):
    samples = list(range(6))
    with capture_spans(experiment_name="exp", max_samples_per_step_per_worker=1,
                       tail_keep=["errors", "reward_outliers", "groups"], group_size=N) as exp:
        chosen = RolloutTraceConfig.sampler().select(samples)
        (head,) = chosen
        right_all, wrong_all, mixed, tool_error, truncated = [s for s in samples if s != head]
        scripts = {
            head: [[CALL, RIGHT]] * N,
            right_all: [[RIGHT]] * N,
            wrong_all: [[CALL, WRONG]] * N,
            mixed: [[CALL, RIGHT]] + [[WRONG]] * 3,
            tool_error: [[WRONG]] * 2 + [[BAD_CALL, WRONG]] + [[WRONG]],  # 2/0: an error result
            truncated: [[WRONG]] * 3 + [[("x" * 500, False)]],  # cut at the length limit
        }
        outs = await asyncio.gather(*(
            rollout(tokenizer, 1, sample, n, list(scripts[sample][n]), sample in chosen)
            for n in range(N) for sample in samples))
        assert sum(o.reward_score for o in outs) == 2 * N + 1  # head, right_all, mixed[0]
        RolloutTraceConfig.flush()
        spans = exp.get_finished_spans()
        got = {(s.attributes[semconv.ROLLOUT_SAMPLE_INDEX], s.attributes[semconv.ROLLOUT_ROLLOUT_N]):
               (s.attributes[semconv.ROLLOUT_SAMPLING_REASON],
                s.attributes[semconv.ROLLOUT_SAMPLING_WEIGHT])
               for s in spans if s.attributes.get(semconv.OTEL_VERL_TRAJECTORY)}
        expected = {}
        for n in range(N):
            expected[(head, n)] = (R.HEAD, 6.0)
            expected[(mixed, n)] = (R.REWARD_OUTLIER if n == 0 else R.GROUP, 1.0)
            expected[(tool_error, n)] = (R.ERROR if n == 2 else R.GROUP, 1.0)
        assert got == expected  # the truncated rule is off: that group is dropped
        # every kept trajectory is whole: run, generate per turn, tools, reward
        names = collections.Counter(
            s.name for s in spans if s.attributes.get(semconv.ROLLOUT_SAMPLE_INDEX) == mixed)
        assert names["ToolAgentLoop.run"] == N and names["Gsm8kReward.compute_score"] == N
        assert names["BaseTool.execute"] == 1 and names["agent_loop"] == N
        (tool,) = [s for s in spans if s.name == "BaseTool.execute"
                   and s.attributes[semconv.ROLLOUT_SAMPLE_INDEX] == tool_error]
        assert tool.attributes[semconv.ERROR_TYPE] == "tool_error"
        assert not any(s.attributes.get(semconv.ROLLOUT_SAMPLE_INDEX) in
                       (right_all, wrong_all, truncated) for s in spans)
        (report,) = [s for s in spans if s.name == semconv.SAMPLING_REPORT_SPAN]
        counts = {k.removeprefix("rollout.sampling."): v for k, v in report.attributes.items()
                  if k.startswith("rollout.sampling.")}
        assert counts["ran"] == 6 * N and counts["kept.head"] == N
        assert counts["kept.error"] == 1 and counts["kept.reward_outlier"] == 1
        assert counts["kept.group"] == 6 and counts["dropped"] == 3 * N
        assert counts["ran"] == sum(v for k, v in counts.items() if k.startswith("kept.")) + \
            counts["dropped"]


async def test_agent_loop_truncated_rule(tokenizer):
    with capture_spans(max_samples_per_step_per_worker=0, tail_keep="truncated") as exp:
        await rollout(tokenizer, 1, 0, 0, [("x" * 500, False)], False)
        await rollout(tokenizer, 1, 1, 0, [WRONG], False)
        roots = [s for s in exp.get_finished_spans()
                 if s.attributes.get(semconv.OTEL_VERL_TRAJECTORY)]
        assert [(s.attributes[semconv.ROLLOUT_SAMPLE_INDEX],
                 s.attributes[semconv.ROLLOUT_TERMINATION],
                 s.attributes[semconv.ROLLOUT_SAMPLING_REASON]) for s in roots] == [
            (0, "response_length", R.TRUNCATED)]


@pytest.fixture
def stub():
    with EngineStub() as s:
        yield s


async def test_engine_gets_no_trace_context_from_a_provisional_trajectory(stub):
    """The stub's /inference/v1/generate finishes with ``length``: truncated, so kept."""
    with capture_spans(max_samples_per_step_per_worker=1, tail_keep=["truncated"]) as exp:
        async with VLLMGenerateClient(stub.url, "tiny") as client:
            for sample, traced in ((0, False), (1, True)):
                with otel_verl.rollout_trace_attr(step=1, sample_index=sample, trace=traced):
                    await client.generate(f"r{sample}", prompt_ids=[1, 2],
                                          sampling_params={"max_tokens": 2})
        sent = [r["engine_traceparent"] for r in stub.requests]
        assert sent[0] is None and sent[1].startswith("00-")
        roots = {s.attributes[semconv.ROLLOUT_SAMPLE_INDEX]: s.attributes[
            semconv.ROLLOUT_SAMPLING_REASON] for s in exp.get_finished_spans()
            if s.attributes.get(semconv.OTEL_VERL_TRAJECTORY)}
        # the head sample is truncated too: it would have been kept anyway, so its inclusion
        # probability is 1 and it says so (reason truncated, weight 1)
        assert roots == {0: R.TRUNCATED, 1: R.TRUNCATED}
