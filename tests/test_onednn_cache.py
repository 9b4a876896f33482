"""Under bf16 compute on a CPU the trainer caps oneDNN's primitive cache, unless the user set
its size; float32 runs and other devices leave the environment alone."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from rlkit.device.onednn_cache import CAPACITY, CAPACITY_VARIABLE, cap_onednn_primitive_cache
from rlkit.trainer.builders import configure_host_memory

CPU = SimpleNamespace(device_type="cpu")
CUDA = SimpleNamespace(device_type="cuda")


def test_the_cap_is_set_when_the_environment_has_none(monkeypatch):
    monkeypatch.delenv(CAPACITY_VARIABLE, raising=False)
    assert cap_onednn_primitive_cache() == str(CAPACITY) == "64"
    assert os.environ[CAPACITY_VARIABLE] == "64"


def test_a_users_own_capacity_is_kept(monkeypatch):
    monkeypatch.setenv(CAPACITY_VARIABLE, "512")
    assert cap_onednn_primitive_cache() == "512"
    assert os.environ[CAPACITY_VARIABLE] == "512"


@pytest.mark.parametrize(
    ("platform", "precision", "capped"),
    [(CPU, "bf16", True), (CPU, "fp16", True), (CPU, "no", False), (CUDA, "bf16", False)],
)
def test_the_trainer_caps_it_for_low_precision_compute_on_a_cpu_only(
    monkeypatch, platform, precision, capped
):
    monkeypatch.delenv(CAPACITY_VARIABLE, raising=False)
    # keep_freed=False: malloc's settings are another test's concern.
    assert configure_host_memory(False, platform, precision) is None
    assert (os.environ.get(CAPACITY_VARIABLE) == "64") is capped
