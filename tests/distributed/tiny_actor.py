"""A tiny actor wrapper and batch for the backend tests (imported by tests and launched scripts).

The wrapper computes per-token log-probs from the decoder's hidden states and the LM head's
weight matrix directly, bypassing ``lm_head.forward``, as the trainer's actor does.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoModelForCausalLM


class TinyActor(nn.Module):
    """``forward(input_ids, attention_mask) -> log p(token_t | tokens_<t)``, shape (B, T-1)."""

    def __init__(self, model_dir: str) -> None:
        super().__init__()
        self.backbone = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # use_cache=False: a KV cache would grow again when activation checkpointing
        # recomputes a layer in backward.
        hidden = self.backbone.model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        logits = hidden[:, :-1] @ self.backbone.lm_head.weight.T  # (B, T-1, V)
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        return log_probs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def global_batch(
    vocab_size: int, rows: int = 4, length: int = 10, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A fixed left-padded batch: ids (rows, length), mask (rows, length), weights (rows,)."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab_size, (rows, length), generator=gen)
    lengths = torch.tensor([length, length - 3, length - 1, length - 5])[:rows]
    attention_mask = (torch.arange(length)[None, :] >= (length - lengths)[:, None]).long()
    input_ids = input_ids * attention_mask  # pad id 0 on the left
    weights = torch.randn(rows, generator=gen)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "weights": weights}


def global_loss_of_slice(
    model: nn.Module, batch: dict[str, torch.Tensor], rows: slice, num_processes: int
) -> torch.Tensor:
    """This process's share of the global-batch loss, scaled for averaged gradients.

    loss_r = num_processes * sum_{rows r, valid tokens} -w * log p / N_global, where N_global
    counts the valid target tokens of the WHOLE batch, so the mean over processes of
    loss_r's gradient is the gradient of the global-batch loss.
    """
    token_mask = (batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).float()
    n_global = token_mask.sum()
    log_probs = model(batch["input_ids"][rows], batch["attention_mask"][rows])
    weighted = -batch["weights"][rows, None] * log_probs * token_mask[rows]
    return weighted.sum() / n_global * num_processes
