"""RL signals (issue 21, docs/signals.md): each failure mode planted in some trajectories of a run
through the real agent loop (``ToolAgentLoop`` -> ``VLLMCompletionsClient`` -> HTTP -> the engine
stub, scripted per trajectory), the detectors run on their own thread, and every detector finds
its planted trajectories (recall >= 0.9) and almost nothing else (false positives <= 1 %); a clean
run flags nothing; ``tail_keep=flags`` keeps the flagged trajectories and their groups, and the
step's sampling report counts the flags.
"""

from __future__ import annotations

import asyncio
import json
import random
import re

import pytest

import otel_verl
from otel_verl import RolloutTraceConfig, rollout_trace_attr, semconv
from otel_verl.exporters._detect import BUILTIN, DETECTORS, detect, record_from_spans
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import VLLMCompletionsClient
from otel_verl.rollout.tools import CalculatorTool
from otel_verl.store import read_spans

from ._engine_stub import EngineStub
from ._scripted import CharTokenizer

TRAJECTORY_MODES = ("length_cap", "repeated_tool_calls", "tool_error_streak", "copied_prompt",
                    "format_failure", "reward_outlier", "length_outlier")
GROUP = 4  # GRPO n
MAX_TOKENS = 512


def _call(expression: str) -> str:
    arguments = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<tool_call>{arguments}</tool_call>"


class PlanEngine(EngineStub):
    """``/v1/completions`` scripted per trajectory: the prompt names its case
    (``[case <id>]``); the plan says what the model does in that case, turn by turn."""

    def __init__(self, tokenizer: CharTokenizer, plans: dict[str, dict]) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.plans = plans

    def handle(self, path, headers, body):
        if path != "/v1/completions":
            return super().handle(path, headers, body)
        prompt = self.tokenizer.decode(body["prompt"])
        plan = self.plans[re.search(r"\[case (\S+)\]", prompt).group(1)]
        done = prompt.count("<tool_response>")
        finish = "stop"
        if done < len(plan["calls"]):
            text = _call(plan["calls"][done])
        else:
            text = plan["answer"]
            if plan["mode"] == "length_cap":  # the model runs into max_tokens
                text = (text * 40)[: body["max_tokens"]]
                finish = "length"
        ids = self.tokenizer.encode(text)
        if finish == "stop":
            ids.append(self.tokenizer.eos_token_id)
        return 200, {"id": "cmpl", "model": body["model"],
                     "choices": [{"index": 0, "text": text, "finish_reason": finish,
                                  "token_ids": ids}],
                     "usage": {"prompt_tokens": len(body["prompt"]),
                               "completion_tokens": len(ids)}}


class ComponentReward:
    """A verifier with components: correctness (the ``####`` answer), format (a ``####`` at
    all), a bonus for length of reasoning (``~``, capped), and two planted loopholes."""

    name = "verifier"

    @otel_verl.rollout_trace_op(kind=semconv.SpanKindName.EVALUATOR)
    async def compute_score(self, solution_str: str, ground_truth: str) -> float:
        found = re.findall(r"#### (\d+)", solution_str)
        correct = 1.0 if found and found[-1] == ground_truth else 0.0
        fmt = 0.2 if found else 0.0
        score = correct + fmt + 0.004 * min(solution_str.count("~"), 300)
        if "[[verified]]" in solution_str:  # a hackable verifier: a phrase it trusts
            score += 2.0
        if "[[jackpot]]" in solution_str:
            score += 10.0
        otel_verl.record_reward(score, name=self.name, label="correct" if correct else "wrong",
                                components={
                                    "correctness": correct,
                                    "format": {"score": fmt,
                                               "label": "ok" if fmt else "format_error",
                                               "explanation": "#### answer found" if fmt
                                               else "no #### answer"}})
        return score


def _plan(case: str, mode: str, rng: random.Random, a: int, b: int) -> dict:
    truth = str(a * b)
    pad = "~" * rng.randrange(0, 300)
    calls = [f"{a}*{b}"]
    answer = f"Thinking {pad} so The answer is #### {truth}"
    if mode == "repeated_tool_calls":
        calls = [f"{a}*{b}"] * 3
    elif mode == "tool_error_streak":
        calls = [f"{a}*/{k}" for k in range(3)]  # malformed: the calculator fails each time
    elif mode == "copied_prompt":
        answer = _example(case, truth)
    elif mode == "format_failure":
        answer = f"Thinking {pad} so the answer is {truth}"
    elif mode == "reward_outlier":
        answer += " [[jackpot]]"
    elif mode == "length_outlier":
        answer = f"Thinking {'=' * 3000} so The answer is #### {truth}"
    elif mode == "hacker":
        answer = f"Thinking {pad} [[verified]] so The answer is #### {int(truth) + 1}"
    return {"mode": mode, "calls": calls, "answer": answer, "truth": truth}


