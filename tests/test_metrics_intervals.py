"""rlkit.metrics.intervals: Student-t, t intervals, the paired t-test and Wilson, by hand
and (when scipy is importable) against scipy.stats."""

from __future__ import annotations

import math

import pytest

from rlkit.metrics.intervals import (
    mean_at_n_interval,
    paired_t_test,
    pass_at_k_interval,
    proportion_interval,
    regularized_beta,
    student_t_cdf,
    student_t_quantile,
    student_t_sf,
    t_interval,
    wilson_interval,
)


@pytest.mark.parametrize("x", [0.0, 0.01, 0.3, 0.5, 0.77, 0.999, 1.0])
@pytest.mark.parametrize(("a", "b"), [(1.0, 1.0), (3.0, 1.0), (1.0, 2.5), (0.5, 1.0)])
def test_incomplete_beta_closed_forms(x, a, b):
    # I_x(a, 1) = x^a and I_x(1, b) = 1 - (1 - x)^b (so I_x(1, 1) = x).
    expected = x**a if b == 1.0 else 1.0 - (1.0 - x) ** b
    assert regularized_beta(x, a, b) == pytest.approx(expected, abs=1e-13)


@pytest.mark.parametrize("p", [0.5, 0.6, 0.9, 0.975, 0.995, 0.9995, 0.025, 0.001])
def test_t_quantile_closed_forms_for_one_and_two_degrees_of_freedom(p):
    # df = 1 is the Cauchy distribution: t = tan(pi (p - 1/2)).
    assert student_t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
    # df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t^2)), inverted: t = (2p - 1) / sqrt(2 p (1 - p)).
    exact = (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    assert student_t_quantile(p, 2) == pytest.approx(exact, rel=1e-10, abs=1e-12)
    assert student_t_cdf(exact, 2) == pytest.approx(p, rel=1e-12)


@pytest.mark.parametrize(
    ("df", "table"),
    # The two-sided 95% column of a printed t table (3 decimals).
    [(3, 3.182), (4, 2.776), (5, 2.571), (9, 2.262), (10, 2.228), (30, 2.042), (120, 1.980)],
)
def test_t_quantile_matches_the_printed_table(df, table):
    assert student_t_quantile(0.975, df) == pytest.approx(table, abs=5e-4)
    assert student_t_sf(student_t_quantile(0.975, df), df) == pytest.approx(0.025, rel=1e-10)


def test_t_interval_by_hand():
    # [1, 2, 3]: mean 2, std sqrt((1 + 0 + 1) / 2) = 1, half width t(0.975, 2) / sqrt(3)
    # = 4.302653 / 1.732051 = 2.484138.
    est = t_interval([1.0, 2.0, 3.0])
    assert (est.mean, est.std, est.n, est.method) == (2.0, 1.0, 3, "t")
    assert est.low == pytest.approx(2 - 2.484138, abs=1e-6)
    assert est.high == pytest.approx(2 + 2.484138, abs=1e-6)
    assert est.interval_text() == "[-0.4841, 4.4841]"


def test_one_value_has_no_interval_and_no_nan():
    est = t_interval([0.7])
    assert est.mean == 0.7 and est.std is None and not est.has_interval
    assert est.interval_text() == "n=1: no interval"
    test = paired_t_test([0.7], [0.5])
    assert test.p_value is None and test.verdict == "n=1: no interval"


def test_paired_t_test_by_hand():
    # d = [0.5, 1, 1.5]: mean 1, std 0.5, t = 1 / (0.5 / sqrt 3) = 3.464102; with df = 2 the
    # two-sided p is 1 - |t| / sqrt(2 + t^2) = 1 - 3.464102 / 3.741657 = 0.074180.
    test = paired_t_test([1.0, 2.0, 3.5], [0.5, 1.0, 2.0])
    assert test.difference.mean == pytest.approx(1.0)
    assert test.difference.std == pytest.approx(0.5)
    assert test.t_statistic == pytest.approx(3.464102, abs=1e-6)
    assert test.p_value == pytest.approx(0.074180, abs=1e-6)
    # Half width 4.302653 * 0.5 / sqrt 3 = 1.242069: [-0.242069, 2.242069] includes 0.
    assert test.difference.low == pytest.approx(-0.242069, abs=1e-6)
    assert test.verdict == "not distinguishable (interval includes 0)"
    lower = paired_t_test([0.0, 0.1, 0.2, 0.3], [1.0, 1.2, 1.1, 1.4])
    assert lower.verdict == "lower" and lower.p_value < 0.05


def test_paired_differences_without_spread():
    same = paired_t_test([0.5, 0.25], [0.5, 0.25])
    assert (same.difference.low, same.difference.high, same.p_value) == (0.0, 0.0, 1.0)
    assert same.verdict.startswith("not distinguishable")
    shifted = paired_t_test([0.6, 0.35], [0.5, 0.25])  # every pair differs by 0.1
    assert shifted.p_value == 0.0 and shifted.t_statistic == math.inf
    assert shifted.verdict == "higher"


def test_wilson_by_hand():
    # 8 of 10, z = 1.959964: center (0.8 + z²/20) / (1 + z²/10) = 0.716738, half width
    # z sqrt(0.016 + z²/400) / (1 + z²/10) = 0.226577.
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.716738 - 0.226577, abs=1e-5)
    assert high == pytest.approx(0.716738 + 0.226577, abs=1e-5)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0


