"""``gspo``: Group Sequence Policy Optimization (arXiv:2507.18071), token form.

The importance ratio is the length-normalised *sequence* ratio::

    log s_b = Σ_t Δ_{b,t} m_{b,t} / max(n_b, 1)
    log s_{b,t} = sg(log s_b) + log π_θ(y_t) − sg(log π_θ(y_t)),  clamped to <= 10
    L = max(−A·s_{b,t}, −A·clip(s_{b,t}, 1 − ε_low, 1 + ε_high))

(GSPO-token: the value is s_b for every token, the gradient flows per token.)
No dual clip. The paper uses ε_low = 3e-4, ε_high = 4e-4 (set them in the
preset; the defaults here are the common ε = 0.2).

Difference from verl: verl *ignores* ``loss_agg_mode`` and always aggregates
with ``seq-mean-token-mean``; rlkit honours the argument. Pass
``loss_agg_mode="seq-mean-token-mean"`` for verl's numbers.

:func:`gspo_terms` is this math in plain torch; by default the loss runs its fused
twin ``algorithms.losses.fused.gspo_terms_fused``, and ``algorithms.set_math("plain")``
selects the plain one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from algorithms import math_mode
from algorithms.aggregation import Normaliser, mask_weights
from algorithms.losses.arguments import check_inputs, clip_bounds, reject_unknown_options
from algorithms.losses.fused import gspo_terms_fused
from algorithms.losses.ratio import LOG_SEQ_RATIO_MAX, SurrogateTerms, valid_tokens
from algorithms.losses.reduction import policy_metrics, reduce_token_loss
from rlkit.registry import POLICY_LOSSES


def gspo_terms(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    valid: Tensor,
    weights: Tensor,
    *,
    low: float,
    high: float,
) -> SurrogateTerms:
    """GSPO-token's clipped surrogate per token, in plain torch (gradient by autograd).

    log s_b = Σ_t Δ_t m_t / max(n_b, 1);  log s_{b,t} = sg(log s_b) + log π_θ − sg(log π_θ),
    clamped to <= 10;  L = max(−A·s_{b,t}, −A·clip(s_{b,t}, 1 − ε_low, 1 + ε_high)).

    Args:
        old_log_prob, log_prob, advantages: (B, T); padding may hold anything in the
            log-probs (even −inf).
        valid: (B, T) bool; weights: the same mask as float token weights.
        low, high: ε_low, ε_high.

    Returns:
        :class:`SurrogateTerms` (``log_ratio``: the token Δ, for ``ppo_kl``;
        ``clipped_lower``: None, GSPO has no dual clip).
    """
    log_ratio = torch.where(valid, log_prob.detach() - old_log_prob, 0.0)
    seq_log_ratio = (log_ratio * weights).sum(dim=-1) / weights.sum(dim=-1).clamp(min=1.0)
    log_prob = torch.where(valid, log_prob, 0.0)
    # Value log s_b, gradient that of log π_θ: the bracket is exactly 0, so the sum
    # is exactly log s_b (log s_b + log π − log π could round differently).
    token_log_ratio = seq_log_ratio[:, None] + (log_prob - log_prob.detach())
    ratio = torch.exp(token_log_ratio.clamp(max=LOG_SEQ_RATIO_MAX))
    surr1 = -advantages * ratio
    surr2 = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    return SurrogateTerms(torch.maximum(surr1, surr2), surr2 > surr1, None, log_ratio)


@POLICY_LOSSES.register(
    "gspo", paper="arXiv:2507.18071", properties=("reduces_to_vanilla_at_ratio_one",)
)
def gspo(
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
    **options: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: PPO clip on the length-normalised sequence importance ratio.

    s_b = exp(mean_t Δ) (value), per-token gradient of log π_θ; L = max(−A·s,
    −A·clip(s, 1 − ε_low, 1 + ε_high)). arXiv:2507.18071. verl forces
    ``seq-mean-token-mean``; rlkit honours ``loss_agg_mode``.

    Property kit (``rlkit.testing``): declares ``reduces_to_vanilla_at_ratio_one`` (at s = 1 each
    token's gradient is −A, as PPO's).

    Args:
        old_log_prob: (B, T) log π_old of the sampled tokens.
        log_prob: (B, T) log π_θ (with gradient).
        advantages: (B, T) A (GSPO assumes one advantage per sequence).
        response_mask: (B, T) mask.
        loss_agg_mode: aggregation; verl forces ``seq-mean-token-mean``.
        clip_ratio, clip_ratio_low, clip_ratio_high: ε, ε_low, ε_high of the
            sequence-ratio clip.
        clip_ratio_c: unused (GSPO has no dual clip); accepted for the shared signature.
        rollout_is_weights: (B, T) detached weights multiplying the per-token loss.
        num_tokens, num_seqs, norm_length: the mini-batch's normalisers.
        **options: none; any key raises TypeError.

    Returns:
        loss: 0-dim tensor.
        metrics: ``pg_clipfrac`` (the clip binds), ``ppo_kl`` (mean −Δ over
        tokens), ``pg_clipfrac_lower`` (always 0).
    """
    reject_unknown_options("gspo", options)
    check_inputs("gspo", old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    low, high = clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    valid = valid_tokens(response_mask)
    weights = mask_weights(response_mask, log_prob.dtype)
    terms = math_mode.choose(gspo_terms, gspo_terms_fused)(
        old_log_prob, log_prob, advantages, valid, weights, low=low, high=high
    )
    loss = reduce_token_loss(
        terms.loss,
        weights,
        loss_agg_mode,
        rollout_is_weights,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    return loss, policy_metrics(response_mask, weights, terms.log_ratio, clipped=terms.clipped)
