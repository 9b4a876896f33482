"""Fixtures that start REAL vLLM servers on this CPU machine (vLLM's CPU build, run from
the ``.venv-vllm`` environment ``scripts/install_vllm.sh`` builds).

vLLM's CPU attention takes head sizes 32, 64, 80, ...: the test models have two heads of
32 (hidden size 64), not the 16 of the other tests' tiny models. One server per package
(about 40 s to start): it stops when tests/vllm ends, so it never shares the CPU with
later tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer
from rlkit.rollout.servers.errors import ServerStartError

pytestmark = pytest.mark.vllm

#: Launch settings every test server uses: float32 as the trainer computes, 1 GiB of KV
#: cache, and eager mode (no graph capture: a CPU server starts in about half the time).
CPU_SERVER = {
    "device": "cpu",
    "dtype": "float32",
    "kv_cache_gib": 1,
    "server_args": ["--enforce-eager"],
    "startup_timeout_s": 300.0,
}


def require_vllm() -> None:
    from rlkit.rollout.vllm.server import check_vllm_install, find_vllm_python

    try:
        check_vllm_install(find_vllm_python())
    except ServerStartError as exc:
        # Not a skip: setup builds .venv-vllm (scripts/install_vllm.sh) and CI runs these.
        pytest.fail(str(exc))


def build_servable_qwen2(out_dir: Path, tokenizer, seed: int) -> Path:
    """A tiny random Qwen2 with tied embeddings and vLLM-CPU-sized heads (2 x 32)."""
    return build_tiny_qwen2(
        out_dir, tokenizer, hidden_size=64, num_heads=2, num_kv_heads=1, seed=seed
    )


@pytest.fixture(scope="session")
def tokenizer():
    return train_byte_tokenizer()


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tokenizer) -> dict[str, Path]:
    """Two tiny random Qwen2 models: ``a`` (served at start) and ``b`` (other weights)."""
    root = tmp_path_factory.mktemp("vllm_models")
    return {
        name: build_servable_qwen2(root / name, tokenizer, seed)
        for name, seed in [("a", 0), ("b", 1)]
    }


@pytest.fixture(scope="session")
def hf_models(model_dirs) -> dict[str, torch.nn.Module]:
    return {
        k: AutoModelForCausalLM.from_pretrained(v, dtype=torch.float32).eval()
        for k, v in model_dirs.items()
    }


@pytest.fixture(scope="package")
def engine(model_dirs, tokenizer, tmp_path_factory):
    """One real CPU vLLM server serving model ``a``."""
    require_vllm()
    from rlkit.registry import ROLLOUT_ENGINES
    from rlkit.rollout import vllm  # noqa: F401  (registers "vllm")

    eng = ROLLOUT_ENGINES.get("vllm")(
        model_path=str(model_dirs["a"]),
        tokenizer=tokenizer,
        seed=0,  # called as the trainer calls it: model_path, tokenizer, seed, **options
        num_servers=1,
        log_dir=str(tmp_path_factory.mktemp("vllm_logs")),
        max_concurrency=16,
        request_timeout_s=120.0,
        retry_backoff_s=0.2,
        **CPU_SERVER,
    )
    try:
        yield eng
    finally:
        eng.close()
