"""Kernel selection on every platform, with accelerator availability simulated.

NPU and CUDA are simulated by fake Platform objects and by monkeypatching the
package check; this tests which kernel rlkit *chooses*, not that the NPU/CUDA
kernels run (they never ran here; see docs/devices.md).
"""

import gin
import pytest
import torch

import rlkit.device
import rlkit.kernels.availability as availability
from rlkit.device import CPUPlatform
from rlkit.kernels import (
    KernelUnavailableError,
    UnknownOpError,
    choose,
    describe,
    op_registry,
    register_kernel,
    set_overrides,
)
from rlkit.ops import token_logprobs_and_entropy
from rlkit.registry import UnknownNameError


class FakeNPU(CPUPlatform):
    """An "NPU" whose devices are present (it runs nothing on an NPU)."""

    name = "npu"
    device_type = "npu"
    dist_backend = "hccl"


class FakeCUDA(CPUPlatform):
    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"


def _installed(monkeypatch, *packages):
    monkeypatch.setattr(availability, "package_available", lambda name: name in packages)


@pytest.fixture(autouse=True)
def _clean_state():
    set_overrides(None)
    gin.clear_config()
    rlkit.device.reset()
    yield
    set_overrides(None)
    gin.clear_config()
    rlkit.device.reset()


def _choices(platform):
    return {
        op: choose(op, platform).name
        for op in ("rms_norm", "rotary", "swiglu", "attention", "logprobs")
    }


def test_cpu_gets_grouped_head_sdpa_and_chunked_logprobs():
    assert _choices("cpu") == {
        "rms_norm": "hf",
        "rotary": "hf",
        "swiglu": "hf",
        "attention": "grouped_sdpa",
        "logprobs": "chunked",
    }


def test_npu_with_torch_npu_gets_the_npu_kernels(monkeypatch):
    _installed(monkeypatch, "torch_npu", "transformers.integrations.npu_flash_attention")
    assert _choices(FakeNPU()) == {
        "rms_norm": "npu_rms_norm",
        "rotary": "npu_rotary_mul",
        "swiglu": "npu_swiglu",
        "attention": "npu_fusion_attention",
        "logprobs": "npu_cross_entropy",
    }


def test_npu_without_torch_npu_falls_back_and_says_why(monkeypatch):
    _installed(monkeypatch)
    choice = choose("rms_norm", FakeNPU())
    assert choice.name == "hf"
    assert "skipped npu_rms_norm: needs torch_npu (not installed)" in choice.reason
    assert "liger" not in choice.reason  # CUDA-only kernels are not noise on an NPU


def test_npu_attention_needs_transformers_npu_integration(monkeypatch):
    _installed(monkeypatch, "torch_npu")
    choice = choose("attention", FakeNPU())
    assert choice.name == "sdpa"
    assert "transformers.integrations.npu_flash_attention" in choice.reason


def test_cuda_with_flash_attn_and_liger(monkeypatch):
    _installed(monkeypatch, "flash_attn", "liger_kernel")
    assert _choices(FakeCUDA()) == {
        "rms_norm": "liger",
        "rotary": "liger",
        "swiglu": "liger",
        "attention": "flash_attention_2",
        "logprobs": "chunked",
    }


def test_bare_cuda_gets_plain_torch_and_sdpa(monkeypatch):
    _installed(monkeypatch)
    choices = _choices(FakeCUDA())
    assert choices["attention"] == "sdpa" and choices["rms_norm"] == "hf"
    assert "flash_attention_2: needs flash_attn" in choose("attention", FakeCUDA()).reason


def test_absent_device_makes_platform_kernels_unavailable():
    # The real NPU platform: torch_npu is not installed on this machine.
    with pytest.raises(KernelUnavailableError, match="platform is not available here"):
        choose("rms_norm", "npu")


def test_forced_available_kernel_is_used():
    choice = choose("rms_norm", "cpu", override="torch_lean")
    assert choice.name == "torch_lean" and choice.reason == "forced by the override argument"


