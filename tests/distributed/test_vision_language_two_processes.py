"""A vision-language actor's update on image rows under FSDP2 with 2 processes (gloo) equals
the one-process update (``vision_language_checks.py``), packed and padded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from tests.distributed.launch import accelerate_launch, launch_env
from tests.numerics import assert_gradients_close, gamma, reduction_depth

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("vision_language_checks.py")
REPO = Path(__file__).resolve().parents[2]
LR, CLIP = 0.5, 0.05  # vision_language_checks: one clipped SGD step
ROWS, POSITIONS = 4, 32  # its global batch: 4 image rows, under 32 tokens each


def _run(command: list[str], out: Path) -> dict:
    out.mkdir()
    proc = subprocess.run(
        [*command, "--out", str(out)],
        cwd=REPO,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("result_rank*.json"))]
    grads, params = (torch.load(out / f"{what}.pt") for what in ("grads", "params"))
    return {"ranks": ranks, "grads": grads, "params": params}


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_two_process_image_update_equals_one_process(vision_model_dir, tmp_path, packed):
    """Gradients within 2 gamma_D of each tensor's largest element (tests/numerics.py, D
    with the vision tower's chain); the clipped SGD step is linear in the gradient and the
    clip factor, so parameters within 2 lr c tol max|g| plus an ulp of |p| per run."""
    flags = ["--model", vision_model_dir] + (["--remove-padding"] if packed else [])
    two = _run([*accelerate_launch(2), str(SCRIPT), *flags], tmp_path / "two")
    one = _run([sys.executable, str(SCRIPT), *flags], tmp_path / "one")
    assert [r["processes"] for r in two["ranks"]] == [2, 2]
    assert all(r["sharded"] for r in two["ranks"]) and not one["ranks"][0]["sharded"]
    depth = reduction_depth(
        AutoConfig.from_pretrained(vision_model_dir), rows=ROWS, positions=POSITIONS
    )
    tol = 2 * gamma(depth)
    assert any(".visual." in n and g.abs().max() > 0 for n, g in one["grads"].items())
    assert_gradients_close(two["grads"], one["grads"], depth=depth)
    norm = one["ranks"][0]["grad_norm"]
    assert two["ranks"][0]["grad_norm"] == pytest.approx(norm, rel=tol)
    clip = min(1.0, CLIP / (norm + 1e-6))
    g_max = max(g.abs().max().item() for g in one["grads"].values())
    p_max = max(p.abs().max().item() for p in one["params"].values())
    bound = 2 * LR * clip * tol * g_max + 2 * torch.finfo(torch.float32).eps * p_max
    for name, want in one["params"].items():
        assert (two["params"][name] - want).abs().max().item() <= bound, name
