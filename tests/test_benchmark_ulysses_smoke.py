"""The Ulysses benchmark runs end to end on 2 processes at a small size (no timing
assertions)."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import load_benchmark

pytestmark = pytest.mark.distributed


def test_benchmark_prints_memory_and_exchange_rows_for_both_sizes(capsys):
    benchmark = load_benchmark("ulysses.py")
    args = ["--tokens", "256", "--hidden-size", "64", "--layers", "2", "--repeats", "1"]
    assert benchmark.main(args) == 0
    rows = {
        cells[0]: cells[1:]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ") and not line.startswith("| k ")
        for cells in [[c.strip() for c in line.strip().strip("|").split("|")]]
    }
    assert rows["1"][1] == "1.00x"
    # Each process keeps about half the activations: its tokens, its heads' attention.
    assert float(rows["2"][1].rstrip("x")) < 0.75
    assert float(rows["all-to-all, forward + backward"][0]) > 0
    assert float(rows["attention, forward"][0]) > 0
