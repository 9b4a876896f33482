"""Trainer-side reference log-probs computed with transformers (tests only)."""

from __future__ import annotations

import torch


@torch.no_grad()
def response_log_probs(
    model: torch.nn.Module,
    prompt: list[int],
    response: list[int],
    temperature: float,
    top_k: int = -1,
    top_p: float = 1.0,
) -> torch.Tensor:
    """``log_softmax(filter(logits / T))[token]`` of each response token, shape ``(len(response),)``.

    ``temperature <= 0`` means greedy: ``log_softmax(logits)``. ``top_k`` / ``top_p``
    renormalise over the kept tokens (the sampling distribution); off by default.
    """
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    keep = torch.ones_like(logp, dtype=torch.bool)
    if top_k > 0:
        kth = logp.topk(top_k, dim=-1).values[:, -1:]
        keep &= logp >= kth
    if top_p < 1.0:
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        mass_before = sorted_lp.exp().cumsum(-1) - sorted_lp.exp()
        keep_sorted = mass_before < top_p  # keep tokens until the mass reaches top_p
        keep &= torch.zeros_like(keep).scatter(-1, order, keep_sorted)
    filtered = torch.log_softmax(logp.masked_fill(~keep, float("-inf")), dim=-1)
    target = torch.tensor(response)[:, None]
    return filtered.gather(-1, target).squeeze(-1)
