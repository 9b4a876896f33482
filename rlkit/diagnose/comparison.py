"""The engine's distribution against the trainer's, token by token.

For every response token ``t`` the engine reports the log-prob of the token it sampled
and of its ``k`` most likely tokens ``S_t``; the trainer's forward on the same ids gives
its own log-probs. Three numbers per token:

* the **sampled-token gap** ``|log pi_train(y_t) - log pi_engine(y_t)|``, the quantity
  ``rollout/logprob_abs_diff_mean`` averages during training;
* the **KL over the engine's top-k**, ``sum_{v in S_t} p(v) (log p(v) - log q(v))`` with
  ``p`` the engine's and ``q`` the trainer's distribution, both renormalised over ``S_t``.
  Renormalising makes it the exact KL when ``S_t`` is the whole vocabulary, and keeps it
  meaningful under top-k / top-p sampling, whose filtered distribution is the
  unfiltered one renormalised over the tokens kept;
* **top-1 agreement**: the engine's most likely token is the trainer's.

:func:`token_stats` computes them; :func:`summarize` reduces them overall and per position
bucket, where rope, window and long-context faults show as a gap growing with position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QUANTILES = (0.5, 0.9, 0.99)
"""The quantiles of the sampled-token gap reported besides mean and max."""


@dataclass
class TokenStats:
    """Per response token of one row (length ``L``).

    Attributes:
        position: (L,) the token's index in the response (0 = first generated token).
        gap: (L,) ``|log pi_train - log pi_engine|`` of the sampled token.
        kl: (L,) KL(engine || trainer) over the engine's top-k, renormalised; ``nan``
            where the engine reported no top-k.
        top1_agree: (L,) 1.0 where the engine's most likely token is the trainer's
            (``nan`` without top-k).
        mass: (L,) the trainer's probability mass on the engine's top-k (1.0 for the
            whole vocabulary; ``nan`` without top-k).
    """

    position: torch.Tensor
    gap: torch.Tensor
    kl: torch.Tensor
    top1_agree: torch.Tensor
    mass: torch.Tensor


def token_stats(
    engine_log_probs: torch.Tensor,
    trainer_log_probs: torch.Tensor,
    engine_top_ids: torch.Tensor | None = None,
    engine_top_log_probs: torch.Tensor | None = None,
    trainer_full_log_probs: torch.Tensor | None = None,
) -> TokenStats:
    """The per-token comparison of one row.

    Args:
        engine_log_probs: (L,) the engine's log-prob of each sampled token.
        trainer_log_probs: (L,) the trainer's log-prob of the same tokens.
        engine_top_ids: (L, k) the engine's most likely ids (``-1``: no entry).
        engine_top_log_probs: (L, k) their log-probs (``-inf``: no entry).
        trainer_full_log_probs: (L, V) the trainer's log-softmax at every position.
    """
    length = engine_log_probs.shape[0]
    gap = (trainer_log_probs.double() - engine_log_probs.double()).abs()
    nan = torch.full((length,), float("nan"), dtype=torch.float64)
    kl, agree, mass = nan, nan.clone(), nan.clone()
    if engine_top_ids is not None and trainer_full_log_probs is not None and length:
        present = engine_top_ids >= 0
        ids = engine_top_ids.clamp(min=0)
        p_log = torch.where(present, engine_top_log_probs.double(), float("-inf"))
        q_log = torch.where(present, trainer_full_log_probs.double().gather(-1, ids), float("-inf"))
        p_log = p_log - torch.logsumexp(p_log, -1, keepdim=True)
        mass = q_log.logsumexp(-1).exp()
        q_log = q_log - torch.logsumexp(q_log, -1, keepdim=True)
        p = p_log.exp()
        terms = torch.where(present & (p > 0), p * (p_log - q_log), 0.0)
        kl = terms.sum(-1).clamp(min=0.0)
        agree = (engine_top_ids[:, 0] == trainer_full_log_probs.argmax(-1)).double()
    return TokenStats(torch.arange(length), gap, kl, agree, mass)


def position_buckets(max_position: int, count: int = 4) -> list[tuple[int, int]]:
    """``count`` half-open ranges ``[lo, hi)`` of response positions, doubling in width
    from the start (early tokens are the most numerous): for 48 positions and 4 buckets
    ``[(0, 4), (4, 10), (10, 22), (22, 48)]``."""
    if max_position <= count:
        return [(i, i + 1) for i in range(max_position)]
    weights = [2**i for i in range(count)]
    edges, total = [0], sum(weights)
    for w in weights[:-1]:
        edges.append(max(edges[-1] + 1, round(edges[-1] + max_position * w / total)))
    edges.append(max_position)
    return list(zip(edges[:-1], edges[1:]))


def _reduce(stats: list[TokenStats], keep: list[torch.Tensor] | None = None) -> dict[str, float]:
    pick = keep or [torch.ones_like(s.gap, dtype=torch.bool) for s in stats]
    gap = torch.cat([s.gap[k] for s, k in zip(stats, pick)])
    out: dict[str, float] = {"tokens": float(gap.numel())}
    if not gap.numel():
        return out
    out["gap_mean"] = float(gap.mean())
    out["gap_max"] = float(gap.max())
    for q in QUANTILES:
        out[f"gap_p{round(q * 100)}"] = float(torch.quantile(gap, q))
    for name in ("kl", "top1_agree", "mass"):
        values = torch.cat([getattr(s, name)[k] for s, k in zip(stats, pick)])
        values = values[~values.isnan()]
        if values.numel():
            out[f"{name}_mean"] = float(values.mean())
    kl = torch.cat([s.kl[k] for s, k in zip(stats, pick)])
    kl = kl[~kl.isnan()]
    if kl.numel():
        out["kl_max"] = float(kl.max())
    return out


def summarize(stats: list[TokenStats], buckets: int = 4) -> dict[str, object]:
    """Overall numbers and, per position bucket (``"0-4"``, ...), the same numbers."""
    longest = max((int(s.position.numel()) for s in stats), default=0)
    by_position = {}
    for lo, hi in position_buckets(longest, buckets):
        keep = [(s.position >= lo) & (s.position < hi) for s in stats]
        by_position[f"{lo}-{hi - 1}" if hi - 1 > lo else str(lo)] = _reduce(stats, keep)
    return {"overall": _reduce(stats), "by_position": by_position}


def growth_with_position(summary: dict[str, object]) -> float:
    """The last position bucket's mean gap over the first's (``nan`` with under two
    buckets, or a first bucket of zero gap): well above 1 points at positions."""
    buckets = [b for b in summary["by_position"].values() if "gap_mean" in b]
    if len(buckets) < 2 or buckets[0]["gap_mean"] <= 0:
        return float("nan")
    return buckets[-1]["gap_mean"] / buckets[0]["gap_mean"]
