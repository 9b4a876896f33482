"""The built-in platforms: CUDA (and ROCm), Ascend NPU, Intel XPU, Apple MPS, CPU.

Only the CPU platform has run on real hardware in rlkit's own checks; the others
follow the documented ``torch.cuda`` / ``torch_npu`` / ``torch.xpu`` / ``torch.mps``
APIs (see docs/devices.md).
"""

from __future__ import annotations

from typing import Any

import torch

from rlkit.device.accelerator import AcceleratorPlatform
from rlkit.device.host_memory import process_rss_bytes
from rlkit.device.platform import GIB, Platform


class CPUPlatform(Platform):
    """The host: every answer of the :class:`Platform` base class."""

    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    visible_devices_env = None


class CUDAPlatform(AcceleratorPlatform):
    """NVIDIA GPUs (and AMD GPUs under ROCm, which PyTorch also exposes as ``cuda``)."""

    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    module_name = "cuda"

    def versions(self) -> dict[str, str]:
        found = super().versions()
        found["cuda"] = str(torch.version.cuda)
        if torch.version.hip:
            found["hip"] = str(torch.version.hip)
        return found


class NPUPlatform(AcceleratorPlatform):
    """Huawei Ascend NPUs through ``torch_npu`` (which adds ``torch.npu``)."""

    name = "npu"
    device_type = "npu"
    dist_backend = "hccl"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    module_name = "npu"
    requires_package = "torch_npu"


class XPUPlatform(AcceleratorPlatform):
    """Intel GPUs through ``torch.xpu`` (built into PyTorch >= 2.5)."""

    name = "xpu"
    device_type = "xpu"
    dist_backend = "xccl"
    visible_devices_env = "ZE_AFFINITY_MASK"
    module_name = "xpu"

    def unavailable_reason(self) -> str | None:
        if not hasattr(torch, "xpu"):
            return "this PyTorch build has no torch.xpu"
        return super().unavailable_reason()


class MPSPlatform(Platform):
    """Apple-silicon GPUs through ``torch.mps`` (one device, no peak statistics)."""

    name = "mps"
    device_type = "mps"
    dist_backend = "gloo"
    visible_devices_env = None

    def unavailable_reason(self) -> str | None:
        if not torch.backends.mps.is_available():
            return "torch.backends.mps.is_available() is False"
        return None

    def device_name(self, index: int = 0) -> str:
        return "Apple MPS"

    def memory_stats(self) -> dict[str, float]:
        # MPS keeps no peak counters; the driver figure is the closest to "reserved".
        allocated = torch.mps.current_allocated_memory() / GIB
        return {
            "max_memory_allocated_gb": allocated,
            "memory_allocated_gb": allocated,
            "max_memory_reserved_gb": torch.mps.driver_allocated_memory() / GIB,
            "cpu_memory_used_gb": process_rss_bytes() / GIB,
        }

    def empty_cache(self) -> None:
        torch.mps.empty_cache()

    def synchronize(self) -> None:
        torch.mps.synchronize()

    def get_rng_state(self) -> dict[str, Any]:
        return {"platform": self.name, "states": [torch.mps.get_rng_state()]}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self._require_rng_owner(state)
        torch.mps.set_rng_state(state["states"][0])
