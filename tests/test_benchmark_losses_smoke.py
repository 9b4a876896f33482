"""The policy-loss benchmark runs end to end on a tiny batch (no timing assertions)."""

from __future__ import annotations

import algorithms
from tests.benchmark_scripts import load_benchmark


def test_benchmark_prints_one_row_per_registered_loss(capsys):
    benchmark = load_benchmark("losses.py")
    assert benchmark.main(["--batch", "4", "--length", "32", "--repeats", "1"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    header, rows = table[0], table[1:]
    assert "copy floor ms" in header and "loop ref ms" in header and "abs diff" in header
    assert [row.split("|")[1].strip() for row in rows] == algorithms.loss_names()
    for row in rows:
        # last column: |vectorised − loop reference| of the loss on a float64 sub-batch
        assert float(row.split("|")[-2]) < 1e-9, row
