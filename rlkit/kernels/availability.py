"""Whether a registered kernel can run on a platform, and if not, why."""

from __future__ import annotations

import functools
import importlib.util

from rlkit.device import Platform
from rlkit.kernels.registry import ANY_PLATFORM, KernelSpec


@functools.cache
def package_available(name: str) -> bool:
    """Whether ``name`` (a package or dotted module) can be imported, without importing it.

    A dotted name imports its parent packages. Cached for the process.
    """
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package raises
        return False


def unavailable_reason(spec: KernelSpec, platform: Platform) -> str | None:
    """Why ``spec`` cannot run on ``platform`` (a short phrase), or ``None`` if it can.

    Checked in order: the platform is one the kernel supports, the platform's
    devices are present, the required packages are importable, the kernel's own
    check passes.
    """
    if ANY_PLATFORM not in spec.platforms and platform.name not in spec.platforms:
        return f"runs only on {', '.join(spec.platforms)}, not {platform.name}"
    device_problem = platform.unavailable_reason()
    if device_problem is not None:
        return f"platform {platform.name} is not available ({device_problem})"
    missing = [p for p in spec.requires if not package_available(p)]
    if missing:
        return f"needs {', '.join(missing)} (not installed)"
    if spec.check is not None:
        return spec.check(platform)
    return None