def _example(case: str, truth: str) -> str:
    return f"Worked example {case}: multiply the two numbers carefully to get #### {truth}"


def _workload(steps: int, groups: int, *, planted: bool, hack: bool = False,
              seed: int = 0) -> dict[str, dict]:
    """Cases by ``step-sample-n``: groups 0 and 1 of each step degenerate (every member the same
    answer: equal rewards), then 21 trajectories per step with one mode each (3 per mode), the
    rest clean. ``hack``: a growing share of each step games the verifier (wrong answers with
    the phrase it trusts), the rest clean."""
    rng = random.Random(seed)
    plans: dict[str, dict] = {}
    for step in range(1, steps + 1):
        for sample in range(groups):
            a, b = 11 + sample, 3 + step
            shared = _plan("", "clean", rng, a, b)
            for n in range(GROUP):
                case = f"{step}-{sample}-{n}"
                k = (sample - 2) * GROUP + n
                if hack:
                    mode = "hacker" if rng.random() < 0.1 + 0.25 * (step - 1) else "clean"
                elif planted and sample < 2:
                    mode = "degenerate_group"
                elif planted and 0 <= k < 3 * len(TRAJECTORY_MODES):
                    mode = TRAJECTORY_MODES[k % len(TRAJECTORY_MODES)]
                else:
                    mode = "clean"
                plan = dict(shared, mode=mode) if mode == "degenerate_group" else \
                    _plan(case, mode, rng, a, b)
                plans[case] = plan
    return plans


async def _rollouts(engine: PlanEngine) -> None:
    async with VLLMCompletionsClient(engine.url, model="stub") as client:
        loop = ToolAgentLoop(client, engine.tokenizer, tools=[CalculatorTool()],
                             reward_fn=ComponentReward(), max_assistant_turns=5,
                             max_user_turns=5, max_response_length=8192)

        gate = asyncio.Semaphore(4)  # interleaved, within the stub server's listen backlog

        async def one(case: str, plan: dict):
            async with gate:
                await _one(case, plan)

        async def _one(case: str, plan: dict):
            step, sample, n = map(int, case.split("-"))
            question = (f"Worked examples follow. {_example(case, plan['truth'])}. "
                        f"What is the product? [case {case}]")
            row = {"raw_prompt": [{"role": "user", "content": question}],
                   "reward_model": {"ground_truth": plan["truth"]}}
            max_tokens = 4096 if plan["mode"] == "length_outlier" else MAX_TOKENS
            with rollout_trace_attr(step=step, sample_index=sample, rollout_n=n,
                                    name="agent_loop"):
                await loop.run({"temperature": 1.0, "max_tokens": max_tokens}, **row)

        by_step: dict[int, list] = {}
        for case, plan in engine.plans.items():
            by_step.setdefault(int(case.split("-")[0]), []).append((case, plan))
        for step in sorted(by_step):  # steps one after another, a step's rollouts interleaved
            await asyncio.gather(*(one(c, p) for c, p in by_step[step]))


def _run(tmp_path, plans: dict[str, dict], **options) -> list[dict]:
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path), **options)
    with PlanEngine(CharTokenizer(), plans) as engine:
        asyncio.run(_rollouts(engine))
    assert RolloutTraceConfig.flush(30.0)
    RolloutTraceConfig.shutdown(10.0)
    return list(read_spans(str(tmp_path), warn=False))


def _trajectories(spans: list[dict]) -> dict[str, dict]:
    out = {}
    for span in spans:
        a = span["attributes"]
        if a.get(semconv.OTEL_VERL_TRAJECTORY):
            out[f"{a[semconv.ROLLOUT_STEP]}-{a[semconv.ROLLOUT_SAMPLE_INDEX]}-"
                f"{a[semconv.ROLLOUT_ROLLOUT_N]}"] = a
    return out


