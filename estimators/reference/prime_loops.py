"""Loop references of PRIME's math, as verl's ``recipe/prime`` writes it.

One group, one row and one token at a time, in float64 Python arithmetic (0-dim
tensors where autograd must give reference gradients). Written from the formulas of
``prime_core_algos.py`` (``masked_rloo`` inside ``compute_rloo_advantage_return``,
``compute_ce_dpo_loss_rm``, ``compute_detach_dpo_loss_rm``, ``compute_dpo_accuracy``,
``compute_dpo_abs_accuracy``) and ``prime_dp_rm.py`` (the token scores of
``_forward_micro_batch``, ``prime_norm``), in verl's own arrangement (verl's
``masked_rloo`` is p·n/(n−1) − Σ_j μ_j/(n−1), not the centred form rlkit computes).

Groups are the rows sharing ``index`` (verl: contiguous blocks of ``n``). Where verl
has no number (a group of one divides by n − 1 = 0, an empty row averages nothing,
whitening fewer than two tokens divides by zero) these loops take rlkit's documented
choice, marked "rlkit:" below. Slow by design: tiny inputs only.

Both halves of PRIME live here, the advantage estimator (``prime_advantages``) and
the implicit PRM's rewards, losses and accuracies (``algorithms.implicit_prm``'s
references), because :func:`estimators.reference.estimator_loops.call` needs the
former and ``estimators`` does not import ``algorithms`` (docs/architecture.md).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch
from torch import Tensor


def _groups(index: Any, rows: list[int]) -> dict[Any, list[int]]:
    out: dict[Any, list[int]] = defaultdict(list)
    for i in rows:
        out[index[i].item() if isinstance(index, Tensor) else index[i]].append(i)
    return out


def _valid_positions(mask: Tensor, i: int) -> list[int]:
    return [t for t in range(mask.shape[1]) if bool(mask[i, t] != 0)]


def _non_empty(mask: Tensor) -> list[int]:
    return [i for i in range(mask.shape[0]) if _valid_positions(mask, i)]


# -- the estimator --------------------------------------------------------------------
def masked_rloo(
    values: list[list[float]], masks: list[list[bool]], index: Any
) -> list[list[float]]:
    """verl ``masked_rloo``: per row the mean of its masked values; baseline Σ means / (n−1);
    masked values become v·n/(n−1) − baseline, the rest 0."""
    b = len(values)
    out = [[0.0] * len(row) for row in values]
    rows = [i for i in range(b) if any(masks[i])]  # rlkit: empty rows take no part
    for group in _groups(index, rows).values():
        n = len(group)
        if n < 2:
            continue  # rlkit: a group of one contributes 0 (verl divides by n - 1 = 0)
        means = []
        for i in group:
            picked = [v for v, m in zip(values[i], masks[i]) if m]
            means.append(sum(picked) / len(picked))
        baseline = sum(means) / (n - 1)
        for i in group:
            for t, m in enumerate(masks[i]):
                if m:
                    out[i][t] = values[i][t] * n / (n - 1) - baseline
    return out


def whiten(values: list[list[float]], masks: list[list[bool]]) -> list[list[float]]:
    """verl ``masked_whiten``: (x − mean)·rsqrt(var·N/(N−1) + 1e-8) over mask-1 entries,
    means dividing by N + 1e-8; 0 on mask-0 entries."""
    picked = [v for row, mrow in zip(values, masks) for v, m in zip(row, mrow) if m]
    count = len(picked)
    if count < 2:  # rlkit: centre only (verl divides by zero)
        mean = sum(picked) / count if count else 0.0
        return [[v - mean if m else 0.0 for v, m in zip(r, mr)] for r, mr in zip(values, masks)]
    mean = sum(picked) / (count + 1e-8)
    variance = sum((v - mean) ** 2 for v in picked) / (count + 1e-8)
    variance = variance * count / (count - 1)
    scale = 1.0 / math.sqrt(variance + 1e-8)
    return [
        [(v - mean) * scale if m else 0.0 for v, m in zip(r, mr)] for r, mr in zip(values, masks)
    ]


def prime_advantages(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Any,
    process_rewards: Tensor,
    reward_dpo_coef: float = 5.0,
    reward_gt_coef: float = 5.0,
) -> tuple[Tensor, Tensor]:
    """verl ``compute_rloo_advantage_return``: RLOO per source, weighted sum, reverse
    cumulative returns, whitened. The outcome ``acc`` of a row is its reward sum, put on
    its last valid token (verl: ``acc`` at ``valid_response_length - 1``)."""
    b, t_len = response_mask.shape
    mask = (response_mask != 0).tolist()
    given, rewards = process_rewards.double().tolist(), token_level_rewards.double().tolist()
    process = [[given[i][t] if mask[i][t] else 0.0 for t in range(t_len)] for i in range(b)]
    outcome = [[0.0] * t_len for _ in range(b)]
    outcome_mask = [[False] * t_len for _ in range(b)]
    for i in range(b):
        valid = [t for t in range(t_len) if mask[i][t]]
        if valid:
            acc = sum(rewards[i][t] for t in valid)
            outcome[i][valid[-1]] = acc
            outcome_mask[i][valid[-1]] = True
    from_process = masked_rloo(process, mask, index)
    from_outcome = masked_rloo(outcome, outcome_mask, index)
    returns = [[0.0] * t_len for _ in range(b)]
    for i in range(b):
        running = 0.0
        for t in reversed(range(t_len)):
            reward = reward_dpo_coef * from_process[i][t] + reward_gt_coef * from_outcome[i][t]
            running += reward * mask[i][t]
            returns[i][t] = running if mask[i][t] else 0.0
    advantages = whiten(returns, mask)
    dtype = token_level_rewards.dtype
    return torch.tensor(advantages, dtype=dtype), torch.tensor(returns, dtype=dtype)


# -- the implicit PRM -----------------------------------------------------------------
def implicit_process_rewards(
    prm_log_probs: Tensor,
    ref_log_probs: Tensor,
    response_mask: Tensor,
    beta: float,
    granularity: str = "token",
    norm: str = "batch_norm",
    include_last_token: bool = False,
) -> Tensor:
    """``_forward_micro_batch`` (lambda = 0) then ``prime_norm``, token by token."""
    b, t_len = response_mask.shape
    scores = [[0.0] * t_len for _ in range(b)]
    for i in range(b):
        valid = _valid_positions(response_mask, i)
        r = {t: beta * (float(prm_log_probs[i, t]) - float(ref_log_probs[i, t])) for t in valid}
        if not valid:
            continue
        if granularity == "whole":
            scores[i][valid[-1]] = sum(r.values())
        else:
            for t in valid if include_last_token else valid[:-1]:
                scores[i][t] = r[t]
    if norm == "batch_norm":
        largest = 0.0
        for row in scores:
            running = 0.0
            for t in reversed(range(t_len)):
                running += row[t]
                largest = max(largest, abs(running))
        scores = [[x / (largest + 1e-6) for x in row] for row in scores]
    return torch.tensor(scores, dtype=torch.float64)


def _sequence_q(prm_log_probs: Tensor, ref_log_probs: Tensor, mask: Tensor, i: int) -> Tensor:
    total = torch.zeros((), dtype=torch.float64)
    for t in _valid_positions(mask, i):
        total = total + (prm_log_probs[i, t] - ref_log_probs[i, t])
    return total


def ce_loss(
    prm_log_probs: Tensor,
    ref_log_probs: Tensor,
    mask: Tensor,
    acc: Tensor,
    beta: float,
    num_seqs: float | None = None,
) -> Tensor:
    """``compute_ce_dpo_loss_rm``: BCE(σ(β Σ_t q_t), acc), summed over non-empty rows / num_seqs."""
    rows = _non_empty(mask)
    total = torch.zeros((), dtype=torch.float64)
    for i in rows:
        p = torch.sigmoid(beta * _sequence_q(prm_log_probs, ref_log_probs, mask, i))
        a = float(acc[i])
        total = total - (a * torch.log(p) + (1 - a) * torch.log(1 - p))
    return total / (num_seqs if num_seqs is not None else max(len(rows), 1))


def opponent_q(q: Tensor, acc: Tensor, mask: Tensor, index: Any) -> list[float]:
    """``Q_bc`` / ``acc_bc`` of ``compute_detach_dpo_loss_rm``: the mean Σ_t q of the group's
    rows with lower acc (for acc > 0) or higher acc (otherwise); 0 if none."""
    rows = _non_empty(mask)
    sums = {i: sum(float(q[i, t]) for t in _valid_positions(mask, i)) for i in rows}
    out = [0.0] * mask.shape[0]
    for group in _groups(index, rows).values():
        for i in group:
            if acc[i] > 0:
                chosen = [sums[j] for j in group if acc[j] < acc[i]]
            else:
                chosen = [sums[j] for j in group if acc[j] > acc[i]]
            out[i] = sum(chosen) / len(chosen) if chosen else 0.0
    return out


def dpo_loss(
    prm_log_probs: Tensor,
    ref_log_probs: Tensor,
    mask: Tensor,
    acc: Tensor,
    opponents: list[float],
    beta: float,
    num_seqs: float | None = None,
) -> Tensor:
    """``compute_detach_dpo_loss_rm`` (``bon_mode="none"``): −log σ((βQ − βQ̄)·(±1))."""
    rows = _non_empty(mask)
    total = torch.zeros((), dtype=torch.float64)
    for i in rows:
        cur = beta * _sequence_q(prm_log_probs, ref_log_probs, mask, i)
        other = opponents[i] * beta
        sign = 1.0 if acc[i] > 0 else -1.0
        total = total - torch.log(torch.sigmoid((cur - other) * sign))
    return total / (num_seqs if num_seqs is not None else max(len(rows), 1))


def dpo_accuracy(scores: Tensor, acc: Tensor, mask: Tensor, index: Any) -> float:
    """``compute_dpo_accuracy``: per group, pairs i < j weighted by |acc_i − acc_j|; mean of groups."""
    rows = _non_empty(mask)
    sums = {i: sum(float(scores[i, t]) for t in _valid_positions(mask, i)) for i in rows}
    per_group = []
    for group in _groups(index, rows).values():
        right, weight = 0.0, 0.0
        for a, i in enumerate(group):
            for j in group[a + 1 :]:
                acc_gap = float(acc[i]) - float(acc[j])
                score_gap = sums[i] - sums[j]
                right += ((score_gap > 0) == (acc_gap > 0)) * abs(acc_gap)
                weight += abs(acc_gap)
        per_group.append(0.5 if weight == 0 else right / weight)
    return sum(per_group) / len(per_group) if per_group else 0.5


def dpo_abs_accuracy(scores: Tensor, acc: Tensor, mask: Tensor) -> float:
    """``compute_dpo_abs_accuracy``: share of rows with sign(Σ_t score) = sign(2·acc − 1)."""

    def sign(x: float) -> int:
        return (x > 0) - (x < 0)

    rows = _non_empty(mask)
    hits = [
        sign(sum(float(scores[i, t]) for t in _valid_positions(mask, i)))
        == sign(2 * float(acc[i]) - 1)
        for i in rows
    ]
    return sum(hits) / len(hits) if hits else 0.5
