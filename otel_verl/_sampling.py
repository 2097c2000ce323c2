"""Deterministic, consistent trajectory sampling (``max_samples_per_step_per_worker``).

verl picks N sample indices per step per worker with the unseeded numpy RNG, so the traced
prompts change every step and differ between workers and runs. Here every sample index gets a
stable rank (a keyed BLAKE2 hash of the experiment name and the index); a worker traces the N
lowest-ranked unique samples of its chunk. The same prompts therefore win in every step, on every
worker that sees them, and in every rerun, and every rollout (GRPO repeat) of a winner is traced.

Usage::

    sampler = RolloutTraceConfig.sampler()
    chosen = sampler.select(chunk_sample_indices)        # batch form, in the agent-loop worker
    with rollout_trace_attr(sample_index=i, step=s, rollout_n=n, trace=i in chosen): ...

    if sampler.should_trace(sample_index, step): ...     # streaming form, batch not known up front

    sampler.weight(sample_index)    # 1 / inclusion probability of a traced sample (the head rule)

Weights: a sample chosen by ``select`` from a chunk of M unique samples with limit N had inclusion
probability N / M (the rank is a uniform hash, independent of the data), so its weight is M / N;
with every sample traced the weight is 1. In the streaming form the population of a step is not
known when a sample is decided: the weight is ``1 / fraction`` (exact when the limit does not
bind); the per-step sampling report (``otel_verl.exporters._tail``) carries the exact counts.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Hashable, Iterable
from typing import Any

from otel_verl import semconv

_SCALE = float(1 << 64)
_MAX_WEIGHTS_KEPT = 1 << 16


def normalise_index(sample_index: Any) -> Any:
    """numpy/torch integer scalars and int subclasses as plain ints, so ``np.int64(3)`` and ``3``
    are the same sample (verl hands numpy ints around)."""
    if type(sample_index) is int or isinstance(sample_index, (str, bool)):
        return sample_index
    item = getattr(sample_index, "item", None)
    if callable(item) and getattr(sample_index, "ndim", 0) == 0:
        try:
            sample_index = item()
        except (TypeError, ValueError):
            return sample_index
    if isinstance(sample_index, int) and not isinstance(sample_index, bool):
        return int(sample_index)
    return sample_index


def sample_rank(experiment_name: str, sample_index: Hashable) -> float:
    """A stable pseudo-random rank in [0, 1) for a sample of an experiment (same on every host)."""
    sample_index = normalise_index(sample_index)
    digest = hashlib.blake2b(f"{sample_index!r}".encode(), digest_size=8,
                             key=experiment_name.encode()[:64]).digest()
    return int.from_bytes(digest, "big") / _SCALE


def sampling_attributes(sampler: TrajectorySampler, sample_index: Any,
                        provisional: bool) -> dict[str, Any]:
    """The sampling attributes a trajectory span starts with: reason and weight of the head rule
    (``all`` when every sample is traced), or the provisional marker for the tail decision."""
    if provisional:
        return {semconv.OTEL_VERL_PROVISIONAL: True}
    if sampler.limit is None:
        return {semconv.ROLLOUT_SAMPLING_REASON: semconv.SamplingReason.ALL,
                semconv.ROLLOUT_SAMPLING_WEIGHT: 1.0}
    return {semconv.ROLLOUT_SAMPLING_REASON: semconv.SamplingReason.HEAD,
            semconv.ROLLOUT_SAMPLING_WEIGHT: sampler.weight(sample_index)}


class TrajectorySampler:
    """Chooses which samples to trace, deterministically.

    Args:
        max_samples_per_step_per_worker: N; ``None`` traces every sample, 0 traces none.
        experiment_name: keys the ranking, so different experiments sample different prompts.
        fraction: streaming form only: a sample is eligible when its rank is below this
            fraction (default 1.0: every sample eligible, the first N eligible ones per step win).
            With ``fraction = N / samples_per_step`` the winners are the same set across steps.

    Raises:
        ValueError: N is negative, or fraction is outside (0, 1].
    """

    def __init__(self, max_samples_per_step_per_worker: int | None, experiment_name: str,
                 fraction: float = 1.0) -> None:
        limit = max_samples_per_step_per_worker
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 0):
            raise ValueError("max_samples_per_step_per_worker: expected null or an integer >= 0, "
                             f"got {limit!r}")
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction: expected a number in (0, 1], got {fraction!r}")
        self.limit = limit
        self.experiment_name = experiment_name
        self.fraction = fraction
        self._lock = threading.Lock()
        self._seen: dict[Hashable, dict[Hashable, bool]] = {}
        self._weights: dict[Hashable, float] = {}

    def rank(self, sample_index: Hashable) -> float:
        """The sample's stable rank in [0, 1); lower ranks are traced first."""
        return sample_rank(self.experiment_name, sample_index)

    def select(self, sample_indices: Iterable[Hashable]) -> frozenset[Any]:
        """The sample indices of one chunk to trace: the N unique ones of lowest rank.

        Args:
            sample_indices: the chunk's sample indices (repeats, e.g. GRPO rollouts, allowed).

        Returns:
            The chosen unique indices; every rollout of a chosen index is to be traced.
        """
        unique = list(dict.fromkeys(normalise_index(i) for i in sample_indices))
        if self.limit is None or len(unique) <= self.limit:
            chosen = frozenset(unique)
        elif self.limit == 0:
            return frozenset()
        else:
            ranked = sorted(unique, key=lambda index: (self.rank(index), repr(index)))
            chosen = frozenset(ranked[: self.limit])
        self._remember(chosen, len(unique) / len(chosen) if chosen else 1.0)
        return chosen

    def _remember(self, chosen: Iterable[Hashable], weight: float) -> None:
        with self._lock:
            if len(self._weights) > _MAX_WEIGHTS_KEPT:  # oldest half out (insertion order)
                for old in list(self._weights)[: _MAX_WEIGHTS_KEPT // 2]:
                    del self._weights[old]
            for index in chosen:
                self._weights.pop(index, None)
                self._weights[index] = weight

    def weight(self, sample_index: Hashable) -> float:
        """The head rule's weight of a traced sample: 1 / its inclusion probability.

        M / N for a sample chosen by the latest ``select`` holding it (M unique samples in the
        chunk, N the limit); ``1 / fraction`` in the streaming form; 1 when every sample is
        traced or the sample was not chosen by this sampler.
        """
        if self.limit is None:
            return 1.0
        weight = self._weights.get(normalise_index(sample_index))
        if weight is not None:
            return weight
        return 1.0 / self.fraction

    def should_trace(self, sample_index: Hashable, step: Hashable = None) -> bool:
        """Streaming form: decide one sample at a time within a step. Thread-safe.

        The same sample always gets the same answer within a step (so all its rollouts agree);
        at most N distinct samples are admitted per step.
        """
        if self.limit is None:
            return True
        if self.limit == 0:
            return False
        sample_index = normalise_index(sample_index)
        with self._lock:
            decided = self._seen.setdefault(step, {})
            if sample_index in decided:
                return decided[sample_index]
            if len(self._seen) > 64:  # keep only recent steps
                for old in list(self._seen)[:-8]:
                    del self._seen[old]
            admitted = sum(decided.values())
            verdict = admitted < self.limit and self.rank(sample_index) < self.fraction
            decided[sample_index] = verdict
            return verdict
