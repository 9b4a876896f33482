"""The :class:`Platform` interface: everything rlkit needs to know about one accelerator.

One subclass per accelerator family (CUDA, Ascend NPU, CPU, MPS, XPU) answers the
questions the trainer would otherwise scatter over ``if torch.cuda...`` branches:
which ``torch.device`` to use, which ``torch.distributed`` backend, which
environment variable restricts the visible devices, memory statistics for the
``perf/*`` metrics, cache emptying, synchronisation, the device RNG state for
checkpoints, and the chip's peak FLOP/s for MFU.

The base class implements the host-only (CPU) answers; accelerator subclasses
override what differs.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkit.device.flops import peak_flops_for
from rlkit.device.host_memory import process_rss_bytes

#: Bytes per "GB" in :meth:`Platform.memory_stats` (GiB, as torch and verl report).
GIB = float(1 << 30)


class Platform:
    """Base class; also the behaviour of a host-only (CPU) platform.

    Class attributes:
        name: registry name, e.g. ``"cuda"``; kernels name the platforms they run on.
        device_type: the string for ``torch.device`` (``"cuda"``, ``"npu"``, ``"cpu"``).
        dist_backend: the ``torch.distributed`` backend (``"nccl"``, ``"hccl"``, ``"gloo"``).
        visible_devices_env: the environment variable that restricts the visible
            devices (``"CUDA_VISIBLE_DEVICES"``, ``"ASCEND_RT_VISIBLE_DEVICES"``),
            or ``None`` where there is none (CPU, MPS).
    """

    name: str = "base"
    device_type: str = "cpu"
    dist_backend: str = "gloo"
    visible_devices_env: str | None = None

    # -- presence -------------------------------------------------------------
    def is_available(self) -> bool:
        """Whether this platform's devices can be used in this process."""
        return self.unavailable_reason() is None

    def unavailable_reason(self) -> str | None:
        """Why the platform is unavailable (a sentence), or ``None`` if it is available."""
        return None

    def device_count(self) -> int:
        """Number of visible devices (1 for the host)."""
        return 1

    def device_name(self, index: int = 0) -> str:
        """Marketing name of device ``index`` (e.g. ``"NVIDIA H100 80GB HBM3"``)."""
        return "cpu"

    def device(self, index: int = 0) -> torch.device:
        """The ``torch.device`` of device ``index`` (the index is ignored on the host)."""
        return torch.device(self.device_type)

    # -- memory ---------------------------------------------------------------
    def memory_stats(self) -> dict[str, float]:
        """Memory use for the ``perf/*`` metrics, in GiB.

        Returns:
            dict with ``max_memory_allocated_gb``, ``memory_allocated_gb`` and
            ``max_memory_reserved_gb`` (device memory of the current device; 0 on a
            host-only platform) and ``cpu_memory_used_gb`` (this process's resident
            set size).
        """
        return {
            "max_memory_allocated_gb": 0.0,
            "memory_allocated_gb": 0.0,
            "max_memory_reserved_gb": 0.0,
            "cpu_memory_used_gb": process_rss_bytes() / GIB,
        }

    def reset_peak_memory_stats(self) -> None:
        """Restart the ``max_*`` counters of :meth:`memory_stats` (no-op on the host)."""

    def empty_cache(self) -> None:
        """Return cached, unused device memory to the driver (no-op on the host)."""

    def synchronize(self) -> None:
        """Wait for all queued work on the current device (no-op on the host)."""

    # -- randomness -----------------------------------------------------------
    def get_rng_state(self) -> dict[str, Any]:
        """The device RNG state of every visible device, for checkpoints.

        The host (CPU) generator is the trainer's business, so a host-only platform
        returns ``{}``.
        """
        return {}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`get_rng_state`.

        An empty dict (a checkpoint written on the host) is accepted and restores
        nothing.

        Raises:
            ValueError: the state was saved on another platform.
        """
        if state:
            self._require_rng_owner(state)

    def _require_rng_owner(self, state: dict[str, Any]) -> None:
        if state.get("platform") != self.name:
            raise ValueError(
                f"cannot restore a device RNG state saved on {state.get('platform')!r} on "
                f"platform {self.name!r}; resume on the platform it was saved on, or drop the "
                f"device RNG entry from the checkpoint"
            )

    # -- speed ----------------------------------------------------------------
    def peak_flops(self, dtype: torch.dtype) -> float | None:
        """Dense peak FLOP/s of one device for matrix products in ``dtype`` (for MFU).

        Returns:
            The datasheet figure without sparsity, or ``None`` for the host and for
            chips or dtypes not in :mod:`rlkit.device.flops`.
        """
        return peak_flops_for(self.device_name(0), dtype)

    # -- reporting --------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        """Software versions relevant to this platform (for ``rlkit doctor``)."""
        return {"torch": torch.__version__}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, device_type={self.device_type!r})"
