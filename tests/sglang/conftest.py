"""Fixtures that start REAL SGLang servers on this CPU machine (session-scoped: ~30 s, 2.4 GB each).

At most two servers run at once. Every server is stopped at the end of the
session, also when a test fails (the engine's ``close`` and rlkit's atexit /
SIGTERM handlers stop the whole process group).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer

pytestmark = pytest.mark.sglang


def sglang_installed() -> bool:
    return importlib.util.find_spec("sglang") is not None


def require_sglang() -> None:
    if not sglang_installed():
        # Not a skip: CI installs SGLang (scripts/install_sglang.sh) and must run these tests.
        pytest.fail("SGLang is not installed: run scripts/install_sglang.sh")


#: Launch settings every test server uses (small KV cache: 2 servers fit beside other work).
CPU_SERVER = {
    "device": "cpu",
    "dtype": "float32",
    "max_total_tokens": 8192,
    "attention_backend": "torch_native",
    "startup_timeout_s": 300.0,
}


@pytest.fixture(scope="session")
def tokenizer():
    return train_byte_tokenizer()


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tokenizer) -> dict[str, Path]:
    """Two tiny random Qwen2 models: ``a`` (served at start) and ``b`` (other weights)."""
    root = tmp_path_factory.mktemp("sglang_models")
    return {
        "a": build_tiny_qwen2(root / "a", tokenizer, seed=0),
        "b": build_tiny_qwen2(root / "b", tokenizer, seed=1),
    }


@pytest.fixture(scope="session")
def hf_models(model_dirs) -> dict[str, torch.nn.Module]:
    return {
        k: AutoModelForCausalLM.from_pretrained(v, dtype=torch.float32).eval()
        for k, v in model_dirs.items()
    }


# Package scope: the servers stop when tests/sglang ends, not at the end of the whole
# session, so they never share the CPU with later tests.
#: The package's shared servers take no device or KV-cache size: on this CPU machine the
#: factory's CPU defaults choose them (``--device cpu``, a bounded ``--max-total-tokens``).
PLATFORM_DEFAULTS = {k: v for k, v in CPU_SERVER.items() if k not in ("device", "max_total_tokens")}


@pytest.fixture(scope="package")
def engine(model_dirs, tokenizer, tmp_path_factory):
    """Two real CPU SGLang servers serving model ``a``, disk weight sync, started with
    the CPU defaults the factory chooses on this machine."""
    require_sglang()
    from rlkit.registry import ROLLOUT_ENGINES
    from rlkit.rollout import sglang  # noqa: F401  (registers "sglang")

    log_dir = tmp_path_factory.mktemp("sglang_logs")
    eng = ROLLOUT_ENGINES.get("sglang")(
        model_path=str(model_dirs["a"]),
        tokenizer=tokenizer,
        seed=0,  # called as the trainer calls it: model_path, tokenizer, seed, **options
        num_servers=2,
        log_dir=str(log_dir),
        max_concurrency=16,
        request_timeout_s=60.0,
        max_retries=3,
        retry_backoff_s=0.2,
        **PLATFORM_DEFAULTS,
    )
    try:
        yield eng
    finally:
        eng.close()
