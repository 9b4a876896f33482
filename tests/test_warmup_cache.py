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


def test_a_tool_model_cached_with_other_heads_is_rebuilt_with_the_heads_asked_for(tmp_path):
    from transformers import AutoConfig

    from rlkit.tasks.tool_arithmetic import tool_sft_model

    out = tmp_path / "tool_sft"
    path = tool_sft_model(str(out), steps=1, batch_size=2, num_heads=2)
    config = AutoConfig.from_pretrained(path)
    # hidden 64 over 2 heads: heads of 32, the narrowest vLLM's CPU attention takes
    assert (config.num_attention_heads, config.num_key_value_heads) == (2, 2)
    assert config.hidden_size // config.num_attention_heads == 32
    tool_sft_model(str(out), steps=1, batch_size=2)  # the default, 4 heads: not the cached 2
    config = AutoConfig.from_pretrained(path)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
