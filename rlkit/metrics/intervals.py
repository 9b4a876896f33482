"""Interval estimates and paired tests for a few seeds or many problems.

Everything here is plain Python (``math`` and ``statistics`` only), so rlkit needs no
statistics package at run time. The Student-t distribution is computed exactly from the
regularized incomplete beta function (a continued fraction, as in Numerical Recipes
§6.4): for ``df`` degrees of freedom and ``t >= 0``,

    P(T > t) = I_x(df/2, 1/2) / 2,   x = df / (df + t²).

The quantile inverts that by bisection, so it is exact to float rounding for any ``df``.

- :func:`t_interval`: mean, sample standard deviation (n - 1 denominator) and the
  interval ``mean ± t_{(1+level)/2, n-1} · std / √n``. With n = 1 there is no interval
  (``low`` and ``high`` are ``None``), never a NaN.
- :func:`paired_t_test`: the same interval on the paired differences ``a_i - b_i`` and
  the two-sided p-value of the paired t-test (H0: mean difference 0).
- :func:`proportion_interval`: per-problem values in [0, 1] (accuracy, mean@n, pass@k):
  a Wilson score interval when every value is 0 or 1 (a binomial proportion), else a
  t interval over problems clipped to [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from rlkit.metrics.pass_at_k import pass_at_k

#: The default confidence level of every interval.
LEVEL = 0.95
_TINY = 1e-300
_MAX_TERMS = 500


@dataclass(frozen=True)
class Estimate:
    """A mean over ``n`` values with its spread and interval.

    Attributes:
        mean: the sample mean.
        std: the sample standard deviation (n - 1 denominator); ``None`` when n < 2.
        n: how many values (seeds, problems, pairs).
        low, high: the interval's ends; ``None`` when there is none (n = 1 with a t interval).
        level: the confidence level (0.95 = 95 %).
        method: ``"t"``, ``"wilson"`` or ``"none"`` (no interval).
    """

    mean: float
    std: float | None
    n: int
    low: float | None
    high: float | None
    level: float = LEVEL
    method: str = "t"

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies in the interval (``True`` when there is no interval)."""
        if not self.has_interval:
            return True
        return self.low <= value <= self.high

    def interval_text(self, digits: int = 4) -> str:
        """``[low, high]``, or ``n=1: no interval``."""
        if not self.has_interval:
            return f"n={self.n}: no interval"
        return f"[{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def to_json(self) -> dict[str, float | int | str | None]:
        return {
            "mean": self.mean,
            "std": self.std,
            "n": self.n,
            "low": self.low,
            "high": self.high,
            "level": self.level,
            "method": self.method,
        }


@dataclass(frozen=True)
class PairedTest:
    """A paired comparison ``a - b``: the difference's estimate and the paired t-test.

    Attributes:
        difference: mean, std and interval of the per-pair differences ``a_i - b_i``.
        t_statistic: ``mean / (std / √n)``; ``None`` when n < 2 (infinite when every
            pair differs by the same non-zero amount).
        p_value: two-sided p-value of H0 "mean difference = 0"; ``None`` when n < 2.
    """

    difference: Estimate
    t_statistic: float | None
    p_value: float | None

    @property
    def verdict(self) -> str:
        """Plain words: ``higher``, ``lower``, or ``not distinguishable`` (the interval
        includes 0), or ``n=1: no interval``."""
        d = self.difference
        if not d.has_interval:
            return f"n={d.n}: no interval"
        if d.low > 0:
            return "higher"
        if d.high < 0:
            return "lower"
        return "not distinguishable (interval includes 0)"

    def to_json(self) -> dict[str, object]:
        return {
            "difference": self.difference.to_json(),
            "t": self.t_statistic,
            "p_value": self.p_value,
            "verdict": self.verdict,
        }


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean (``ValueError`` on an empty sequence)."""
    if not values:
        raise ValueError("the mean of no values is undefined")
    return math.fsum(values) / len(values)


def sample_std(values: Sequence[float]) -> float:
    """The sample standard deviation, n - 1 denominator (needs two values or more)."""
    if len(values) < 2:
        raise ValueError(f"a sample standard deviation needs 2 values or more, got {len(values)}")
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (len(values) - 1))


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (modified Lentz; converges for x < (a+1)/(a+b+2))."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),  # even step
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),  # odd step
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + aa / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta did not converge for a={a}, b={b}, x={x}")


def regularized_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and x in [0, 1]."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be within [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    # The fraction converges fast only on this side; use I_x(a,b) = 1 - I_{1-x}(b,a) on the other.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def _check_df(df: float) -> None:
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")


def student_t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    _check_df(df)
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * regularized_beta(df / (df + t * t), df / 2.0, 0.5)
    return tail if t >= 0 else 1.0 - tail


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (= P(T > -t): symmetry)."""
    return student_t_sf(-t, df)


