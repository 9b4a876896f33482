"""The vocabulary-parallel log-prob/entropy op on 2 gloo processes (uneven slices, a
temperature, a masked vocabulary tail) equals the unsplit op, and so does its plain twin.

Tolerance: each value is a float32 reduction over at most 50 logits, done as per-slice
partial sums that are then added (another order than the unsplit op's), so the two differ
by at most ``2 gamma_50`` of the largest term: with logits of size ~4 * 4 sigma, 1e-4 in
absolute terms is above that bound (~6e-6 x 16) and far below a lost term (~1e-2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.launch import free_port, launch_env
from tests.numerics import gamma

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.distributed


def test_split_vocabulary_statistics_and_gradients_equal_the_unsplit_ones(tmp_path):
    out = tmp_path / "vocab_parallel.json"
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"),
        *("--master_port", str(free_port())),
        *("-m", "tests.distributed.vocab_parallel_checks", str(out)),
    ]
    done = subprocess.run(
        command, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    bound = 2 * gamma(50) * 16 * 16  # terms up to ~16 (4-sigma logits x 4), 16x headroom
    for name, diffs in json.loads(out.read_text()).items():
        for key in ("log_p", "entropy", "plain_log_p"):
            assert diffs[key] <= bound, (name, key, diffs)
        for key in ("grad", "plain_grad"):
            assert diffs[key] <= bound * max(1.0, diffs["grad_scale"]), (name, key, diffs)
