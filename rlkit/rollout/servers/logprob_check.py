"""Training-inference mismatch after a weight sync: server vs trainer log-probs.

After every sync the engine scores a fixed token sequence on each server
(prompt log-probs at temperature 1) and on the trainer's live model, and reports
the largest absolute difference. A sync that silently failed (wrong parameter
names, a stale server, dtype trouble) shows up as a large difference at once.
"""

from __future__ import annotations

import torch


def probe_token_ids(vocab_size: int, length: int = 32, offset: int = 3) -> list[int]:
    """A fixed, model-independent probe sequence: ``offset, offset + 7, ...`` mod vocab.

    A stride of 7 visits varied ids; ``offset`` skips the usual special tokens
    (0-2). For vocab 259, length 4: ``[3, 10, 17, 24]``.
    """
    if vocab_size <= offset:
        raise ValueError(f"vocab_size {vocab_size} too small for a probe starting at id {offset}")
    span = vocab_size - offset
    return [offset + (7 * i) % span for i in range(length)]


@torch.no_grad()
def trainer_log_probs(model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    """``log_softmax(logits)[t+1]`` of the next token at every position, shape ``(L-1,)``.

    Args:
        model: a Hugging Face causal LM (``model(input_ids).logits`` of shape (1, L, V)).
        token_ids: the sequence, length L >= 2.
    """
    device = next(model.parameters()).device
    ids = torch.tensor([token_ids], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids=ids).logits[0, :-1].float()
    finally:
        model.train(was_training)
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1).cpu()


def max_abs_diff(server: list[float], trainer: torch.Tensor) -> float:
    """Largest ``|server - trainer|``; ``inf`` if the lengths differ or a value is not finite."""
    if len(server) != trainer.numel():
        return float("inf")
    diff = (torch.tensor(server, dtype=torch.float64) - trainer.double()).abs()
    return float(diff.max()) if bool(torch.isfinite(diff).all()) else float("inf")
