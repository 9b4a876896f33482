"""Argument checks shared by every advantage estimator.

Every estimator has the same keyword interface (see :mod:`estimators`). These
helpers turn its tensors into one validated :class:`TokenBatch`, reject options
an estimator does not understand (so a typo in a gin config fails loudly), and
name the missing argument when an estimator needs one it was not given.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import Any

import torch

#: The keyword arguments every estimator accepts (used or ignored).
SHARED_ARGUMENTS = (
    "index",
    "values",
    "reward_baselines",
    "gamma",
    "lam",
    "norm_by_std",
    "epsilon",
)

# Spellings from verl / TRL configs that people will carry over by habit.
_PEER_SPELLINGS = {
    "norm_adv_by_std_in_grpo": "norm_by_std",
    "config": "explicit keyword arguments (gamma=..., lam=..., norm_by_std=...)",
    "scale_rewards": "the estimator name ('grpo', 'grpo_batch_std' or 'dr_grpo')",
    "uid": "index",
    "group_ids": "index",
    "baselines": "reward_baselines",
}


class TokenBatch:
    """The validated (B, T) inputs of an estimator.

    The mask forms are made on first use, so an estimator pays only for the
    conversions it needs.

    Attributes:
        rewards: (B, T) token rewards in the compute dtype (float32 for
            half-precision inputs, else the input dtype).
        out_dtype: dtype of the outputs (the dtype of the rewards given).
    """

    def __init__(self, rewards: torch.Tensor, response_mask: torch.Tensor, out_dtype: torch.dtype):
        self.rewards = rewards
        self.out_dtype = out_dtype
        self._response_mask = response_mask

    @property
    def batch_size(self) -> int:
        return self.rewards.shape[0]

    @cached_property
    def mask(self) -> torch.Tensor:
        """(B, T) bool, True on tokens that are trained on."""
        given = self._response_mask
        return given if given.dtype == torch.bool else given != 0

    @cached_property
    def mask_f(self) -> torch.Tensor:
        """(B, T) the mask as 0/1 in the compute dtype (a float mask of that dtype is used as is)."""
        return self._response_mask.to(self.rewards.dtype)

    @cached_property
    def lengths(self) -> torch.Tensor:
        """(B,) number of valid tokens of each row, in the compute dtype."""
        return self.mask_f.sum(dim=-1)

    def finish(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Cast outputs back to the rewards' dtype (no copy when it already matches)."""
        return tuple(t.to(self.out_dtype) for t in tensors)


def prepare_batch(
    estimator: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor
) -> TokenBatch:
    """Validate rewards and mask and bring them to one compute dtype.

    Args:
        estimator: name used in error messages.
        token_level_rewards: (B, T) floating tensor.
        response_mask: (B, T) bool or 0/1 numeric tensor on the same device
            (numeric masks must hold only 0 and 1; they are not re-checked).

    Returns:
        The :class:`TokenBatch`.

    Raises:
        TypeError: a non-tensor or non-floating rewards tensor.
        ValueError: wrong rank, mismatched shapes or devices.
    """
    if not isinstance(token_level_rewards, torch.Tensor):
        raise TypeError(
            f"{estimator}: token_level_rewards must be a (B, T) torch.Tensor, "
            f"got {type(token_level_rewards).__name__}"
        )
    if not isinstance(response_mask, torch.Tensor):
        raise TypeError(
            f"{estimator}: response_mask must be a (B, T) torch.Tensor, "
            f"got {type(response_mask).__name__}"
        )
    if token_level_rewards.ndim != 2:
        raise ValueError(
            f"{estimator}: token_level_rewards must be (B, T), got shape "
            f"{tuple(token_level_rewards.shape)}; add a batch dimension with .unsqueeze(0)"
        )
    if not token_level_rewards.is_floating_point():
        raise TypeError(
            f"{estimator}: token_level_rewards must be floating point, got "
            f"{token_level_rewards.dtype}; convert with .float()"
        )
    if response_mask.shape != token_level_rewards.shape:
        raise ValueError(
            f"{estimator}: response_mask shape {tuple(response_mask.shape)} does not match "
            f"token_level_rewards shape {tuple(token_level_rewards.shape)}"
        )
    if response_mask.device != token_level_rewards.device:
        raise ValueError(
            f"{estimator}: response_mask is on {response_mask.device} but token_level_rewards "
            f"on {token_level_rewards.device}; move them to one device"
        )
    out_dtype = token_level_rewards.dtype
    compute_dtype = out_dtype if out_dtype in (torch.float32, torch.float64) else torch.float32
    rewards = token_level_rewards.detach().to(compute_dtype)
    return TokenBatch(rewards, response_mask.detach(), out_dtype)