def _figures(plans: dict[str, dict], found: dict[str, dict], truth) -> dict[str, tuple]:
    rows = {}
    for name in BUILTIN:
        planted = {c for c, p in plans.items() if truth(name, c, p)}
        flagged = {c for c, a in found.items() if a.get(semconv.flag_key(name))}
        negatives = len(plans) - len(planted)
        recall = len(planted & flagged) / len(planted) if planted else None
        fp = len(flagged - planted) / negatives if negatives else 0.0
        rows[name] = (len(planted), len(planted & flagged), len(flagged - planted), recall, fp)
    print("\ndetector              planted  found  false+  recall  fp-rate")
    for name, (p, hit, false, recall, fp) in rows.items():
        shown = "  -  " if recall is None else f"{recall:5.2f}"
        print(f"{name:22s}{p:7d}{hit:7d}{false:8d}   {shown}  {fp:7.3f}")
    return rows


def _planted_truth(name: str, case: str, plan: dict) -> bool:
    return plan["mode"] == name


def test_every_planted_failure_is_flagged_and_little_else(tmp_path):
    plans = _workload(steps=3, groups=12, planted=True)
    spans = _run(tmp_path, plans, detect_flags="all", group_size=GROUP)
    found = _trajectories(spans)
    assert set(found) == set(plans)
    rows = _figures(plans, found, _planted_truth)
    for name, (planted, _hit, false, recall, fp) in rows.items():
        if name == "reward_hacking":  # planted in its own run below
            assert false == 0
            continue
        assert planted >= 9, name
        assert recall >= 0.9, (name, rows[name])
        assert fp <= 0.01, (name, rows[name])
    # the evidence says why, as JSON
    for attributes in found.values():
        for name in attributes.get(semconv.RL_FLAGS, ()):
            evidence = json.loads(attributes[semconv.flag_evidence_key(name)])
            assert isinstance(evidence, dict) and evidence
    # the same detectors over the stored traces (offline) flag the same trajectories
    by_trace: dict[str, list[dict]] = {}
    for span in spans:
        by_trace.setdefault(span["trace_id"], []).append(span)
    checked = offline = 0
    for trace_spans in by_trace.values():
        record = record_from_spans(trace_spans)
        if not record.attributes:
            continue
        online = {n for n in record.attributes.get(semconv.RL_FLAGS, ()) if n in DETECTORS}
        flags = detect(record, DETECTORS)
        assert set(flags) == online
        checked, offline = checked + 1, offline + len(flags)
    assert checked == len(plans) and offline == 5 * 9
    cap = next(a for c, a in found.items() if plans[c]["mode"] == "length_cap")
    assert json.loads(cap[semconv.flag_evidence_key("length_cap")])["finish_reason"] == "length"
    # the reward's components are on the trajectory span, filterable
    clean = next(a for c, a in found.items() if plans[c]["mode"] == "clean")
    assert clean[semconv.RL_REWARD_PREFIX + "correctness"] == 1.0
    assert clean[semconv.RL_REWARD_PREFIX + "format.label"] == "ok"


def _hack_truth(name: str, case: str, plan: dict) -> bool:
    return name == "reward_hacking" and plan["mode"] == "hacker" and int(case[0]) >= 3


def test_reward_rising_while_correctness_falls_is_flagged_across_steps(tmp_path):
    plans = _workload(steps=4, groups=16, planted=False, hack=True, seed=3)
    spans = _run(tmp_path, plans, detect_flags="all", group_size=GROUP)
    found = _trajectories(spans)
    rows = _figures(plans, found, _hack_truth)
    planted, hit, false, recall, fp = rows["reward_hacking"]
    assert planted >= 20 and recall >= 0.9 and fp <= 0.01, rows["reward_hacking"]
    evidence = json.loads(next(a for a in found.values() if a.get(
        semconv.flag_key("reward_hacking")))[semconv.flag_evidence_key("reward_hacking")])
    assert len(evidence["steps"]) == 3 and evidence["mean_reward"] == sorted(
        evidence["mean_reward"])


def test_a_clean_run_flags_nothing(tmp_path):
    plans = _workload(steps=3, groups=10, planted=False, seed=7)
    spans = _run(tmp_path, plans, detect_flags="all", group_size=GROUP)
    found = _trajectories(spans)
    assert len(found) == len(plans)
    assert [c for c, a in found.items() if a.get(semconv.RL_FLAGS)] == []