def student_t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (e.g. ``student_t_quantile(0.975, 2)`` = 4.3027)."""
    _check_df(df)
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be within (0, 1), got {p}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    target = 1.0 - p  # an upper-tail probability: precise even for p close to 1
    low, high = 0.0, 1.0
    while student_t_sf(high, df) > target:
        low, high = high, 2.0 * high
    for _ in range(200):  # bisection: the tail is monotone in t
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        low, high = (mid, high) if student_t_sf(mid, df) > target else (low, mid)
    return 0.5 * (low + high)


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"the confidence level must be within (0, 1), got {level}")


def t_interval(values: Sequence[float], level: float = LEVEL) -> Estimate:
    """Mean, sample std and the t interval of the mean (no interval for one value).

    Raises:
        ValueError: no values, a non-finite value, or a level outside (0, 1).
    """
    _check_level(level)
    values = [float(v) for v in values]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"every value must be finite, got {values}")
    m, n = mean(values), len(values)
    if n < 2:
        return Estimate(m, None, n, None, None, level, "none")
    std = sample_std(values)
    half = student_t_quantile(0.5 + level / 2.0, n - 1) * std / math.sqrt(n)
    return Estimate(m, std, n, m - half, m + half, level, "t")


def paired_t_test(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> PairedTest:
    """The paired comparison of ``a`` against ``b`` (pair i = ``a[i]``, ``b[i]``).

    Returns:
        The :class:`PairedTest` of the differences ``a_i - b_i``. When every difference
        is the same, the interval has zero width and p is 1 (all zero) or 0 (all equal
        and non-zero): with no spread there is nothing to test against.

    Raises:
        ValueError: sequences of different lengths, or empty ones.
    """
    if len(a) != len(b):
        raise ValueError(f"paired values need equal lengths, got {len(a)} and {len(b)}")
    difference = t_interval([float(x) - float(y) for x, y in zip(a, b)], level)
    if difference.std is None:
        return PairedTest(difference, None, None)
    if difference.std == 0.0:
        if difference.mean == 0.0:
            return PairedTest(difference, 0.0, 1.0)
        return PairedTest(difference, math.copysign(math.inf, difference.mean), 0.0)
    t = difference.mean / (difference.std / math.sqrt(difference.n))
    p = 2.0 * student_t_sf(abs(t), difference.n - 1)
    return PairedTest(difference, t, min(1.0, p))


def wilson_interval(successes: float, trials: int, level: float = LEVEL) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion ``successes / trials``."""
    _check_level(level)
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, trials >= 1; got {successes}/{trials}")
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    p, z2 = successes / trials, z * z
    center = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    # At 0 and at `trials` successes an end is exactly 0 or 1; computed, it rounds to ~1e-17.
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == trials else min(1.0, center + half)
    return low, high


def proportion_interval(values: Sequence[float], level: float = LEVEL) -> Estimate:
    """The mean of per-unit values in [0, 1] with its interval.

    Wilson when every value is 0 or 1 (then the mean is a binomial proportion and
    Wilson stays sensible at 0 %, 100 % and few units, where a t interval collapses);
    otherwise the t interval, clipped to [0, 1].
    """
    if values and all(v in (0, 1) for v in values):
        low, high = wilson_interval(sum(values), len(values), level)
        std = sample_std(values) if len(values) > 1 else None
        return Estimate(mean(values), std, len(values), low, high, level, "wilson")
    est = t_interval(values, level)
    if not est.has_interval:
        return est
    return Estimate(est.mean, est.std, est.n, max(0.0, est.low), min(1.0, est.high), level, "t")


def per_problem_mean(correct: Sequence[Sequence[bool]]) -> list[float]:
    """Each problem's fraction of correct responses (its mean@n)."""
    return [sum(c) / len(c) for c in correct]


def per_problem_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> list[float]:
    """Each problem's unbiased pass@k (Chen et al. 2021) from its n responses."""
    return [pass_at_k(len(c), int(sum(c)), k) for c in correct]


def pass_at_k_interval(correct: Sequence[Sequence[bool]], k: int, level: float = LEVEL) -> Estimate:
    """pass@k averaged over problems with its :func:`proportion_interval` (unit: problem)."""
    return proportion_interval(per_problem_pass_at_k(correct, k), level)


def mean_at_n_interval(correct: Sequence[Sequence[bool]], level: float = LEVEL) -> Estimate:
    """mean@n (accuracy) averaged over problems with its :func:`proportion_interval`."""
    return proportion_interval(per_problem_mean(correct), level)
