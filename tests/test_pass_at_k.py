"""Unbiased pass@k (Chen et al. 2021) and mean@n."""

import math

import pytest

from rlkit.metrics.pass_at_k import mean_and_pass_at_k, pass_at_k


def test_pass_at_k_matches_the_binomial_formula():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # = c/n
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k = 3
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - math.comb(7, 4) / math.comb(10, 4))


def test_mean_and_pass_at_k_average_over_problems():
    out = mean_and_pass_at_k([[True, False], [False, False]])
    # mean@2 = (0.5 + 0) / 2; pass@2 = (1 + 0) / 2; pass@1 = mean
    assert out == {"mean@2": 0.25, "pass@1": 0.25, "pass@2": 0.5}


@pytest.mark.parametrize("n, c, k", [(3, 1, 0), (3, 1, 4), (3, 4, 1)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)
