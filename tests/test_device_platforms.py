"""Platforms: the CPU answers, detection and selection (accelerators simulated), FLOP table.

Only the CPU platform runs for real here; CUDA/NPU detection is exercised by
simulating their availability (monkeypatching ``unavailable_reason``), which tests
rlkit's selection logic, not the accelerators.
"""

import gin
import pytest
import torch

import rlkit.device
from rlkit.device import (
    CPUPlatform,
    CUDAPlatform,
    NPUPlatform,
    Platform,
    PlatformError,
    get_platform,
    platform_for_device,
)
from rlkit.device.flops import peak_flops_for


@pytest.fixture(autouse=True)
def _fresh_platform():
    rlkit.device.reset()
    gin.clear_config()
    yield
    rlkit.device.reset()
    gin.clear_config()


def _simulate_available(monkeypatch, *classes):
    for cls in classes:
        monkeypatch.setattr(cls, "unavailable_reason", lambda self: None)


# -- the CPU platform (real) ------------------------------------------------------


def test_cpu_platform_attributes():
    cpu = get_platform("cpu")
    assert (cpu.name, cpu.device_type, cpu.dist_backend) == ("cpu", "cpu", "gloo")
    assert cpu.visible_devices_env is None
    assert cpu.is_available() and cpu.device() == torch.device("cpu")
    assert cpu.device(3) == torch.device("cpu")  # the host has no device index


def test_cpu_memory_stats_report_rss_and_zero_device_memory():
    stats = get_platform("cpu").memory_stats()
    assert set(stats) == {
        "max_memory_allocated_gb",
        "memory_allocated_gb",
        "max_memory_reserved_gb",
        "cpu_memory_used_gb",
    }
    assert stats["max_memory_allocated_gb"] == stats["memory_allocated_gb"] == 0.0
    assert stats["max_memory_reserved_gb"] == 0.0
    # A Python process with torch loaded is well above 50 MiB resident.
    assert stats["cpu_memory_used_gb"] > 50 / 1024


def test_cpu_rss_grows_when_new_memory_is_touched():
    import mmap

    cpu = get_platform("cpu")
    before = cpu.memory_stats()["cpu_memory_used_gb"]
    # Fresh anonymous pages, written so they are resident. (A tensor would come from the
    # allocator, which may hand back memory that an earlier test left resident.)
    block = mmap.mmap(-1, 64 * 1024 * 1024)
    block.write(b"\x01" * len(block))
    after = cpu.memory_stats()["cpu_memory_used_gb"]
    block.close()
    assert after - before > 0.75 * 64 / 1024


def test_cpu_rng_state_is_empty_and_foreign_state_is_refused():
    cpu = get_platform("cpu")
    assert cpu.get_rng_state() == {}
    cpu.set_rng_state({})  # a host checkpoint restores nothing, silently
    with pytest.raises(ValueError, match="saved on 'cuda'"):
        cpu.set_rng_state({"platform": "cuda", "states": []})


def test_cpu_no_ops_and_no_peak_flops():
    cpu = get_platform("cpu")
    cpu.reset_peak_memory_stats()
    cpu.empty_cache()
    cpu.synchronize()
    assert cpu.peak_flops(torch.bfloat16) is None


def test_accelerator_platform_constants():
    cuda, npu = get_platform("cuda"), get_platform("npu")
    assert (cuda.device_type, cuda.dist_backend, cuda.visible_devices_env) == (
        "cuda",
        "nccl",
        "CUDA_VISIBLE_DEVICES",
    )
    assert (npu.device_type, npu.dist_backend, npu.visible_devices_env) == (
        "npu",
        "hccl",
        "ASCEND_RT_VISIBLE_DEVICES",
    )
    assert cuda.device(1) == torch.device("cuda", 1)


def test_missing_accelerators_say_why():
    # This machine has no torch_npu and no CUDA device.
    assert "torch_npu" in get_platform("npu").unavailable_reason()
    assert "is_available" in get_platform("cuda").unavailable_reason()


# -- detection and selection ------------------------------------------------------


def test_detection_falls_back_to_cpu_here():
    assert rlkit.device.current().name == "cpu"
    assert rlkit.device.platform_source() == "detected"


def test_detection_prefers_npu_then_cuda(monkeypatch):
    _simulate_available(monkeypatch, CUDAPlatform)
    assert rlkit.device.detect().name == "cuda"
    _simulate_available(monkeypatch, NPUPlatform)
    assert rlkit.device.detect().name == "npu"


