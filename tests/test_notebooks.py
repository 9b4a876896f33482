"""The notebooks in ``notebooks/`` run top to bottom, draw their figures and compute the
numbers their text claims.

Each notebook is executed once per session with nbclient on the ``python3`` kernel
(ipykernel of this interpreter), writing its PNGs and ``summary.json`` into
``$RLKIT_NOTEBOOK_OUT/<notebook>/``. CI needs only ``pip install -e .[dev]`` (nbclient,
nbformat, ipykernel): ipykernel installs the ``python3`` kernel spec into the
environment, and jupyter_client launches its ``python`` as ``sys.executable``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import matplotlib.image
import nbformat
import pytest
from jupyter_client import KernelManager
from nbclient import NotebookClient

import algorithms
import estimators

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAMES = ("losses", "estimators", "kl", "research_results")
MIN_PNG_BYTES = 8_000  # an empty 12x7-inch axes grid is about 6 KB


def run_notebook(name: str, out: Path) -> dict:
    """Execute ``notebooks/<name>.ipynb``; return its summary.json (raises on a cell error)."""
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=240,
        resources={"metadata": {"path": str(NOTEBOOKS)}},  # cwd: notebook_output is importable
    )
    env = {**os.environ, "RLKIT_NOTEBOOK_OUT": str(out), "MPLBACKEND": "Agg"}
    client.execute(env=env)  # CellExecutionError names the failing cell
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors, errors
    return json.loads((out / name / "summary.json").read_text())


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    out = tmp_path_factory.mktemp("notebook_out")
    return {name: (out / name, run_notebook(name, out)) for name in NAMES}


def assert_real_figures(directory: Path, expected: list[str]) -> None:
    """Every expected PNG exists, is more than a blank canvas and has drawn pixels."""
    for stem in expected:
        path = directory / f"{stem}.png"
        assert path.is_file(), (
            f"{path.name} missing; found {sorted(p.name for p in directory.glob('*.png'))}"
        )
        assert path.stat().st_size > MIN_PNG_BYTES, (
            f"{path.name} is only {path.stat().st_size} bytes"
        )
        pixels = matplotlib.image.imread(path)[..., :3]
        drawn = (pixels < 0.95).any(axis=-1).mean()
        assert drawn > 0.02, f"{path.name}: only {drawn:.1%} of the pixels are not white"


# ----------------------------------------------------------------- stored form
@pytest.mark.parametrize("name", NAMES)
def test_stored_notebook_carries_its_outputs_and_figures(name):
    # Stored executed (scripts/execute_notebooks.py): a reader sees the figures unrun.
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count is not None for c in code)
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1))  # top to bottom, once
    figures = sum(c.source.count("save_figure(") for c in code)
    images = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert figures and len(images) >= figures
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    text = [o.get("text", "") + o.get("data", {}).get("text/plain", "") for c in code
            for o in c.outputs]  # fmt: skip
    assert not [t for t in text if "/tmp/" in t or "/work/" in t or "/home/" in t]
    assert nb.metadata.kernelspec.name == "python3"


def test_python3_kernel_runs_this_interpreter():
    cmd = KernelManager(kernel_name="python3").format_kernel_cmd()
    assert Path(cmd[0]).resolve() == Path(sys.executable).resolve(), cmd


# ---------------------------------------------------------------------- losses
def test_losses_notebook_draws_every_registered_loss(outputs):
    directory, summary = outputs["losses"]
    names = algorithms.loss_names()
    assert summary["losses_plotted"] == names
    families = [f"loss_family_{name}" for name in names]
    assert_real_figures(
        directory,
        ["losses_overview", "losses_with_custom", "loss_toy_batch_kl_cov_clip_cov", *families],
    )


def test_losses_notebook_gradients_match_the_clip_rules(outputs):
    _, s = outputs["losses"]
    # PPO, A = +1, ε = 0.2: inside the band dL/dlog π = −A·r = −1.1; past 1.2 clipped: 0
    assert s["vanilla_grad_pos_r1.1"] == pytest.approx(-1.1)
    assert s["vanilla_grad_pos_r1.5"] == 0.0
    # r = 1.25: clipped with ε_high = 0.2, still inside with clip-higher ε_high = 0.28
    assert s["vanilla_grad_pos_r1.25"] == 0.0
    assert s["clip_higher_grad_pos_r1.25"] == pytest.approx(-1.25)
    # A = −1, r = 4 > c = 3: loss capped at −A·c = 3, no gradient
    assert s["dual_clip_loss_neg_r4"] == pytest.approx(3.0)
    assert s["dual_clip_grad_neg_r4"] == 0.0
    # CISPO: gradient −clip(r, 0.8, 1.2)·A: −1.2 at r = 2, never below 0.8 in size
    assert s["cispo_grad_pos_r2"] == pytest.approx(-1.2)
    assert s["cispo_min_abs_grad"] == pytest.approx(0.8)
    # SAPO at r = 1: d/dΔ[−A·σ(τ(e^Δ − 1))·4/τ] = −A·4·σ'(0) = −4·0.25 = −1, PPO's gradient
    assert s["sapo_grad_pos_r1"] == pytest.approx(-1.0)


def test_losses_notebook_gspo_uses_the_sequence_ratio(outputs):
    _, s = outputs["losses"]
    # token ratios (2, 1, 1, 1), A = 1: GSPO −(2·1·1·1)^(1/4) on every token; PPO −(2+1+1+1)/4
    assert s["gspo_loss_4_tokens"] == pytest.approx(-(2**0.25))
    assert s["vanilla_loss_4_tokens"] == pytest.approx(-1.25)


def test_losses_notebook_cov_losses_select_k_tokens(outputs):
    _, s = outputs["losses"]
    k = max(1, int(s["toy_valid_tokens"] * 0.05))  # kl_cov_ratio = clip_cov_ratio = 0.05
    assert s["kl_cov_selected"] == k
    assert s["kl_cov_selected_have_top_covariance"]
    assert s["kl_cov_frac_metric"] == pytest.approx(k / s["toy_valid_tokens"])
    assert s["clip_cov_selected"] == k
    assert s["clip_cov_selected_in_band"]


def test_losses_notebook_custom_loss_is_registered_then_removed(outputs):
    _, s = outputs["losses"]
    assert s["custom_loss_listed"] and s["custom_loss_unregistered"]
    # −A·(1 + ε·tanh((r − 1)/ε)): slope −A·r·tanh'(0) = −1 at r = 1
    assert s["custom_grad_pos_r1"] == pytest.approx(-1.0)


# ------------------------------------------------------------------ estimators
def test_estimators_notebook_toy_group_matches_hand_values(outputs):
    directory, s = outputs["estimators"]
    assert_real_figures(
        directory,
        [
            "estimators_toy_groups",
            "estimators_all_outcome",
            "estimators_group_size_std",
            "estimators_degenerate_groups",
            "estimators_gae",
        ],
    )
    g = s["toy_group1"]  # scores (1, 0, 0, 0), lengths (3, 5, 2, 4)
    # mean 0.25, unbiased std √(0.75/3) = 0.5: GRPO (1 − 0.25)/(0.5 + 1e-6), (0 − 0.25)/(0.5 + 1e-6)
    assert g["grpo"] == pytest.approx([0.75 / (0.5 + 1e-6)] + [-0.25 / (0.5 + 1e-6)] * 3)
    assert g["dr_grpo"] == pytest.approx([0.75, -0.25, -0.25, -0.25])
    # RLOO: 1 − mean(0, 0, 0) = 1; 0 − mean(1, 0, 0) = −1/3
    assert g["rloo"] == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    # OPO: baseline Σ|y|·s / Σ|y| = 3·1 / (3 + 5 + 2 + 4) = 3/14
    assert g["opo"] == pytest.approx([11 / 14, -3 / 14, -3 / 14, -3 / 14])
    rpp = g["reinforce_plus_plus_baseline"]  # whitened over the batch: only signs and ties
    assert rpp[0] > 0 > rpp[1] and rpp[1] == pytest.approx(rpp[2]) == pytest.approx(rpp[3])
    assert s["outcome_estimators"] == [
        e.name
        for e in estimators.describe()
        if not e.extra.get("needs_values")
        and not e.extra.get("needs_reward_baselines")
        and not e.extra.get("inputs")
    ]


def test_estimators_notebook_std_normalisation_and_group_size(outputs):
    _, s = outputs["estimators"]
    # n = 8, k = 1 correct: mean 1/8, std √(1·7/(8·7)) = √0.125; GRPO 0.875/√0.125 = 2.4749
    assert s["grpo_correct_k1_n8"] == pytest.approx(0.875 / (math.sqrt(0.125) + 1e-6))
    assert s["dr_grpo_correct_k1_n8"] == pytest.approx(0.875)
    assert s["rloo_correct_k1_n8"] == pytest.approx(1.0)  # 1 − mean of seven zeros
    d = s["degenerate_fraction"]
    for n, sampled, exact in zip(d["sizes"], d["sampled"], d["exact"]):
        assert exact == pytest.approx(0.2**n + 0.8**n)
        assert abs(sampled - exact) < 0.04  # 2000 groups: binomial std <= 0.011


def test_estimators_notebook_gae_limits(outputs):
    _, s = outputs["estimators"]
    # rewards: +1 at t = 4, 9, 14, 19 and −0.05 on the other 20 tokens: Σ r = 4 − 1 = 3
    # V_t = 0.16·(24 − t): λ = γ = 1 gives A_0 = Σ r − V_0 = 3 − 3.84 = −0.84
    assert s["gae_mc_adv0"] == pytest.approx(-0.84)
    assert s["gae_mc_expected"] == pytest.approx(-0.84)
    # λ = 0: A_5 = r_5 + V_6 − V_5 = −0.05 + 2.88 − 3.04 = −0.21
    assert s["gae_td_adv5"] == pytest.approx(-0.21)
    assert s["gae_td_expected"] == pytest.approx(-0.21)
    assert s["gae_whitened_mean"] == pytest.approx(0.0, abs=1e-9)
    assert s["gae_whitened_std"] == pytest.approx(1.0, abs=1e-6)


# -------------------------------------------------------------------------- KL
def test_kl_notebook_penalty_gradients(outputs):
    directory, s = outputs["kl"]
    assert_real_figures(
        directory,
        [
            "kl_penalties_vs_log_ratio",
            "kl_bias_variance",
            "kl_monte_carlo",
            "kl_straight_through_gradients",
        ],
    )
    g = s["grad_at_delta_1"]  # d/dlog π at Δ = 1
    assert g["k1"] == pytest.approx(1.0)  # dΔ/dΔ
    assert g["k2"] == pytest.approx(1.0)  # Δ
    assert g["k3"] == pytest.approx(1 - math.exp(-1))  # 1 − e^−Δ
    assert g["abs"] == pytest.approx(1.0)
    for kind in ("k1+", "k2+", "k3+", "abs+"):
        assert g[kind] == pytest.approx(1.0)  # k2's gradient Δ


def test_kl_notebook_k3_unbiased_and_less_noisy_than_k1_near_the_reference(outputs):
    _, s = outputs["kl"]
    assert s["k1_max_abs_bias"] < 1e-12
    assert s["k3_max_abs_bias_unclamped"] < 1e-12
    if s["num_pairs_k3_clamped"]:
        assert s["k3_min_bias_clamped"] < -1e-3  # the clamp at 10 biases k3 low
    assert s["num_pairs_kl_below_0.05"] >= 50
    assert s["frac_var_k1_gt_var_k3_kl_below_0.05"] == 1.0
    assert s["median_var_ratio_k1_over_k3_kl_below_0.05"] > 10
    mc = s["monte_carlo"]
    assert abs(mc["k1"]["z"]) < 4 and abs(mc["k3"]["z"]) < 4
    assert mc["k1"]["stderr"] > 3 * mc["k3"]["stderr"]


def test_kl_notebook_straight_through_gives_the_kl_gradient(outputs):
    _, s = outputs["kl"]
    g = s["gradients"]
    assert g["k1_max_grad_norm"] < 1e-12  # Σ_y π ∇log π = ∇Σπ = 0
    for kind in ("k2", "k1+", "k2+", "k3+", "abs+"):
        assert g[f"{kind}_max_rel_err_vs_forward"] < 1e-10, kind
    assert g["k3_max_rel_err_vs_reverse_unclamped"] < 1e-10  # k3 follows KL(π_ref ‖ π)
    assert g["k3_median_rel_err_vs_forward"] > 1e-3


# ------------------------------------------------------------ research results
def test_research_notebook_draws_each_claim_with_the_stored_verdict(outputs):
    from rlkit.sweep.claims import read_results

    directory, summary = outputs["research_results"]
    stored = read_results(NOTEBOOKS.parent / "docs" / "research_results.json")
    assert {r.claim.name for r in stored} == set(summary)
    for r in stored:
        assert summary[r.claim.name]["verdict"] == r.verdict
        assert summary[r.claim.name]["seeds"] >= 3  # the claims are tested on 3+ seeds
    assert_real_figures(directory, [f"research_{r.claim.name}" for r in stored])
