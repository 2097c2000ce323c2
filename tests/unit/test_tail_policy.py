"""Tail sampling as policy plus mechanism: the built-in rules are policies whose outcome is the
documented rule's (an independent oracle, over random groups), and a user's own policy keeps,
weighs, counts and reports like a built-in one."""

from __future__ import annotations

import collections
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_verl import semconv
from otel_verl.exporters._tail import (
    GroupView,
    KeepDecision,
    TailPolicy,
    TailSamplingProcessor,
    TrajectoryView,
)

TRUNCATING = semconv.TRUNCATING_TERMINATIONS[0]
Member = collections.namedtuple("Member", "error truncated reward head")


def _provider(**kwargs):
    exporter = InMemorySpanExporter()
    processor = TailSamplingProcessor(SimpleSpanProcessor(exporter), **kwargs)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return provider.get_tracer("t"), processor, exporter


def _run(tracer, sample, n, member, *, step=1, extra=None):
    attrs = {semconv.OTEL_VERL_TRAJECTORY: True, semconv.ROLLOUT_STEP: step,
             semconv.ROLLOUT_SAMPLE_INDEX: sample, semconv.ROLLOUT_ROLLOUT_N: n,
             semconv.ROLLOUT_EXPERIMENT_NAME: "e", semconv.ROLLOUT_VALIDATE: False,
             **(extra or {})}
    if member.head:
        attrs[semconv.ROLLOUT_SAMPLING_REASON] = semconv.SamplingReason.HEAD
        attrs[semconv.ROLLOUT_SAMPLING_WEIGHT] = 4.0
    else:
        attrs[semconv.OTEL_VERL_PROVISIONAL] = True
    root = tracer.start_span("agent_loop", attributes=attrs)
    child = tracer.start_span("tool", context=trace.set_span_in_context(root))
    if member.error:
        child.set_attribute(semconv.ERROR_TYPE, "ToolError")
    child.end()
    if member.truncated:
        root.set_attribute(semconv.ROLLOUT_TERMINATION, TRUNCATING)
    if member.reward is not None:
        root.set_attribute(semconv.ROLLOUT_REWARD, member.reward)
    root.end()


def _outcome(exporter, sample=0):
    """rollout_n -> (reason, weight) of the exported trajectory spans of one sample."""
    return {s.attributes[semconv.ROLLOUT_ROLLOUT_N]:
            (s.attributes.get(semconv.ROLLOUT_SAMPLING_REASON),
             s.attributes.get(semconv.ROLLOUT_SAMPLING_WEIGHT))
            for s in exporter.get_finished_spans()
            if s.attributes.get(semconv.OTEL_VERL_TRAJECTORY)
            and s.attributes.get(semconv.ROLLOUT_SAMPLE_INDEX) == sample}


# --- the oracle: the rules as docs/sampling.md states them, written here from scratch ------------


def _oracle_outliers(rewards, z):
    if len(rewards) < 2 or len(set(rewards)) == 1:
        return set()
    if set(rewards) <= {0.0, 1.0} or set(rewards) <= {-1.0, 1.0}:
        values = sorted(set(rewards))
        first, second = (rewards.count(v) for v in values)
        if first == second:
            return set(range(len(rewards)))
        rare = values[0] if first < second else values[1]
        return {i for i, r in enumerate(rewards) if r == rare}
    mean = sum(rewards) / len(rewards)
    spread = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return {i for i, r in enumerate(rewards) if abs(r - mean) / spread >= z}


def _oracle(members, rules, z, budget):
    """rollout_n -> (reason, weight) the documented rules export, or absent when dropped."""
    reason = [None] * len(members)
    spent = 0

    def keep(i, why):
        nonlocal spent
        if members[i].head:  # kept anyway: the rule's reason, weight 1; no budget
            reason[i] = why
        elif budget is not None and spent >= budget:
            reason[i] = "over budget"
        else:
            spent += 1
            reason[i] = why

    for i, m in enumerate(members):  # at each trajectory's end, in order
        if "errors" in rules and m.error:
            keep(i, "error")
        elif "truncated" in rules and m.truncated:
            keep(i, "truncated")
    if "reward_outliers" in rules:  # when the group is complete
        scored = [i for i, m in enumerate(members) if m.reward is not None]
        for j in sorted(_oracle_outliers([members[i].reward for i in scored], z)):
            if reason[scored[j]] is None:
                keep(scored[j], "reward_outlier")
    if "groups" in rules and any(r in ("error", "truncated", "reward_outlier") for r in reason):
        for i in range(len(members)):
            if reason[i] is None:
                keep(i, "group")
    out = {}
    for i, m in enumerate(members):
        if reason[i] in (None, "over budget"):
            if m.head:
                out[i] = ("head", 4.0)
        else:
            out[i] = (reason[i], 1.0)
    return out


