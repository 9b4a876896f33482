"""``kl_cov``: KL penalty on the highest-covariance tokens (arXiv:2505.22617).

No clipping. With r = exp(clamp(Δ, ±20)) and cov_t = (A − mean A)(log π − mean log π)
over the micro-batch's N valid tokens::

    L_t = −A·r                      for all tokens
    L_t = −A·r + coef·|Δ|           for the k = max(1, ⌊N·kl_cov_ratio⌋) tokens of largest cov

Differences from verl: verl exponentiates Δ unclamped (identical for |Δ| <= 20)
and reports mean |Δ| as ``ppo_kl``; rlkit reports mean −Δ as ``ppo_kl``, like
every other loss, and mean |Δ| as ``ppo_kl_abs``. The selection is per
micro-batch, as in verl, so this loss (unlike the others) depends on how the
mini-batch is split. verl's code default coefficient is 1.0, its config default
0.1; rlkit uses 0.1. Equal covariances (e.g. a row whose advantage equals the
batch mean) are ranked by position (earlier token first); verl's ``topk``
leaves their order unspecified.
"""

from __future__ import annotations

import torch
from torch import Tensor

from algorithms.aggregation import Normaliser, mask_weights, token_count
from algorithms.losses.arguments import (
    check_inputs,
    check_range,
    clip_bounds,
    reject_unknown_options,
)
from algorithms.losses.covariance import token_covariance, top_k_indices
from algorithms.losses.ratio import log_ratio, safe_log_prob, valid_tokens
from algorithms.losses.reduction import policy_metrics, reduce_token_loss
from rlkit.registry import POLICY_LOSSES


@POLICY_LOSSES.register(
    "kl_cov",
    paper="arXiv:2505.22617",
    properties=("reduces_to_vanilla_at_ratio_one",),
    properties_exempt=("microbatch_invariance", "row_permutation_invariance"),
)
def kl_cov(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: Tensor | None = None,
    num_tokens: Normaliser = None,
    num_seqs: Normaliser = None,
    norm_length: Normaliser = None,
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 0.1,
    **options: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Policy gradient with an |Δ| penalty on the top-covariance tokens.

    L = −A·r, plus ppo_kl_coef·|Δ| on the ⌊N·kl_cov_ratio⌋ (>= 1) tokens of largest
    (A − Ā)(log π − mean log π). arXiv:2505.22617. ``ppo_kl`` is mean −Δ here
    (verl reports mean |Δ| under that name; see ``ppo_kl_abs``).

    Property kit (``rlkit.testing``): exempt from ``microbatch_invariance``: the
    penalised tokens, k and the covariance means are those of the micro-batch
    (as in verl), so splitting a mini-batch changes the loss; and from
    ``row_permutation_invariance``: equal covariances (e.g. all advantages
    equal) are ranked by position, so permuting rows can change which token is
    penalised. Declares ``reduces_to_vanilla_at_ratio_one`` (the |Δ| penalty has
    zero gradient at Δ = 0).

    Args:
        old_log_prob: (B, T) log π_old.
        log_prob: (B, T) log π_θ (with gradient).
        advantages: (B, T) A.
        response_mask: (B, T) mask.
        loss_agg_mode: aggregation mode.
        clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c: unused (no clipping).
        rollout_is_weights: (B, T) detached weights multiplying the per-token loss.
        num_tokens, num_seqs, norm_length: the mini-batch's global normalisers.
        kl_cov_ratio: fraction of valid tokens penalised, in (0, 1]; at least one.
        ppo_kl_coef: coefficient of |Δ| on the selected tokens, >= 0.
        **options: any other key raises TypeError.

    Returns:
        loss: 0-dim tensor.
        metrics: ``pg_clipfrac`` = ``pg_clipfrac_lower`` = 0, ``ppo_kl`` (mean −Δ),
        ``ppo_kl_abs`` (mean |Δ|, verl's ``ppo_kl``), ``kl_cov_frac`` (fraction
        of valid tokens penalised).
    """
    reject_unknown_options("kl_cov", options, ("kl_cov_ratio", "ppo_kl_coef"))
    check_inputs("kl_cov", old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)  # unused, but validated
    check_range("kl_cov", "kl_cov_ratio", kl_cov_ratio, low=0.0, high=1.0)
    check_range("kl_cov", "ppo_kl_coef", ppo_kl_coef, low=0.0, low_inclusive=True)
    valid = valid_tokens(response_mask)
    weights = mask_weights(response_mask, log_prob.dtype)
    delta = log_ratio(log_prob, old_log_prob, valid)
    loss_mat = -advantages * torch.exp(delta)
    covariance = token_covariance(advantages, safe_log_prob(log_prob.detach(), valid), weights)
    n_valid = int(token_count(valid).item())  # topk needs a Python k (one sync)
    k = max(1, int(n_valid * kl_cov_ratio)) if n_valid > 0 else 0
    chosen = top_k_indices(torch.where(valid, covariance, -torch.inf), k)
    rows, cols = chosen // delta.shape[-1], chosen % delta.shape[-1]
    penalised = loss_mat[rows, cols] + ppo_kl_coef * delta[rows, cols].abs()
    loss_mat = loss_mat.index_put((rows, cols), penalised)
    loss = reduce_token_loss(
        loss_mat,
        weights,
        loss_agg_mode,
        rollout_is_weights,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    metrics = policy_metrics(
        response_mask,
        weights,
        delta,
        ppo_kl_abs=delta.abs(),
        kl_cov_frac=chosen.numel() / max(n_valid, 1),
    )
    return loss, metrics
