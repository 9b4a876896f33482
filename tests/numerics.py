"""Float32 tolerances derived from the arithmetic, for tests that compare two code paths.

Two computations of the same mathematical quantity by different float32 code paths (other
micro-batch shapes, packed vs padded rows, another CPU kernel, another thread count) agree
only up to rounding, and CPU kernels choose their summation order by vector width (AVX2 vs
AVX-512) and by thread count. Comparisons therefore use the bounds below, never bitwise
equality, unless both sides provably run the same kernels on the same shapes.

**Gradients.** A gradient element is a float32 sum of products, and the terms themselves
come out of a chain of float32 reductions (matmuls, softmax, norms). The classical bound
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 3.1) for a
computation whose longest chain of summed terms has length ``D`` is a relative error of
at most ``gamma_D = D * u / (1 - D * u)`` with ``u = 2**-24``, relative to the sum of the
absolute values of the terms, in any summation order and with any blocking. So two code
paths differ by at most ``2 * gamma_D`` of that magnitude. A test cannot see each
element's sum of absolute terms; it uses the largest gradient element of the same tensor
instead. An element's own value would be the wrong scale (cancellation can make it far
smaller than its terms); the tensor's largest element is a proxy, not a strict bound,
but ``gamma_D`` is itself a worst case in which every rounding error points the same
way, while real ones add up like a random walk (~ sqrt(D) u, 30-100x smaller), which
leaves room for cancellation. :func:`reduction_depth` counts ``D`` for a decoder-only
transformer (about 1,400 for the tests' tiny models: ``2 gamma_D`` ~ 1.7e-4). Measured
differences: 1e-7 to 4e-6 of the tensor's largest element, on AVX2 and on scalar kernels,
with 1 and 2 threads. The bugs these tests exist for are much bigger: a wrong normaliser
or a lost or misplaced token changes a gradient by 1e-2 or more of its size.

**Adam and AdamW.** Adam's update ``lr * m_hat / (sqrt(v_hat) + eps)`` does not depend on
the gradient's scale. Where a gradient element is close to zero compared with its
rounding noise (from cancellation), the direction of its update comes from the noise:
the first step is about ``lr * sign(g)``, so the two paths can move that element by a
full step in opposite directions. Parameters after Adam steps are therefore checked
against :func:`adam_step_bound` (which no sign flip can break), and only a small
fraction of the elements may differ by more than ``lr / 1000``
(:func:`assert_adam_updates_agree`). Gradient accuracy is checked on the gradients the
optimizer is given (:func:`optimizer_step_gradients`), not through Adam.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

U32 = 2.0**-24
"""Unit roundoff of float32 (round to nearest): half the distance from 1 to the next float."""


def gamma(depth: int, u: float = U32) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: relative error bound of a length-n chain of sums."""
    if depth * u >= 1:
        raise ValueError(f"depth {depth} is too long for a bound with u = {u}")
    return depth * u / (1 - depth * u)


def reduction_depth(config, *, rows: int, positions: int) -> int:
    """Length ``D`` of the longest chain of float32 sums from the loss to a parameter's gradient.

    For a decoder-only transformer with ``rows`` sequences of at most ``positions`` tokens
    per optimizer step:

    * ``rows * positions``: a weight gradient sums over every token of the step (within
      the backward matmul and across micro-batch accumulation);
    * ``2 * vocab_size``: the log-sum-exp over the vocabulary forward, and the LM head's
      backward (a sum over the vocabulary per hidden unit);
    * per layer, forward and backward: the matmuls' inner sizes (hidden size and MLP
      width), attention over ``positions`` keys, and the head dimension of the scores.

    A vision-language model adds its vision tower's chain in front of the language
    model's: the patch embedding's inner size (channels x time x patch area), then per
    vision block its matmuls' inner sizes and attention over an image's patches (bounded
    by ``positions`` x merge area, as an image's tokens are part of the sequence).

    Args:
        config: a Hugging Face model config (``hidden_size``, ``intermediate_size``,
            ``num_hidden_layers``, ``num_attention_heads``, ``vocab_size``; a
            vision-language config's text and vision parts).
        rows: sequences that contribute to one optimizer step.
        positions: the longest sequence (prompt + response), in tokens.
    """
    vision = getattr(config, "vision_config", None)
    extra = 0
    if vision is not None:
        patch = vision.in_chans * vision.temporal_patch_size * vision.patch_size**2
        patches = positions * vision.spatial_merge_size**2
        extra = patch + 2 * vision.depth * (vision.hidden_size + vision.intermediate_size + patches)
        config = config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_layer = config.hidden_size + config.intermediate_size + positions + head_dim
    return (
        rows * positions + 2 * config.vocab_size + 2 * config.num_hidden_layers * per_layer + extra
    )


