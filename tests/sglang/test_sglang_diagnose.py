"""``rlkit diagnose`` and the per-sync weight check against REAL SGLang servers: a healthy
setup passes at float32 noise; a rope setting changed on the server only is named; a run
whose weight sync is made to skip stops at that sync with one message.

The healthy and skipped-sync runs serve a tiny Llama, whose weights SGLang reads back by
name (its Qwen2 class cannot: the engine then checks with the log-prob probe alone)."""

from __future__ import annotations

import json

import pytest
import torch

from rlkit.diagnose.run import diagnose
from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.sglang.factory import make_sglang_engine
from rlkit.train import UserError, run_training
from tests.experiment_factory import small_experiment
from tests.sglang.conftest import CPU_SERVER, require_sglang

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


def _sglang_run(model_dir, out_dir, **engine_options):
    return small_experiment(
        model_dir,
        out_dir,
        data={"max_prompt_length": 32, "use_chat_template": False},
        rollout={
            "engine": "sglang",
            "max_response_length": 12,
            "engine_options": {"num_servers": 1, **CPU_SERVER, **engine_options},
        },
        trainer={"total_steps": 2, "save_at_end": False},
    )


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, tokenizer) -> str:
    from rlkit.models.tiny_families import build_tiny_family

    torch.manual_seed(0)
    return str(build_tiny_family("llama3", tmp_path_factory.mktemp("llama") / "m", tokenizer))


def test_a_healthy_sglang_setup_passes_at_float32_noise(llama_dir, tmp_path):
    require_sglang()
    found = diagnose(_sglang_run(llama_dir, tmp_path / "run"), prompts=8)
    overall = found.tokens["overall"]
    assert found.passed, found.causes
    assert overall["gap_mean"] < 1e-4  # float32 on both sides, another kernel
    assert overall["top1_agree_mean"] == 1.0
    assert overall["kl_mean"] < found.kl_bound
    # The server's weights were compared before and after one sync through the run's path.
    assert found.weights["method"] == "slices"
    assert found.weights["compared_at_start"] > 0 and found.weights["compared_after_sync"] > 0
    assert "error" not in found.weights


def test_a_rope_setting_changed_on_the_server_only_is_named(demo_model_dir, tmp_path):
    require_sglang()
    # transformers 5 keeps rope settings in `rope_parameters` (the checkpoint's theta: 10000)
    override = json.dumps({"rope_parameters": {"rope_type": "default", "rope_theta": 10.0}})
    cfg = _sglang_run(
        demo_model_dir,
        tmp_path / "run",
        server_args=["--json-model-override-args", override],
    )
    found = diagnose(cfg, prompts=8)
    assert not found.passed
    assert found.causes[0]["name"] == "model configuration"
    assert "rope_theta" in found.causes[0]["evidence"]
    overall = found.tokens["overall"]
    # Far past float32 noise (3e-7 in the healthy test): on this small model and short
    # prompts (6e-4 measured) still under the bound, so the configuration names the cause.
    assert overall["gap_mean"] > 1e-5
    # The weights are the trainer's: the fault is in what the server computes with them.
    assert "error" not in found.weights


@pytest.fixture
def skipping_engine():
    """An SGLang engine whose weight sync reaches no server: the route is never called,
    as when an update is sent to the wrong place or an adapter is never delivered."""

    def make(**kwargs):
        engine = make_sglang_engine(**kwargs)
        engine._load = lambda weights, version, targets: None  # the planted fault
        return engine

    ROLLOUT_ENGINES.add("sglang_skipping_sync", make, holds_own_weights=True)
    yield "sglang_skipping_sync"
    ROLLOUT_ENGINES.unregister("sglang_skipping_sync")


def test_a_run_whose_sync_skips_stops_at_that_sync_with_one_message(
    llama_dir, tmp_path, skipping_engine
):
    require_sglang()
    cfg = _sglang_run(llama_dir, tmp_path / "run")
    cfg.rollout.engine = skipping_engine
    # The random model scores every response 0, so the advantages are 0: an entropy bonus
    # makes the first update move the weights all the same.
    cfg.algorithm.entropy_coeff = 0.01
    progress: dict = {}
    with pytest.raises(UserError) as raised:
        run_training(cfg, progress)
    message = str(raised.value)
    assert "does not hold the trainer's weights" in message
    assert "after syncing weight version 2" in message  # step 1: 2 mini-batches, 2 optimizer steps
    assert "layers." in message or "embed" in message  # the parameters are named
    assert progress["trainer"].step_count == 0  # stopped inside step 1, at its sync
