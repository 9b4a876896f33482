"""The trainer under ``accelerate launch --num_processes 2`` (FSDP2, gloo) with a real SGLang server.

Rank 0 starts the server and shares its URL; every rank generates through it; after each
update the sharded policy is gathered, synced from disk and checked against the server.
The server is killed during the first sync: rank 0 restarts it while rank 1 finishes the
sync's collectives, and both push the same weights again.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.distributed.launch import accelerate_launch, launch_env
from tests.sglang.conftest import CPU_SERVER, require_sglang

pytestmark = [pytest.mark.sglang, pytest.mark.distributed, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]

GIN = """
include 'presets/grpo.gin'
ModelConfig.path = "{model}"
DataConfig.dataset_fn = @arithmetic_dataset
arithmetic_dataset.limit = 32
# Response length as the reward: groups differ, so every step really updates the policy.
DataConfig.reward = "tests.test_trainer_run:response_length_reward"
DataConfig.max_prompt_length = 16
DataConfig.train_batch_size = 4
DataConfig.val_limit = 0
RolloutConfig.engine = "tests.sglang.server_faults:sglang_killed_at_sync"
RolloutConfig.engine_options = {options}
RolloutConfig.n = 4
RolloutConfig.max_response_length = 6
AlgorithmConfig.use_kl_loss = False
OptimConfig.lr = 1e-3
OptimConfig.ppo_mini_batch_size = 2
OptimConfig.micro_batch_size = 2
TrainerConfig.total_steps = 2
TrainerConfig.test_freq = 0
TrainerConfig.save_freq = 0
TrainerConfig.save_at_end = False
TrainerConfig.output_dir = "{out}"
TrainerConfig.progress_bar = False
"""


def test_two_ranks_share_one_server_keep_it_in_sync_and_sync_it_again_after_it_dies(
    demo_model_dir, tmp_path
):
    require_sglang()
    out = tmp_path / "run"
    options = {
        "num_servers": 1,
        "weight_sync": "disk",
        "log_dir": str(tmp_path / "logs"),
        "kill_at_sync": 1,  # the sync after step 1's update
    }
    cfg = tmp_path / "two.gin"
    cfg.write_text(
        GIN.format(model=demo_model_dir, out=out, options=json.dumps(options | CPU_SERVER))
    )
    command = [*accelerate_launch(2), "-m", "rlkit.train", str(cfg)]
    proc = subprocess.run(
        command, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "processes=2" in proc.stdout and "sglang_killed_at_sync" in proc.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["actor/grad_norm"] > 0 for r in steps)  # real updates
    # Step 2 generated with the weights step 1 produced: the server's log-probs of its
    # own samples equal the (re-gathered) trainer's, and so do those after each sync.
    # The server died in step 1's sync, was restarted and synced again on both ranks; step
    # 2 generated from the restarted server with step 1's weights.
    assert [r["weight_sync/retries"] for r in steps] == [1.0, 0.0]
    assert steps[1]["rollout/server_restarts"] == 1.0
    assert "was restarted: syncing the same weights to every server again" in proc.stderr
    for r in steps:
        assert r["rollout/logprob_diff_max"] < 1e-3, r
        assert r["weight_sync/logprob_max_abs_diff"] < 1e-3, r
    assert len(list((tmp_path / "logs").glob("sglang_server_*.log"))) == 1  # one server
