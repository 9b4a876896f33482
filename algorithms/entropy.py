"""Entropy of the policy's categorical distribution over the vocabulary.

``from_logits``: H = −Σ_v p_v log p_v with p = softmax(z), computed as
H = log s − Σ_v p_v·(z_v − m), where m = max z and s = Σ_v e^(z_v − m) (the
logsumexp form verl uses), made safe for degenerate logits:

* ``-inf`` logits (banned tokens) have probability 0 and contribute 0 to the
  value and to the gradient (not the NaN of 0 · −inf);
* a row whose logits are all ``-inf`` has entropy 0 and zero gradient;
* huge finite logits are fine: the maximum is subtracted first.

``+inf`` and NaN logits are not valid inputs (they give NaN).

This is the plain reference for the fused, chunked entropy the actor computes
from hidden states (:func:`rlkit.ops.token_logprobs_and_entropy`), which never
materialises the logits; the tests check that the two agree.
"""

from __future__ import annotations

import torch
from torch import Tensor


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dimension.

    Args:
        logits: (..., V), e.g. (B, T, V), finite or ``-inf``; the computation runs
            in the logits' dtype (pass float32 logits for float32 accuracy).

    Returns:
        Tensor of shape ``logits.shape[:-1]``, >= 0 up to rounding; differentiable.

    Raises:
        ValueError: ``logits`` is 0-dim.
    """
    if logits.dim() == 0:
        raise ValueError("logits must have a vocabulary dimension, got a 0-dim tensor")
    top = logits.detach().amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    shifted = logits - top
    exp = torch.exp(shifted)
    total = exp.sum(dim=-1, keepdim=True)
    # An all -inf row has total 0: use 1 so that its entropy (and gradient) is 0.
    total = torch.where(total > 0, total, torch.ones_like(total))
    probs = exp / total
    # p = 0 exactly where shifted = -inf; zero those so 0 · -inf does not give NaN.
    shifted = shifted.masked_fill(torch.isneginf(shifted), 0.0)
    return torch.log(total).squeeze(-1) - (probs * shifted).sum(dim=-1)
