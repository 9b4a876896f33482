"""Accelerator platforms: one :class:`Platform` object answers every device question.

    import rlkit.device
    platform = rlkit.device.current()          # detected once, cached
    x = torch.zeros(3, device=platform.device())
    platform.memory_stats()["max_memory_allocated_gb"]

``rlkit.device.set_platform("cpu")`` (or the gin binding
``rlkit.device.set_platform.name = "cpu"``) overrides detection. See docs/devices.md.
"""

from rlkit.device.platform import Platform
from rlkit.device.platforms import (
    CPUPlatform,
    CUDAPlatform,
    MPSPlatform,
    NPUPlatform,
    XPUPlatform,
)
from rlkit.device.selection import (
    DETECTION_ORDER,
    PlatformError,
    current,
    detect,
    get_platform,
    platform_for_device,
    platform_names,
    platform_source,
    register_platform,
    reset,
    set_platform,
)

__all__ = [
    "CPUPlatform",
    "CUDAPlatform",
    "DETECTION_ORDER",
    "MPSPlatform",
    "NPUPlatform",
    "Platform",
    "PlatformError",
    "XPUPlatform",
    "current",
    "detect",
    "get_platform",
    "platform_for_device",
    "platform_names",
    "platform_source",
    "register_platform",
    "reset",
    "set_platform",
]
