"""Intervals for paired benchmark rounds, stdlib only (for benches that run modes side by side).

A noisy machine makes single rounds scatter; a paired design (each round runs every mode back to
back, in rotating order) makes the per-round ratio or difference the unit, and these helpers turn
the rounds into an estimate with a 95 % interval instead of a guessed range:

- ``median_interval(xs)``: the median and a distribution-free interval for it from order
  statistics (the sign test's interval: it assumes only independent rounds, not normality);
- ``bootstrap_ratio_of_sums(num, den)``: ``sum(num) / sum(den)`` with a percentile bootstrap over
  rounds, resampling the pairs together (the ratio of summed rates, which weighs each round by
  its rate instead of each round's ratio equally);
- ``fmt(estimate)``: ``0.953 [0.921, 0.987]``.

Usage::

    from _paired import bootstrap_ratio_of_sums, median_interval
    ratios = [on / off for on, off in zip(rates_on, rates_off)]
    print(median_interval(ratios), bootstrap_ratio_of_sums(rates_on, rates_off))
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Estimate", "bootstrap_ratio_of_sums", "fmt", "median_interval", "order_stat_rank"]


@dataclass(frozen=True)
class Estimate:
    """A point estimate with an interval; ``coverage`` is what the interval achieves.

    For the order-statistics interval ``coverage`` is exact (>= the level asked for, or less when
    there are too few rounds to reach it: then the interval is the full range and says so).
    """

    value: float
    lo: float
    hi: float
    coverage: float
    n: int


def _binom_cdf_half(k: int, n: int) -> float:
    """P(B <= k) for B ~ Binomial(n, 1/2)."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / 2**n


def order_stat_rank(n: int, level: float = 0.95) -> tuple[int, float]:
    """The 1-based rank ``k`` such that ``[x_(k), x_(n+1-k)]`` covers the median with
    probability >= ``level``, taking the largest such ``k``; returns ``(k, exact coverage)``.

    When even the full range does not reach ``level`` (n < 6 at 95 %), returns ``(1, coverage of
    the full range)``.
    """
    if n < 1:
        raise ValueError("need at least one value")
    alpha = 1.0 - level
    k = 1
    # coverage of [x_(k), x_(n+1-k)] is 1 - 2 P(B <= k-1)
    while k + 1 <= (n + 1) // 2 and 2 * _binom_cdf_half(k, n) <= alpha:
        k += 1
    return k, 1.0 - 2 * _binom_cdf_half(k - 1, n)


def median_interval(values: Sequence[float], level: float = 0.95) -> Estimate:
    """The median of ``values`` and the distribution-free interval for it (see ``order_stat_rank``)."""
    xs = sorted(values)
    n = len(xs)
    k, coverage = order_stat_rank(n, level)
    return Estimate(statistics.median(xs), xs[k - 1], xs[n - k], coverage, n)


def _percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 1] of an ascending sequence."""
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def bootstrap_ratio_of_sums(num: Sequence[float], den: Sequence[float], level: float = 0.95,
                            reps: int = 10_000, seed: int = 0) -> Estimate:
    """``sum(num) / sum(den)`` with a percentile bootstrap interval, resampling rounds in pairs.

    ``coverage`` is the nominal ``level`` (a bootstrap interval's coverage is approximate).
    """
    if len(num) != len(den) or not num:
        raise ValueError("num and den must be non-empty and of equal length")
    n = len(num)
    rng = random.Random(seed)
    stats = []
    for _ in range(reps):
        idx = [rng.randrange(n) for _ in range(n)]
        d = sum(den[i] for i in idx)
        if d:
            stats.append(sum(num[i] for i in idx) / d)
    stats.sort()
    alpha = 1.0 - level
    return Estimate(sum(num) / sum(den), _percentile(stats, alpha / 2),
                    _percentile(stats, 1 - alpha / 2), level, n)


def fmt(est: Estimate, digits: int = 3) -> str:
    """``value [lo, hi]``, with the coverage appended when it differs from 95 %."""
    text = f"{est.value:.{digits}f} [{est.lo:.{digits}f}, {est.hi:.{digits}f}]"
    if abs(est.coverage - 0.95) > 0.005:
        text += f" ({100 * est.coverage:.1f} %)"
    return text