def test_per_problem_intervals_pick_wilson_for_0_1_values_and_clip_t():
    # Greedy accuracy: every problem is 0 or 1, a binomial proportion -> Wilson.
    greedy = mean_at_n_interval([[True], [True], [False], [True]])
    assert greedy.method == "wilson" and greedy.mean == 0.75
    assert (greedy.low, greedy.high) == pytest.approx(wilson_interval(3, 4))
    # pass@2 of n=4 with c=1 and c=3: 0.5 and 1 (1 - C(3,2)/C(4,2); n - c < k). t over 2
    # problems: mean 0.75, std 0.353553, half 12.7062 * 0.353553 / sqrt 2 = 3.18 -> [0, 1].
    est = pass_at_k_interval([[True, False, False, False], [True, True, True, False]], 2)
    assert est.method == "t" and est.mean == pytest.approx(0.75)
    assert (est.low, est.high) == (0.0, 1.0)
    assert proportion_interval([0.5, 0.5]).interval_text() == "[0.5000, 0.5000]"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: t_interval([]), "no values"),
        (lambda: t_interval([1.0, math.nan]), "finite"),
        (lambda: t_interval([1.0, 2.0], level=1.5), "level"),
        (lambda: paired_t_test([1.0], [1.0, 2.0]), "equal lengths"),
        (lambda: student_t_quantile(1.0, 3), "within \\(0, 1\\)"),
        (lambda: student_t_cdf(1.0, 0), "degrees of freedom"),
        (lambda: wilson_interval(3, 2), "successes"),
    ],
)
def test_bad_arguments_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    special = pytest.importorskip("scipy.special")
    for df in (1, 2, 3, 4.5, 7, 29, 250):
        for p in (0.001, 0.05, 0.5, 0.9, 0.975, 0.9999):
            assert student_t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9)
        for t in (-40.0, -2.0, 0.3, 1.96, 8.0):
            assert student_t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), rel=1e-9, abs=1e-15)
    for x, a, b in ((0.2, 2.5, 0.5), (0.9, 40.0, 0.5), (0.5, 0.5, 0.5)):
        assert regularized_beta(x, a, b) == pytest.approx(special.betainc(a, b, x), rel=1e-12)
    a, b = [0.71, 0.64, 0.80, 0.75, 0.69], [0.70, 0.60, 0.77, 0.71, 0.70]
    ref = stats.ttest_rel(a, b)
    ours = paired_t_test(a, b)
    assert ours.t_statistic == pytest.approx(ref.statistic, rel=1e-9)
    assert ours.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    low, high = ref.confidence_interval(0.95)
    assert (ours.difference.low, ours.difference.high) == pytest.approx((low, high), rel=1e-9)
