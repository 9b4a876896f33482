"""Installing the chosen kernels into a loaded Hugging Face model, in place.

What is patched (never by copying model code):

===========  =========================================================  ===========
op           what changes                                               scope
===========  =========================================================  ===========
rms_norm     ``forward`` of each ``Qwen2RMSNorm`` / ``Qwen3RMSNorm`` /  this model
             ``LlamaRMSNorm`` instance (incl. Qwen3's q_norm/k_norm)
swiglu       ``forward`` of each ``Qwen2MLP`` / ``Qwen3MLP`` /          this model
             ``LlamaMLP`` instance whose ``hidden_act`` is SiLU
rotary       ``apply_rotary_pos_emb`` of ``modeling_qwen2`` /           process-wide
             ``modeling_qwen3`` / ``modeling_llama`` (HF attention
             calls it as a module-level function)
attention    ``config._attn_implementation`` via                        this model
             ``model.set_attn_implementation``
===========  =========================================================  ===========

Instance forwards are bound methods in the instance ``__dict__``; choosing a
``native`` kernel (``hf``) removes them, and for rotary restores the original
module function, so patching is reversible and idempotent.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from types import MethodType, ModuleType

from torch import nn

import rlkit.device
from rlkit.device import Platform
from rlkit.kernels.selection import KernelChoice, choose
from rlkit.models.attention_features import keep_exact_attention

logger = logging.getLogger(__name__)

#: The ops :func:`apply_kernels` installs into a model.
MODEL_OPS: tuple[str, ...] = ("rms_norm", "rotary", "swiglu", "attention")

_FAMILIES = (("qwen2", "Qwen2"), ("qwen3", "Qwen3"), ("llama", "Llama"))


def _classes(suffix: str) -> frozenset[tuple[str, str]]:
    return frozenset(
        (f"transformers.models.{pkg}.modeling_{pkg}", f"{prefix}{suffix}")
        for pkg, prefix in _FAMILIES
    )


#: (modeling module, class name) of the patched module classes.
RMS_NORM_CLASSES = _classes("RMSNorm")
MLP_CLASSES = _classes("MLP")
ATTENTION_CLASSES = _classes("Attention")

_SILU_NAMES = ("silu", "swish")
# Original module-level rotary functions, by modeling module name, while patched.
_ORIGINAL_ROTARY: dict[str, Callable[..., object]] = {}


def _key(module: nn.Module) -> tuple[str, str]:
    return type(module).__module__, type(module).__name__


def _bind(module: nn.Module, choice: KernelChoice) -> None:
    if choice.native:
        module.__dict__.pop("forward", None)
    else:
        module.forward = MethodType(choice.fn, module)


def _install_rms_norm(model: nn.Module, choice: KernelChoice) -> int:
    targets = [m for m in model.modules() if _key(m) in RMS_NORM_CLASSES]
    for module in targets:
        _bind(module, choice)
    return len(targets)


def _is_silu_mlp(module: nn.Module) -> bool:
    act = getattr(getattr(module, "config", None), "hidden_act", None)
    return _key(module) in MLP_CLASSES and act in _SILU_NAMES


def _install_swiglu(model: nn.Module, choice: KernelChoice) -> int:
    targets = [m for m in model.modules() if _is_silu_mlp(m)]
    for module in targets:
        _bind(module, choice)
    return len(targets)


def _modeling_modules(model: nn.Module) -> list[ModuleType]:
    names = sorted({_key(m)[0] for m in model.modules() if _key(m) in ATTENTION_CLASSES})
    return [sys.modules[n] for n in names]


def _install_rotary(model: nn.Module, choice: KernelChoice) -> int:
    modules = _modeling_modules(model)
    for module in modules:
        if choice.native:
            if module.__name__ in _ORIGINAL_ROTARY:
                module.apply_rotary_pos_emb = _ORIGINAL_ROTARY.pop(module.__name__)
        else:
            _ORIGINAL_ROTARY.setdefault(module.__name__, module.apply_rotary_pos_emb)
            module.apply_rotary_pos_emb = choice.fn
    return len(modules)


def _install_attention(model: nn.Module, choice: KernelChoice) -> int:
    if not hasattr(model, "config"):
        return 0
    choice.fn(model)
    keep_exact_attention(model)  # sdpa drops Gemma2's attention soft-capping
    return 1


_INSTALLERS: dict[str, Callable[[nn.Module, KernelChoice], int]] = {
    "rms_norm": _install_rms_norm,
    "rotary": _install_rotary,
    "swiglu": _install_swiglu,
    "attention": _install_attention,
}


def _check_overrides(overrides: dict[str, str]) -> None:
    if "logprobs" in overrides:
        raise ValueError(
            "the logprobs kernel is chosen at each call, not patched into the model; force it "
            "with rlkit.kernels.set_overrides({'logprobs': ...}) or "
            "token_logprobs_and_entropy(kernel=...)"
        )
    unknown = sorted(set(overrides) - set(MODEL_OPS))
    if unknown:
        raise ValueError(f"unknown op(s) {unknown} in overrides; model ops: {', '.join(MODEL_OPS)}")


def apply_kernels(
    model: nn.Module,
    *,
    overrides: dict[str, str] | None = None,
    platform: Platform | str | None = None,
) -> dict[str, str]:
    """Choose a kernel per op and install it into a Qwen2/Qwen3/Llama model in place.

    Args:
        model: a Hugging Face causal LM (or any module containing those layers).
        overrides: op -> implementation name to force (``rms_norm``, ``rotary``,
            ``swiglu``, ``attention``); others follow :func:`rlkit.kernels.choose`.
        platform: the platform to choose for (a Platform or name); ``None`` for
            :func:`rlkit.device.current`.

    Returns:
        op -> chosen implementation name for the four model ops, plus ``logprobs``:
        what :func:`rlkit.ops.token_logprobs_and_entropy` will use on this platform.

    Raises:
        ValueError: an unknown op in ``overrides``, or ``logprobs`` in it.
        UnknownNameError / KernelUnavailableError: a forced kernel is unknown or
            cannot run on the platform.
    """
    overrides = dict(overrides or {})
    _check_overrides(overrides)
    if platform is None:
        platform = rlkit.device.current()
    chosen = {}
    for op in MODEL_OPS:
        choice = choose(op, platform, overrides.get(op))
        patched = _INSTALLERS[op](model, choice)
        if patched == 0 and not choice.native:
            logger.warning(
                "%s kernel %s: no Qwen2/Qwen3/Llama target in the model", op, choice.name
            )
        logger.info("%s -> %s (%s); %d target(s)", op, choice.name, choice.reason, patched)
        chosen[op] = choice.name
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == "eager":
        chosen["attention"] = "eager"  # sdpa replaced where it would drop soft-capping
    chosen["logprobs"] = choose("logprobs", platform).name
    return chosen
