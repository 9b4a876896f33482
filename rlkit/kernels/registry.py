"""One :class:`~rlkit.registry.Registry` of implementations per op, with selection metadata.

An implementation is registered for an op with the platforms it runs on, a
priority (higher wins), the packages it needs and an optional extra check::

    from rlkit.kernels import register_kernel

    @register_kernel("rms_norm", "my_rms", platforms=("cuda",), priority=200,
                     requires=("my_kernels",))
    def my_rms(module, hidden_states): ...

What the function receives depends on the op (see each op's module):

* ``rms_norm``: ``(module, hidden_states) -> Tensor``, bound as the forward of
  every Qwen2/Qwen3/Llama RMSNorm module.
* ``swiglu``: ``(module, x) -> Tensor``, bound as the forward of every MLP.
* ``rotary``: ``(q, k, cos, sin, position_ids=None, unsqueeze_dim=1) -> (q, k)``,
  installed as the modeling module's ``apply_rotary_pos_emb``.
* ``attention``: ``(model) -> None``, selects the model's attention implementation.
* ``logprobs``: ``(hidden (N,H), weight (V,H), bias, labels (N,), *, temperature,
  chunk_size, compute_entropy) -> (log_p (N,), entropy (N,) | None)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rlkit.registry import Entry, Registry, UnknownNameError

#: A kernel with this in ``platforms`` runs on every platform.
ANY_PLATFORM = "*"

#: op -> its registry; ``home`` modules hold the built-in implementations.
KERNEL_OPS: dict[str, Registry[Callable[..., Any]]] = {
    "rms_norm": Registry("rms_norm kernel", home="rlkit.kernels.rms_norm"),
    "rotary": Registry("rotary kernel", home="rlkit.kernels.rotary"),
    "swiglu": Registry("swiglu kernel", home="rlkit.kernels.swiglu"),
    "attention": Registry("attention kernel", home="rlkit.kernels.attention"),
    "logprobs": Registry("logprobs kernel", home="rlkit.kernels.logprobs"),
}


class UnknownOpError(UnknownNameError):
    """Raised for an op name that has no kernel registry."""


def op_registry(op: str) -> Registry[Callable[..., Any]]:
    """The registry of implementations of ``op``.

    Raises:
        UnknownOpError: ``op`` is not one of :data:`KERNEL_OPS`.
    """
    if op not in KERNEL_OPS:
        raise UnknownOpError(f"unknown kernel op {op!r}; ops: {', '.join(KERNEL_OPS)}")
    return KERNEL_OPS[op]


@dataclass(frozen=True)
class KernelSpec:
    """Selection metadata of one registered implementation.

    Attributes:
        name: implementation name (unique within the op).
        fn: the implementation (signature depends on the op; see module docstring).
        platforms: platform names it runs on, or ``("*",)`` for all.
        priority: higher is preferred when several are available.
        requires: importable packages it needs (``"torch_npu"``, ``"flash_attn"``).
        check: extra availability test ``(platform) -> reason or None``.
        native: True for "the model's own code" (patching restores the original).
        summary: one line for ``rlkit doctor``.
    """

    name: str
    fn: Callable[..., Any]
    platforms: tuple[str, ...]
    priority: int
    requires: tuple[str, ...]
    check: Callable[[Any], str | None] | None
    native: bool
    summary: str


def spec_of(entry: Entry[Callable[..., Any]]) -> KernelSpec:
    """The :class:`KernelSpec` of a registry entry (``pkg.module:fn`` paths run anywhere)."""
    extra = entry.extra
    return KernelSpec(
        name=entry.name,
        fn=entry.fn,
        platforms=tuple(extra.get("platforms", (ANY_PLATFORM,))),
        priority=int(extra.get("priority", 0)),
        requires=tuple(extra.get("requires", ())),
        check=extra.get("check"),
        native=bool(extra.get("native", False)),
        summary=entry.summary,
    )


def register_kernel(
    op: str,
    name: str,
    *,
    platforms: Iterable[str] = (ANY_PLATFORM,),
    priority: int = 0,
    requires: Iterable[str] = (),
    check: Callable[[Any], str | None] | None = None,
    native: bool = False,
    summary: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering an implementation of ``op`` (see :class:`KernelSpec`).

    Raises:
        UnknownOpError: ``op`` is not a kernel op.
        RegistrationError: ``name`` is taken by another function for this op.
    """
    return op_registry(op).register(
        name,
        summary=summary,
        platforms=tuple(platforms),
        priority=priority,
        requires=tuple(requires),
        check=check,
        native=native,
    )
