"""bench/_paired.py: the intervals the benches report for paired rounds."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest
from _modules import load_file
from hypothesis import given, settings
from hypothesis import strategies as st

_PATH = Path(__file__).resolve().parents[2] / "bench" / "_paired.py"
paired = load_file(_PATH, "bench_paired")


@pytest.mark.parametrize(("n", "k"), [(6, 1), (8, 1), (9, 2), (12, 3), (16, 4), (18, 5),
                                      (20, 6), (30, 10)])
def test_order_stat_rank_matches_the_sign_test_table(n: int, k: int) -> None:
    # the standard table of ranks for a 95 % interval of the median
    got, coverage = paired.order_stat_rank(n)
    assert got == k
    exact = 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n
    assert coverage == pytest.approx(exact)
    assert coverage >= 0.95
    # one rank narrower would fall below 95 %
    assert 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n < 0.95


def test_too_few_rounds_give_the_full_range_and_say_so() -> None:
    est = paired.median_interval([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (est.value, est.lo, est.hi) == (3.0, 1.0, 5.0)
    assert est.coverage == pytest.approx(1 - 2 / 32)
    assert "(93.8 %)" in paired.fmt(est)


def test_median_interval_picks_the_order_statistics() -> None:
    xs = [float(i) for i in range(16, 0, -1)]  # 16..1, unsorted on purpose
    est = paired.median_interval(xs)
    assert est.value == 8.5 and est.n == 16
    assert (est.lo, est.hi) == (4.0, 13.0)  # x_(4), x_(13)


def test_median_interval_covers_the_true_median_about_95_percent() -> None:
    rng = random.Random(1234)
    trials, hits = 2000, 0
    for _ in range(trials):
        xs = [rng.lognormvariate(0.0, 1.0) for _ in range(16)]  # true median exp(0) = 1
        est = paired.median_interval(xs)
        hits += est.lo <= 1.0 <= est.hi
    # exact coverage 0.9787; 2000 trials put the count within about +-0.007 (2 sd)
    assert 0.96 <= hits / trials <= 0.995


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=40))
def test_median_interval_brackets_the_median(xs: list[float]) -> None:
    est = paired.median_interval(xs)
    assert est.lo <= est.value <= est.hi
    assert est.value == statistics.median(xs)
    assert est.lo in xs and est.hi in xs


def test_bootstrap_of_a_constant_ratio_is_that_ratio() -> None:
    den = [10.0, 3.0, 7.5, 1.0, 12.0, 4.0]
    num = [0.9 * d for d in den]
    est = paired.bootstrap_ratio_of_sums(num, den, reps=500)
    assert est.value == pytest.approx(0.9)
    assert est.lo == pytest.approx(0.9) and est.hi == pytest.approx(0.9)


def test_bootstrap_resamples_rounds_in_pairs() -> None:
    # each pair has ratio 0.5 or 2.0 at very different scales; resampling num and den
    # independently would produce ratios far outside what the pairs can make
    den = [1.0, 100.0] * 8
    num = [2.0, 50.0] * 8
    est = paired.bootstrap_ratio_of_sums(num, den, reps=2000, seed=3)
    assert est.value == pytest.approx(sum(num) / sum(den))
    assert est.lo < est.value < est.hi
    assert 0.5 <= est.lo and est.hi <= 2.0
    again = paired.bootstrap_ratio_of_sums(num, den, reps=2000, seed=3)
    assert again == est  # seeded: the same report twice


def test_bootstrap_interval_narrows_with_more_rounds() -> None:
    rng = random.Random(7)

    def rounds(n: int) -> tuple[list[float], list[float]]:
        off = [rng.uniform(1.0, 2.0) for _ in range(n)]
        return [o * rng.gauss(0.95, 0.05) for o in off], off
    few = paired.bootstrap_ratio_of_sums(*rounds(8), reps=2000)
    many = paired.bootstrap_ratio_of_sums(*rounds(128), reps=2000)
    assert many.hi - many.lo < few.hi - few.lo
    assert many.lo < 0.95 < many.hi


def test_bootstrap_rejects_unpaired_input() -> None:
    with pytest.raises(ValueError):
        paired.bootstrap_ratio_of_sums([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired.median_interval([])
