"""Batch statistics under the metric names verl users already read."""

from __future__ import annotations

import torch

from rlkit.trainer.batch import TrainBatch


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    v = values.float()
    return {
        f"{prefix}/mean": v.mean().item(),
        f"{prefix}/max": v.max().item(),
        f"{prefix}/min": v.min().item(),
    }


def data_metrics(
    batch: TrainBatch, *, max_response_length: int, max_prompt_length: int
) -> dict[str, float]:
    """``critic/*``, ``response_length/*`` and ``prompt_length/*`` (``global_seqlen/*``,
    tokens per process, come from :mod:`rlkit.trainer.balancing`).

    Token statistics are over the tokens the policy sampled (``loss_mask``); sequence
    statistics over rows with at least one such token. Lengths count every response
    token (tool and user turns included).
    """
    mask = batch.loss_mask.bool()
    valid_rows = mask.any(dim=1)
    out: dict[str, float] = {}
    out |= _stats("critic/score", batch.scores[valid_rows])
    out |= _stats("critic/rewards", (batch.token_level_rewards * mask).sum(dim=1)[valid_rows])
    out |= _stats("critic/advantages", batch.advantages[mask])
    out |= _stats("critic/returns", batch.returns[mask])
    if "values" in batch.extras:
        values, returns = batch.extras["values"][mask], batch.returns[mask]
        out |= _stats("critic/values", values)
        if values.numel() > 1:
            explained = 1 - torch.var(returns - values) / (torch.var(returns) + 1e-5)
            out["critic/vf_explained_var"] = explained.item()
    out["critic/acc/mean"] = batch.acc[valid_rows].mean().item() if valid_rows.any() else 0.0
    resp = batch.response_lengths.float()
    prompt = batch.prompt_lengths.float()
    out |= _stats("response_length", resp)
    out |= lengths_by_correctness(resp[valid_rows], batch.acc[valid_rows])
    out |= _stats("prompt_length", prompt)
    if resp.numel():
        out["response_length/clip_ratio"] = (resp >= max_response_length).float().mean().item()
        out["prompt_length/clip_ratio"] = (prompt >= max_prompt_length).float().mean().item()
    inserted = resp - batch.loss_mask.sum(dim=1)
    if resp.numel() and inserted.any():  # multi-turn: tool / user tokens inside responses
        out |= _stats("response_length/policy_tokens", resp - inserted)
        out |= _stats("response_length/inserted_tokens", inserted)
    return out


def lengths_by_correctness(lengths: torch.Tensor, acc: torch.Tensor) -> dict[str, float]:
    """``response_length/correct/mean`` and ``/incorrect/mean``: the lengths of the
    responses the reward counted right (``acc`` > 0.5) and wrong, each where there is one
    (Dr. GRPO, arXiv:2503.20783, plots how the wrong ones grow under GRPO's per-response
    length normalisation)."""
    right = acc.float() > 0.5
    out: dict[str, float] = {}
    for name, rows in (("correct", right), ("incorrect", ~right)):
        if rows.any():
            out[f"response_length/{name}/mean"] = lengths[rows].float().mean().item()
    return out


def unfiltered_metrics(
    scores: list[float], acc: list[float], lengths: list[int], *, max_response_length: int
) -> dict[str, float]:
    """``critic/score/*``, ``critic/acc/mean`` and ``response_length/*`` of every response
    generated in a step whose groups were all filtered away: the step trains nothing,
    but its curve point is still there (over the rows the filter saw)."""
    if not scores:
        return {}
    resp = torch.tensor(lengths, dtype=torch.float32)
    out = _stats("critic/score", torch.tensor(scores)) | _stats("response_length", resp)
    out["critic/acc/mean"] = float(sum(acc) / len(acc))
    out["response_length/clip_ratio"] = (resp >= max_response_length).float().mean().item()
    return out


class WeightedMeans:
    """Accumulates metric values with weights (e.g. token counts) across micro-batches."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def add(self, metrics: dict[str, torch.Tensor | float], weight: float = 1.0) -> None:
        for k, v in metrics.items():
            value = float(v.item() if isinstance(v, torch.Tensor) else v)
            self.sums[k] = self.sums.get(k, 0.0) + value * weight
            self.weights[k] = self.weights.get(k, 0.0) + weight

    def reduced(self, all_reduce) -> dict[str, float]:
        """Weighted means across processes (``all_reduce`` sums a tensor in place)."""
        keys = sorted(self.sums)
        if not keys:
            return {}
        packed = torch.tensor([[self.sums[k], self.weights[k]] for k in keys], dtype=torch.float64)
        all_reduce(packed)
        return {k: (s / w if w > 0 else 0.0) for k, (s, w) in zip(keys, packed.tolist())}
