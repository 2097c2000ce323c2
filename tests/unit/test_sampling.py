"""Deterministic, consistent sampling with verl's meaning of max_samples_per_step_per_worker."""

import pytest

from otel_verl import TrajectorySampler


def test_null_traces_all_and_zero_none():
    assert TrajectorySampler(None, "e").select([3, 1, 3]) == {1, 3}
    assert TrajectorySampler(0, "e").select([3, 1]) == frozenset()
    assert TrajectorySampler(0, "e").should_trace(1, step=0) is False


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_bad_limit_rejected(bad):
    with pytest.raises(ValueError, match="max_samples_per_step_per_worker"):
        TrajectorySampler(bad, "e")


def test_same_winners_across_steps_workers_and_order():
    sampler = TrajectorySampler(3, "exp")
    batch = list(range(64))
    first = sampler.select(batch)
    assert len(first) == 3
    assert TrajectorySampler(3, "exp").select(reversed(batch)) == first  # another worker/run
    # a worker that sees only part of the batch still agrees on the winners it holds
    chunk = [i for i in batch if i % 2 == 0]
    winners_in_chunk = TrajectorySampler(64, "exp").select(chunk)
    assert first & set(chunk) <= winners_in_chunk
    # every rollout of a winner is traced: repeats don't change the choice
    assert sampler.select(batch * 4) == first


def test_lowest_ranks_win_and_experiments_differ():
    sampler = TrajectorySampler(5, "exp")
    batch = range(200)
    ranked = sorted(batch, key=sampler.rank)
    assert sampler.select(batch) == set(ranked[:5])
    assert TrajectorySampler(5, "other").select(batch) != sampler.select(batch)


def test_global_consistency_when_chunks_overlap():
    """A sample chosen in the full batch is chosen in any chunk holding it with limit >= its rank."""
    sampler = TrajectorySampler(2, "exp")
    batch = list(range(100))
    best = sorted(batch, key=sampler.rank)[0]
    for start in range(0, 100, 25):
        chunk = batch[start:start + 25]
        if best in chunk:
            assert best in sampler.select(chunk)


def test_streaming_form_caps_per_step_and_is_stable_within_a_step():
    sampler = TrajectorySampler(2, "exp")
    decisions = [sampler.should_trace(i, step=1) for i in range(10)]
    assert sum(decisions) == 2
    # all rollouts of a sample agree
    assert [sampler.should_trace(i, step=1) for i in range(10)] == decisions
    # a new step has its own budget
    assert sum(sampler.should_trace(i, step=2) for i in range(10)) == 2


def test_streaming_with_fraction_follows_the_same_prompts():
    sampler = TrajectorySampler(100, "exp", fraction=0.1)
    chosen = [{i for i in range(500) if sampler.should_trace(i, step)} for step in range(3)]
    assert chosen[0] == chosen[1] == chosen[2]
    assert 20 < len(chosen[0]) < 80


def test_numpy_indices_are_the_same_samples():
    np = __import__("numpy")
    sampler = TrajectorySampler(3, "exp")
    assert sampler.rank(np.int64(3)) == sampler.rank(3)
    assert sampler.select(np.arange(50)) == sampler.select(range(50))
    assert all(type(i) is int for i in sampler.select(np.arange(50)))
    assert sampler.should_trace(np.int32(7), step=1) == TrajectorySampler(3, "exp").should_trace(
        7, step=1)


def test_head_weight_is_population_over_chosen():
    sampler = TrajectorySampler(2, "exp")
    chosen = sampler.select(list(range(10)) * 4)  # 10 unique samples, 4 rollouts each
    assert all(sampler.weight(i) == 5.0 for i in chosen)
    small = TrajectorySampler(8, "exp")
    assert all(small.weight(i) == 1.0 for i in small.select(range(3)))  # all traced
    assert TrajectorySampler(None, "exp").weight(3) == 1.0
    streaming = TrajectorySampler(2, "exp", fraction=0.25)
    assert streaming.weight(7) == 4.0  # not chosen by select: the streaming form's 1/fraction


def test_sampling_attributes_say_head_all_or_provisional():
    from otel_verl import semconv
    from otel_verl._sampling import sampling_attributes

    sampler = TrajectorySampler(1, "exp")
    (chosen,) = sampler.select(range(4))
    assert sampling_attributes(sampler, chosen, False) == {
        semconv.ROLLOUT_SAMPLING_REASON: "head", semconv.ROLLOUT_SAMPLING_WEIGHT: 4.0}
    assert sampling_attributes(TrajectorySampler(None, "e"), 0, False)[
        semconv.ROLLOUT_SAMPLING_REASON] == "all"
    assert sampling_attributes(sampler, 1, True) == {semconv.OTEL_VERL_PROVISIONAL: True}
