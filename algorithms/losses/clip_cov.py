"""``clip_cov``: drop the gradient of random high-covariance tokens (arXiv:2505.22617).

PPO's clipped surrogate L_t = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)), r =
exp(clamp(Δ, ±20)); then, among the valid tokens where the PPO clip does *not*
bind and lb < cov_t < ub (cov_t = (A − mean A)(log π − mean log π) over the
micro-batch), choose k = max(1, ⌊N·clip_cov_ratio⌋) uniformly at random (all
of them if fewer) and set their loss to 0 (verl's ``corr`` multiplier), which
removes their gradient.

The random choice is driven by ``generator`` (a ``torch.Generator``): the same
seed gives the same tokens. Without one, torch's global RNG is used. The choice
is the k candidates with the largest i.i.d. U[0, 1) float64 keys (one key per
candidate, drawn in row-major order), i.e. a uniformly random k-subset, like
verl's ``randperm``.

Differences from verl: verl exponentiates Δ unclamped (identical for |Δ| <= 20)
and reports the fraction of zeroed tokens as ``pg_clipfrac``; rlkit reports the
PPO clip fraction as ``pg_clipfrac`` (the same meaning as in ``vanilla``) and the
zeroed fraction as ``clip_cov_frac``. No dual clip. Selection is per micro-batch.

The PPO clip is vanilla's (``vanilla.vanilla_terms`` in plain torch, or by default
its fused twin; ``algorithms.set_math("plain")`` selects the plain one).
"""

from __future__ import annotations

import torch
from torch import Tensor

from algorithms import math_mode
from algorithms.aggregation import Normaliser, mask_weights, token_count
from algorithms.losses.arguments import (
    check_inputs,
    check_range,
    clip_bounds,
    reject_unknown_options,
)
from algorithms.losses.covariance import token_covariance, top_k_indices
from algorithms.losses.fused import vanilla_terms_fused
from algorithms.losses.ratio import safe_log_prob, valid_tokens
from algorithms.losses.reduction import policy_metrics, reduce_token_loss
from algorithms.losses.vanilla import vanilla_terms
from rlkit.registry import POLICY_LOSSES


def random_subset(candidates: Tensor, k: int, generator: torch.Generator | None) -> Tensor:
    """Flat indices of ``k`` of the True entries of ``candidates``, uniformly at random.

    Each candidate, in row-major order, draws a U[0, 1) float64 key from
    ``generator``; the k largest keys win (a uniformly random k-subset, like
    verl's ``randperm``). Only candidates draw keys, so the cost follows their
    number, not B·T.
    """
    positions = torch.nonzero(candidates.reshape(-1)).squeeze(1)
    k = min(k, positions.numel())
    if k == 0:
        return positions[:0]
    device = generator.device if generator is not None else candidates.device
    keys = torch.rand(positions.numel(), generator=generator, device=device, dtype=torch.float64)
    return positions[top_k_indices(keys.to(candidates.device), k)]


@POLICY_LOSSES.register(
    "clip_cov",
    paper="arXiv:2505.22617",
    properties_exempt=("microbatch_invariance", "row_permutation_invariance"),
)
def clip_cov(
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
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
    **options: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip loss that zeroes the loss of random high-covariance tokens.

    L = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)), set to 0 on ⌊N·clip_cov_ratio⌋
    (>= 1) random unclipped tokens with lb < cov < ub. arXiv:2505.22617.
    ``pg_clipfrac`` is PPO's clip fraction (verl reports the zeroed fraction
    under that name; see ``clip_cov_frac``).

    Property kit (``rlkit.testing``): exempt from ``microbatch_invariance``: the
    candidates, k and the covariance means are those of the micro-batch (as in
    verl), so splitting a mini-batch changes which tokens are zeroed; and from
    ``row_permutation_invariance``: the random keys are drawn per candidate in
    row-major order, so permuting rows changes the random choice. It does not
    reduce to vanilla at ratio one (the zeroed tokens lose their gradient).

    Args:
        old_log_prob: (B, T) log π_old.
        log_prob: (B, T) log π_θ (with gradient).
        advantages: (B, T) A.
        response_mask: (B, T) mask.
        loss_agg_mode: aggregation mode.
        clip_ratio, clip_ratio_low, clip_ratio_high: ε, ε_low, ε_high of the PPO clip.
        clip_ratio_c: unused (no dual clip); accepted for the shared signature.
        rollout_is_weights: (B, T) detached weights multiplying the per-token loss.
        num_tokens, num_seqs, norm_length: the mini-batch's normalisers.
        clip_cov_ratio: fraction of valid tokens to zero, in (0, 1]; at least one.
        clip_cov_lb: candidates need cov > clip_cov_lb.
        clip_cov_ub: candidates need cov < clip_cov_ub (> clip_cov_lb).
        generator: ``torch.Generator`` driving the random choice (reproducible).
        **options: any other key raises TypeError.

    Returns:
        loss: 0-dim tensor.
        metrics: ``pg_clipfrac`` (PPO clip binds), ``ppo_kl`` (mean −Δ),
        ``pg_clipfrac_lower`` (0), ``clip_cov_frac`` (fraction of valid tokens zeroed).
    """
    reject_unknown_options(
        "clip_cov", options, ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "generator")
    )
    check_inputs("clip_cov", old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    low, high = clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    check_range("clip_cov", "clip_cov_ratio", clip_cov_ratio, low=0.0, high=1.0)
    if not clip_cov_lb < clip_cov_ub:
        raise ValueError(
            f"clip_cov: need clip_cov_lb < clip_cov_ub, got {clip_cov_lb} and {clip_cov_ub}"
        )
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"clip_cov: generator must be a torch.Generator, got {type(generator)}")
    valid = valid_tokens(response_mask)
    weights = mask_weights(response_mask, log_prob.dtype)
    # PPO's clip without the dual clip: vanilla's terms (plain or fused, as selected).
    terms = math_mode.choose(vanilla_terms, vanilla_terms_fused)(
        old_log_prob, log_prob, advantages, valid, low=low, high=high, clip_ratio_c=None
    )
    clipped = terms.clipped
    covariance = token_covariance(advantages, safe_log_prob(log_prob.detach(), valid), weights)
    candidates = valid & ~clipped & (covariance > clip_cov_lb) & (covariance < clip_cov_ub)
    n_valid = int(token_count(valid).item())  # the subset size is a Python int
    chosen = random_subset(candidates, max(1, int(n_valid * clip_cov_ratio)), generator)
    width = terms.loss.shape[-1]
    rows, cols = chosen // width, chosen % width
    loss_mat = terms.loss.index_put((rows, cols), terms.loss.new_zeros(()))
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
        terms.log_ratio,
        clipped=clipped,
        clip_cov_frac=chosen.numel() / max(n_valid, 1),
    )
    return loss, metrics
