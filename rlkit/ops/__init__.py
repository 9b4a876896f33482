"""Numerical ops shared by the trainer: memory-bounded per-token log-probs and entropy.

The thin public face: arguments are checked here, then the call is dispatched to an
implementation in :mod:`rlkit.kernels` (``chunked_logprobs``, ``naive_logprobs``, ...).

from rlkit.ops import token_logprobs_and_entropy
log_p, entropy = token_logprobs_and_entropy(
    hidden, model.lm_head.weight, labels, temperature=1.0
)
"""

from rlkit.ops.logprobs import logprobs_and_entropy_from_logits, token_logprobs_and_entropy

__all__ = ["logprobs_and_entropy_from_logits", "token_logprobs_and_entropy"]