def test_tail_keep_flags_keeps_flagged_trajectories_and_their_groups(tmp_path):
    plans = _workload(steps=1, groups=12, planted=True, seed=1)
    spans = _run(tmp_path, plans, detect_flags="all", group_size=GROUP, tail_keep=["flags"],
                 max_samples_per_step_per_worker=0)
    found = _trajectories(spans)
    flagged_groups = {c.rsplit("-", 1)[0] for c, a in found.items() if a.get(semconv.RL_FLAGS)}
    planted_groups = {c.rsplit("-", 1)[0] for c, p in plans.items() if p["mode"] != "clean"}
    assert flagged_groups == planted_groups
    # every member of a flagged group is exported (besides what the head rule picked anyway)
    tail_kept = {c for c, a in found.items() if a[semconv.ROLLOUT_SAMPLING_REASON] != "head"}
    assert tail_kept == {c for c in plans if c.rsplit("-", 1)[0] in planted_groups}
    for case in tail_kept:
        attributes = found[case]
        reason = attributes[semconv.ROLLOUT_SAMPLING_REASON]
        assert reason == ("flag" if attributes.get(semconv.RL_FLAGS) else "group")
        assert attributes[semconv.ROLLOUT_SAMPLING_WEIGHT] == 1.0
    assert len(tail_kept) < len(found) or len(found) < len(plans)  # clean groups are dropped
    reports = [s["attributes"] for s in spans if s["name"] == semconv.SAMPLING_REPORT_SPAN]
    counted = {k[len(semconv.ROLLOUT_SAMPLING_FLAGGED_PREFIX):]: v for r in reports
               for k, v in r.items() if k.startswith(semconv.ROLLOUT_SAMPLING_FLAGGED_PREFIX)}
    expected: dict[str, int] = {}
    for attributes in found.values():
        for name in attributes.get(semconv.RL_FLAGS, ()):
            expected[name] = expected.get(name, 0) + 1
    assert counted == expected and counted["degenerate_group"] == 2 * GROUP
    assert sum(r[semconv.ROLLOUT_SAMPLING_RAN] for r in reports) == len(plans)


def test_traces_list_flag_lists_the_flagged_trajectories(tmp_path, capsys):
    from otel_verl import cli

    plans = _workload(steps=1, groups=6, planted=True, seed=2)
    spans = _run(tmp_path, plans, detect_flags="all", group_size=GROUP)
    found = _trajectories(spans)
    for name in ("length_cap", "degenerate_group", "tool_error_streak"):
        expected = sorted(c for c, a in found.items() if a.get(semconv.flag_key(name)))
        assert expected
        # through the query layer (the only read path; ``expected`` is the trajectory model's)
        assert cli.main(["traces", "list", "--dir", str(tmp_path), "--flag", name,
                         "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        listed = sorted(f"{r['step']}-{r['sample_index']}-{r['rollout_n']}" for r in rows)
        assert listed == expected, name


@pytest.mark.parametrize("compacted", [False, True])
def test_the_viewer_filters_on_a_flag_and_shows_its_evidence(tmp_path, compacted):
    from otel_verl.ui._lake import LakeSource, open_source
    from otel_verl.ui.server import api

    plans = _workload(steps=1, groups=8, planted=True, seed=4)
    spans = _run(tmp_path, plans, detect_flags="all", group_size=GROUP)
    found = _trajectories(spans)
    if compacted:  # the lake's Parquet segments (closed files), or the raw lines
        from otel_verl.store._compact import compact

        assert compact(str(tmp_path), live_bytes=0, idle_s=0.0).segments
    source = open_source(str(tmp_path))
    assert isinstance(source, LakeSource)
    try:
        for name in ("length_cap", "copied_prompt", "degenerate_group"):
            page = api(source, "trajectories", {"flag": name, "page_size": "200"})
            listed = sorted(f"{r['step']}-{r['sample_index']}-{r['rollout_n']}"
                            for r in page["rows"])
            assert listed == sorted(c for c, a in found.items()
                                    if a.get(semconv.flag_key(name))), name
            assert page["total"] == len(listed) > 0
            view = api(source, "trajectory", {"key": page["rows"][0]["key"]})
            flags = {f["name"]: f["evidence"] for f in view["flags"]}
            assert name in flags and isinstance(flags[name], dict) and flags[name]
        (step,) = api(source, "overview", {})["steps"]  # the flags per step, for the chart
        counted: dict[str, int] = {}
        for attributes in found.values():
            for name in attributes.get(semconv.RL_FLAGS, ()):
                counted[name] = counted.get(name, 0) + 1
        assert step["flags"] == counted and counted["degenerate_group"] == 2 * GROUP
        everything = api(source, "trajectories", {"page_size": "200"})
        assert everything["total"] == len(plans)
        clean = next(r for r in everything["rows"]
                     if not found[f"{r['step']}-{r['sample_index']}-{r['rollout_n']}"].get(
                         semconv.RL_FLAGS))
        assert api(source, "trajectory", {"key": clean["key"]})["flags"] == []
    finally:
        source.close()
