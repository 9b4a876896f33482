"""``learning_curve.png``: the panels a run's metrics allow, held-out curves drawn once
when they are the same number, intervals as bands."""

from __future__ import annotations

import json

import pytest

from rlkit.logging.run_dashboard import held_out_keys, plot_run_dashboard


def _metrics(tmp_path, records):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_pass_at_1_equal_to_mean_at_1_is_drawn_once():
    records = [
        {"step": 0, "val/a/mean@1": 0.2, "val/a/pass@1": 0.2, "val/a/score/mean": 0.2},
        {"step": 2, "val/a/mean@1": 0.5, "val/a/pass@1": 0.5},
    ]
    assert held_out_keys(records) == {"a": {"mean@1": "val/a/mean@1"}}


def test_a_pass_at_k_that_differs_from_mean_at_n_is_kept():
    # 4 samples: pass@4 >= mean@4; pass@1 equals mean@4 and is dropped.
    records = [
        {
            "step": 0,
            "val/openai/gsm8k/mean@4": 0.25,
            "val/openai/gsm8k/pass@1": 0.25,
            "val/openai/gsm8k/pass@4": 0.6,
            "val/openai/gsm8k/mean@4_ci_low": 0.2,
        },
    ]
    assert held_out_keys(records) == {
        "openai/gsm8k": {"mean@4": "val/openai/gsm8k/mean@4", "pass@4": "val/openai/gsm8k/pass@4"}
    }


def test_a_run_draws_its_panels_on_a_grid(tmp_path):
    records = [
        {
            "step": step,
            "critic/score/mean": 0.1 * step,
            "critic/score/min": 0.0,
            "critic/score/max": 1.0,
            "response_length/mean": 20 + step,
            "response_length/max": 40,
            "actor/entropy": 1.0 - 0.05 * step,
            "actor/pg_clipfrac": 0.01,
            "actor/ppo_kl": 0.001,
            "actor/grad_norm": 0.5,
        }
        for step in range(1, 6)
    ]
    records[0] |= {"val/a/mean@4": 0.3, "val/a/mean@4_ci_low": 0.2, "val/a/mean@4_ci_high": 0.4}
    out = plot_run_dashboard(_metrics(tmp_path, records), tmp_path / "curve.png", title="grpo")
    from matplotlib import image

    height, width = image.imread(out).shape[:2]
    assert (width, height) == (1500, 750)  # 3 x 2 panels, not one strip


def test_a_run_without_any_drawn_metric_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="logs none of the metrics"):
        plot_run_dashboard(_metrics(tmp_path, [{"step": 1, "x": 1.0}]), tmp_path / "c.png")