@st.composite
def members_strategy(draw):
    """A group: rewards from a binary or a continuous palette, some missing, or an even split of
    two values (a binary tie; for continuous values every z-score is exactly 1, the boundary)."""
    if draw(st.booleans()):
        low, high = draw(st.sampled_from([(0.0, 1.0), (-1.0, 1.0), (0.5, 3.0), (0.0, 0.5)]))
        half = draw(st.integers(1, 4))
        rewards = draw(st.permutations([low] * half + [high] * half))
        rewards += draw(st.lists(st.none(), max_size=2))
    else:
        palette = draw(st.sampled_from([(0.0, 1.0), (-1.0, 1.0), (0.0, 0.5, 1.0, 3.0, -2.0)]))
        rewards = draw(st.lists(st.one_of(st.none(), st.sampled_from(palette)), min_size=1,
                                max_size=9))
    flags = st.tuples(st.booleans(), st.booleans(), st.booleans())
    return [Member(error, truncated, reward, head)
            for reward, (error, truncated, head) in
            zip(rewards, draw(st.lists(flags, min_size=len(rewards), max_size=len(rewards))),
                strict=True)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(members=members_strategy(),
       rules=st.sets(st.sampled_from(["errors", "truncated", "reward_outliers", "groups"])),
       z=st.sampled_from([0.5, 1.0, 1.5, 2.0]),
       budget=st.one_of(st.none(), st.integers(0, 4)))
def test_builtin_policies_match_the_documented_rules_on_random_groups(members, rules, z, budget):
    tracer, processor, exporter = _provider(keep=tuple(rules), group_size=len(members),
                                            reward_z=z, max_per_step=budget)
    for n, member in enumerate(members):
        _run(tracer, 0, n, member)
    processor.force_flush()
    assert _outcome(exporter) == _oracle(members, rules, z, budget)


# --- a user's own policies -------------------------------------------------------------------------


def keep_flagged(trajectory: TrajectoryView, group: GroupView | None) -> KeepDecision | None:
    return KeepDecision("flagged") if trajectory.attributes.get("my.flag") else None


def test_a_user_policy_keeps_its_trajectory_and_groups_keeps_the_siblings():
    tracer, processor, exporter = _provider(keep=("groups",), group_size=3,
                                            policies=[keep_flagged])
    plain = Member(False, False, None, False)
    _run(tracer, 0, 0, plain)
    _run(tracer, 0, 1, plain, extra={"my.flag": True})
    _run(tracer, 0, 2, plain)
    _run(tracer, 1, 0, plain)  # another sample, nothing flagged: dropped
    processor.force_flush()
    assert _outcome(exporter) == {0: ("group", 1.0), 1: ("flagged", 1.0), 2: ("group", 1.0)}
    assert _outcome(exporter, sample=1) == {}
    report = [s for s in exporter.get_finished_spans()
              if s.name == semconv.SAMPLING_REPORT_SPAN][-1]
    assert report.attributes[semconv.ROLLOUT_SAMPLING_KEPT_PREFIX + "flagged"] == 1
    assert report.attributes[semconv.ROLLOUT_SAMPLING_KEPT_PREFIX + "group"] == 2
    assert report.attributes[semconv.ROLLOUT_SAMPLING_DROPPED] == 1
    assert processor.stats()["tail_kept.flagged"] == 1


def test_a_group_policy_sees_the_whole_group_and_its_weight_is_recorded():
    def best_of_group(trajectory, group):
        if group is None or group.late:
            return None
        best = max((m.reward for m in group.members if m.reward is not None), default=None)
        return KeepDecision("best", weight=2.5) if trajectory.reward == best else None

    tracer, processor, exporter = _provider(
        keep=(), group_size=4, policies=[TailPolicy("best", best_of_group, needs_group=True)])
    for n, reward in enumerate([0.2, 0.9, 0.1, 0.4]):
        _run(tracer, 0, n, Member(False, False, reward, False))
    assert _outcome(exporter) == {1: ("best", 2.5)}  # decided when the 4th ended, no flush


def test_a_policy_that_raises_or_answers_nonsense_has_no_opinion_and_is_counted():
    def broken(trajectory, group):
        raise RuntimeError("bug in my policy")

    def nonsense(trajectory, group):
        return "keep it"

    tracer, processor, exporter = _provider(keep=("errors",), policies=[broken, nonsense])
    _run(tracer, 0, 0, Member(True, False, None, False))
    _run(tracer, 0, 1, Member(False, False, None, False))
    processor.force_flush()
    assert _outcome(exporter) == {0: ("error", 1.0)}  # the built-in rule is asked first
    assert processor.stats()["tail_policy_errors"] == 2  # trajectory 1: both asked, both bad


def test_policy_order_builtins_then_yours_then_groups():
    processor = _provider(keep=("groups", "truncated", "errors"), policies=[keep_flagged])[1]
    assert [p.name for p in processor.policies] == ["errors", "truncated",
                                                    keep_flagged.__qualname__, "groups"]


@pytest.mark.parametrize("bad", [dict(reason=""), dict(reason="x", weight=0.0),
                                 dict(reason="x", weight=float("nan")),
                                 dict(reason="x", weight=float("inf"))])
def test_keep_decision_refuses_what_would_bias_the_statistics(bad):
    with pytest.raises(ValueError, match="KeepDecision"):
        KeepDecision(**bad)
