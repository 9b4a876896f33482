"""PRIME: leave-one-out over the implicit PRM's process rewards and the outcome, summed,
returned over tokens and whitened.

PRIME (Cui et al., "Process Reinforcement through Implicit Rewards", arXiv:2502.01456)
trains an implicit process reward model (PRM) next to the policy; its token-level
rewards β·(log π_prm − log π_ref) (``algorithms.implicit_prm.implicit_process_rewards``)
reach this estimator as ``process_rewards``. Each reward source gets its own
leave-one-out baseline within the prompt's group, then the sources are weighted and
summed, turned into reverse cumulative returns and whitened over the batch: verl's
``recipe/prime`` ``compute_rloo_advantage_return`` with its ``masked_rloo``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from estimators.group_stats import group_sum
from estimators.input_checks import TokenBatch, prepare_batch, reject_unknown_options
from estimators.masked_stats import masked_whiten_
from estimators.outcome_scores import outcome_group_stats
from rlkit.registry import ESTIMATORS

#: verl's ``algorithm.reward_dpo_coef`` and ``algorithm.reward_gt_coef`` defaults.
DEFAULT_REWARD_DPO_COEF = 5.0
DEFAULT_REWARD_GT_COEF = 5.0
OPTIONS = ("reward_dpo_coef", "reward_gt_coef")


def _coefficient(options: dict[str, Any], name: str, default: float) -> float:
    value = options.get(name, default)
    # bool is an int: True would silently mean 1.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"prime: option {name} must be a finite number, got {value!r}")
    return float(value)


def _process_rewards(tensor: Any, batch: TokenBatch) -> torch.Tensor:
    """The (B, T) process rewards in the compute dtype, 0 on mask-0 tokens."""
    if tensor is None:
        raise ValueError(
            "prime needs `process_rewards` (B, T): the implicit PRM's token-level rewards "
            "beta * (log pi_prm - log pi_ref), which the trainer computes with PRIME's reward "
            "model (algorithms.implicit_prm.implicit_process_rewards); pass process_rewards=..."
        )
    if not isinstance(tensor, torch.Tensor) or tensor.shape != batch.rewards.shape:
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(
            f"prime: `process_rewards` must be a (B, T) = {tuple(batch.rewards.shape)} tensor "
            f"like token_level_rewards, got {shape}"
        )
    if tensor.device != batch.rewards.device:
        raise ValueError(
            f"prime: `process_rewards` is on {tensor.device} but token_level_rewards on "
            f"{batch.rewards.device}; move them to one device"
        )
    # where(), not a product: garbage (even inf) on mask-0 tokens must not leak.
    return torch.where(batch.mask, tensor.detach().to(batch.rewards.dtype), 0.0)


def process_leave_one_out_(
    process: torch.Tensor,
    batch: TokenBatch,
    group_ids: torch.Tensor,
    num_groups: int,
    coef: float,
) -> torch.Tensor:
    """In place: ``coef`` times verl's ``masked_rloo`` of the process rewards, groups by id.

    With μ_i = Σ_t p_{i,t} m_{i,t} / Σ_t m_{i,t} (row mean) and ḡ the mean of μ over the
    group's n non-empty rows, verl writes p·n/(n−1) − Σ_j μ_j/(n−1) on valid tokens,
    which is (p − ḡ)·n/(n−1): the form computed here, as p·s − ḡ·s·m with
    s = coef·n/(n−1), two passes over ``process``.

    Args:
        process: (B, T) process rewards, 0 on mask-0 tokens; overwritten.
        batch: the validated inputs.
        group_ids: (B,) dense group ids; num_groups: G.
        coef: verl's ``reward_dpo_coef``.

    Returns:
        ``process``, now the weighted leave-one-out rewards: 0 on mask-0 tokens, on
        empty rows and on groups of one.
    """
    if coef == 0:  # verl skips the source: nothing of it, not even an inf, gets through
        return process.zero_()
    valid = batch.lengths > 0
    row_means = torch.where(valid, process.sum(-1) / batch.lengths.clamp(min=1), 0.0)
    size = group_sum(valid.to(process.dtype), group_ids, num_groups)
    group_mean = group_sum(row_means, group_ids, num_groups) / size.clamp(min=1)
    # n / (n - 1), and 0 for a group of one: no other response to compare with.
    scale = coef * torch.where(size > 1, size / (size - 1).clamp(min=1), 0.0)
    offset = (scale * group_mean)[group_ids]
    process.mul_(scale[group_ids][:, None])
    return process.addcmul_(batch.mask_f, offset[:, None], value=-1)


def last_valid_index(batch: TokenBatch) -> torch.Tensor:
    """(B,) position of each row's last valid token (T - 1 for an empty row); needs T > 0."""
    # argmax returns the first maximum: in the flipped mask, the last valid token.
    flipped = batch.mask.flip(-1).to(torch.uint8)
    return batch.rewards.shape[1] - 1 - flipped.argmax(-1)


