"""Sequence-length balancing across processes and verl's global_seqlen/* metrics."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.trainer.balancing import (
    balanced_partitions,
    contiguous_partitions,
    seqlen_balance_metrics,
)


def sums(lengths, parts):
    return [sum(lengths[i] for i in p) for p in parts]


def test_two_long_rows_at_the_front_are_split_between_the_processes():
    # Contiguous: [100, 90, 10, 5 | 8, 7, 6, 4] = 205 vs 25. Sorted: 100 90 10 8 7 6 5 4,
    # taken 2 at a time: {100|90}, {10|8}, {7|6}, {5|4} with spreads 10, 2, 1, 1.
    # Merge {100|90} with {10|8}: heaviest 100 + lightest 8, 90 + 10 -> {108|100}, spread 8.
    # Merge {108|100} with {7|6}: 108 + 6, 100 + 7 -> {114|107}, spread 7; then with
    # {5|4}: 114 + 4, 107 + 5 -> {118|112}.
    lengths = [100, 90, 10, 5, 8, 7, 6, 4]
    parts = balanced_partitions(lengths, 2)
    assert sorted(sums(lengths, parts)) == [112, 118]
    assert sorted(map(len, parts)) == [4, 4]
    assert parts == [[0, 4, 6, 7], [1, 2, 3, 5]]  # 100+8+6+4, 90+10+5+7


def test_the_metrics_report_both_splits_with_verl_names():
    lengths = [100, 90, 10, 5, 8, 7, 6, 4]
    metrics = seqlen_balance_metrics(lengths, balanced_partitions(lengths, 2))
    assert metrics == {
        "global_seqlen/min": 25.0,  # 8 + 7 + 6 + 4
        "global_seqlen/max": 205.0,  # 100 + 90 + 10 + 5
        "global_seqlen/minmax_diff": 180.0,
        "global_seqlen/balanced_min": 112.0,
        "global_seqlen/balanced_max": 118.0,
        "global_seqlen/mean": 115.0,  # 230 tokens / 2 processes
    }


def test_one_process_gets_every_row():
    assert balanced_partitions([3, 1, 2], 1) == [[0, 1, 2]]
    metrics = seqlen_balance_metrics([3, 1, 2], [[0, 1, 2]])
    assert metrics["global_seqlen/min"] == metrics["global_seqlen/balanced_max"] == 6.0


def test_rows_that_do_not_split_evenly_are_refused():
    with pytest.raises(ValueError, match="cannot split 5 rows into 2 equal parts"):
        balanced_partitions([1] * 5, 2)
    with pytest.raises(ValueError, match="cannot split 4 rows into 0"):
        contiguous_partitions(4, 0)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda k: st.tuples(st.just(k), st.lists(st.integers(1, 500), min_size=k, max_size=4 * k))
    )
)
def test_parts_are_equal_sized_a_permutation_and_never_worse_than_contiguous(case):
    k, lengths = case
    lengths = lengths[: len(lengths) - len(lengths) % k]
    parts = balanced_partitions(lengths, k)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert {len(p) for p in parts} == {len(lengths) // k}
    spread = max(sums(lengths, parts)) - min(sums(lengths, parts))
    contiguous = sums(lengths, contiguous_partitions(len(lengths), k))
    # Not always optimal, but within the largest row of the best equal split (the merge
    # pairs heaviest with lightest), and here checked against brute force for small n.
    if len(lengths) <= 8 and k == 2:
        best = min(
            abs(2 * sum(lengths[i] for i in half) - sum(lengths))
            for half in itertools.combinations(range(len(lengths)), len(lengths) // 2)
        )
        assert spread <= best + max(lengths)
    assert max(sums(lengths, parts)) <= max(contiguous) + max(lengths)
