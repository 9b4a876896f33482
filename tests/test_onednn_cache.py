"""Under bf16 compute on a CPU the trainer caps the caches of compiled bf16 kernels (oneDNN's
primitive cache and ideep's computation cache), unless the user set their size; float32 runs
and other devices leave the environment alone."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from rlkit.device.onednn_cache import (
    CAPACITY,
    CAPACITY_VARIABLES,
    KernelCacheSettingError,
    cap_onednn_kernel_caches,
)
from rlkit.trainer.builders import computes_in_low_precision, configure_host_memory
from rlkit.trainer.config import ExperimentConfig, ModelConfig, RewardModelConfig, TrainerConfig

CPU = SimpleNamespace(device_type="cpu")
CUDA = SimpleNamespace(device_type="cuda")
PRIMITIVES, COMPUTATIONS = CAPACITY_VARIABLES


@pytest.fixture
def no_caps(monkeypatch):
    """Neither variable set; whatever the test sets is undone after it (setenv first, so
    that monkeypatch records the variable even where the environment had none)."""
    for name in CAPACITY_VARIABLES:
        monkeypatch.setenv(name, "64")
        monkeypatch.delenv(name)


def test_both_caps_are_set_when_the_environment_has_none(no_caps):
    assert CAPACITY_VARIABLES == ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
    assert cap_onednn_kernel_caches() == {PRIMITIVES: "64", COMPUTATIONS: "64"}
    assert os.environ[PRIMITIVES] == os.environ[COMPUTATIONS] == str(CAPACITY) == "64"


def test_a_users_own_capacity_is_kept_and_the_other_cache_still_capped(no_caps, monkeypatch):
    monkeypatch.setenv(COMPUTATIONS, "512")
    assert cap_onednn_kernel_caches() == {PRIMITIVES: "64", COMPUTATIONS: "512"}
    assert os.environ[COMPUTATIONS] == "512"


@pytest.mark.parametrize(
    ("platform", "low_precision", "capped"),
    [(CPU, True, True), (CPU, False, False), (CUDA, True, False)],
)
def test_the_trainer_caps_them_for_low_precision_compute_on_a_cpu_only(
    no_caps, platform, low_precision, capped
):
    # keep_freed=False: malloc's settings are another test's concern.
    assert configure_host_memory(False, platform, low_precision) is None
    for name in CAPACITY_VARIABLES:
        assert (os.environ.get(name) == "64") is capped, name


@pytest.mark.parametrize(
    ("mixed_precision", "policy_dtype", "reward_model", "low"),
    [
        ("no", "float32", None, False),
        ("bf16", "float32", None, True),
        ("fp16", "float32", None, True),
        ("no", "bfloat16", None, True),
        ("no", "float16", None, True),
        ("no", "float32", "bfloat16", True),
        ("no", "float32", "float32", False),
    ],
)
def test_low_precision_means_mixed_precision_or_any_model_loaded_in_bf16_or_fp16(
    mixed_precision, policy_dtype, reward_model, low
):
    # A reward model's dtype counts only when there is one (its path set); the default
    # float32 policy under mixed_precision="no" is the one float32-only experiment.
    config = ExperimentConfig(
        model=ModelConfig(dtype=policy_dtype),
        trainer=TrainerConfig(mixed_precision=mixed_precision),
        reward_model=RewardModelConfig(
            path="rm" if reward_model else "", dtype=reward_model or "float32"
        ),
    )
    assert computes_in_low_precision(config) is low


# A child process runs bf16 products of one layer's weight (512 -> 1376) at DISTINCT token
# counts, each a new shape, and prints how many bytes malloc holds in use afterwards beyond
# before (glibc's mallinfo2). The caps are in the environment before torch loads, as the
# trainer sets them before it loads the model.
CHILD = """
import ctypes, sys
import torch
from rlkit.device.onednn_cache import cap_onednn_kernel_caches

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
torch.set_num_threads(1)
weight = torch.randn(1376, 512, dtype=torch.bfloat16)
torch.nn.functional.linear(torch.randn(8, 512, dtype=torch.bfloat16), weight)
before = libc.mallinfo2().uordblks
for rows in range(100, 100 + {distinct}):
    torch.nn.functional.linear(torch.randn(rows, 512, dtype=torch.bfloat16), weight)
print(libc.mallinfo2().uordblks - before)
"""


def bytes_kept_after_new_shapes(capacity: int, distinct: int = 120) -> int:
    env = {k: v for k, v in os.environ.items() if k not in CAPACITY_VARIABLES}
    env |= dict.fromkeys(CAPACITY_VARIABLES, str(capacity))
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(distinct=distinct)],
        env=env, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return int(done.stdout.split()[-1])


def test_the_caps_bound_the_memory_new_bf16_shapes_leave_behind():
    capped, default = bytes_kept_after_new_shapes(8), bytes_kept_after_new_shapes(1024)
    MiB = 2**20
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        # Measured about 0.55 MiB per shape with both caches at 1,024 entries: 120 new
        # shapes keep ~66 MiB; capped at 8 entries each, only the last 8 shapes' entries.
        assert default > 20 * MiB, default
        assert capped < default / 4, (capped, default)
    else:
        # Without native bf16 products PyTorch does not route them through oneDNN: neither
        # run keeps more than a few MiB of anything per shape.
        assert max(capped, default) < 10 * MiB, (capped, default)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LRU_CACHE_CAPACITY", "0"),
        ("LRU_CACHE_CAPACITY", "lots"),
        ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "-1"),
    ],
)
def test_a_capacity_the_caches_cannot_take_is_refused_with_its_name_and_the_fix(
    no_caps, monkeypatch, name, value
):
    # ideep's cache at 0 crashes the process at the first bf16 product: refused before.
    monkeypatch.setenv(name, value)
    with pytest.raises(
        KernelCacheSettingError, match=rf"{name}='{value}' in the environment: .* unset it"
    ):
        configure_host_memory(False, CPU, True)


def test_a_capacity_below_one_is_refused():
    with pytest.raises(ValueError, match="capacity must be at least 1, got 0"):
        cap_onednn_kernel_caches(0)


def test_zero_turns_onednns_own_cache_off_and_is_accepted(no_caps, monkeypatch):
    monkeypatch.setenv(PRIMITIVES, "0")
    assert cap_onednn_kernel_caches() == {PRIMITIVES: "0", COMPUTATIONS: "64"}
