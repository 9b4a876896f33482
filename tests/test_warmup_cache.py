"""The warm-up models' cache under several processes: the processes of a multi-process
launch all evaluate the experiment's model reference; one builds the model, the others
wait and reuse it, and nobody reads a half-written directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BUILD = """
import sys
from rlkit.tasks.arithmetic import arithmetic_sft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
path = arithmetic_sft_model(sys.argv[1], steps=30, batch_size=16, hidden_size=16)
AutoTokenizer.from_pretrained(path)
AutoModelForCausalLM.from_pretrained(path)
print("loaded", path)
"""


def test_two_processes_building_one_warm_up_model_train_it_once(tmp_path):
    out = tmp_path / "sft"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, str(out)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    logs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in logs]
    assert all(f"loaded {out}" in log for log, _ in logs)
    trained = [log.count("[sft] step    0/30") for log, _ in logs]
    assert sorted(trained) == [0, 1]  # one process trained, the other reused its model
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft", "sft.lock"]