@ESTIMATORS.register(
    "prime",
    paper="arXiv:2502.01456",
    summary="leave-one-out on PRM process rewards and outcome, whitened",
    inputs=("process_rewards",),
    properties=("reward_shift_invariant", "group_shift_invariant"),
    properties_exempt=("singleton_group_zero", "equal_scores_zero"),
)
@torch.no_grad()
def prime(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Any = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
    process_rewards: torch.Tensor | None = None,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PRIME advantages: per-source leave-one-out, weighted sum, returns, whitening.

    PRIME (arXiv:2502.01456), as verl's ``recipe/prime``. For response i of a group of
    n non-empty responses (rows sharing ``index``), with p the process rewards, m the
    mask, s_i = Σ_t r_{i,t} m_{i,t} the outcome score and L_i its last valid token:

        μ_i = Σ_t p_{i,t} m_{i,t} / Σ_t m_{i,t},   ḡ = mean_{j in g} μ_j
        P_{i,t} = (p_{i,t} − ḡ) · n/(n−1) · m_{i,t}              (process leave-one-out)
        O_{i,t} = (s_i − mean_{j in g} s_j) · n/(n−1) · [t = L_i]  (= s_i − mean_{j≠i} s_j)
        R = reward_dpo_coef · P + reward_gt_coef · O
        G_{i,t} = Σ_{t' >= t} R_{i,t'} m_{i,t'}                    (returns)
        A = masked_whiten(G)   over every valid token of the batch

    ``masked_whiten`` uses one mean and the unbiased variance over the valid tokens,
    (G − mean)·rsqrt(var + 1e-8), as verl's ``verl_F.masked_whiten``.

    verl correspondences: ``process_rewards`` is verl's ``rm_scores`` (already β-scaled
    and, with ``prime_norm="batch_norm"``, normalised); s_i is verl's ``acc`` (the score
    on the last valid token; the sum over the row equals it when rewards sit there, as
    reward managers place them). verl groups rows in contiguous blocks of
    ``rollout.n``; here groups are the rows sharing ``index``, in any order and of any
    size, giving verl's numbers on its layout. As in verl, a source whose coefficient
    is 0 is left out.

    Degenerate inputs (verl divides by zero or averages an empty row there):

    * a group with one non-empty response contributes 0 from both sources (no other
      sample to compare with), so its returns are 0; whitening over the batch then
      gives it −mean/std, not 0;
    * empty responses get 0, and count neither in n nor in the whitening;
    * a batch with fewer than two valid tokens is only centred (one token: 0).

    Property kit (``rlkit.testing``): declares ``reward_shift_invariant`` and
    ``group_shift_invariant`` (the outcome's leave-one-out removes any per-group
    constant); exempt from ``singleton_group_zero`` and ``equal_scores_zero``: the
    process rewards still differ between equal-scored responses, and the batch-wide
    whitening moves a 0 return away from 0. Not group-local (whitening) and not
    zero-sum per group.

    Args:
        token_level_rewards: (B, T) rewards; only their row sum s_i (the outcome) is
            used, placed on the last valid token.
        response_mask: (B, T) bool or 0/1 valid-token mask.
        index: (B,) group ids. Required.
        values: ignored.
        reward_baselines: ignored.
        gamma: ignored (verl's PRIME returns are undiscounted).
        lam: ignored.
        norm_by_std: ignored (the whitening always divides by the batch std).
        epsilon: ignored (the whitening adds 1e-8 to the variance, as verl).
        process_rewards: (B, T) the implicit PRM's token-level rewards. Required
            (declared input: the trainer passes it by keyword); values on mask-0
            tokens are ignored.
        **options: ``reward_dpo_coef`` (default 5.0, weight of the process rewards) and
            ``reward_gt_coef`` (default 5.0, weight of the outcome). Any other key
            raises TypeError.

    Returns:
        advantages: (B, T) whitened returns on valid tokens, 0 on mask-0 tokens.
        returns: (B, T) G on valid tokens (before whitening), 0 on mask-0 tokens.

    Raises:
        ValueError: ``process_rewards`` or ``index`` missing or malformed; bad shapes.
        TypeError: an unknown option, or a coefficient that is not a finite number.
    """
    reject_unknown_options("prime", options, known=OPTIONS)
    dpo_coef = _coefficient(options, "reward_dpo_coef", DEFAULT_REWARD_DPO_COEF)
    gt_coef = _coefficient(options, "reward_gt_coef", DEFAULT_REWARD_GT_COEF)
    batch = prepare_batch("prime", token_level_rewards, response_mask)
    process = _process_rewards(process_rewards, batch)
    _, _, stats = outcome_group_stats("prime", batch, index)
    if process.numel() == 0:
        return batch.finish(process, process.clone())
    combined = process_leave_one_out_(process, batch, stats.group_ids, stats.num_groups, dpo_coef)
    if gt_coef != 0:  # as verl, a source with coefficient 0 is left out
        # stats.centred is exactly 0 for groups of one and empty rows, so clamping n - 1
        # cannot leak a value, and an empty row adds 0 at its (masked) last column.
        outcome = gt_coef * (stats.centred * stats.size / (stats.size - 1).clamp(min=1))
        rows = torch.arange(batch.batch_size, device=process.device)
        combined.index_put_((rows, last_valid_index(batch)), outcome, accumulate=True)
    returns = combined.flip(-1).cumsum(-1).flip(-1).mul_(batch.mask_f)
    advantages = masked_whiten_(returns.clone(), batch.mask_f)
    return batch.finish(advantages, returns)
