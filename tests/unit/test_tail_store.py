"""Weights end to end: head + tail sampling into the local store, read back, per-step statistics
that are unbiased (checked exactly over every head choice), and `otel-verl traces list --steps`."""

from __future__ import annotations

import json

import pytest

import otel_verl
from otel_verl import RolloutTraceConfig, TrajectorySampler, semconv
from otel_verl.cli import main
from otel_verl.store import Lake, group_trajectories, read_spans, sampling_reports

from .test_tail import trajectory

# sample -> per-rollout (reward, op_error); 2 rollouts per sample
POPULATION = {
    0: [(1.0, False), (1.0, False)],
    1: [(0.0, False), (0.0, False)],
    2: [(1.0, False), (0.0, False)],  # mixed: reward outliers (a tie: both)
    3: [(0.0, False), (0.0, True)],  # an error: kept, and its group with it
    4: [(1.0, False), (1.0, False)],
    5: [(0.0, False), (1.0, False)],  # mixed
}
TRUE_TOTAL_REWARD = sum(r for rows in POPULATION.values() for r, _ in rows)
TRUE_COUNT = sum(len(rows) for rows in POPULATION.values())


def run_population(directory, head, monkeypatch):
    """One step of the population, with the head rule picking ``head`` (its rank made lowest)."""
    monkeypatch.setattr(TrajectorySampler, "rank",
                        lambda self, index: 0.0 if index == head else 0.5 + index / 100)
    RolloutTraceConfig.init("p", "exp", "file", trace_dir=str(directory), processor="simple",
                            max_samples_per_step_per_worker=1,
                            tail_keep=["errors", "reward_outliers", "groups"], group_size=2)
    chosen = RolloutTraceConfig.sampler().select(POPULATION)
    assert chosen == {head}
    for sample, rows in POPULATION.items():
        for n, (reward, op_error) in enumerate(rows):
            trajectory(1, sample, n, trace=sample in chosen, reward=reward, op_error=op_error)
    RolloutTraceConfig.shutdown()
    RolloutTraceConfig.reset()
    spans = list(read_spans(directory))
    return group_trajectories(spans), sampling_reports(spans)


def test_weighted_totals_are_exactly_unbiased_over_the_head_choice(tmp_path, monkeypatch):
    totals, counts = [], []
    for head in POPULATION:
        trajectories, reports = run_population(tmp_path / str(head), head, monkeypatch)
        assert all(t.sampling_reason is not None for t in trajectories)
        totals.append(sum(t.sampling_weight * t.reward for t in trajectories))
        counts.append(sum(t.sampling_weight for t in trajectories))
        (report,) = reports.values()
        assert report["ran"] == TRUE_COUNT
        kept = sum(v for k, v in report.items() if k.startswith("kept."))
        assert kept == len(trajectories) and kept + report["dropped"] == TRUE_COUNT
    # the head rule picks each sample with probability 1/6: the expectation is the mean over them
    assert sum(totals) / len(totals) == pytest.approx(TRUE_TOTAL_REWARD)
    assert sum(counts) / len(counts) == pytest.approx(TRUE_COUNT)
    # the plain mean over exported trajectories is biased (tail rules favour mixed groups)
    assert len(set(totals)) > 1


def test_step_statistics_and_the_cli(tmp_path, monkeypatch, capsys):
    directory = tmp_path / "store"
    run_population(directory, 0, monkeypatch)
    with Lake.open(directory) as lake:  # the one step statistics (STEPS_SQL)
        (stats,) = lake.steps()
    assert stats["step"] == 1 and stats["ran"] == TRUE_COUNT and stats["dropped"] == 4
    assert stats["by_reason"] == {"head": 2, "reward_outlier": 4, "error": 1, "group": 1}
    assert stats["estimated"] == pytest.approx(2 * 6 + 6)  # head rollouts x 6 + 6 tail-kept
    weighted = (2 * 6 * 1.0 + 1.0 + 1.0) / 18  # head sample 0 (reward 1) x 6, s2 and s5 one 1
    assert stats["reward_mean"] == pytest.approx(weighted)
    assert stats["reward_mean_unweighted"] == pytest.approx(4 / 8)
    assert stats["error_rate"] == pytest.approx(1 / 18)

    assert main(["traces", "list", "--dir", str(directory), "--steps", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["ran"] == TRUE_COUNT and row["reward_mean"] == pytest.approx(weighted)
    assert main(["traces", "list", "--dir", str(directory), "--steps"]) == 0
    text = capsys.readouterr().out
    assert "REWARD (WEIGHTED)" in text and "head=2" in text
    # the report span is not listed as a trajectory
    assert main(["traces", "list", "--dir", str(directory), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed) == 8 and all(t["sampling_reason"] for t in listed)
    assert {t["sampling_weight"] for t in listed} == {6.0, 1.0}


def test_store_without_weights_counts_each_trajectory_once(tmp_path):
    RolloutTraceConfig.init("p", "exp", "file", trace_dir=str(tmp_path), processor="simple")
    with otel_verl.rollout_trace_attr(step=1, sample_index=0):
        otel_verl.record_reward(0.5)
    RolloutTraceConfig.shutdown()
    (t,) = group_trajectories(read_spans(tmp_path))
    assert t.sampling_reason == semconv.SamplingReason.ALL and t.sampling_weight == 1.0
    with Lake.open(tmp_path) as lake:
        (stats,) = lake.steps()
    assert stats["reward_mean"] == 0.5 and stats["ran"] is None and stats["estimated"] == 1.0
