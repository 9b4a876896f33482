"""Loop references of every registered policy loss, one row and one token at a time.

Each function takes (old, new, adv, mask) like the loss (``new`` with gradient), the
loss's settings by keyword and the aggregation's normalisers as ``**n``, and returns
(loss, metrics): a 0-dim float64 tensor whose autograd gradient is the reference
gradient, and the metrics it checks. verl 0.9 semantics unless the rlkit docstring
states a difference.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from algorithms.reference.aggregation_loops import (
    EPS_SEQ,
    aggregate,
    clamp,
    grid,
    masked_mean,
    valid,
    valid_positions,
    weight,
)

Normaliser = float | None
Result = tuple[Tensor, dict[str, Any]]


def _is_weight(is_w: Tensor | None, b: int, t: int) -> Tensor | float:
    return is_w[b, t] if is_w is not None else 1.0


def vanilla(
    old: Tensor,
    new: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    mode: str = "token-mean",
    low: float = 0.2,
    high: float = 0.2,
    c: float = 3.0,
    is_w: Tensor | None = None,
    **n: Normaliser,
) -> Result:
    """PPO clip with dual clip: max(−A·r, −A·clip(r)), then min(·, −A·c) where A < 0."""
    rows, length = mask.shape
    loss, clip = grid(rows, length), grid(rows, length, 0)
    lower, kl = grid(rows, length, 0), grid(rows, length, 0)
    for b in range(rows):
        for t in range(length):
            if not valid(mask, b, t):
                continue
            delta = clamp(new[b, t] - old[b, t], -20.0, 20.0)
            r = torch.exp(delta)
            a = adv[b, t]
            l1 = -a * r
            l2 = -a * clamp(r, 1 - low, 1 + high)
            pg = torch.maximum(l1, l2)
            clip[b][t] = float(l2 > l1)
            if a < 0:
                l3 = -a * c
                lower[b][t] = float(pg > l3)
                pg = torch.minimum(pg, l3)
            loss[b][t] = pg * _is_weight(is_w, b, t)
            kl[b][t] = -float(delta.detach())
    metrics = {
        "pg_clipfrac": masked_mean(clip, mask),
        "ppo_kl": masked_mean(kl, mask),
        "pg_clipfrac_lower": masked_mean(lower, mask),
    }
    return aggregate(loss, mask, mode, **n), metrics


def gspo(
    old: Tensor,
    new: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    mode: str = "token-mean",
    low: float = 0.2,
    high: float = 0.2,
    is_w: Tensor | None = None,
    **n: Normaliser,
) -> Result:
    """GSPO-token: PPO clip on s = exp(mean Δ) (value), gradient of log π per token."""
    rows, length = mask.shape
    loss, clip, kl = grid(rows, length), grid(rows, length, 0), grid(rows, length, 0)
    for b in range(rows):
        seq, count = 0.0, 0.0
        for t in range(length):
            if valid(mask, b, t):
                seq += float(new[b, t].detach() - old[b, t]) * weight(mask, b, t)
                count += weight(mask, b, t)
        seq /= max(count, 1.0)
        for t in range(length):
            if not valid(mask, b, t):
                continue
            log_s = clamp(new[b, t] - new[b, t].detach() + seq, hi=10.0)
            s = torch.exp(log_s)
            l1 = -adv[b, t] * s
            l2 = -adv[b, t] * clamp(s, 1 - low, 1 + high)
            clip[b][t] = float(l2 > l1)
            loss[b][t] = torch.maximum(l1, l2) * _is_weight(is_w, b, t)
            kl[b][t] = float(old[b, t] - new[b, t].detach())
    metrics = {"pg_clipfrac": masked_mean(clip, mask), "ppo_kl": masked_mean(kl, mask)}
    return aggregate(loss, mask, mode, **n), metrics


def covariances(adv: Tensor, new: Tensor, mask: Tensor) -> dict[tuple[int, int], float]:
    """(A − mean A)(log π − mean log π) per valid token, means over the valid tokens."""
    pos = valid_positions(mask)
    if not pos:
        return {}
    mean_a = sum(float(adv[p]) for p in pos) / len(pos)
    mean_lp = sum(float(new[p].detach()) for p in pos) / len(pos)
    return {p: (float(adv[p]) - mean_a) * (float(new[p].detach()) - mean_lp) for p in pos}


def kl_cov(
    old: Tensor,
    new: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    mode: str = "token-mean",
    ratio: float = 2e-4,
    coef: float = 0.1,
    is_w: Tensor | None = None,
    **n: Normaliser,
) -> Result:
    """−A·r, plus coef·|Δ| on the k tokens of largest covariance."""
    rows, length = mask.shape
    cov = covariances(adv, new, mask)
    k = max(1, int(len(cov) * ratio)) if cov else 0
    chosen = set(sorted(cov, key=lambda p: cov[p], reverse=True)[:k])
    loss = grid(rows, length)
    for b, t in valid_positions(mask):
        delta = clamp(new[b, t] - old[b, t], -20.0, 20.0)
        pg = -adv[b, t] * torch.exp(delta)
        if (b, t) in chosen:
            pg = pg + coef * delta.abs()
        loss[b][t] = pg * _is_weight(is_w, b, t)
    frac = len(chosen) / len(cov) if cov else 0.0
    return aggregate(loss, mask, mode, **n), {"kl_cov_frac": frac, "chosen": chosen}


def clip_cov(
    old: Tensor,
    new: Tensor,
    adv: Tensor,
    mask: Tensor,
    generator: torch.Generator,
    *,
    mode: str = "token-mean",
    low: float = 0.2,
    high: float = 0.2,
    ratio: float = 2e-4,
    lb: float = 1.0,
    ub: float = 5.0,
    is_w: Tensor | None = None,
    **n: Normaliser,
) -> Result:
    """PPO clip; k random unclipped tokens with lb < cov < ub get loss 0.

    ``generator`` draws one float64 key per candidate in row-major order (as rlkit).
    """
    rows, length = mask.shape
    cov = covariances(adv, new, mask)
    loss, clipped = grid(rows, length), {}
    for b, t in valid_positions(mask):
        r = torch.exp(clamp(new[b, t] - old[b, t], -20.0, 20.0))
        l1 = -adv[b, t] * r
        l2 = -adv[b, t] * clamp(r, 1 - low, 1 + high)
        clipped[(b, t)] = bool(l2 > l1)
        loss[b][t] = torch.maximum(l1, l2)
    candidates = [p for p in cov if not clipped[p] and lb < cov[p] < ub]  # row-major order
    k = min(max(1, int(len(cov) * ratio)), len(candidates))
    keys = torch.rand(len(candidates), generator=generator, dtype=torch.float64).tolist()
    ranked = sorted(range(len(candidates)), key=lambda i: keys[i], reverse=True)
    chosen = {candidates[i] for i in ranked[:k]}
    for b, t in valid_positions(mask):
        if (b, t) in chosen:
            loss[b][t] = loss[b][t] * 0.0
        loss[b][t] = loss[b][t] * _is_weight(is_w, b, t)
    clip_frac = sum(clipped.values()) / len(cov) if cov else 0.0
    return aggregate(loss, mask, mode, **n), {"pg_clipfrac": clip_frac, "chosen": chosen}


def cispo(
    old: Tensor,
    new: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    mode: str = "token-mean",
    low: float = 0.2,
    high: float = 0.2,
    variant: str = "verl",
    cap: float = 5.0,
    is_w: Tensor | None = None,
    **n: Normaliser,
) -> Result:
    """−sg(w)·A·log π, w = clip(r, 1 − ε_low, 1 + ε_high) (verl) or min(r, cap) (trl)."""
    rows, length = mask.shape
    loss, clip = grid(rows, length), grid(rows, length, 0)
    for b, t in valid_positions(mask):
        r = float(torch.exp(clamp(new[b, t].detach() - old[b, t], -20.0, 20.0)))
        w = min(max(r, 1 - low), 1 + high) if variant == "verl" else min(r, cap)
        clip[b][t] = float(w != r)
        loss[b][t] = -w * adv[b, t] * new[b, t] * _is_weight(is_w, b, t)
    return aggregate(loss, mask, mode, **n), {"pg_clipfrac": masked_mean(clip, mask)}


def gpg(
    old: Tensor,
    new: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    mode: str = "token-mean",
    is_w: Tensor | None = None,
    **n: Normaliser,
) -> Result:
    """REINFORCE: −A·log π."""
    rows, length = mask.shape
    loss = grid(rows, length)
    for b, t in valid_positions(mask):
        loss[b][t] = -adv[b, t] * new[b, t] * _is_weight(is_w, b, t)
    return aggregate(loss, mask, mode, **n), {}


def sapo(
    old: Tensor,
    new: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    mode: str = "token-mean",
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    is_w: Tensor | None = None,
    **n: Normaliser,
) -> Result:
    """−sigmoid(τ(r − 1))·4/τ·A, τ = tau_pos where A > 0 else tau_neg."""
    rows, length = mask.shape
    loss = grid(rows, length)
    for b, t in valid_positions(mask):
        r = torch.exp(clamp(new[b, t] - old[b, t], -20.0, 20.0))
        tau = tau_pos if adv[b, t] > 0 else tau_neg
        gate = torch.sigmoid(tau * (r - 1.0)) * (4.0 / tau)
        loss[b][t] = -gate * adv[b, t] * _is_weight(is_w, b, t)
    return aggregate(loss, mask, mode, **n), {}


def geo_mean(
    old: Tensor,
    new: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    mode: str = "token-mean",
    low: float = 0.2,
    high: float = 0.2,
    is_w: Tensor | None = None,
    **n: Normaliser,
) -> Result:
    """GMPO per sequence; the row loss is spread on each valid token for the mode."""
    rows, length = mask.shape
    seq_losses = []
    for b in range(rows):
        count = sum(weight(mask, b, t) for t in range(length) if valid(mask, b, t))
        log_r = torch.zeros((), dtype=torch.float64)
        adv_sum, log_w = 0.0, 0.0
        for t in range(length):
            if not valid(mask, b, t):
                continue
            delta = new[b, t] - old[b, t]
            lo_hi = clamp(delta, -low, high)
            a = float(adv[b, t])
            if a > 0:
                kept = torch.minimum(delta, lo_hi)
            elif a < 0:
                kept = torch.maximum(delta, lo_hi)
            else:
                kept = delta * 0.0
            log_r = log_r + kept * weight(mask, b, t)
            adv_sum += a * weight(mask, b, t)
            if is_w is not None:
                log_w += math.log(float(is_w[b, t]) + 1e-10) * weight(mask, b, t)
        seq = -(adv_sum / (count + EPS_SEQ)) * torch.exp(log_r / (count + EPS_SEQ))
        if is_w is not None:
            seq = seq * math.exp(log_w / (count + EPS_SEQ))
        seq_losses.append((seq, count))
    if mode == "seq-mean-token-mean":
        present = [s for s, c in seq_losses if c > 0]
        num_seqs = n.get("num_seqs") or max(len(present), 1)
        return sum(present, torch.zeros((), dtype=torch.float64)) / num_seqs, {}
    loss = grid(rows, length)
    for b, t in valid_positions(mask):
        loss[b][t] = seq_losses[b][0]
    return aggregate(loss, mask, mode, **n), {}
