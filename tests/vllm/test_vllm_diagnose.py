"""``rlkit diagnose`` against REAL vLLM CPU servers: the float32 setup passes at float32 noise
with the servers' weights checksummed; a bfloat16 engine (float16 on a CPU without
AVX-512 BF16) under a float32 trainer exits 1 and names the dtype first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.diagnose.cli import MISMATCH_EXIT, main
from tests.vllm.conftest import CPU_SERVER, require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def servable_demo_dir(tmp_path_factory) -> str:
    """The demo's warmed-up arithmetic policy with vLLM-CPU-sized heads (4 x 32)."""
    from rlkit.tasks.arithmetic import arithmetic_sft_model

    out = tmp_path_factory.mktemp("vllm_diagnose_sft") / "model"
    return arithmetic_sft_model(str(out), steps=40, batch_size=64, hidden_size=128, lr=3e-3)


def _diagnose(tmp_path, model_dir: str, dtype: str) -> tuple[int, dict]:
    options = {
        "device": "cpu",
        "dtype": dtype,
        "server_args": CPU_SERVER["server_args"],
        "startup_timeout_s": CPU_SERVER["startup_timeout_s"],
    }
    out = tmp_path / "report"
    status = main(
        [
            "experiments/demo.gin",
            "--gin_param",
            f"ModelConfig.path = '{model_dir}'",
            "--gin_param",
            "RolloutConfig.engine = 'vllm'",
            "--gin_param",
            f"RolloutConfig.engine_options = {json.dumps(options)}",
            "--prompts",
            "16",
            "--out",
            str(out),
        ]
    )
    return status, json.loads((out / "report.json").read_text())


def test_a_float32_vllm_setup_is_healthy_and_its_weights_checksummed(tmp_path, servable_demo_dir):
    require_vllm()
    status, report = _diagnose(tmp_path, servable_demo_dir, "float32")
    assert status == 0, report["causes"]
    overall = report["tokens"]["overall"]
    assert overall["gap_mean"] < 1e-4 and overall["top1_agree_mean"] == 1.0
    assert report["top_k"] == 20 and overall["kl_mean"] < report["kl_bound"]
    weights = report["weights"]
    assert weights["method"] == "checksums"
    assert weights["compared_at_start"] > 0 and weights["compared_after_sync"] > 0


def sixteen_bit_dtype() -> str:
    """bfloat16 where this CPU computes it natively (AVX-512 BF16, checked to serve on vLLM's
    CPU build); float16 on a CPU without it, whose bfloat16 support in that build was not
    checked."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "bfloat16" if "avx512_bf16" in flags else "float16"


def test_a_16_bit_engine_under_a_float32_trainer_is_named(tmp_path, servable_demo_dir):
    require_vllm()
    dtype = sixteen_bit_dtype()
    status, report = _diagnose(tmp_path, servable_demo_dir, dtype)
    assert status == MISMATCH_EXIT
    assert report["causes"][0]["name"] == "dtype"
    assert dtype in report["causes"][0]["evidence"]
    assert report["tokens"]["overall"]["gap_mean"] > report["bound"]
    # The weights on the server are the trainer's, rounded to bfloat16: not the cause.
    assert "error" not in report["weights"]
