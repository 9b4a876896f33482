"""The estimator benchmark runs end to end on a tiny batch (correctness only, no timing)."""

from __future__ import annotations

import estimators
from tests.benchmark_scripts import load_benchmark


def test_benchmark_prints_a_row_per_registered_estimator(capsys):
    benchmark = load_benchmark("estimators.py")
    assert benchmark.main(["--batch", "8", "--length", "16", "--repeats", "1"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    header, rows = table[0], table[1:]
    assert "copy floor ms" in header and "loop ref. ms" in header
    names = [row.split("|")[1].strip() for row in rows]
    assert names == estimators.names()
    for row in rows:
        # The last column is the largest difference from the loop reference.
        assert float(row.split("|")[-2]) < 1e-5, row


def test_benchmark_runs_with_multi_turn_masks(capsys):
    benchmark = load_benchmark("estimators.py")
    assert (
        benchmark.main(
            [
                "--batch",
                "16",
                "--length",
                "130",
                "--repeats",
                "1",
                "--mask",
                "multi_turn",
                "--only",
                "gae",
                "remax",
            ]
        )
        == 0
    )
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert [row.split("|")[1].strip() for row in rows] == ["gae", "remax"]
    assert all(float(row.split("|")[-2]) < 1e-5 for row in rows)
