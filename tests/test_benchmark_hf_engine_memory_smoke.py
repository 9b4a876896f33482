"""The HF-engine memory benchmark runs at a tiny size (no memory or timing assertions)."""

from __future__ import annotations

from tests.benchmark_scripts import load_benchmark


def test_step_by_step_log_probs_equal_the_output_scores_recipe(capsys):
    # The generate loop and the output_scores recipe seed torch alike and sample the same
    # tokens; the engine's step-by-step log-probs must sum to what stacking the scores gives.
    benchmark = load_benchmark("hf_engine_memory.py")
    assert benchmark.main(["--rows", "2", "--lengths", "3", "9"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert [row.split("|")[1].strip() for row in rows] == ["3", "9"]
    for row in rows:
        cells = [float(c) for c in row.split("|")[2:-1]]
        assert all(c >= 0 for c in cells[:3]), row  # the three peaks
        assert cells[4] < 1e-3, row  # summed log-prob difference
