"""Critic (value-function) losses, registered in ``VALUE_LOSSES`` with one signature::

    fn(vpreds, returns, values, response_mask, *, cliprange_value, loss_agg_mode,
       num_tokens, num_seqs, norm_length) -> (loss, metrics)

``clipped`` (PPO's clipped value loss, as in verl and TRL)::

    v_clip = clamp(v, V_old − c, V_old + c)
    loss   = 0.5 · agg( max((v − R)², (v_clip − R)²) )

``mse`` (no clipping; OpenRLHF's value loss without ``value_clip``)::

    loss   = 0.5 · agg( (v − R)² )

The trainer picks one by ``AlgorithmConfig.value_loss``.

Note: ``algorithms.value_loss`` (the package attribute) is the function
:func:`value_loss`, which shadows this module's name on the package; import
module members with ``from algorithms.value_loss import clipped_value_loss``.
"""

from __future__ import annotations

from torch import Tensor

from algorithms.aggregation import Normaliser, aggregate_loss, masked_mean
from rlkit.registry import VALUE_LOSSES


def _check_shapes(*tensors: Tensor) -> None:
    if len({tuple(t.shape) for t in tensors}) != 1:
        raise ValueError(
            "vpreds, returns, values and response_mask must share one (B, T) shape; got "
            f"{[tuple(t.shape) for t in tensors]}"
        )


@VALUE_LOSSES.register("clipped", paper="arXiv:1707.06347")
def clipped_value_loss(
    vpreds: Tensor,
    returns: Tensor,
    values: Tensor,
    response_mask: Tensor,
    *,
    cliprange_value: float = 0.5,
    loss_agg_mode: str = "token-mean",
    num_tokens: Normaliser = None,
    num_seqs: Normaliser = None,
    norm_length: Normaliser = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped value loss 0.5·agg(max((v−R)², (clip(v, V±c)−R)²)).

    Args:
        vpreds: (B, T) current value predictions v (with gradient).
        returns: (B, T) return targets R.
        values: (B, T) value predictions V at rollout time (the clip centre).
        response_mask: (B, T) mask of tokens that count.
        cliprange_value: c >= 0, the half-width of the clip band around V.
        loss_agg_mode: aggregation mode (see ``algorithms.aggregation``).
        num_tokens, num_seqs, norm_length: the mini-batch's global normalisers.

    Returns:
        loss: 0-dim tensor.
        metrics: detached 0-dim tensors ``vf_clipfrac`` (fraction of valid tokens
        where the clipped term is larger) and ``vpred_mean`` (mean v).

    Raises:
        ValueError: shapes differ or ``cliprange_value`` < 0.
    """
    _check_shapes(vpreds, returns, values, response_mask)
    if not cliprange_value >= 0:
        raise ValueError(f"cliprange_value must be >= 0, got {cliprange_value}")
    clipped = vpreds.clamp(values - cliprange_value, values + cliprange_value)
    unclipped_loss = (vpreds - returns).square()
    clipped_loss = (clipped - returns).square()
    loss = 0.5 * aggregate_loss(
        unclipped_loss.maximum(clipped_loss),
        response_mask,
        loss_agg_mode,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    metrics = {
        "vf_clipfrac": masked_mean(clipped_loss.detach() > unclipped_loss.detach(), response_mask),
        "vpred_mean": masked_mean(vpreds.detach(), response_mask),
    }
    return loss, metrics


@VALUE_LOSSES.register("mse")
def mse_value_loss(
    vpreds: Tensor,
    returns: Tensor,
    values: Tensor,
    response_mask: Tensor,
    *,
    cliprange_value: float = 0.5,
    loss_agg_mode: str = "token-mean",
    num_tokens: Normaliser = None,
    num_seqs: Normaliser = None,
    norm_length: Normaliser = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Unclipped squared error 0.5·agg((v−R)²).

    Args:
        vpreds, returns, values, response_mask: (B, T), as for :func:`clipped_value_loss`
            (``values`` is only checked for shape: nothing is clipped around it).
        cliprange_value: accepted for the shared signature and ignored.
        loss_agg_mode, num_tokens, num_seqs, norm_length: the aggregation.

    Returns:
        loss: 0-dim tensor.
        metrics: ``vf_clipfrac`` (always 0) and ``vpred_mean`` (mean v), detached.
    """
    del cliprange_value
    _check_shapes(vpreds, returns, values, response_mask)
    loss = 0.5 * aggregate_loss(
        (vpreds - returns).square(),
        response_mask,
        loss_agg_mode,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    metrics = {
        "vf_clipfrac": vpreds.new_zeros(()),
        "vpred_mean": masked_mean(vpreds.detach(), response_mask),
    }
    return loss, metrics


def value_loss(
    vpreds: Tensor,
    returns: Tensor,
    values: Tensor,
    response_mask: Tensor,
    *,
    kind: str = "clipped",
    **kwargs: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Value loss of the named kind in ``VALUE_LOSSES`` (default ``clipped``).

    Args:
        vpreds, returns, values, response_mask: (B, T) tensors, see
            :func:`clipped_value_loss`.
        kind: registry name.
        **kwargs: forwarded (``cliprange_value``, ``loss_agg_mode``, normalisers).

    Returns:
        ``(loss, metrics)`` of that value loss.
    """
    return VALUE_LOSSES.get(kind)(vpreds, returns, values, response_mask, **kwargs)
