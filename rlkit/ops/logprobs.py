"""Per-token log-probabilities and entropies: the public ops the trainer calls.

:func:`token_logprobs_and_entropy` goes from the final hidden states straight to
``log p(label)`` and the entropy without materialising the (tokens x vocab)
logits; it dispatches through the kernel registry (op ``"logprobs"``), so a
platform can register a fused implementation. :func:`logprobs_and_entropy_from_logits`
is the variant for callers that already hold logits.
"""

from __future__ import annotations

import math

import torch

from rlkit.device import platform_for_device
from rlkit.kernels.chunked_logprobs import logits_logprobs_chunked
from rlkit.kernels.selection import choose


def _check_temperature(temperature: float) -> float:
    if isinstance(temperature, torch.Tensor):
        temperature = float(temperature)
    if (
        not (isinstance(temperature, int | float) and math.isfinite(temperature))
        or temperature <= 0
    ):
        raise ValueError(
            f"temperature must be a finite number > 0, got {temperature!r}; use 1.0 for the "
            f"untempered distribution"
        )
    return float(temperature)


def _check_chunk_size(chunk_size: int) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    return chunk_size


def _check_labels(labels: torch.Tensor, lead_shape: torch.Size, vocab: int) -> torch.Tensor:
    if (
        not isinstance(labels, torch.Tensor)
        or labels.dtype.is_floating_point
        or labels.is_complex()
    ):
        raise TypeError(
            f"labels must be an integer tensor of token ids, got "
            f"{getattr(labels, 'dtype', type(labels).__name__)}"
        )
    if labels.shape != lead_shape:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal the leading shape "
            f"{tuple(lead_shape)} of the inputs (one label per token)"
        )
    flat = labels.reshape(-1).long()
    out_of_range = (flat < 0) | (flat >= vocab)
    if out_of_range.any():
        bad = int(flat[out_of_range][0])
        raise ValueError(
            f"labels must be token ids in [0, {vocab}), found {bad}; replace padding or "
            f"ignore-index labels (e.g. -100) by any valid id and mask the result instead"
        )
    return flat


def _check_lm_head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if hidden.dim() < 1 or not hidden.dtype.is_floating_point:
        raise TypeError(f"hidden must be a floating tensor (..., H), got {hidden.dtype}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"lm_head_weight must be (vocab, hidden) = (V, {hidden.shape[-1]}), got "
            f"{tuple(weight.shape)}; pass model.lm_head.weight (nn.Linear stores (out, in))"
        )
    if weight.dtype != hidden.dtype or weight.device != hidden.device:
        raise ValueError(
            f"hidden ({hidden.dtype}, {hidden.device}) and lm_head_weight ({weight.dtype}, "
            f"{weight.device}) must share dtype and device; cast one to match"
        )
    if bias is not None and (bias.shape != weight.shape[:1] or bias.dtype != weight.dtype):
        raise ValueError(
            f"lm_head_bias must be ({weight.shape[0]},) {weight.dtype}, got "
            f"{tuple(bias.shape)} {bias.dtype}"
        )


