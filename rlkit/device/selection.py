"""Which platform this process runs on: detected once, or set explicitly (also from gin).

Precedence, highest first:

1. ``set_platform("npu")`` called from code;
2. the gin binding ``rlkit.device.set_platform.name = "npu"`` (read on the first
   :func:`current` call, or applied when the trainer calls ``set_platform()``
   with no argument after parsing its gin files);
3. detection: the first available of ``npu``, ``cuda``, ``xpu``, ``mps``, ``cpu``.
"""

from __future__ import annotations

from collections.abc import Callable

import gin
import torch

from rlkit.device.platform import Platform
from rlkit.device.platforms import (
    CPUPlatform,
    CUDAPlatform,
    MPSPlatform,
    NPUPlatform,
    XPUPlatform,
)

#: Detection order: a machine with both an NPU stack and CUDA is an NPU box
#: (torch_npu is only ever installed on purpose).
DETECTION_ORDER: tuple[str, ...] = ("npu", "cuda", "xpu", "mps", "cpu")

_FACTORIES: dict[str, Callable[[], Platform]] = {
    "cpu": CPUPlatform,
    "cuda": CUDAPlatform,
    "npu": NPUPlatform,
    "xpu": XPUPlatform,
    "mps": MPSPlatform,
}
_INSTANCES: dict[str, Platform] = {}
_current: Platform | None = None
_source = "not yet chosen"


class PlatformError(ValueError):
    """An unknown platform name, or one whose devices are not available here."""


def register_platform(name: str, factory: Callable[[], Platform]) -> None:
    """Make a custom :class:`Platform` subclass selectable by ``name``.

    Args:
        name: the name ``set_platform`` and kernels refer to.
        factory: a zero-argument callable (usually the class) building the platform.
    """
    _FACTORIES[name] = factory
    _INSTANCES.pop(name, None)


def platform_names() -> list[str]:
    """All known platform names, in detection order then the custom ones."""
    extra = sorted(set(_FACTORIES) - set(DETECTION_ORDER))
    return [n for n in DETECTION_ORDER if n in _FACTORIES] + extra


def get_platform(name: str) -> Platform:
    """The platform object called ``name``, whether or not it is available here.

    Raises:
        PlatformError: no platform has that name; the message lists the known ones.
    """
    if name not in _FACTORIES:
        raise PlatformError(
            f"unknown platform {name!r}; known platforms: {', '.join(platform_names())}"
        )
    if name not in _INSTANCES:
        _INSTANCES[name] = _FACTORIES[name]()
    return _INSTANCES[name]


def detect() -> Platform:
    """The first available platform in :data:`DETECTION_ORDER` (CPU always is)."""
    for name in DETECTION_ORDER:
        platform = get_platform(name)
        if platform.is_available():
            return platform
    return get_platform("cpu")


def _available_platform(name: str) -> Platform:
    platform = get_platform(name)
    reason = platform.unavailable_reason()
    if reason is not None:
        usable = [n for n in platform_names() if get_platform(n).is_available()]
        raise PlatformError(
            f"platform {name!r} was requested but is not available here: {reason}. "
            f"Available: {', '.join(usable)}; known: {', '.join(platform_names())}. "
            f"Bind rlkit.device.set_platform.name to one of the available ones, or to None "
            f"to detect."
        )
    return platform


def _gin_bound_name() -> str | None:
    try:
        return gin.query_parameter("rlkit.device.set_platform.name")
    except ValueError:  # nothing bound
        return None


@gin.configurable("set_platform", module="rlkit.device")
def set_platform(name: str | None = None) -> Platform:
    """Select the platform used by :func:`current` (and so by the trainer and kernels).

    Gin: ``rlkit.device.set_platform.name = "cpu"`` binds ``name``; it takes effect on
    the first :func:`current` call, or when ``set_platform()`` is called without an
    argument after the gin files are parsed.

    Args:
        name: a platform name (``"cuda"``, ``"npu"``, ``"cpu"``, ``"mps"``, ``"xpu"`` or a
            registered custom one), or ``None`` to detect.

    Returns:
        The platform now current.

    Raises:
        PlatformError: unknown name, or the platform is not available here.
    """
    global _current, _source
    _current = detect() if name is None else _available_platform(name)
    _source = "detected" if name is None else "set_platform"
    return _current


def current() -> Platform:
    """The platform of this process: set, gin-bound, or detected once and cached."""
    global _current, _source
    if _current is None:
        bound = _gin_bound_name()
        _current = detect() if bound is None else _available_platform(bound)
        _source = "detected" if bound is None else "gin binding rlkit.device.set_platform.name"
    return _current


def platform_source() -> str:
    """How the current platform was chosen: ``"detected"``, ``"set_platform"`` or the gin binding."""
    current()
    return _source


def platform_for_device(device: torch.device | str) -> Platform:
    """The platform that owns tensors on ``device``.

    The current platform answers for its own device type (so a custom or test
    platform is honoured); any other type maps to the built-in of that name.
    """
    device_type = torch.device(device).type
    active = current()
    if active.device_type == device_type:
        return active
    return get_platform(device_type) if device_type in _FACTORIES else get_platform("cpu")


def reset() -> None:
    """Forget the cached platform so the next :func:`current` detects again (tests)."""
    global _current, _source
    _current, _source = None, "not yet chosen"