def token_tensor(
    estimator: str, name: str, tensor: Any, batch: TokenBatch, hint: str
) -> torch.Tensor:
    """A required (B, T) float tensor such as ``values``, in the compute dtype.

    Raises:
        ValueError: it is missing or has the wrong shape / device.
    """
    if tensor is None:
        raise ValueError(f"{estimator} needs `{name}` (B, T) {hint}; pass {name}=...")
    if not isinstance(tensor, torch.Tensor) or tensor.shape != batch.rewards.shape:
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(
            f"{estimator}: `{name}` must be a (B, T) = {tuple(batch.rewards.shape)} tensor "
            f"like token_level_rewards, got {shape}"
        )
    _same_device(estimator, name, tensor, batch)
    return tensor.detach().to(batch.rewards.dtype)


def row_tensor(
    estimator: str, name: str, tensor: Any, batch: TokenBatch, hint: str
) -> torch.Tensor:
    """A required (B,) float tensor such as ``reward_baselines``, in the compute dtype.

    Raises:
        ValueError: it is missing or has the wrong shape / device.
    """
    if tensor is None:
        raise ValueError(f"{estimator} needs `{name}` (B,) {hint}; pass {name}=...")
    if not isinstance(tensor, torch.Tensor) or tensor.shape != (batch.batch_size,):
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(
            f"{estimator}: `{name}` must be a (B,) = ({batch.batch_size},) tensor, got {shape}"
        )
    _same_device(estimator, name, tensor, batch)
    return tensor.detach().to(batch.rewards.dtype)


def _same_device(estimator: str, name: str, tensor: torch.Tensor, batch: TokenBatch) -> None:
    if tensor.device != batch.rewards.device:
        raise ValueError(
            f"{estimator}: `{name}` is on {tensor.device} but token_level_rewards on "
            f"{batch.rewards.device}; move them to one device"
        )


def check_discount(estimator: str, **factors: float) -> None:
    """Check discount-like factors (gamma, lam) lie in [0, 1].

    Raises:
        ValueError: a factor outside [0, 1] or not finite.
    """
    for name, value in factors.items():
        if not (isinstance(value, int | float) and math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ValueError(f"{estimator}: {name} must be a number in [0, 1], got {value!r}")


def check_epsilon(estimator: str, epsilon: float) -> None:
    """Check the std-normaliser epsilon is a finite number >= 0.

    Raises:
        ValueError: negative or not finite.
    """
    if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"{estimator}: epsilon must be a finite number >= 0, got {epsilon!r}")


def reject_unknown_options(
    estimator: str, options: Mapping[str, Any], known: Iterable[str] = ()
) -> None:
    """Raise for keyword options the estimator does not understand.

    Args:
        estimator: name used in the message.
        options: the ``**options`` the estimator received.
        known: the estimator-specific option names it understands.

    Raises:
        TypeError: naming each unknown option, with the nearest known spelling.
    """
    known = tuple(known)
    unknown = sorted(set(options) - set(known))
    if not unknown:
        return
    candidates = [*known, *SHARED_ARGUMENTS]
    hints = []
    for key in unknown:
        near = _PEER_SPELLINGS.get(key) or next(
            iter(difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)), None
        )
        if near:
            hints.append(f"{key!r} -> use {near}")
    listed = ", ".join(known) if known else "none"
    raise TypeError(
        f"{estimator} got unknown option(s) {', '.join(map(repr, unknown))}. "
        f"Its own options: {listed}; shared arguments: {', '.join(SHARED_ARGUMENTS)}."
        + (f" Hint: {'; '.join(hints)}." if hints else "")
    )


def bool_option(estimator: str, options: Mapping[str, Any], name: str, default: bool) -> bool:
    """Read a bool option strictly (a string like "false" would otherwise be truthy).

    Raises:
        TypeError: the value is not a bool.
    """
    value = options.get(name, default)
    if not isinstance(value, bool):
        raise TypeError(f"{estimator}: option {name} must be True or False, got {value!r}")
    return value
