"""Choosing one implementation per op: forced by config, else the best available.

Precedence, highest first:

1. the ``override`` argument of :func:`choose` (``apply_kernels(overrides=...)``,
   ``token_logprobs_and_entropy(kernel=...)``);
2. :func:`set_overrides`, also from gin:
   ``rlkit.kernels.set_overrides.overrides = {"attention": "eager"}``;
3. the available implementation with the highest priority.

A forced choice that is unknown or unavailable raises; it never falls back
silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gin

import rlkit.device
from rlkit.device import Platform
from rlkit.kernels import availability
from rlkit.kernels.registry import ANY_PLATFORM, KERNEL_OPS, KernelSpec, op_registry, spec_of

_overrides: dict[str, str] = {}


class KernelUnavailableError(RuntimeError):
    """A forced kernel cannot run here, or no kernel of an op can."""


@dataclass(frozen=True)
class KernelChoice:
    """The implementation chosen for one op.

    Attributes:
        name: implementation name.
        reason: why it was chosen (forced, or priority and what was skipped).
        fn: the implementation itself.
        native: True if it is the model's own code (nothing to patch).
    """

    name: str
    reason: str
    fn: Callable[..., Any] | None = field(default=None, compare=False, repr=False)
    native: bool = field(default=False, compare=False, repr=False)


@dataclass(frozen=True)
class KernelStatus:
    """One candidate implementation of an op on a platform (for ``rlkit doctor``)."""

    op: str
    name: str
    priority: int
    platforms: tuple[str, ...]
    why_unavailable: str | None
    chosen: bool
    summary: str


def _resolve_platform(platform: Platform | str | None) -> Platform:
    if platform is None:
        return rlkit.device.current()
    if isinstance(platform, str):
        return rlkit.device.get_platform(platform)
    return platform


def _check_override_ops(overrides: dict[str, str]) -> None:
    unknown = sorted(set(overrides) - set(KERNEL_OPS))
    if unknown:
        raise ValueError(
            f"kernel overrides name unknown op(s) {unknown}; ops: {', '.join(KERNEL_OPS)}"
        )


@gin.configurable("set_overrides", module="rlkit.kernels")
def set_overrides(overrides: dict[str, str] | None = None) -> None:
    """Force implementations process-wide, e.g. ``{"attention": "eager"}``.

    Gin: ``rlkit.kernels.set_overrides.overrides = {"logprobs": "naive"}``; the
    binding is read by :func:`choose` even if ``set_overrides`` is never called.

    Args:
        overrides: op -> implementation name; ``None`` or ``{}`` clears them.

    Raises:
        ValueError: an op name is unknown.
    """
    overrides = dict(overrides or {})
    _check_override_ops(overrides)
    _overrides.clear()
    _overrides.update(overrides)


def configured_overrides() -> dict[str, str]:
    """The process-wide overrides: set by :func:`set_overrides`, else the gin binding."""
    if _overrides:
        return dict(_overrides)
    try:
        bound = gin.query_parameter("rlkit.kernels.set_overrides.overrides")
    except ValueError:  # nothing bound
        return {}
    return dict(bound or {})


def _candidates(op: str) -> list[KernelSpec]:
    specs = [spec_of(e) for e in op_registry(op).describe()]
    return sorted(specs, key=lambda s: (-s.priority, s.name))


def _forced(op: str, name: str, source: str, platform: Platform) -> KernelChoice:
    spec = spec_of(op_registry(op).entry(name))
    why = availability.unavailable_reason(spec, platform)
    if why is not None:
        usable = [
            s.name for s in _candidates(op) if availability.unavailable_reason(s, platform) is None
        ]
        raise KernelUnavailableError(
            f"{op} kernel {name!r} was forced by {source} but cannot run on platform "
            f"{platform.name!r}: {why}. Available here: {', '.join(usable) or '(none)'}. "
            f"Remove the override or pick one of those."
        )
    return KernelChoice(spec.name, f"forced by {source}", spec.fn, spec.native)


def choose(
    op: str, platform: Platform | str | None = None, override: str | None = None
) -> KernelChoice:
    """Pick the implementation of ``op`` for ``platform``.

    Args:
        op: one of ``rms_norm``, ``rotary``, ``swiglu``, ``attention``, ``logprobs``.
        platform: a :class:`~rlkit.device.Platform`, a platform name, or ``None`` for
            :func:`rlkit.device.current`.
        override: force this implementation name (or ``"pkg.module:function"``).

    Returns:
        The :class:`KernelChoice`; its reason says what decided it.

    Raises:
        UnknownOpError: ``op`` is unknown.
        UnknownNameError: a forced name is not registered for ``op`` (lists the names).
        KernelUnavailableError: a forced implementation cannot run on the platform,
            or no implementation of ``op`` can.
    """
    registry = op_registry(op)
    platform = _resolve_platform(platform)
    if override is not None:
        return _forced(op, override, "the override argument", platform)
    configured = configured_overrides().get(op)
    if configured is not None:
        return _forced(op, configured, "rlkit.kernels.set_overrides", platform)
    skipped = []
    for spec in _candidates(op):
        why = availability.unavailable_reason(spec, platform)
        if why is None:
            reason = f"highest-priority available on {platform.name} (priority {spec.priority})"
            # Kernels for other platforms are noise; say why this platform's own were skipped.
            own = [s for s in skipped if not s.startswith("~")]
            if own:
                reason += "; skipped " + "; ".join(own)
            return KernelChoice(spec.name, reason, spec.fn, spec.native)
        targets_platform = ANY_PLATFORM in spec.platforms or platform.name in spec.platforms
        skipped.append(f"{'' if targets_platform else '~'}{spec.name}: {why}")
    device_problem = platform.unavailable_reason()
    if device_problem is not None:
        raise KernelUnavailableError(
            f"no {op} kernel can run on platform {platform.name!r}: the platform is not "
            f"available here ({device_problem})"
        )
    raise KernelUnavailableError(
        f"no {op} kernel can run on platform {platform.name!r}: "
        f"{'; '.join(x.lstrip('~') for x in skipped)}. "
        f"Registered: {', '.join(registry.names())}."
    )


def describe(platform: Platform | str | None = None) -> list[KernelStatus]:
    """Every implementation of every op with its availability on ``platform``.

    Returns:
        One :class:`KernelStatus` per (op, implementation), ops in registry order,
        implementations by descending priority; ``chosen`` marks what
        :func:`choose` picks (nothing is chosen for an op whose forced choice fails).
    """
    platform = _resolve_platform(platform)
    rows = []
    for op in KERNEL_OPS:
        try:
            chosen = choose(op, platform).name
        except (KernelUnavailableError, LookupError):
            chosen = None
        for spec in _candidates(op):
            rows.append(
                KernelStatus(
                    op=op,
                    name=spec.name,
                    priority=spec.priority,
                    platforms=spec.platforms,
                    why_unavailable=availability.unavailable_reason(spec, platform),
                    chosen=spec.name == chosen,
                    summary=spec.summary,
                )
            )
    return rows
