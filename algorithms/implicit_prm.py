"""PRIME's implicit process reward model (PRM): process rewards, PRM losses, ranking metrics.

PRIME (Cui et al., "Process Reinforcement through Implicit Rewards", arXiv:2502.01456)
trains a causal LM π_φ (the PRM, initialised from the policy's SFT model) against a
frozen reference π_ref on outcome labels only. Its log-ratio per token

    q_t = log π_φ(y_t | y_<t) − log π_ref(y_t | y_<t)

is an implicit token-level reward: the PRM is trained so that β·Σ_t q_t predicts the
outcome, and β·q_t then serves the policy as a dense process reward (the estimator
``prime`` consumes it). Everything here is a pure function over (B, T) tensors, as
verl's ``recipe/prime`` computes it (``prime_dp_rm.py``: ``_forward_micro_batch``,
``prime_norm``, ``update_rm``; ``prime_core_algos.py``: ``compute_ce_dpo_loss_rm``,
``compute_detach_dpo_loss_rm``, ``compute_dpo_accuracy``, ``compute_dpo_abs_accuracy``;
``prime_fsdp_workers.py``: the metric names).

Conventions: ``response_mask`` marks the tokens that count (interior mask-0 spans are
allowed; a row's "last valid token" is its last mask-1 token, verl's
``attention_mask.sum() - 1`` for right padding); empty rows (no valid token) take part
in nothing: they get 0 rewards, add nothing to the loss and its ``num_seqs``, and are
left out of the metrics (verl averages them in). ``index`` is a (B,) integer tensor of
group ids (the trainer's ``TrainBatch.index``); verl groups rows in contiguous blocks
of ``rollout.n`` instead. Half-precision inputs are computed in float32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from algorithms.aggregation import Normaliser, aggregate_sequence_loss, masked_values

#: ``granularity`` choices (verl's ``reward_model.prime_granularity``).
GRANULARITIES = ("token", "whole")
#: ``norm`` choices (verl's ``reward_model.prime_norm``).
NORMS = ("batch_norm", "none")
#: ``loss_type`` choices (verl's ``reward_model.model.loss_type``; its BoN variants are not here).
LOSS_TYPES = ("ce", "dpo")
#: Added to the largest |return| in ``batch_norm``, as verl.
BATCH_NORM_EPS = 1e-6

#: verl's metric names (``prime_dp_rm.py`` / ``prime_fsdp_workers.py``).
METRIC_DPO_LOSS = "reward_model/dpo_loss"
METRIC_GRAD_NORM = "reward_model/grad_norm"
METRIC_LR = "rm/lr"
METRIC_REWARD = "reward_model/reward"
METRIC_RAW_REWARD = "reward_model/raw_reward"
METRIC_DPO_ACC = "reward_model/dpo_acc"
METRIC_DPO_ACC_ABS = "reward_model/dpo_acc_abs"
METRIC_DPO_ACC_BEFORE = "reward_model/dpo_acc_before"
METRIC_DPO_ACC_ABS_BEFORE = "reward_model/dpo_acc_abs_before"
METRIC_NAMES = (
    METRIC_DPO_LOSS,
    METRIC_GRAD_NORM,
    METRIC_LR,
    METRIC_REWARD,
    METRIC_RAW_REWARD,
    METRIC_DPO_ACC,
    METRIC_DPO_ACC_ABS,
    METRIC_DPO_ACC_BEFORE,
    METRIC_DPO_ACC_ABS_BEFORE,
)


# -- argument checks and masks ---------------------------------------------------------
def _compute(x: Tensor) -> Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _check_tokens(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1 or any(len(s) != 2 for s in shapes.values()):
        raise ValueError(f"expected (B, T) tensors of one shape, got {shapes}")


def _check_rows(batch: int, **tensors: Tensor) -> None:
    for name, t in tensors.items():
        if not isinstance(t, Tensor) or tuple(t.shape) != (batch,):
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a (B,) = ({batch},) tensor, got {shape}")


def _check_beta(beta: float) -> None:
    if isinstance(beta, bool) or not isinstance(beta, int | float) or not math.isfinite(beta):
        raise TypeError(f"beta must be a finite number, got {beta!r}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0 (verl's beta_train, default 0.05), got {beta!r}")


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _valid_tokens(response_mask: Tensor) -> Tensor:
    return response_mask if response_mask.dtype == torch.bool else response_mask != 0


def last_valid_token(response_mask: Tensor) -> Tensor:
    """(B, T) bool, True on the last mask-1 token of every non-empty row."""
    valid = _valid_tokens(response_mask)
    seen = valid.cumsum(-1)
    return valid & (seen == seen[:, -1:])


def sequence_sums(token_values: Tensor, response_mask: Tensor) -> Tensor:
    """(B,) Σ_t x_t m_t (mask-0 entries ignored, even NaN or inf)."""
    return masked_values(_compute(token_values), response_mask).sum(-1)


# -- implicit rewards -----------------------------------------------------------------
def implicit_q(prm_log_probs: Tensor, ref_log_probs: Tensor, response_mask: Tensor) -> Tensor:
    """The PRM's per-token log-ratio q_t = log π_φ(y_t|y_<t) − log π_ref(y_t|y_<t).

    verl's ``q`` in ``_forward_micro_batch`` (trimmed after the response there).

    Args:
        prm_log_probs: (B, T) log-probs of the sampled tokens under the PRM (with
            gradient when the loss needs it).
        ref_log_probs: (B, T) the same under the frozen reference (detached here).
        response_mask: (B, T) bool or 0/1 mask.

    Returns:
        (B, T) q on valid tokens, exactly 0 (and gradient 0) elsewhere, whatever the
        log-probs hold there (-inf included).

    Raises:
        ValueError: the shapes differ or are not (B, T).
    """
    _check_tokens(
        prm_log_probs=prm_log_probs, ref_log_probs=ref_log_probs, response_mask=response_mask
    )
    diff = _compute(prm_log_probs) - _compute(ref_log_probs).detach()
    return masked_values(diff, response_mask)


def batch_norm(token_scores: Tensor) -> Tensor:
    """verl's ``prime_norm == "batch_norm"``: x / (max_{b,t} |Σ_{t' >= t} x_{b,t'}| + 1e-6).

    One scale for the whole batch, from the largest absolute reverse cumulative sum
    (the largest return the scores could produce), so that returns stay in [-1, 1]
    while the relative sizes of the rewards are kept. verl takes the maximum over the
    rows of one data-parallel rank; pass the rows the scale should cover.

    Args:
        token_scores: (B, T) token-level scores, 0 on mask-0 tokens.

    Returns:
        (B, T) the scaled scores (an empty tensor is returned as is).
    """
    if token_scores.numel() == 0:
        return token_scores
    returns = token_scores.flip(-1).cumsum(-1).flip(-1)
    return token_scores / (returns.abs().max() + BATCH_NORM_EPS)


@torch.no_grad()
def implicit_process_rewards(
    prm_log_probs: Tensor,
    ref_log_probs: Tensor,
    response_mask: Tensor,
    *,
    beta: float,
    granularity: str = "token",
    norm: str = "batch_norm",
    include_last_token: bool = False,
) -> Tensor:
    """The policy's process rewards from the implicit PRM: r_t = β·q_t, placed and normalised.

    PRIME (arXiv:2502.01456): r_φ(y_t) = β log π_φ(y_t|y_<t) / π_ref(y_t|y_<t).
    verl (``_forward_micro_batch`` with ``lambda = 0``, then ``prime_norm``):

    * ``granularity="token"``: r_t on every valid token except the row's last valid
      one, which gets 0 (verl writes ``r[:, :len - 1]``; the original PRIME code and
      ``include_last_token=True`` keep the last token's reward too);
    * ``granularity="whole"``: Σ_t r_t over all valid tokens, on the last valid token
      (what verl's assignment of the row slice ``r[i, :len]`` means; as written it
      fails for rows longer than one token);
    * ``norm="batch_norm"``: then :func:`batch_norm` over the batch; ``"none"``: as is.

    verl's ``lambda != 0`` (a GAE-style sum of q with the outcome on the last token)
    is not implemented.

    Args:
        prm_log_probs: (B, T) PRM log-probs of the sampled tokens.
        ref_log_probs: (B, T) reference log-probs.
        response_mask: (B, T) bool or 0/1 mask.
        beta: β > 0 (verl's ``beta_train``, default 0.05).
        granularity: ``"token"`` or ``"whole"``.
        norm: ``"batch_norm"`` or ``"none"``.
        include_last_token: keep r on the last valid token with ``"token"`` granularity.

    Returns:
        (B, T) process rewards (verl's ``rm_scores``), 0 on mask-0 tokens and empty
        rows, in the log-probs' dtype (float32 for half precision), no gradient.

    Raises:
        ValueError: shapes differ; unknown granularity or norm; beta <= 0.
        TypeError: beta is not a finite number.
    """
    _check_beta(beta)
    _choice("granularity", granularity, GRANULARITIES)
    _choice("norm", norm, NORMS)
    rewards = beta * implicit_q(prm_log_probs, ref_log_probs, response_mask)
    last = last_valid_token(response_mask)
    if granularity == "whole":
        scores = torch.where(last, rewards.sum(-1, keepdim=True), 0.0)
    elif include_last_token:
        scores = rewards
    else:
        scores = torch.where(last, 0.0, rewards)
    return batch_norm(scores) if norm == "batch_norm" else scores


# -- the PRM's losses -----------------------------------------------------------------
@torch.no_grad()
def dpo_opponent_q(q: Tensor, acc: Tensor, response_mask: Tensor, index: Tensor) -> Tensor:
    """The detached DPO baseline of each row: mean Σ_t q of its group's other-outcome rows.

    verl's ``Q_bc`` / ``acc_bc`` in ``compute_detach_dpo_loss_rm``: for a row with
    acc_i > 0 the mean of Q_j = Σ_t q_{j,t} over the rows j of its group with
    acc_j < acc_i, else over those with acc_j > acc_i; 0 when there is none. Compute it
    once on the whole batch before the PRM update (verl's ``update="reverse"``: score,
    then update), so that micro-batches see their group mates' scores.

    Args:
        q: (B, T) :func:`implicit_q` before the update (no gradient needed).
        acc: (B,) outcome correctness.
        response_mask: (B, T) mask; empty rows are never anyone's opponent.
        index: (B,) integer group ids.

    Returns:
        (B,) the opponents' mean Q (not β-scaled), 0 for rows without an opponent
        and for empty rows.

    Raises:
        ValueError: shapes do not match.
    """
    _check_tokens(q=q, response_mask=response_mask)
    _check_rows(q.shape[0], acc=acc, index=index)
    seq_q = sequence_sums(q.detach(), response_mask)
    acc = acc.to(seq_q.dtype)
    valid = _valid_tokens(response_mask).any(-1)
    same = (index[:, None] == index[None, :]) & valid[None, :] & valid[:, None]
    below, above = acc[None, :] < acc[:, None], acc[None, :] > acc[:, None]
    chosen = same & torch.where(acc[:, None] > 0, below, above)
    weights = chosen.to(seq_q.dtype)
    count = weights.sum(-1)
    return torch.where(count > 0, (weights @ seq_q) / count.clamp(min=1), 0.0)


def implicit_prm_loss(
    prm_log_probs: Tensor,
    ref_log_probs: Tensor,
    response_mask: Tensor,
    acc: Tensor,
    *,
    beta: float,
    loss_type: str = "ce",
    opponent_q: Tensor | None = None,
    num_seqs: Normaliser = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The implicit PRM's loss on outcome labels, normalised by the mini-batch's ``num_seqs``.

    With Q_b = Σ_t q_{b,t} m_{b,t} (:func:`implicit_q`, differentiable in the PRM):

    * ``"ce"`` (PRIME's cross-entropy, verl ``compute_ce_dpo_loss_rm``), a = acc_b in [0, 1]:
      ℓ_b = −[a log σ(β Q_b) + (1 − a) log(1 − σ(β Q_b))]
    * ``"dpo"`` (verl ``compute_detach_dpo_loss_rm`` with ``bon_mode="none"``), with
      Q̄_b = ``opponent_q`` (:func:`dpo_opponent_q`, detached) and s_b = +1 if
      acc_b > 0 else −1: ℓ_b = −log σ(β (Q_b − Q̄_b) s_b)

    loss = Σ_b ℓ_b [row b non-empty] / num_seqs.

    Micro-batches: pass the mini-batch's number of non-empty rows as ``num_seqs``
    (``Algorithm.normalisers``' ``num_seqs``); then the micro-batch losses, values and
    gradients, sum to the whole mini-batch's loss. verl takes each micro-batch's mean
    and divides it by the number of micro-batches, the same for equal-sized
    micro-batches without empty rows; its dynamic-batch branch scales by a length
    that is always 1 (a bug, not reproduced). ``num_seqs=None`` uses this call's
    non-empty rows (right when the call sees the whole mini-batch).

    Deliberate difference: σ and the logs are fused into ``softplus`` (BCE with
    logits), exact for every β Q; verl's ``binary_cross_entropy(sigmoid(z))`` clamps
    each log at −100 and saturates once σ rounds to 1 (|z| > ~17 in float32).

    Args:
        prm_log_probs: (B, T) PRM log-probs with gradient.
        ref_log_probs: (B, T) reference log-probs.
        response_mask: (B, T) bool or 0/1 mask.
        acc: (B,) outcome correctness (0/1, or in [0, 1] for ``"ce"``).
        beta: β > 0 (verl's ``beta_train``).
        loss_type: ``"ce"`` or ``"dpo"``.
        opponent_q: (B,) required for ``"dpo"``, ignored for ``"ce"``.
        num_seqs: the mini-batch's number of non-empty rows (>= 1); default: this call's.

    Returns:
        loss: 0-dim tensor, differentiable in ``prm_log_probs``.
        metrics: ``reward_model/dpo_loss`` (verl's name for either type): the loss,
            detached; it sums over the micro-batches of a mini-batch.

    Raises:
        ValueError: shapes do not match; unknown loss_type; ``opponent_q`` missing
            for ``"dpo"``; beta <= 0; a bad ``num_seqs``.
        TypeError: beta is not a finite number.
    """
    _check_beta(beta)
    _choice("loss_type", loss_type, LOSS_TYPES)
    q = implicit_q(prm_log_probs, ref_log_probs, response_mask)
    _check_rows(q.shape[0], acc=acc)
    logits = beta * q.sum(-1)
    target = acc.to(logits.dtype)
    if loss_type == "ce":
        per_row = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    else:
        if opponent_q is None:
            raise ValueError(
                "loss_type 'dpo' needs opponent_q (B,): dpo_opponent_q(q, acc, mask, index) "
                "computed on the whole batch before the PRM update"
            )
        _check_rows(q.shape[0], opponent_q=opponent_q)
        sign = torch.where(target > 0, 1.0, -1.0).to(logits.dtype)
        margin = (logits - beta * opponent_q.detach().to(logits.dtype)) * sign
        per_row = F.softplus(-margin)  # -log sigmoid(margin), stable
    loss = aggregate_sequence_loss(per_row, response_mask, "seq-mean-token-mean", num_seqs=num_seqs)
    return loss, {METRIC_DPO_LOSS: loss.detach()}


# -- ranking metrics ------------------------------------------------------------------
#: The accuracy reported when there is nothing to rank (chance level).
NO_PAIRS_ACCURACY = 0.5


@torch.no_grad()
def compute_dpo_accuracy(
    token_level_scores: Tensor, acc: Tensor, response_mask: Tensor, index: Tensor
) -> Tensor:
    """Pairwise ranking accuracy of the PRM within groups, weighted by the outcome gap.

    verl ``compute_dpo_accuracy``: with S_i = Σ_t x_{i,t} m_{i,t}, for every pair i < j
    (row order) of one group, Δa = acc_i − acc_j and ΔS = S_i − S_j; the group's
    accuracy is Σ [(ΔS > 0) = (Δa > 0)] |Δa| / Σ |Δa|, or 0.5 when Σ |Δa| = 0 (all
    outcomes equal, or one row); the result is the mean over groups. As in verl a tie
    ΔS = 0 counts as right exactly when Δa < 0, so ties depend on the row order.

    Args:
        token_level_scores: (B, T) the PRM's token scores (verl passes the process
            rewards ``rm_scores``).
        acc: (B,) outcome correctness.
        response_mask: (B, T) mask; empty rows are left out (of pairs and groups).
        index: (B,) integer group ids (verl: contiguous blocks of ``n``).

    Returns:
        0-dim float64 tensor in [0, 1]; 0.5 when no group has a non-empty row.

    Raises:
        ValueError: shapes do not match.
    """
    _check_tokens(token_level_scores=token_level_scores, response_mask=response_mask)
    _check_rows(token_level_scores.shape[0], acc=acc, index=index)
    scores = sequence_sums(token_level_scores, response_mask)
    acc = acc.to(scores.dtype)
    valid = _valid_tokens(response_mask).any(-1)
    rows = torch.arange(scores.shape[0], device=scores.device)
    pairs = (index[:, None] == index[None, :]) & (rows[:, None] < rows[None, :])
    pairs &= valid[:, None] & valid[None, :]
    acc_gap = acc[:, None] - acc[None, :]
    right = (scores[:, None] - scores[None, :] > 0) == (acc_gap > 0)
    weight = torch.where(pairs, acc_gap.abs(), 0.0).to(torch.float64)
    groups, group_of = torch.unique(index, return_inverse=True)
    totals = torch.zeros(groups.numel(), 2, dtype=torch.float64, device=scores.device)
    per_row = torch.stack([(weight * right).sum(-1), weight.sum(-1)], dim=-1)
    totals.index_add_(0, group_of, per_row)
    present = torch.zeros(groups.numel(), dtype=torch.bool, device=scores.device)
    present.index_fill_(0, group_of[valid], True)
    numerator, denominator = totals.unbind(-1)
    ranked = denominator > 0
    accuracy = torch.where(
        ranked, numerator / torch.where(ranked, denominator, 1.0), NO_PAIRS_ACCURACY
    )
    if not bool(present.any()):
        return torch.tensor(NO_PAIRS_ACCURACY, dtype=torch.float64, device=scores.device)
    return accuracy[present].mean()


@torch.no_grad()
def compute_dpo_abs_accuracy(
    token_level_scores: Tensor, acc: Tensor, response_mask: Tensor
) -> Tensor:
    """Fraction of responses whose summed PRM score has the outcome's sign.

    verl ``compute_dpo_abs_accuracy``: mean over rows of [sign(S_i) = sign(2 acc_i − 1)]
    with S_i = Σ_t x_{i,t} m_{i,t} (a score of exactly 0 matches neither 0 nor 1).

    Args:
        token_level_scores: (B, T) the PRM's token scores.
        acc: (B,) outcome correctness.
        response_mask: (B, T) mask; empty rows are left out.

    Returns:
        0-dim float64 tensor in [0, 1]; 0.5 when no row is non-empty.

    Raises:
        ValueError: shapes do not match.
    """
    _check_tokens(token_level_scores=token_level_scores, response_mask=response_mask)
    _check_rows(token_level_scores.shape[0], acc=acc)
    scores = sequence_sums(token_level_scores, response_mask)
    valid = _valid_tokens(response_mask).any(-1)
    hit = torch.sign(scores) == torch.sign(acc.to(scores.dtype) * 2 - 1)
    count = valid.sum()
    if int(count) == 0:
        return torch.tensor(NO_PAIRS_ACCURACY, dtype=torch.float64, device=scores.device)
    return (hit & valid).sum().to(torch.float64) / count


@torch.no_grad()
def reward_model_metrics(
    process_rewards: Tensor,
    q: Tensor,
    acc: Tensor,
    response_mask: Tensor,
    index: Tensor,
    *,
    before_update: bool = False,
) -> dict[str, Tensor]:
    """verl's PRM metrics of one scoring pass.

    Args:
        process_rewards: (B, T) :func:`implicit_process_rewards` (verl's ``rm_scores``).
        q: (B, T) :func:`implicit_q` of the same pass.
        acc: (B,) outcome correctness.
        response_mask: (B, T) mask.
        index: (B,) integer group ids.
        before_update: the scores come from the forward of the update itself (verl's
            ``update_rm``): the accuracies get verl's ``_before`` names.

    Returns:
        0-dim detached tensors: ``reward_model/reward`` (mean Σ_t process reward per
        non-empty row), ``reward_model/raw_reward`` (mean Σ_t q), and
        ``reward_model/dpo_acc`` / ``reward_model/dpo_acc_abs`` (or
        ``..._before``) from :func:`compute_dpo_accuracy` and
        :func:`compute_dpo_abs_accuracy` on the process rewards, as verl.
    """
    valid = _valid_tokens(response_mask).any(-1)
    rows = valid.sum().clamp(min=1)

    def row_mean(x: Tensor) -> Tensor:
        return torch.where(valid, sequence_sums(x, response_mask), 0.0).sum() / rows

    pairwise = compute_dpo_accuracy(process_rewards, acc, response_mask, index)
    absolute = compute_dpo_abs_accuracy(process_rewards, acc, response_mask)
    pairwise_name, absolute_name = (
        (METRIC_DPO_ACC_BEFORE, METRIC_DPO_ACC_ABS_BEFORE)
        if before_update
        else (METRIC_DPO_ACC, METRIC_DPO_ACC_ABS)
    )
    return {
        METRIC_REWARD: row_mean(process_rewards),
        METRIC_RAW_REWARD: row_mean(q.detach()),
        pairwise_name: pairwise,
        absolute_name: absolute,
    }
