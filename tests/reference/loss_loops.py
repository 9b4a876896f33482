"""Straightforward loop references for the policy losses and their helpers.

Each function follows the written formula (verl 0.9 semantics unless the rlkit
docstring states a difference) one row and one token at a time, with 0-dim
tensor arithmetic so that autograd gives reference gradients too. Slow on
purpose: readable, obviously right, used only on tiny inputs (and timed on a
sub-batch by ``benchmarks/losses.py``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

EPS_SEQ = 1e-8


def _valid(mask: Tensor, b: int, t: int) -> bool:
    return bool(mask[b, t] != 0)


def _weight(mask: Tensor, b: int, t: int) -> float:
    return float(mask[b, t])


# -- aggregation -------------------------------------------------------------------
def aggregate(
    loss: list[list[Tensor | None]],
    mask: Tensor,
    mode: str,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
) -> Tensor:
    """Aggregate a nested list of per-token 0-dim losses (None at padding)."""
    B, T = mask.shape
    total = torch.zeros((), dtype=torch.float64)
    row_sums, row_counts = [], []
    for b in range(B):
        row, count = torch.zeros((), dtype=torch.float64), 0.0
        for t in range(T):
            if _valid(mask, b, t):
                row = row + loss[b][t] * _weight(mask, b, t)
                count += _weight(mask, b, t)
        row_sums.append(row)
        row_counts.append(count)
        total = total + row
    if num_tokens is None:
        num_tokens = sum(row_counts)
    if num_seqs is None:
        num_seqs = sum(1 for c in row_counts if c > 0)
    if norm_length is None:
        norm_length = T
    num_tokens = num_tokens if num_tokens > 0 else 1
    num_seqs = num_seqs if num_seqs > 0 else 1
    if mode == "token-mean":
        return total / num_tokens
    if mode == "token-sum":
        return total
    if mode == "seq-mean-token-sum":
        return total / num_seqs
    if mode == "seq-mean-token-sum-norm":
        return total / num_seqs / norm_length
    if mode == "seq-mean-token-mean":
        acc = torch.zeros((), dtype=torch.float64)
        for row, count in zip(row_sums, row_counts):
            acc = acc + row / (count + EPS_SEQ)
        return acc / num_seqs
    raise ValueError(mode)


def masked_mean(values: list[list[float]], mask: Tensor) -> float:
    """Mean of a nested list of floats over valid tokens (0 when none)."""
    B, T = mask.shape
    num = den = 0.0
    for b in range(B):
        for t in range(T):
            if _valid(mask, b, t):
                num += float(values[b][t]) * _weight(mask, b, t)
                den += _weight(mask, b, t)
    return num / den if den > 0 else 0.0


def _grid(B: int, T: int, fill: object = None) -> list[list]:
    return [[fill for _ in range(T)] for _ in range(B)]


def _clamp(x: Tensor, lo: float | None = None, hi: float | None = None) -> Tensor:
    return torch.clamp(x, min=lo, max=hi)


# -- policy losses --------------------------------------------------------------------
def vanilla(old, new, adv, mask, *, mode="token-mean", low=0.2, high=0.2, c=3.0, is_w=None, **n):
    B, T = mask.shape
    loss, clip, lower, kl = _grid(B, T), _grid(B, T, 0), _grid(B, T, 0), _grid(B, T, 0)
    for b in range(B):
        for t in range(T):
            if not _valid(mask, b, t):
                continue
            delta = _clamp(new[b, t] - old[b, t], -20.0, 20.0)
            r = torch.exp(delta)
            a = adv[b, t]
            l1 = -a * r
            l2 = -a * _clamp(r, 1 - low, 1 + high)
            pg = torch.maximum(l1, l2)
            clip[b][t] = float(l2 > l1)
            if a < 0:
                l3 = -a * c
                lower[b][t] = float(pg > l3)
                pg = torch.minimum(pg, l3)
            loss[b][t] = pg * (is_w[b, t] if is_w is not None else 1.0)
            kl[b][t] = -float(delta.detach())
    metrics = {
        "pg_clipfrac": masked_mean(clip, mask),
        "ppo_kl": masked_mean(kl, mask),
        "pg_clipfrac_lower": masked_mean(lower, mask),
    }
    return aggregate(loss, mask, mode, **n), metrics


def gspo(old, new, adv, mask, *, mode="token-mean", low=0.2, high=0.2, is_w=None, **n):
    B, T = mask.shape
    loss, clip, kl = _grid(B, T), _grid(B, T, 0), _grid(B, T, 0)
    for b in range(B):
        seq, count = 0.0, 0.0
        for t in range(T):
            if _valid(mask, b, t):
                seq += float(new[b, t].detach() - old[b, t]) * _weight(mask, b, t)
                count += _weight(mask, b, t)
        seq /= max(count, 1.0)
        for t in range(T):
            if not _valid(mask, b, t):
                continue
            log_s = _clamp(new[b, t] - new[b, t].detach() + seq, hi=10.0)
            s = torch.exp(log_s)
            l1 = -adv[b, t] * s
            l2 = -adv[b, t] * _clamp(s, 1 - low, 1 + high)
            clip[b][t] = float(l2 > l1)
            w = is_w[b, t] if is_w is not None else 1.0
            loss[b][t] = torch.maximum(l1, l2) * w
            kl[b][t] = float(old[b, t] - new[b, t].detach())
    metrics = {"pg_clipfrac": masked_mean(clip, mask), "ppo_kl": masked_mean(kl, mask)}
    return aggregate(loss, mask, mode, **n), metrics


def _valid_positions(mask: Tensor) -> list[tuple[int, int]]:
    B, T = mask.shape
    return [(b, t) for b in range(B) for t in range(T) if _valid(mask, b, t)]


def covariances(adv: Tensor, new: Tensor, mask: Tensor) -> dict[tuple[int, int], float]:
    pos = _valid_positions(mask)
    if not pos:
        return {}
    mean_a = sum(float(adv[p]) for p in pos) / len(pos)
    mean_lp = sum(float(new[p].detach()) for p in pos) / len(pos)
    return {p: (float(adv[p]) - mean_a) * (float(new[p].detach()) - mean_lp) for p in pos}


def kl_cov(old, new, adv, mask, *, mode="token-mean", ratio=2e-4, coef=0.1, is_w=None, **n):
    B, T = mask.shape
    cov = covariances(adv, new, mask)
    k = max(1, int(len(cov) * ratio)) if cov else 0
    chosen = set(sorted(cov, key=lambda p: cov[p], reverse=True)[:k])
    loss = _grid(B, T)
    for b, t in _valid_positions(mask):
        delta = _clamp(new[b, t] - old[b, t], -20.0, 20.0)
        pg = -adv[b, t] * torch.exp(delta)
        if (b, t) in chosen:
            pg = pg + coef * delta.abs()
        loss[b][t] = pg * (is_w[b, t] if is_w is not None else 1.0)
    frac = len(chosen) / len(cov) if cov else 0.0
    return aggregate(loss, mask, mode, **n), {"kl_cov_frac": frac, "chosen": chosen}


def clip_cov(
    old, new, adv, mask, generator, *, mode="token-mean", low=0.2, high=0.2, ratio=2e-4,
    lb=1.0, ub=5.0, is_w=None, **n,
):  # fmt: skip
    """``generator`` draws one float64 key per candidate in row-major order (as rlkit)."""
    B, T = mask.shape
    cov = covariances(adv, new, mask)
    loss, clipped = _grid(B, T), {}
    for b, t in _valid_positions(mask):
        r = torch.exp(_clamp(new[b, t] - old[b, t], -20.0, 20.0))
        l1 = -adv[b, t] * r
        l2 = -adv[b, t] * _clamp(r, 1 - low, 1 + high)
        clipped[(b, t)] = bool(l2 > l1)
        loss[b][t] = torch.maximum(l1, l2)
    candidates = [p for p in cov if not clipped[p] and lb < cov[p] < ub]  # row-major order
    k = min(max(1, int(len(cov) * ratio)), len(candidates))
    keys = torch.rand(len(candidates), generator=generator, dtype=torch.float64).tolist()
    ranked = sorted(range(len(candidates)), key=lambda i: keys[i], reverse=True)
    chosen = {candidates[i] for i in ranked[:k]}
    for b, t in _valid_positions(mask):
        if (b, t) in chosen:
            loss[b][t] = loss[b][t] * 0.0
        loss[b][t] = loss[b][t] * (is_w[b, t] if is_w is not None else 1.0)
    clip_frac = sum(clipped.values()) / len(cov) if cov else 0.0
    return aggregate(loss, mask, mode, **n), {"pg_clipfrac": clip_frac, "chosen": chosen}


def cispo(
    old, new, adv, mask, *, mode="token-mean", low=0.2, high=0.2, variant="verl", cap=5.0,
    is_w=None, **n,
):  # fmt: skip
    B, T = mask.shape
    loss, clip = _grid(B, T), _grid(B, T, 0)
    for b, t in _valid_positions(mask):
        r = float(torch.exp(_clamp(new[b, t].detach() - old[b, t], -20.0, 20.0)))
        w = min(max(r, 1 - low), 1 + high) if variant == "verl" else min(r, cap)
        clip[b][t] = float(w != r)
        loss[b][t] = -w * adv[b, t] * new[b, t] * (is_w[b, t] if is_w is not None else 1.0)
    return aggregate(loss, mask, mode, **n), {"pg_clipfrac": masked_mean(clip, mask)}


def gpg(old, new, adv, mask, *, mode="token-mean", is_w=None, **n):
    B, T = mask.shape
    loss = _grid(B, T)
    for b, t in _valid_positions(mask):
        loss[b][t] = -adv[b, t] * new[b, t] * (is_w[b, t] if is_w is not None else 1.0)
    return aggregate(loss, mask, mode, **n), {}


def sapo(old, new, adv, mask, *, mode="token-mean", tau_pos=1.0, tau_neg=1.05, is_w=None, **n):
    B, T = mask.shape
    loss = _grid(B, T)
    for b, t in _valid_positions(mask):
        r = torch.exp(_clamp(new[b, t] - old[b, t], -20.0, 20.0))
        tau = tau_pos if adv[b, t] > 0 else tau_neg
        gate = torch.sigmoid(tau * (r - 1.0)) * (4.0 / tau)
        loss[b][t] = -gate * adv[b, t] * (is_w[b, t] if is_w is not None else 1.0)
    return aggregate(loss, mask, mode, **n), {}


def geo_mean(old, new, adv, mask, *, mode="token-mean", low=0.2, high=0.2, is_w=None, **n):
    """GMPO per sequence; the row loss is spread on each valid token for the mode."""
    B, T = mask.shape
    seq_losses = []
    for b in range(B):
        count = sum(_weight(mask, b, t) for t in range(T) if _valid(mask, b, t))
        log_r = torch.zeros((), dtype=torch.float64)
        adv_sum, log_w = 0.0, 0.0
        for t in range(T):
            if not _valid(mask, b, t):
                continue
            delta = new[b, t] - old[b, t]
            lo_hi = _clamp(delta, -low, high)
            a = float(adv[b, t])
            if a > 0:
                kept = torch.minimum(delta, lo_hi)
            elif a < 0:
                kept = torch.maximum(delta, lo_hi)
            else:
                kept = delta * 0.0
            log_r = log_r + kept * _weight(mask, b, t)
            adv_sum += a * _weight(mask, b, t)
            if is_w is not None:
                log_w += math.log(float(is_w[b, t]) + 1e-10) * _weight(mask, b, t)
        seq = -(adv_sum / (count + EPS_SEQ)) * torch.exp(log_r / (count + EPS_SEQ))
        if is_w is not None:
            seq = seq * math.exp(log_w / (count + EPS_SEQ))
        seq_losses.append((seq, count))
    if mode == "seq-mean-token-mean":
        present = [s for s, c in seq_losses if c > 0]
        num_seqs = n.get("num_seqs") or max(len(present), 1)
        return sum(present, torch.zeros((), dtype=torch.float64)) / num_seqs, {}
    loss = _grid(B, T)
    for b, t in _valid_positions(mask):
        loss[b][t] = seq_losses[b][0]
    return aggregate(loss, mask, mode, **n), {}


# -- KL, value, entropy, rollout correction -----------------------------------------------
def kl(logp: float, ref: float, kind: str) -> float:
    """One token's KL penalty value (forward value only)."""
    kind = kind.rstrip("+")
    d = logp - ref
    if kind in ("k1", "kl"):
        return d
    if kind == "abs":
        return abs(d)
    if kind in ("k2", "mse"):
        return 0.5 * d * d
    if kind in ("k3", "low_var_kl"):
        k = min(max(ref - logp, -20.0), 20.0)
        return min(max(math.expm1(k) - k, -10.0), 10.0)
    raise ValueError(kind)


