"""Tail sampling under verl's own AgentLoopWorker + ToolAgentLoop (verl's config, verl's reward
path): the head sample, every erroring trajectory and the mixed groups are exported, each with its
reason and weight, and the per-step report adds up."""

from __future__ import annotations

import asyncio
import collections
import re

import _harness as h

from otel_verl import TrajectorySampler, semconv
from otel_verl.semconv import SamplingReason as R
from otel_verl.store import group_trajectories, read_spans, sampling_reports

SAMPLES = list(range(6))
WRONG = "The answer is 8."
BAD_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "3+x"}}</tool_call>'


def test_verl_agent_loop_head_plus_errors_plus_mixed_groups(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_VERL_TAIL_KEEP", "errors,reward_outliers,groups")
    monkeypatch.setenv("OTEL_VERL_GROUP_SIZE", "2")
    (head,) = TrajectorySampler(1, "exp_it").select(SAMPLES)
    mixed, failing = [s for s in SAMPLES if s != head][:2]
    turns: collections.Counter = collections.Counter()
    original = h.FakeServer._generate

    async def scripted(self, *, request_id, prompt_ids, sampling_params, **kwargs):
        """The first rollout of ``mixed`` answers wrong; the first of ``failing`` calls the tool
        with an expression it cannot evaluate (the tool raises: an error span)."""
        out = await original(self, request_id=request_id, prompt_ids=prompt_ids,
                             sampling_params=sampling_params, **kwargs)
        text = self.tokenizer.decode(prompt_ids)
        sample = int(re.search(r"\(q(\d+)\)", text).group(1))
        first_turn = "<tool_response>" not in text
        if sample in (mixed, failing):
            turns[(sample, first_turn)] += 1
            if turns[(sample, first_turn)] == 1:  # one rollout of the two
                reply = (BAD_CALL if first_turn else None) if sample == failing else \
                    (None if first_turn else WRONG)
                if reply is not None:
                    ids = self.tokenizer.encode(reply, add_special_tokens=False)
                    ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
                    out.token_ids, out.log_probs = ids, [0.0] * len(ids)
        return out

    monkeypatch.setattr(h.FakeServer, "_generate", scripted)
    config = h.compose_config([
        *h.base_overrides(tiny_model, h.write_tool_config(tmp_path),
                          {"backend": "file", "max_samples_per_step_per_worker": 1}),
        "actor_rollout_ref.rollout.n=2"])
    worker, _, _ = h.make_worker(config)
    output = asyncio.run(worker.generate_sequences(h.make_batch(SAMPLES, step=1, n=2)))
    from verl.utils.rollout_trace import RolloutTraceConfig

    RolloutTraceConfig.flush()
    assert output.batch["rm_scores"].sum(-1).tolist().count(0.0) >= 1  # the wrong answer

    spans = list(read_spans(tmp_path / "traces"))
    kept: dict = collections.defaultdict(list)
    for t in group_trajectories(spans):
        assert t.root is not None  # whole trajectories only
        kept[t.sample_index].append((t.sampling_reason, t.sampling_weight, t.reward,
                                     bool(t.errors)))
    assert set(kept) == {head, mixed, failing}
    assert sorted(r[:2] for r in kept[head]) == [(R.HEAD, 6.0)] * 2
    assert sorted(r[:3] for r in kept[mixed]) == [(R.REWARD_OUTLIER, 1.0, 0.0),
                                                   (R.REWARD_OUTLIER, 1.0, 1.0)]
    reasons = sorted((r[0], r[3]) for r in kept[failing])
    assert reasons == [(R.ERROR, True), (R.GROUP, False)]
    (report,) = sampling_reports(spans).values()
    assert report["ran"] == 12 and report["dropped"] == 6
    assert report["kept.head"] == 2 and report["kept.reward_outlier"] == 2
    assert report["kept.error"] == 1 and report["kept.group"] == 1
    # nothing of the dropped samples left the process
    assert {s["attributes"].get(semconv.ROLLOUT_SAMPLE_INDEX) for s in spans} <= \
        {head, mixed, failing, None}