def test_current_is_detected_once_and_cached(monkeypatch):
    first = rlkit.device.current()
    _simulate_available(monkeypatch, CUDAPlatform)
    assert rlkit.device.current() is first  # cached: no re-detection
    rlkit.device.reset()
    assert rlkit.device.current().name == "cuda"


def test_set_platform_overrides_detection(monkeypatch):
    _simulate_available(monkeypatch, CUDAPlatform)
    assert rlkit.device.set_platform("cpu").name == "cpu"
    assert rlkit.device.current().name == "cpu"
    assert rlkit.device.set_platform(None).name == "cuda"  # None = detect


def test_set_platform_unknown_name_lists_choices():
    with pytest.raises(PlatformError, match="known platforms: npu, cuda, xpu, mps, cpu"):
        rlkit.device.set_platform("tpu")


def test_set_platform_unavailable_name_says_why_and_lists_available():
    with pytest.raises(PlatformError, match=r"'npu'.*torch_npu.*Available: cpu"):
        rlkit.device.set_platform("npu")


def test_gin_binding_selects_the_platform_on_first_current_call(monkeypatch):
    _simulate_available(monkeypatch, CUDAPlatform)
    gin.parse_config('rlkit.device.set_platform.name = "cpu"')
    assert rlkit.device.current().name == "cpu"
    assert "gin" in rlkit.device.platform_source()


def test_gin_binding_applies_when_set_platform_called_without_argument(monkeypatch):
    _simulate_available(monkeypatch, CUDAPlatform)
    assert rlkit.device.current().name == "cuda"  # detected before the config was parsed
    gin.parse_config('rlkit.device.set_platform.name = "cpu"')
    assert rlkit.device.set_platform().name == "cpu"


def test_gin_binding_to_unavailable_platform_is_a_clear_error():
    gin.parse_config('rlkit.device.set_platform.name = "npu"')
    with pytest.raises(PlatformError, match="not available here"):
        rlkit.device.current()


def test_platform_for_device_maps_tensor_devices():
    assert platform_for_device(torch.zeros(1).device).name == "cpu"
    assert platform_for_device("cuda:1").name == "cuda"
    assert platform_for_device(torch.device("xpu", 0)).name == "xpu"


def test_custom_platform_can_be_registered_and_selected():
    class Fake(CPUPlatform):
        name = "fake"

    rlkit.device.register_platform("fake", Fake)
    try:
        assert "fake" in rlkit.device.platform_names()
        assert rlkit.device.set_platform("fake").name == "fake"
        assert isinstance(rlkit.device.current(), Platform)
    finally:
        rlkit.device.selection._FACTORIES.pop("fake")
        rlkit.device.selection._INSTANCES.pop("fake", None)


# -- peak FLOP/s ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "dtype", "flops"),
    [
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989.4e12),
        ("NVIDIA H100 PCIe", torch.bfloat16, 756.5e12),
        ("NVIDIA H200", torch.bfloat16, 989.4e12),
        ("NVIDIA H20", torch.bfloat16, 148e12),  # not matched by "H200"
        ("NVIDIA A100-SXM4-80GB", torch.float16, 312e12),
        ("NVIDIA L40S", torch.bfloat16, 362.05e12),
        ("NVIDIA L40", torch.bfloat16, 181.05e12),
        ("Ascend910B2", torch.bfloat16, 354e12),
        ("NVIDIA A100-SXM4-80GB", torch.float64, None),  # dtype not tabulated
        ("Some Future Chip", torch.bfloat16, None),
    ],
)
def test_peak_flops_table(name, dtype, flops):
    assert peak_flops_for(name, dtype) == flops


def test_float32_peak_depends_on_tf32_switch():
    # A100: 19.5 TFLOP/s plain fp32, 156 TFLOP/s when matmuls may use TF32.
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert peak_flops_for("NVIDIA A100-PCIE-40GB", torch.float32) == 19.5e12
        torch.backends.cuda.matmul.allow_tf32 = True
        assert peak_flops_for("NVIDIA A100-PCIE-40GB", torch.float32) == 156e12
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def test_platform_peak_flops_reads_the_device_name(monkeypatch):
    monkeypatch.setattr(CUDAPlatform, "device_name", lambda self, index=0: "NVIDIA H100 80GB HBM3")
    assert get_platform("cuda").peak_flops(torch.bfloat16) == 989.4e12
