"""Shared behaviour of accelerators exposing the ``torch.cuda``-style module API.

``torch.cuda``, ``torch.npu`` (added by ``torch_npu``) and ``torch.xpu`` offer the
same functions (``memory_allocated``, ``max_memory_reserved``, ``get_rng_state_all``,
...), so one class serves all three; subclasses name the module and whatever
differs (backend, environment variable, the package to import first).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Any

import torch

from rlkit.device.host_memory import process_rss_bytes
from rlkit.device.platform import GIB, Platform


class AcceleratorPlatform(Platform):
    """A platform backed by ``torch.<module_name>``.

    Class attributes:
        module_name: the attribute of ``torch`` holding the device API.
        requires_package: a package that must be imported before
            ``torch.<module_name>`` exists (``"torch_npu"``), or ``None``.
    """

    module_name: str = "cuda"
    requires_package: str | None = None

    def _module(self) -> ModuleType:
        if self.requires_package is not None:
            importlib.import_module(self.requires_package)
        return getattr(torch, self.module_name)

    def unavailable_reason(self) -> str | None:
        if self.requires_package and importlib.util.find_spec(self.requires_package) is None:
            return f"package {self.requires_package!r} is not installed"
        try:
            module = self._module()
        except Exception as exc:  # a broken driver install raises all sorts
            return f"torch.{self.module_name} cannot be loaded: {exc}"
        if not module.is_available():
            return f"torch.{self.module_name}.is_available() is False (no device or driver)"
        return None

    def device_count(self) -> int:
        return int(self._module().device_count()) if self.is_available() else 0

    def device_name(self, index: int = 0) -> str:
        return str(self._module().get_device_name(index))

    def device(self, index: int = 0) -> torch.device:
        return torch.device(self.device_type, index)

    def memory_stats(self) -> dict[str, float]:
        module = self._module()
        return {
            "max_memory_allocated_gb": module.max_memory_allocated() / GIB,
            "memory_allocated_gb": module.memory_allocated() / GIB,
            "max_memory_reserved_gb": module.max_memory_reserved() / GIB,
            "cpu_memory_used_gb": process_rss_bytes() / GIB,
        }

    def reset_peak_memory_stats(self) -> None:
        self._module().reset_peak_memory_stats()

    def empty_cache(self) -> None:
        self._module().empty_cache()

    def synchronize(self) -> None:
        self._module().synchronize()

    def get_rng_state(self) -> dict[str, Any]:
        return {"platform": self.name, "states": list(self._module().get_rng_state_all())}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self._require_rng_owner(state)
        states = state["states"]
        if len(states) != self.device_count():
            raise ValueError(
                f"the RNG state holds {len(states)} {self.name} device(s) but "
                f"{self.device_count()} are visible; set {self.visible_devices_env} as when "
                f"the checkpoint was written"
            )
        self._module().set_rng_state_all(states)

    def versions(self) -> dict[str, str]:
        found = super().versions()
        if self.requires_package and importlib.util.find_spec(self.requires_package):
            module = importlib.import_module(self.requires_package)
            found[self.requires_package] = str(getattr(module, "__version__", "?"))
        return found
