"""Per-token KL penalties between the policy and a reference policy.

With Δ = log π(y_t) − log π_ref(y_t) for tokens sampled from π (Schulman's
"Approximating KL divergence", http://joschu.net/blog/kl-approx.html):

========================  ==============================================  ==============
kind (aliases)            value                                           gradient
========================  ==============================================  ==============
``k1`` (``kl``)           Δ                                               of the value
``abs``                   |Δ|                                             of the value
``k2`` (``mse``)          ½Δ²                                             of the value
``k3`` (``low_var_kl``)   e^k − k − 1 with k = clamp(−Δ, ±20), then ≤ 10   of the value
``<kind>+``               the value of ``<kind>``                        of ``k2``
========================  ==============================================  ==============

k1 and k3 are unbiased estimates of KL(π‖π_ref) but their *gradients* are not
the gradient of the KL; k2's gradient is. The ``+`` variants (verl's straight-
through trick) report the named estimator's value and back-propagate k2's
gradient: ``k2 − sg(k2) + sg(value)``.

k3 is computed as ``expm1(k) − k``: verl's ``exp(k) − k − 1`` cancels
catastrophically for small |k| (it can even be slightly negative); expm1 keeps
k3 >= 0 in floating point and agrees with verl to rounding otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlkit.registry import KL_PENALTIES

#: verl's clamps for k3: the exponent (overflow) and the result (outliers).
K3_LOG_RATIO_BOUND = 20.0
K3_VALUE_BOUND = 10.0


def _check(log_prob: Tensor, ref_log_prob: Tensor) -> None:
    if log_prob.shape != ref_log_prob.shape:
        raise ValueError(
            f"log_prob and ref_log_prob must have the same shape; got {tuple(log_prob.shape)} "
            f"and {tuple(ref_log_prob.shape)}"
        )


@KL_PENALTIES.register("k1", aliases=("kl",))
def k1(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k1 = log π − log π_ref, shape of the inputs (B, T)."""
    _check(log_prob, ref_log_prob)
    return log_prob - ref_log_prob


@KL_PENALTIES.register("abs")
def abs_kl(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """|log π − log π_ref|, shape (B, T)."""
    _check(log_prob, ref_log_prob)
    return (log_prob - ref_log_prob).abs()


@KL_PENALTIES.register("k2", aliases=("mse",))
def k2(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k2 = ½(log π − log π_ref)², shape (B, T); its gradient is the KL's."""
    _check(log_prob, ref_log_prob)
    return 0.5 * (log_prob - ref_log_prob).square()


@KL_PENALTIES.register("k3", aliases=("low_var_kl",))
def k3(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k3 = e^k − k − 1 with k = clamp(log π_ref − log π, ±20), clamped to <= 10; (B, T)."""
    _check(log_prob, ref_log_prob)
    k = (ref_log_prob - log_prob).clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    return (torch.expm1(k) - k).clamp(min=0.0, max=K3_VALUE_BOUND)


def straight_through(
    value_fn: Callable[[Tensor, Tensor], Tensor], kind: str, name: str
) -> Callable[..., Tensor]:
    """Build ``<kind>+``: the value of ``value_fn`` with the gradient of k2.

    ``name`` becomes the function's ``__name__`` (the module attribute it is
    bound to, so ``"algorithms.kl:<name>"`` finds it).
    """

    def penalty(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
        surrogate = k2(log_prob, ref_log_prob)
        return surrogate - surrogate.detach() + value_fn(log_prob, ref_log_prob).detach()

    penalty.__name__ = penalty.__qualname__ = name
    penalty.__doc__ = f"Value of {kind}, gradient of k2 (straight-through); (B, T)."
    return penalty


k1_plus = straight_through(k1, "k1", "k1_plus")
abs_plus = straight_through(abs_kl, "abs", "abs_plus")
k3_plus = straight_through(k3, "k3", "k3_plus")

KL_PENALTIES.add("k1+", k1_plus, aliases=("kl+",))
KL_PENALTIES.add("abs+", abs_plus)
# k2's gradient already is k2's: "k2+" is k2 itself, as in verl.
KL_PENALTIES.add("k2+", k2, aliases=("mse+",), summary="Same as k2 (its gradient is k2's).")
KL_PENALTIES.add("k3+", k3_plus, aliases=("low_var_kl+",))


def kl_penalty(log_prob: Tensor, ref_log_prob: Tensor, kind: str = "low_var_kl") -> Tensor:
    """Per-token KL penalty of the named kind (see the module docstring).

    Args:
        log_prob: (B, T) log-probabilities of the sampled tokens under the policy.
        ref_log_prob: (B, T) the same under the reference policy.
        kind: a name or alias in ``KL_PENALTIES`` (``k1``/``kl``, ``k2``/``mse``,
            ``k3``/``low_var_kl``, ``abs``, and each with a ``+`` suffix).

    Returns:
        (B, T) penalty; aggregate it with ``aggregate_loss`` (KL as a loss) or
        subtract β times it from the token rewards (KL in the reward).

    Raises:
        UnknownNameError: unknown ``kind``.
        ValueError: the shapes differ.
    """
    return KL_PENALTIES.get(kind)(log_prob, ref_log_prob)
