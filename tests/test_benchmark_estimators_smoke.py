"""The estimator benchmark runs end to end on a tiny batch (correctness only, no timing)."""

from __future__ import annotations

import estimators
from estimators import math_mode
from tests.benchmark_scripts import load_benchmark


def test_benchmark_prints_a_row_per_registered_estimator(capsys):
    benchmark = load_benchmark("estimators.py")
    assert benchmark.main(["--batch", "8", "--length", "16", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert benchmark.cpu_name() in out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    header, rows = table[0], table[1:]
    assert "copy floor ms" in header and "loop ref. ms" in header and "plain / fused" in header
    names = [row.split("|")[1].strip() for row in rows]
    assert names == estimators.names()
    for row in rows:
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        # a plain timing and ratio exactly for the estimators that keep a fused scan
        assert (cells[1] == "fused") == (cells[0] in math_mode.FUSED_PATHS), row
        assert (cells[3] != "-") == (cells[0] in math_mode.FUSED_PATHS), row
        # The last column is the largest difference from the loop reference.
        assert float(cells[-1]) < 1e-5, row
    assert math_mode.get_math() == "fused"  # the benchmark restores the default


def test_benchmark_runs_with_multi_turn_masks_and_several_sizes(capsys):
    benchmark = load_benchmark("estimators.py")
    argv = ["--sizes", "16x130", "8x70", "--repeats", "1", "--mask", "multi_turn"]
    assert benchmark.main([*argv, "--only", "gae", "remax"]) == 0
    out = capsys.readouterr().out
    assert "B=16 T=130" in out and "B=8 T=70" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    rows = [row for row in rows if not row.startswith("| estimator")]
    assert [row.split("|")[1].strip() for row in rows] == ["gae", "remax"] * 2
    assert all(float(row.split("|")[-2]) < 1e-5 for row in rows)
