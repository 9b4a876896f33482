"""Is a server's copy of the policy the trainer's? The comparisons behind every sync check.

A weight sync can fail without an error: a route that answers 200 and loads nothing, an
adapter never delivered, a parameter renamed on one side. After a small update the
policy's log-probs move by less than any tolerance that float rounding allows, so a
log-prob probe alone cannot tell a skipped sync from a good one. The engines therefore
compare the weights themselves, by the strongest means their server offers:

1. **checksums** (:func:`group_checksums`): per group of parameters (one decoder layer,
   the embeddings, the output layer) the float64 sum, sum of magnitudes and sum of
   squares of every element. The three sums do not depend on how a server lays the
   tensors out: fused projections (``qkv_proj`` = ``q_proj``, ``k_proj``, ``v_proj``
   stacked), zero rows padding the vocabulary, or another parameter order all give the
   trainer's sums. Any changed element changes the sum of squares.
2. **slices** (:func:`slice_names`, :func:`slice_of`): the first :data:`SLICE_LENGTH`
   elements of a fixed sample of parameters, read back by name.
3. the **log-prob probe** of :mod:`rlkit.rollout.servers.logprob_check`, which every
   engine runs too: it also catches a server computing in another dtype.

Values are compared after rounding the trainer's tensors to the server's dtype, which is
how the server stored them; what remains is float64 summation order, far below
:data:`RELATIVE_TOLERANCE`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import torch

Checksum = tuple[float, float, float]
"""``(sum x, sum |x|, sum x^2)`` over a group's elements, in float64."""

RELATIVE_TOLERANCE = 1e-9
"""Largest relative difference of a sum put down to summation order. An Adam step of
learning rate 1e-7 on weights of magnitude 0.02 changes the sum of squares by about
1e-5 relative, ten thousand times more."""

SLICE_LENGTH = 64
"""Elements read back per sampled parameter."""

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parameter_group(name: str) -> str:
    """The group a parameter's checksum adds to, the same for the trainer's Hugging Face
    names and a server's fused ones: ``layers.N`` for anything in decoder layer ``N``,
    otherwise the name without its ``model.`` prefix and ``.weight`` / ``.bias`` suffix.

    ``model.layers.3.self_attn.q_proj.weight`` and ``model.layers.3.self_attn.qkv_proj
    .weight`` -> ``layers.3``; ``model.embed_tokens.weight`` -> ``embed_tokens``;
    ``lm_head.weight`` -> ``lm_head``.
    """
    layer = _LAYER.search(name)
    if layer:
        return f"layers.{layer.group(1)}"
    base = re.sub(r"\.(weight|bias)$", "", name)
    return base.removeprefix("model.")


def server_dtype(name: str | None) -> torch.dtype | None:
    """The torch dtype of a server dtype setting; ``None`` for ``auto`` or unknown (the
    trainer's tensors are then compared as they are)."""
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}
    return _DTYPES.get(aliases.get(str(name), str(name)))


def checksum(tensor: torch.Tensor) -> Checksum:
    """One tensor's ``(sum x, sum |x|, sum x^2)`` in float64."""
    x = tensor.detach().reshape(-1).to(torch.float64)
    return float(x.sum()), float(x.abs().sum()), float((x * x).sum())


def group_checksums(
    named: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None
) -> dict[str, Checksum]:
    """Per :func:`parameter_group`, the element-wise sums of ``named``'s tensors, each
    first rounded to ``dtype`` (the server's) when given."""
    sums: dict[str, list[float]] = {}
    for name, tensor in named:
        t = tensor if dtype is None or not tensor.is_floating_point() else tensor.to(dtype)
        total = sums.setdefault(parameter_group(name), [0.0, 0.0, 0.0])
        for i, value in enumerate(checksum(t)):
            total[i] += value
    return {group: (s[0], s[1], s[2]) for group, s in sums.items()}


def checksum_mismatches(
    expected: Mapping[str, Checksum],
    served: Mapping[str, Checksum],
    tolerance: float = RELATIVE_TOLERANCE,
) -> list[str]:
    """One line per group whose sums differ beyond ``tolerance`` (relative to the sum of
    magnitudes, or of squares), or that the server lacks. Groups only the server has
    (buffers, a separate copy of tied embeddings) are not compared."""
    problems = []
    for group, (s, a, q) in sorted(expected.items(), key=lambda e: _group_order(e[0])):
        if group not in served:
            problems.append(f"{group}: not on the server")
            continue
        s2, a2, q2 = served[group]
        if abs(s - s2) > tolerance * max(a, 1e-30) or abs(q - q2) > tolerance * max(q, 1e-30):
            problems.append(
                f"{group}: sum of squares {q2:.10g} on the server, {q:.10g} in the trainer"
            )
    return problems


def slice_names(names: Sequence[str], count: int = 8) -> list[str]:
    """A fixed sample of ``count`` parameter names spread over ``names`` (in their order):
    the first, the last, and evenly spaced ones between, so the embeddings, the first and
    last layers and some in the middle are read back."""
    if len(names) <= count:
        return list(names)
    step = (len(names) - 1) / (count - 1)
    return [names[round(i * step)] for i in range(count)]


def slice_of(
    tensor: torch.Tensor, dtype: torch.dtype | None = None, length: int = SLICE_LENGTH
) -> list[float]:
    """The first ``length`` elements of ``tensor`` flattened, rounded to ``dtype``."""
    flat = tensor.detach().reshape(-1)[:length]
    if dtype is not None and flat.is_floating_point():
        flat = flat.to(dtype)
    return [float(v) for v in flat.to(torch.float64)]


def slice_mismatches(
    expected: Mapping[str, list[float]], served: Mapping[str, Sequence[float] | None]
) -> list[str]:
    """One line per sampled parameter whose served slice is not the trainer's (exactly:
    both sides hold the same rounded values). A parameter the server cannot read by its
    Hugging Face name (``None``, e.g. one it fuses with others) is not compared, but a
    server that returns none of them is a problem: nothing was checked."""
    problems = []
    read = 0
    for name, values in expected.items():
        got = served.get(name)
        if got is None:
            continue
        read += 1
        got = [float(v) for v in got][: len(values)]
        differ = [i for i, (x, y) in enumerate(zip(values, got)) if x != y]
        if len(got) != len(values) or differ:
            at = differ[0] if differ else min(len(got), len(values))
            problems.append(
                f"{name}: element {at} is {got[at] if at < len(got) else 'missing'} on the "
                f"server, {values[at] if at < len(values) else 'missing'} in the trainer"
            )
    if expected and not read:
        problems.append(f"the server returned none of the {len(expected)} sampled parameters")
    return problems


def _group_order(group: str) -> tuple[int, int, str]:
    layer = re.fullmatch(r"layers\.(\d+)", group)
    return (1, int(layer.group(1)), "") if layer else (0 if "embed" in group else 2, 0, group)
