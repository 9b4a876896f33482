"""The multi-turn benchmark runs at its tiniest size (no timing assertions)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_multi_turn_benchmark_gives_both_embedded_paths_the_same_greedy_work(tool_model_dir):
    # The warmed-up model of the session, reused from its directory: its settings (200 SFT
    # steps, 4 heads) given exactly, or the benchmark would train a model over it.
    proc = subprocess.run(
        [
            sys.executable, "benchmarks/multi_turn.py", "--trajectories", "4", "--repeats", "1",
            "--temperature", "0", "--skip-sglang", "--sft-steps", "200", "--heads", "4",
            "--model-dir", tool_model_dir, "--threads", "1", "--tool-latency-s", "0.05",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {}
    for line in proc.stdout.splitlines():
        if line.startswith("| embedded"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    assert set(rows) == {"embedded", "embedded, re-prefill"}
    continued, reprefilled = rows["embedded"], rows["embedded, re-prefill"]
    # Greedy: the continued cache and the re-prefill do the same trajectories, tool calls
    # (every prompt calls the calculator) and policy tokens.
    assert continued[:3] == reprefilled[:3] and continued[0] == "4"
    assert int(continued[1]) >= 2 and int(continued[2]) > 0
    assert reprefilled[-1] == "1.00x"  # the baseline of the last column
    assert "[tool sft]" not in proc.stdout + proc.stderr  # reused, not trained again
