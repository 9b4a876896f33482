"""A GRPO run of several steps whose rollouts come from a real SGLang server."""

from __future__ import annotations

import math

import pytest

from rlkit.trainer.trainer import RLTrainer
from tests.experiment_factory import small_experiment
from tests.sglang.conftest import CPU_SERVER, require_sglang

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


def test_grpo_with_sglang_engine_trains_and_keeps_server_in_sync(demo_model_dir, tmp_path):
    require_sglang()
    cfg = small_experiment(
        demo_model_dir,
        tmp_path / "run",
        rollout={
            "engine": "sglang",
            "engine_options": {"num_servers": 1, "weight_sync": "disk", **CPU_SERVER},
        },
        trainer={"total_steps": 3, "save_at_end": False},
    )
    trainer = RLTrainer(cfg)
    history = trainer.run()
    assert len(history) == 3
    for metrics in history:
        assert math.isfinite(metrics["actor/pg_loss"])
        # Trainer and server agree on the sampled tokens' log-probs (float32, same weights).
        assert metrics["rollout/logprob_diff_max"] < 1e-3
        # The engine's counters reach the log: one request per prompt (n samples each).
        assert metrics["rollout/num_requests"] >= 4 and metrics["rollout/num_retries"] == 0
        # ... and so do its server states: the one server in rotation, never restarted.
        assert metrics["rollout/servers_usable"] == 1.0
        assert metrics["rollout/server_restarts"] == 0.0
    # After every update the server was re-synced and checked against the trainer.
    assert history[-1]["weight_sync/logprob_max_abs_diff"] < 1e-3
    assert trainer.weights.version >= 3
