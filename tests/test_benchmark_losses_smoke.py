"""The policy-loss benchmark runs end to end on a tiny batch (no timing assertions)."""

from __future__ import annotations

import algorithms
from algorithms import math_mode
from tests.benchmark_scripts import load_benchmark


def test_benchmark_prints_one_row_per_registered_loss(capsys):
    benchmark = load_benchmark("losses.py")
    assert benchmark.main(["--batch", "4", "--length", "32", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert benchmark.cpu_name() in out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    header, rows = table[0], table[1:]
    assert "copy floor ms" in header and "loop ref ms" in header and "abs diff" in header
    assert "plain / fused" in header and "plain saved MB" in header
    assert [row.split("|")[1].strip() for row in rows] == algorithms.loss_names()
    for row in rows:
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        # a plain timing and ratio exactly for the losses that keep a fused path
        assert (cells[1] == "fused") == (cells[0] in math_mode.FUSED_PATHS), row
        assert (cells[3] != "-") == (cells[0] in math_mode.FUSED_PATHS), row
        # last column: |vectorised − loop reference| of the loss on a float64 sub-batch
        assert float(cells[-1]) < 1e-9, row
    assert math_mode.get_math() == "fused"  # the benchmark restores the default


def test_benchmark_runs_several_sizes_in_one_call(capsys):
    benchmark = load_benchmark("losses.py")
    argv = ["--sizes", "2x8", "3x16", "--repeats", "1", "--no-loop"]
    assert benchmark.main(argv) == 0
    out = capsys.readouterr().out
    assert "B=2, T=8" in out and "B=3, T=16" in out
    headers = [line for line in out.splitlines() if line.startswith("| loss |")]
    assert len(headers) == 2
