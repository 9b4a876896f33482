"""A published effect read off a sweep's runs (``rlkit.sweep.claims``): the per-run
statistics, the seed pairing, the verdicts and the stored results, on run directories
written here with known numbers."""

from __future__ import annotations

import json

import pytest

from rlkit.sweep.claims import (
    CONTRADICTED,
    INCONCLUSIVE,
    REPRODUCED,
    STATISTICS,
    Claim,
    evaluate,
    plot_claim,
    read_results,
    verdict,
    write_results,
)


def write_run(sweep_dir, name, curve, status="completed"):
    run = sweep_dir / name
    run.mkdir(parents=True)
    lines = [json.dumps({"step": s, "actor/entropy": v}) for s, v in curve.items()]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "sweep_run.json").write_text(json.dumps({"status": status}))


CLAIM = Claim(
    name="t",
    statement="higher entropy",
    sweep="s",
    baseline="a",
    treatment="b",
    metric="actor/entropy",
    statistic="tail_mean",
    direction=+1,
    window=2,
)


def test_the_statistics_average_the_right_part_of_a_curve():
    curve = {1: 1.0, 2: 2.0, 3: 4.0, 4: 8.0}
    tail_mean, growth, curve_mean = (
        STATISTICS[k][0] for k in ("tail_mean", "growth", "curve_mean")
    )
    assert tail_mean(curve, 2) == 6.0  # (4 + 8) / 2
    assert growth(curve, 2) == 4.5  # (4 + 8) / 2 - (1 + 2) / 2
    assert curve_mean(curve, 2) == 14 / 3  # (2 + 4 + 8) / 3: step 1 left out


@pytest.mark.parametrize(
    ("low", "high", "direction", "expected"),
    [
        (0.1, 0.3, +1, REPRODUCED),
        (0.1, 0.3, -1, CONTRADICTED),
        (-0.3, -0.1, -1, REPRODUCED),
        (-0.1, 0.3, +1, INCONCLUSIVE),
        (None, None, +1, INCONCLUSIVE),
    ],
)
def test_the_verdict_reads_the_side_of_zero_the_interval_lies_on(low, high, direction, expected):
    assert verdict(low, high, direction) == expected


def test_runs_are_paired_by_seed_and_a_seed_one_point_lacks_is_left_out(tmp_path):
    sweep = tmp_path / "s"
    # Seed 4 of both points: the baseline's run failed midway, so seed 4 is not compared.
    write_run(sweep, "a_seed=4", {1: 9.0, 2: 0.0}, status="failed")
    write_run(sweep, "b_seed=4", {1: 0.0, 2: 9.0})
    # Baseline tails (last 2 values): seed 0 -> 1.0, seed 1 -> 2.0, seed 2 -> 3.0.
    for seed, tail in enumerate([1.0, 2.0, 3.0]):
        write_run(sweep, f"a_seed={seed}", {1: 9.0, 2: tail, 3: tail})
    # Treatment: seed 0 -> 1.5, seed 1 -> 2.4, seed 2 -> 3.7; seed 3 has no baseline.
    for seed, tail in enumerate([1.5, 2.4, 3.7, 9.0]):
        write_run(sweep, f"b_seed={seed}", {1: 0.0, 2: tail, 3: tail})
    result = evaluate(CLAIM, tmp_path)
    assert result.seeds == [0, 1, 2]
    assert result.baseline_values == [1.0, 2.0, 3.0]
    assert result.treatment_values == [1.5, 2.4, 3.7]
    # Differences 0.5, 0.4, 0.7: mean 0.5333, std 0.1528, t(0.975, 2) = 4.303,
    # half-width 4.303 * 0.1528 / sqrt(3) = 0.3795 -> [0.154, 0.913], above 0.
    assert result.difference["mean"] == pytest.approx(1.6 / 3)
    assert result.difference["low"] == pytest.approx(0.1538, abs=1e-3)
    assert result.difference["high"] == pytest.approx(0.9128, abs=1e-3)
    assert result.verdict == REPRODUCED


def test_a_sweep_without_two_paired_seeds_names_the_command_that_runs_it(tmp_path):
    write_run(tmp_path / "s", "a_seed=0", {1: 1.0})
    with pytest.raises(FileNotFoundError, match="rlkit sweep experiments/sweeps/s.gin"):
        evaluate(CLAIM, tmp_path)


def test_results_survive_the_json_file_and_draw_two_panels(tmp_path):
    sweep = tmp_path / "s"
    for seed in range(2):
        write_run(sweep, f"a_seed={seed}", {1: 1.0, 2: 1.0 + seed})
        write_run(sweep, f"b_seed={seed}", {1: 1.0, 2: 0.5 + seed})
    result = evaluate(CLAIM, tmp_path)
    (back,) = read_results(write_results([result], tmp_path / "r.json"))
    assert back.claim == CLAIM and back.curves == result.curves
    assert back.verdict == result.verdict and back.difference == result.difference
    fig = plot_claim(back)
    assert len(fig.axes) == 2