def value_loss(vpreds, returns, values, mask, *, clip=0.5, mode="token-mean", **n):
    B, T = mask.shape
    loss, clipped = _grid(B, T), _grid(B, T, 0)
    for b, t in _valid_positions(mask):
        v, ret, old = vpreds[b, t], returns[b, t], values[b, t]
        v_clip = torch.minimum(torch.maximum(v, old - clip), old + clip)
        l1, l2 = (v - ret) ** 2, (v_clip - ret) ** 2
        clipped[b][t] = float(l2 > l1)
        loss[b][t] = torch.maximum(l1, l2)
    return 0.5 * aggregate(loss, mask, mode, **n), {"vf_clipfrac": masked_mean(clipped, mask)}


def entropy(logits_row: list[float]) -> float:
    """Entropy of softmax over one row of logits (may contain -inf)."""
    finite = [z for z in logits_row if z != -math.inf]
    if not finite:
        return 0.0
    top = max(finite)
    total = sum(math.exp(z - top) for z in finite)
    return -sum((math.exp(z - top) / total) * ((z - top) - math.log(total)) for z in finite)


def rollout_weights(old, rollout, mask, *, level="token", mode="truncate", hi=2.0, lo=None):
    """Rollout IS weights as a nested list (0 at padding)."""
    B, T = mask.shape
    out = _grid(B, T, 0.0)
    if mode == "mask" and lo is None:
        lo = 1.0 / hi
    for b in range(B):
        seq = sum(float(old[b, t] - rollout[b, t]) for t in range(T) if _valid(mask, b, t))
        for t in range(T):
            if not _valid(mask, b, t):
                continue
            log_w = float(old[b, t] - rollout[b, t]) if level == "token" else seq
            w = math.exp(min(max(log_w, -20.0), 20.0))
            if mode == "truncate":
                w = min(w, hi)
                if lo is not None:
                    w = max(w, lo)
            else:
                w = w if math.log(lo) <= log_w <= math.log(hi) else 0.0
            out[b][t] = w * _weight(mask, b, t)
    return out


# -- inputs for the tests and the benchmark ---------------------------------------------
def random_batch(
    seed: int,
    batch: int,
    length: int,
    *,
    dtype: torch.dtype = torch.float64,
    spread: float = 0.3,
    keep: float = 0.7,
    empty_rows: int = 0,
) -> dict[str, Tensor]:
    """Random (B, T) policy-loss inputs: log-probs, advantages, a ragged mask.

    ``spread`` is the scale of log π − log π_old (0 gives exactly on-policy
    inputs); ``empty_rows`` leading rows are fully masked; one advantage per row
    with occasional zeros, as group-normalised estimators produce.
    """
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 3.0
    new = old + spread * torch.randn(batch, length, generator=gen, dtype=torch.float64)
    adv = torch.randn(batch, 1, generator=gen, dtype=torch.float64).expand(batch, length)
    adv = adv * (torch.rand(batch, 1, generator=gen, dtype=torch.float64) > 0.15)
    mask = torch.rand(batch, length, generator=gen, dtype=torch.float64) < keep
    mask[: min(empty_rows, batch)] = False
    return {
        "old": old.to(dtype),
        "new": new.to(dtype).requires_grad_(),
        "adv": adv.contiguous().to(dtype),
        "mask": mask,
    }
