"""Tail sampling: head sample + errors + mixed GRPO groups exported, each with reason and weight;
per-step reports that add up; a full buffer exports (never drops) and counts."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import otel_verl
from otel_verl import RolloutTraceConfig, semconv
from otel_verl._state import STATE
from otel_verl.exporters._tail import TailSamplingProcessor, reward_outliers, span_bytes
from otel_verl.semconv import SamplingReason as R
from otel_verl.testing import capture_spans

RULES = ["errors", "reward_outliers", "groups"]
N = 4  # rollouts per sample (GRPO group size)


@otel_verl.rollout_trace_op
def work(fail: bool) -> str:
    if fail:
        raise ValueError("tool blew up")
    return "ok"


def trajectory(step, sample, n, *, trace, reward=None, op_error=False, traj_error=False,
               finish=None, termination=None):
    """One trajectory: an op (that may fail, caught inside), an LLM span, a reward."""
    try:
        with otel_verl.rollout_trace_attr(step=step, sample_index=sample, rollout_n=n,
                                          trace=trace):
            try:
                work(op_error)
            except ValueError:
                pass
            with otel_verl.get_tracer().start_as_current_span("chat tiny",
                                                             kind=SpanKind.CLIENT) as llm:
                if finish:
                    llm.set_attribute(semconv.GEN_AI_RESPONSE_FINISH_REASONS, [finish])
            if termination:
                otel_verl.set_trajectory_attribute(semconv.ROLLOUT_TERMINATION, termination)
            if reward is not None:
                otel_verl.record_reward(reward)
            if traj_error:
                raise RuntimeError("trajectory failed")
    except RuntimeError:
        pass


def roots(exporter, step=None):
    """Exported trajectory spans by (sample_index, rollout_n), of one step or of all."""
    return {(s.attributes.get(semconv.ROLLOUT_SAMPLE_INDEX),
             s.attributes.get(semconv.ROLLOUT_ROLLOUT_N)): s for s in exporter.get_finished_spans()
            if s.attributes.get(semconv.OTEL_VERL_TRAJECTORY)
            and step in (None, s.attributes.get(semconv.ROLLOUT_STEP))}


def reports(exporter):
    return [s for s in exporter.get_finished_spans() if s.name == semconv.SAMPLING_REPORT_SPAN]


def totals(exporter, step):
    """The per-step report counts, summed over the report spans (they are increments)."""
    total = collections.Counter()
    for report in reports(exporter):
        if report.attributes.get(semconv.ROLLOUT_STEP) == step:
            for key, value in report.attributes.items():
                if key.startswith("rollout.sampling."):
                    total[key.removeprefix("rollout.sampling.")] += value
    return total


def assert_no_orphans(exporter):
    """Every exported span belongs to an exported trajectory (or is a report)."""
    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    for span in spans:
        node = span
        while node.parent is not None:
            assert node.parent.span_id in by_id, f"{span.name}: parent not exported"
            node = by_id[node.parent.span_id]
        assert node.attributes.get(semconv.OTEL_VERL_TRAJECTORY) or \
            node.name == semconv.SAMPLING_REPORT_SPAN


def assert_counts_add_up(total):
    kept = sum(v for k, v in total.items() if k.startswith("kept."))
    assert total["ran"] == kept + total["dropped"]


# --- the acceptance case ------------------------------------------------------------------------


def test_head_sample_plus_errors_plus_mixed_groups_exactly():
    samples = list(range(7))
    with capture_spans(experiment_name="exp", max_samples_per_step_per_worker=1,
                       tail_keep=RULES, group_size=N) as exporter:
        chosen = RolloutTraceConfig.sampler().select(samples * N)
        assert len(chosen) == 1
        (head,) = chosen
        others = [s for s in samples if s != head]
        uniform_ok, uniform_bad, mixed, tie, op_err, traj_err = others
        plan = {  # sample -> per-rollout (reward, op_error, traj_error)
            head: [(0.0, False, False)] * N,
            uniform_ok: [(1.0, False, False)] * N,
            uniform_bad: [(0.0, False, False)] * N,
            mixed: [(1.0, False, False)] + [(0.0, False, False)] * 3,
            tie: [(1.0, False, False)] * 2 + [(0.0, False, False)] * 2,
            op_err: [(0.0, False, False)] * 2 + [(0.0, True, False)] + [(0.0, False, False)],
            traj_err: [(None, False, True)] + [(0.0, False, False)] * 3,
        }
        for n in range(N):  # rollouts interleaved, as concurrent workers finish them
            for sample in samples:
                reward, op_error, traj_error = plan[sample][n]
                trajectory(1, sample, n, trace=sample in chosen, reward=reward,
                           op_error=op_error, traj_error=traj_error)
        trajectory(2, head, 0, trace=True, reward=1.0)  # step 2 starts: step 1 is over
        got = {key: (s.attributes[semconv.ROLLOUT_SAMPLING_REASON],
                     s.attributes[semconv.ROLLOUT_SAMPLING_WEIGHT])
               for key, s in roots(exporter, step=1).items()}
        expected = {}
        for n in range(N):
            expected[(head, n)] = (R.HEAD, 7.0)  # 7 samples, 1 traced: weight 7
            expected[(mixed, n)] = (R.REWARD_OUTLIER if n == 0 else R.GROUP, 1.0)
            expected[(tie, n)] = (R.REWARD_OUTLIER, 1.0)  # a tie: both outcomes kept
            expected[(op_err, n)] = (R.ERROR if n == 2 else R.GROUP, 1.0)
            expected[(traj_err, n)] = (R.ERROR if n == 0 else R.GROUP, 1.0)
        assert got == expected
        total = totals(exporter, 1)
        assert total["ran"] == 7 * N
        assert total["kept.head"] == N and total["kept.error"] == 2
        assert total["kept.reward_outlier"] == 1 + 4 and total["kept.group"] == 3 + 3 + 3
        assert total["dropped"] == 2 * N and total["kept.overflow"] == 0
        assert_counts_add_up(total)
        # whole trajectories: each kept one has its op and LLM spans, dropped ones have none
        children = collections.Counter(
            (s.attributes.get(semconv.ROLLOUT_SAMPLE_INDEX), s.attributes.get(
                semconv.ROLLOUT_STEP)) for s in exporter.get_finished_spans()
            if not s.attributes.get(semconv.OTEL_VERL_TRAJECTORY)
            and s.name != semconv.SAMPLING_REPORT_SPAN)
        for sample in (head, mixed, tie, op_err, traj_err):
            assert children[(sample, 1)] == 2 * N
        assert children[(uniform_ok, 1)] == children[(uniform_bad, 1)] == 0
        RolloutTraceConfig.flush()  # step 2's head trajectory span waits for its group until then
        assert_no_orphans(exporter)
        stats = RolloutTraceConfig.stats()
        assert stats["tail_buffered_bytes"] == 0 and stats["tail_undecided"] == 0
    # the error really is the failed op's status
    assert any(s.name.endswith("work") and s.status.status_code.name == "ERROR"
               for s in exporter.get_finished_spans())


@pytest.mark.parametrize("tail", [True, False])
def test_head_trajectories_a_tail_rule_would_keep_get_weight_one(tail):
    """Unbiased weights: a head-sampled trajectory that a tail rule matches is kept with
    probability 1 (head or not), so its weight is 1; the others keep the head weight M/N."""
    options = {"tail_keep": RULES, "group_size": 2} if tail else {}
    with capture_spans(max_samples_per_step_per_worker=2, **options) as exporter:
        chosen = RolloutTraceConfig.sampler().select(range(10))
        mixed, clean = sorted(chosen)
        for n, reward in enumerate([1.0, 0.0]):
            trajectory(1, mixed, n, trace=True, reward=reward)
        for n in range(2):
            trajectory(1, clean, n, trace=True, reward=1.0, op_error=n == 1)
        RolloutTraceConfig.flush()
        got = {k: (s.attributes[semconv.ROLLOUT_SAMPLING_REASON],
                   s.attributes[semconv.ROLLOUT_SAMPLING_WEIGHT]) for k, s in
               roots(exporter).items()}
    if tail:
        assert got == {(mixed, 0): (R.REWARD_OUTLIER, 1.0), (mixed, 1): (R.REWARD_OUTLIER, 1.0),
                       (clean, 0): (R.GROUP, 1.0), (clean, 1): (R.ERROR, 1.0)}
    else:
        assert set(got.values()) == {(R.HEAD, 5.0)}


def test_tail_keep_empty_keeps_todays_behaviour_at_no_cost(spans):
    assert not isinstance(STATE.runtime.processor, TailSamplingProcessor)
    with otel_verl.rollout_trace_attr(step=1, sample_index=0, trace=False) as span:
        assert span is None and not otel_verl.is_recording()
        work(False)
    with otel_verl.rollout_trace_attr(step=1, sample_index=1) as span:
        work(False)
    (root,) = [s for s in spans.get_finished_spans()
               if s.attributes.get(semconv.OTEL_VERL_TRAJECTORY)]
    assert root.attributes[semconv.ROLLOUT_SAMPLING_REASON] == R.ALL
    assert root.attributes[semconv.ROLLOUT_SAMPLING_WEIGHT] == 1.0
    assert len(spans.get_finished_spans()) == 2


def test_provisional_trajectory_sends_no_trace_context_to_engines_or_workers():
    with capture_spans(tail_keep="errors") as exporter:
        with otel_verl.rollout_trace_attr(step=1, sample_index=0, trace=False) as span:
            assert span is not None and otel_verl.is_recording()
            assert otel_verl.traceparent_headers() == {}
            carrier = otel_verl.inject_context()
            assert '"enabled": false' in carrier[semconv.CARRIER_TRAJECTORY]
        with otel_verl.rollout_trace_attr(step=1, sample_index=1, trace=True):
            assert "traceparent" in otel_verl.traceparent_headers()
        RolloutTraceConfig.flush()
        assert set(roots(exporter)) == {(1, None)}  # the provisional one matched no rule


# --- rules ---------------------------------------------------------------------------------------


def test_truncated_rule_from_finish_reason_and_termination():
    with capture_spans(tail_keep=["truncated"]) as exporter:
        trajectory(1, 0, 0, trace=False, reward=1.0, finish="length")
        trajectory(1, 1, 0, trace=False, reward=1.0, termination="max_assistant_turns")
        trajectory(1, 2, 0, trace=False, reward=1.0, finish="stop", termination="no_tool_call")
        trajectory(1, 3, 0, trace=False, op_error=True)  # errors rule is off
        got = {k: s.attributes[semconv.ROLLOUT_SAMPLING_REASON] for k, s in
               roots(exporter).items()}
        assert got == {(0, 0): R.TRUNCATED, (1, 0): R.TRUNCATED}
        RolloutTraceConfig.flush()
        total = totals(exporter, 1)
        assert total["ran"] == 4 and total["dropped"] == 2 and total["kept.truncated"] == 2


def test_continuous_rewards_use_the_z_score():
    with capture_spans(tail_keep=["reward_outliers"], group_size=8, tail_reward_z=2.0) as exp:
        rewards = [0.50, 0.52, 0.48, 0.51, 0.49, 0.50, 0.47, 0.95]
        for n, reward in enumerate(rewards):
            trajectory(1, 0, n, trace=False, reward=reward)
        assert {k: s.attributes[semconv.ROLLOUT_SAMPLING_REASON]
                for k, s in roots(exp).items()} == {(0, 7): R.REWARD_OUTLIER}


def test_group_without_size_waits_for_the_step_change_and_flush_decides_the_rest():
    with capture_spans(tail_keep=["reward_outliers", "groups"]) as exporter:
        for n, reward in enumerate([1.0, 0.0, 0.0]):
            trajectory(1, 0, n, trace=False, reward=reward)
        assert roots(exporter) == {}  # group size unknown: still waiting
        trajectory(2, 5, 0, trace=False, reward=1.0)  # step 2: step 1's groups are decided
        assert set(roots(exporter)) == {(0, 0), (0, 1), (0, 2)}
        trajectory(2, 5, 1, trace=False, reward=0.0)
        RolloutTraceConfig.flush()  # a flush decides the waiting group of step 2
        assert set(roots(exporter, step=2)) == {(5, 0), (5, 1)}
        assert totals(exporter, 1)["ran"] == 3 and totals(exporter, 2)["ran"] == 2


def test_budget_caps_what_tail_rules_add_per_step():
    with capture_spans(tail_keep=["errors"], tail_max_per_step_per_worker=2) as exporter:
        for sample in range(5):
            trajectory(1, sample, 0, trace=False, op_error=True)
        trajectory(2, 9, 0, trace=False, op_error=True)  # a new step, a new budget
        assert len(roots(exporter)) == 3
        RolloutTraceConfig.flush()
        total = totals(exporter, 1)
        assert total["kept.error"] == 2 and total["over_budget"] == 3 and total["dropped"] == 3
        assert_counts_add_up(total)


# --- the buffer -----------------------------------------------------------------------------------


def test_full_buffer_exports_early_and_counts():
    """Buffer for about one trajectory: the oldest undecided ones go out as ``overflow``
    (weight 0), none are lost, a rule still names the ones it keeps."""
    with capture_spans(tail_keep=["errors", "reward_outliers", "groups"], group_size=N,
                       tail_buffer_bytes=12_000) as exporter:
        for n in range(N):
            trajectory(1, 0, n, trace=False, reward=0.0)  # uniform group: would be dropped
        trajectory(1, 1, 0, trace=False, reward=0.0, op_error=True)
        RolloutTraceConfig.flush()
        got = {k: (s.attributes[semconv.ROLLOUT_SAMPLING_REASON],
                   s.attributes[semconv.ROLLOUT_SAMPLING_WEIGHT]) for k, s in
               roots(exporter).items()}
        assert got[(1, 0)] == (R.ERROR, 1.0)
        overflow = [k for k, v in got.items() if v == (R.OVERFLOW, 0.0)]
        assert overflow, got
        assert set(got) - set(overflow) == {(1, 0)}
        stats = RolloutTraceConfig.stats()
        assert stats["tail_spilled"] >= len(overflow)
        assert stats["tail_peak_buffer_bytes"] <= 12_000 + 6_000  # one span over, at most
        total = totals(exporter, 1)
        assert total["kept.overflow"] == len(overflow) and total["ran"] == N + 1
        assert_counts_add_up(total)
        assert_no_orphans(exporter)
        # every span of a spilled trajectory went out
        for key in overflow:
            assert sum(1 for s in exporter.get_finished_spans()
                       if s.attributes.get(semconv.ROLLOUT_SAMPLE_INDEX) == key[0]
                       and s.attributes.get(semconv.ROLLOUT_ROLLOUT_N) == key[1]) == 3


# --- the processor alone (fake clock, stragglers, late spans) -------------------------------------


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def local_provider(**kwargs):
    exporter = InMemorySpanExporter()
    clock = Clock()
    processor = TailSamplingProcessor(SimpleSpanProcessor(exporter), clock=clock, **kwargs)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return provider.get_tracer("t"), processor, exporter, clock


def start_root(tracer, sample, n, step=1, provisional=True):
    attrs = {semconv.OTEL_VERL_TRAJECTORY: True, semconv.ROLLOUT_STEP: step,
             semconv.ROLLOUT_SAMPLE_INDEX: sample, semconv.ROLLOUT_ROLLOUT_N: n,
             semconv.ROLLOUT_EXPERIMENT_NAME: "e", semconv.ROLLOUT_VALIDATE: False}
    if provisional:
        attrs[semconv.OTEL_VERL_PROVISIONAL] = True
    return tracer.start_span("agent_loop", attributes=attrs)


def test_timeout_decides_a_group_and_a_straggler_follows_its_verdict():
    tracer, processor, exporter, clock = local_provider(
        keep=("reward_outliers", "groups"), group_size=4, group_timeout_s=10.0)
    for n, reward in enumerate([1.0, 0.0]):
        root = start_root(tracer, 0, n)
        root.set_attribute(semconv.ROLLOUT_REWARD, reward)
        root.end()
    assert exporter.get_finished_spans() == ()
    clock.now = 11.0
    root = start_root(tracer, 9, 0)  # any trajectory ending checks the timeouts
    root.set_attribute(semconv.ROLLOUT_REWARD, 1.0)
    root.end()
    kept = {s.attributes[semconv.ROLLOUT_ROLLOUT_N] for s in exporter.get_finished_spans()
            if s.attributes[semconv.ROLLOUT_SAMPLE_INDEX] == 0}
    assert kept == {0, 1}  # a 1-1 tie: both outcomes kept
    late = start_root(tracer, 0, 2)  # the group's third rollout, after the decision
    late.set_attribute(semconv.ROLLOUT_REWARD, 1.0)
    late.end()
    assert exporter.get_finished_spans()[-1].attributes[semconv.ROLLOUT_SAMPLING_REASON] == \
        R.GROUP
    assert processor.stats()["tail_groups_timed_out"] == 1


def test_child_ending_after_the_decision_follows_it():
    tracer, processor, exporter, _ = local_provider(keep=("errors",))
    root = start_root(tracer, 0, 0)
    child = tracer.start_span("slow", context=trace.set_span_in_context(root))
    root.set_status(trace.Status(trace.StatusCode.ERROR))
    root.end()
    child.end()  # after its trajectory was kept: exported too
    dropped_root = start_root(tracer, 1, 0)
    dropped_child = tracer.start_span("slow", context=trace.set_span_in_context(dropped_root))
    dropped_root.end()
    dropped_child.end()
    names = [(s.name, s.attributes.get(semconv.ROLLOUT_SAMPLE_INDEX))
             for s in exporter.get_finished_spans()]
    assert names == [("agent_loop", 0), ("slow", None)]
    assert processor.stats()["tail_late_spans_dropped"] == 1


def test_head_trajectories_pass_straight_through_and_are_counted():
    tracer, processor, exporter, _ = local_provider(keep=("errors",))
    root = start_root(tracer, 0, 0, provisional=False)
    child = tracer.start_span("op", context=trace.set_span_in_context(root))
    child.end()
    assert len(exporter.get_finished_spans()) == 1  # not held
    root.end()
    processor.force_flush()
    report = exporter.get_finished_spans()[-1]
    assert report.name == semconv.SAMPLING_REPORT_SPAN
    assert report.attributes[semconv.ROLLOUT_SAMPLING_RAN] == 1
    assert report.attributes[semconv.ROLLOUT_SAMPLING_KEPT_PREFIX + R.ALL] == 1


def test_shutdown_counts_trajectories_still_open():
    tracer, processor, _, _ = local_provider(keep=("errors",))
    start_root(tracer, 0, 0)  # never ends
    processor.shutdown()
    assert processor.stats()["tail_abandoned_open"] == 1
    processor.shutdown()  # idempotent


def test_unknown_rule_rejected():
    with pytest.raises(ValueError, match="tail_keep"):
        TailSamplingProcessor(SimpleSpanProcessor(InMemorySpanExporter()), keep=("oops",))


# --- the outlier rule -----------------------------------------------------------------------------


@pytest.mark.parametrize(("rewards", "expected"), [
    ([1.0, 0.0, 0.0, 0.0], {0}),
    ([1.0, 1.0, 1.0, 0.0], {3}),
    ([1.0, 1.0, 0.0, 0.0], {0, 1, 2, 3}),
    ([-1.0, 1.0, 1.0], {0}),
    ([1.0, 1.0, 1.0], set()),
    ([0.3], set()),
    ([0.5] * 6 + [0.9], {6}),
    ([0.1, 0.2, 0.3, 0.4], set()),
])
def test_reward_outliers_table(rewards, expected):
    assert reward_outliers(rewards, 2.0) == expected


@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=32))
def test_binary_outliers_are_the_minority_of_a_mixed_group(rewards):
    kept = reward_outliers(rewards, 2.0)
    ones = rewards.count(1.0)
    if ones in (0, len(rewards)):
        assert kept == set()
    elif ones * 2 == len(rewards):
        assert kept == set(range(len(rewards)))
    else:
        minority = 1.0 if ones * 2 < len(rewards) else 0.0
        assert kept == {i for i, r in enumerate(rewards) if r == minority}


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=32),
       st.floats(0.1, 5.0))
def test_continuous_outliers_never_raise_and_respect_the_bound(rewards, z):
    kept = reward_outliers(rewards, z)
    n = len(rewards)
    if len(set(rewards)) > 2 and z > (n - 1) ** 0.5 + 1e-9:
        assert kept == set()  # no z-score can exceed sqrt(n-1) (Samuelson)


def test_span_bytes_grows_with_payload():
    tracer, _, exporter, _ = local_provider(keep=("errors",))
    small = tracer.start_span("a")
    small.end()
    big = tracer.start_span("a", attributes={semconv.INPUT_VALUE: "x" * 10_000})
    big.end()
    a, b = exporter.get_finished_spans()
    assert span_bytes(b) - span_bytes(a) >= 10_000


# --- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(("explicit", "verl", "environ", "keep", "group"), [
    ({}, None, {}, (), None),
    ({}, None, {"OTEL_VERL_TAIL_KEEP": "errors, groups", "OTEL_VERL_GROUP_SIZE": "8"},
     ("errors", "groups"), 8),
    ({}, ["actor_rollout_ref.rollout.n=5", "actor_rollout_ref.rollout.trace.tail_keep=[errors]"],
     {"OTEL_VERL_GROUP_SIZE": "8"}, ("errors",), 5),  # verl's n beats the environment
    ({}, {"actor_rollout_ref": {"rollout": {"n": 4, "trace": {"tail_keep": ["truncated"]}}}},
     {}, ("truncated",), 4),
    ({"tail_keep": ["groups", "errors", "groups"], "group_size": 2},
     ["actor_rollout_ref.rollout.n=5"], {}, ("groups", "errors"), 2),
    ({}, None, {"OTEL_VERL_TAIL_KEEP": "errors,nonsense"}, (), None),  # bad env: warned, ignored
    ({}, None, {"OTEL_VERL_TAIL_KEEP": "none"}, (), None),
])
def test_tail_configuration_precedence(explicit, verl, environ, keep, group):
    from otel_verl._config import resolve_config

    config = resolve_config(explicit, verl, environ)
    assert config.tail_keep == keep and config.group_size == group


@pytest.mark.parametrize(("key", "value"), [
    ("tail_keep", ["errors", "sometimes"]), ("tail_keep", 3), ("group_size", 0),
    ("tail_reward_z", 0), ("tail_reward_z", float("nan")), ("tail_max_per_step_per_worker", -1),
    ("tail_buffer_bytes", -5), ("tail_group_timeout_s", 0),
])
def test_bad_tail_values_raise_naming_the_key(key, value):
    from otel_verl._config import ConfigError, resolve_config

    with pytest.raises(ConfigError, match=key):
        resolve_config({key: value}, None, {})


def test_tail_configuration_travels_to_workers():
    from otel_verl._config import resolve_config

    config = resolve_config({"tail_keep": "errors,groups", "group_size": 4}, None, {})
    worker = resolve_config(None, None, {"OTEL_VERL_CONFIG": config.to_json()})
    assert worker.tail_keep == ("errors", "groups") and worker.group_size == 4