def token_logprobs_and_entropy(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = True,
    lm_head_bias: torch.Tensor | None = None,
    kernel: str | None = None,
    logit_softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token ``log p(label)`` and entropy of ``softmax((hidden @ W^T + b) / T)``.

    ``log p_t = z_{t,y_t} - logsumexp_v z_{t,v}`` and ``H_t = -sum_v p_{t,v} log p_{t,v}``
    with ``z = (hidden @ W^T + b) / T``. The default kernel processes ``chunk_size``
    tokens at a time and recomputes each chunk's logits in the backward pass, so
    peak memory is bounded by the chunk, not by tokens x vocab.

    Args:
        hidden: (..., H) final hidden states (e.g. (B, T, H)); gradients flow to it.
        lm_head_weight: (V, H) output-embedding weight (``model.lm_head.weight``);
            gradients flow to it when it requires grad.
        labels: (...) integer token ids in ``[0, V)`` (the next tokens); mask padding
            afterwards rather than passing -100.
        temperature: T > 0 (the rollout temperature, so log-probs match the sampler).
        chunk_size: tokens per chunk of the chunked kernels; extra peak memory is
            about ``2 * chunk_size * V`` floats.
        compute_entropy: also compute the entropy (skipped in forward and backward if
            False).
        lm_head_bias: (V,) LM-head bias, or ``None`` (no Qwen/Llama head has one).
        kernel: force a ``logprobs`` kernel by name (``"chunked"``, ``"naive"``,
            ``"npu_cross_entropy"``, or ``"pkg.module:function"``); ``None`` lets
            :func:`rlkit.kernels.choose` pick for the platform of ``hidden.device``.
        logit_softcap: Gemma2's final-logit soft-capping ``c``: the logits are
            ``c * tanh(z / c)`` before the temperature, as the model's own forward
            computes them. The capped logits are then materialised (tokens x vocab, and
            their ``tanh`` for the backward pass) and the statistics are taken from them
            (:func:`logprobs_and_entropy_from_logits`); ``kernel`` does not apply.

    Returns:
        log_probs: (...) float32 (float64 if ``hidden`` is float64).
        entropy: (...) same dtype, or ``None`` if ``compute_entropy`` is False.

    Raises:
        ValueError / TypeError: mismatched shapes, dtypes or devices, labels outside
            ``[0, V)``, a non-positive temperature or chunk size.
    """
    _check_lm_head(hidden, lm_head_weight, lm_head_bias)
    temperature = _check_temperature(temperature)
    chunk_size = _check_chunk_size(chunk_size)
    lead_shape = hidden.shape[:-1]
    flat_labels = _check_labels(labels, lead_shape, lm_head_weight.shape[0])
    if logit_softcap is not None:
        logits = torch.nn.functional.linear(hidden, lm_head_weight, lm_head_bias)
        capped = torch.tanh(logits / logit_softcap) * logit_softcap
        return logprobs_and_entropy_from_logits(
            capped,
            labels,
            temperature=temperature,
            compute_entropy=compute_entropy,
            chunk_size=chunk_size,
        )
    choice = choose("logprobs", platform=platform_for_device(hidden.device), override=kernel)
    log_p, entropy = choice.fn(
        hidden.reshape(-1, hidden.shape[-1]),
        lm_head_weight,
        lm_head_bias,
        flat_labels,
        temperature=temperature,
        chunk_size=chunk_size,
        compute_entropy=compute_entropy,
    )
    entropy = entropy.reshape(lead_shape) if entropy is not None else None
    return log_p.reshape(lead_shape), entropy


def logprobs_and_entropy_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = True,
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token ``log p(label)`` and entropy of ``softmax(logits / T)``.

    Never materialises ``log_softmax``: autograd saves only ``logits`` (held by the
    caller anyway) and three numbers per token, and the backward pass recomputes
    ``chunk_size`` rows at a time. Logits of ``-inf`` (masked vocabulary) are
    allowed: they contribute 0 to the entropy, and a label on one gets ``-inf``.

    Args:
        logits: (..., V) logits.
        labels: (...) integer token ids in ``[0, V)``.
        temperature: T > 0.
        compute_entropy: also compute the entropy.
        chunk_size: rows per workspace chunk.

    Returns:
        log_probs: (...) float32 (float64 for float64 logits).
        entropy: (...) same dtype, or ``None``.

    Raises:
        ValueError / TypeError: as :func:`token_logprobs_and_entropy`.
    """
    if (
        not isinstance(logits, torch.Tensor)
        or logits.dim() < 1
        or not logits.dtype.is_floating_point
    ):
        raise TypeError("logits must be a floating tensor of shape (..., V)")
    temperature = _check_temperature(temperature)
    chunk_size = _check_chunk_size(chunk_size)
    lead_shape = logits.shape[:-1]
    flat_labels = _check_labels(labels, lead_shape, logits.shape[-1])
    log_p, entropy = logits_logprobs_chunked(
        logits.reshape(-1, logits.shape[-1]),
        flat_labels,
        temperature=temperature,
        chunk_size=chunk_size,
        compute_entropy=compute_entropy,
    )
    entropy = entropy.reshape(lead_shape) if entropy is not None else None
    return log_p.reshape(lead_shape), entropy