def test_forced_unavailable_kernel_is_a_clear_error():
    with pytest.raises(KernelUnavailableError) as err:
        choose("attention", "cpu", override="flash_attention_2")
    message = str(err.value)
    assert "runs only on cuda, not cpu" in message
    assert "Available here: grouped_sdpa, sdpa, eager" in message


def test_forced_kernel_missing_package_is_a_clear_error(monkeypatch):
    _installed(monkeypatch)
    with pytest.raises(KernelUnavailableError, match="needs flash_attn"):
        choose("attention", FakeCUDA(), override="flash_attention_2")


def test_unknown_kernel_name_lists_names_and_suggests():
    with pytest.raises(UnknownNameError, match="Did you mean 'npu_rms_norm'"):
        choose("rms_norm", "cpu", override="npu_rmsnorm")


def test_unknown_op_lists_ops():
    with pytest.raises(UnknownOpError, match="rms_norm, rotary, swiglu, attention, logprobs"):
        choose("layer_norm", "cpu")


def test_set_overrides_forces_process_wide_and_clears():
    set_overrides({"attention": "eager"})
    choice = choose("attention", "cpu")
    assert choice.name == "eager" and "set_overrides" in choice.reason
    set_overrides(None)
    assert choose("attention", "cpu").name == "grouped_sdpa"


def test_override_argument_beats_set_overrides():
    set_overrides({"attention": "eager"})
    assert choose("attention", "cpu", override="sdpa").name == "sdpa"


def test_set_overrides_rejects_unknown_ops():
    with pytest.raises(ValueError, match="unknown op"):
        set_overrides({"layernorm": "hf"})


def test_gin_binding_of_overrides_is_read_without_a_call():
    gin.parse_config('rlkit.kernels.set_overrides.overrides = {"logprobs": "naive"}')
    assert choose("logprobs", "cpu").name == "naive"


def test_dotted_path_kernel_can_be_forced():
    choice = choose(
        "logprobs", "cpu", override="rlkit.kernels.naive_logprobs:naive_linear_logprobs"
    )
    assert choice.name == "rlkit.kernels.naive_logprobs:naive_linear_logprobs"


def test_a_registered_kernel_with_higher_priority_wins_and_is_dispatched():
    calls = []

    @register_kernel("logprobs", "test_recording", priority=1000, summary="test kernel")
    def recording(hidden, weight, bias, labels, *, temperature, chunk_size, compute_entropy):
        calls.append((hidden.shape, chunk_size))
        return torch.zeros(hidden.shape[0]), torch.ones(hidden.shape[0])

    try:
        assert choose("logprobs", "cpu").name == "test_recording"
        lp, ent = token_logprobs_and_entropy(
            torch.zeros(2, 3, 4),
            torch.zeros(5, 4),
            torch.zeros(2, 3, dtype=torch.long),
            chunk_size=7,
        )
        assert calls == [(torch.Size([6, 4]), 7)]  # flattened tokens, chunk passed through
        assert lp.shape == ent.shape == (2, 3) and ent.sum().item() == 6
    finally:
        op_registry("logprobs").unregister("test_recording")
    assert choose("logprobs", "cpu").name == "chunked"


def test_logprobs_dispatch_follows_the_tensor_device_platform(monkeypatch):
    # The current platform is a simulated NPU, but CPU tensors get the CPU choice.
    _installed(monkeypatch, "torch_npu")
    monkeypatch.setitem(rlkit.device.selection._INSTANCES, "npu", FakeNPU())
    rlkit.device.set_platform("npu")
    assert choose("logprobs").name == "npu_cross_entropy"
    lp, _ = token_logprobs_and_entropy(
        torch.zeros(2, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long)
    )
    assert torch.allclose(lp, torch.full((2,), -torch.log(torch.tensor(5.0)).item()))


def test_describe_marks_exactly_one_choice_per_op_on_cpu():
    rows = describe("cpu")
    ops = {r.op for r in rows}
    assert ops == {"rms_norm", "rotary", "swiglu", "attention", "logprobs"}
    for op in ops:
        chosen = [r.name for r in rows if r.op == op and r.chosen]
        assert len(chosen) == 1
    npu_row = next(r for r in rows if r.name == "npu_swiglu")
    assert npu_row.why_unavailable == "runs only on npu, not cpu"