def assert_gradients_close(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], *, depth: int
) -> None:
    """Every tensor within ``2 gamma_D`` of its largest element (module docstring)."""
    assert got.keys() == want.keys() and len(want) > 0
    tol = 2 * gamma(depth)
    for name, expected in want.items():
        scale = expected.abs().max().item()
        torch.testing.assert_close(
            got[name],
            expected,
            rtol=tol,
            atol=tol * scale,
            msg=lambda m, name=name: f"{name}: {m} (2 gamma_D = {tol:.3g}, D = {depth})",
        )


@contextmanager
def optimizer_step_gradients(module: nn.Module) -> Iterator[list[dict[str, torch.Tensor]]]:
    """Record the gradients that each optimizer step over ``module``'s parameters consumes.

    Yields a list that receives, at every ``optimizer.step()`` of an optimizer holding any
    of ``module``'s parameters, ``{name: grad.clone()}`` as the optimizer sees it (after
    accumulation over micro-batches and after gradient clipping). A global
    ``torch.optim`` step pre-hook: it sees optimizers wrapped by accelerate too, and needs
    nothing from the code under test. A skipped step (non-finite loss) records nothing.
    """
    names = {id(p): n for n, p in module.named_parameters()}
    steps: list[dict[str, torch.Tensor]] = []

    def record(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if any(id(p) in names for p in params):
            steps.append(
                {
                    names[id(p)]: p.grad.detach().clone()
                    for p in params
                    if id(p) in names and p.grad is not None
                }
            )

    handle = register_optimizer_step_pre_hook(record)
    try:
        yield steps
    finally:
        handle.remove()


def adam_step_bound(t: int, betas: tuple[float, float]) -> float:
    """Largest ``|m_hat_t| / sqrt(v_hat_t)`` over all gradient histories: Adam's step ``t`` / lr.

    With ``m_t = (1 - b1) sum_i b1^(t-i) g_i`` and ``v_t = (1 - b2) sum_i b2^(t-i) g_i^2``,
    Cauchy-Schwarz gives ``|m_t| <= sqrt(sum_k (1 - b1)^2 b1^(2k) / ((1 - b2) b2^k)) sqrt(v_t)``;
    the bias corrections multiply the ratio by ``sqrt(1 - b2^t) / (1 - b1^t)``. ``eps`` only
    makes the step smaller. Step 1 gives exactly 1; step 2 with (0.9, 0.999) 1.0014.
    """
    b1, b2 = betas
    s = sum((1 - b1) ** 2 * b1 ** (2 * k) / ((1 - b2) * b2**k) for k in range(t))
    return math.sqrt(s) * math.sqrt(1 - b2**t) / (1 - b1**t)


def assert_adam_updates_agree(
    got: dict[str, torch.Tensor],
    want: dict[str, torch.Tensor],
    *,
    lr: float,
    steps: int,
    betas: tuple[float, float],
    weight_decay: float = 0.0,
    loose_fraction: float = 0.01,
) -> None:
    """Parameters after the same ``steps`` (Adam)W steps from the same start, by two paths.

    1. No element may differ by more than the two runs can move it in opposite
       directions: ``2 lr sum_t (adam_step_bound(t) + weight_decay |p|)``, plus the
       rounding of each ``p - update`` (an ulp of ``|p|`` per step and run). A near-zero
       gradient whose sign flips cannot break this.
    2. Elements whose update direction comes from rounding noise are rare (module
       docstring; measured: at most 1 in 39,296 beyond ``lr / 1000``), so at most
       ``loose_fraction`` of all elements may differ by more than ``lr / 1000``. A
       missing, extra or rescaled step moves most elements by ~lr and fails here.
    """
    assert got.keys() == want.keys() and len(want) > 0
    eps = torch.finfo(torch.float32).eps
    per_run = sum(adam_step_bound(t, betas) for t in range(1, steps + 1))
    total = loose = 0
    for name, expected in want.items():
        p_max = max(expected.abs().max().item(), got[name].abs().max().item())
        bound = 2 * lr * (per_run + steps * weight_decay * p_max) + 2 * steps * eps * p_max
        diff = (got[name] - expected).abs()
        assert diff.max().item() <= bound, (
            f"{name}: differs by {diff.max().item():.3g}, more than {steps} Adam steps "
            f"of lr {lr} can move it apart ({bound:.3g})"
        )
        total += diff.numel()
        loose += int((diff > lr / 1000).sum())
    assert loose <= loose_fraction * total, (
        f"{loose} of {total} parameters differ by more than lr/1000 = {lr / 1000:.3g} "
        f"(at most {loose_fraction:.0%} may: near-zero gradients)"
    )
