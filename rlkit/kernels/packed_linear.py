"""Linear layers whose weights oneDNN lays out once per rollout instead of at every call.

A CPU matrix product through oneDNN (``F.linear`` on bf16 tensors) first reorders the
weight into the blocked layout its kernel reads, at every call. In training each weight
serves a micro-batch of thousands of tokens and the reorder is small beside the product.
In a decode step each weight serves one token per row, and the reorder reads the whole
weight an extra time and writes it again. :func:`packed_linears` reorders every eligible
``nn.Linear`` weight once, on entry (``torch.ops.mkldnn._reorder_linear_weight``), and
until exit runs the layer as ``torch.ops.mkldnn._linear_pointwise`` on that packed copy.

``python benchmarks/packed_linear.py`` measures one decode step's layer products, every
layer's weights in turn at 64 rows, both ways. On a 2-core AMD EPYC with AVX-512 BF16 it
measured the packed products at 1.2-1.3x the plain ones' rate, in bf16 and in float32.

Numerics: under bf16 both products are oneDNN's, and on a 2-core AMD EPYC with AVX-512
BF16 the packed one gives bitwise the results of ``F.linear`` (under autocast: of
autocast's cast then ``F.linear``) at every shape tried; ``tests/test_packed_linear.py``
checks whole rollouts. Whether another CPU's kernels sum in the same order is checked at
run time (:func:`packs_exactly`). In float32 ``F.linear`` runs another library's kernel,
and the two differ by float32 rounding (a few units in the last place of a 512-term sum),
which is enough to change which tokens a seeded rollout samples somewhere in a long run.
``exact_only`` packs only where the results stay bitwise the same.

The plain version is ``F.linear`` itself: a layer that is not eligible, or a call the
packed copy cannot serve exactly, runs it. A model sharded by FSDP2 is left plain (each
process would hold a full copy of every layer). Eligible: a plain CPU ``nn.Linear`` (not a
sharded ``DTensor``, no overridden ``forward``) computing in float32, or in bf16 where
oneDNN has bf16 kernels, with a weight large enough to gain (:data:`SMALLEST_PACKED`). A
call falls back when gradients are on, when autocast is not in the state (on or off, and
its dtype) it was in on entry, or when the input is not a contiguous float tensor of the
expected dtype (``F.linear`` itself rounds some strided inputs differently).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import torch
from torch import nn

SMALLEST_PACKED = {torch.float32: 1 << 17, torch.bfloat16: 1 << 14}
"""The fewest weight entries (in x out features) a layer needs to be packed, per compute dtype.

``_linear_pointwise`` costs about 15 us a call before any arithmetic, against 3-4 us for a
small float32 ``F.linear``; on a 2-core AMD EPYC with AVX-512 BF16 the packed float32
product was slower up to 256 x 256 weights (0.2-0.9x at 1-64 rows) and faster from
256 x 512 (1.0-1.1x; 1.15-1.5x at 576 x 576), while bf16, whose plain product pays
oneDNN's reorder anyway, was as fast or faster from 64 x 256 (16,384 entries) up.
Smaller layers stay plain, so the tiny demo models run exactly as before."""

EXACT_CANDIDATES = frozenset({torch.bfloat16})
"""Compute dtypes whose packed product can be bitwise ``F.linear``'s: oneDNN runs both
(its inner-product kernel packed, its matrix-product kernel plain), and whether the two
sum in the same order depends on the CPU's instructions, which :func:`packs_exactly`
checks on this machine."""

PACKING_ROWS = 64
"""The row count oneDNN is told to expect when it lays a weight out (a decode step's
batch). Any row count runs on the packed weight; this one only guides the layout."""


@cache
def packs_exactly(dtype: torch.dtype) -> bool:
    """Whether, on this CPU, packed ``dtype`` products gave bitwise ``F.linear``'s results
    over a spread of shapes (1-64 rows; 64-2,048 inputs, with and without a bias): run
    once per process, a few milliseconds."""
    if dtype not in EXACT_CANDIDATES:
        return False
    generator = torch.Generator().manual_seed(0)
    shapes = ((1, 2048, 128), (7, 64, 256), (64, 512, 384), (33, 256, 64))
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        for rows, inputs, outputs in shapes:
            x = torch.randn(rows, inputs, generator=generator).to(dtype)
            weight = torch.randn(outputs, inputs, generator=generator).to(dtype)
            bias = torch.randn(outputs, generator=generator).to(dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACKING_ROWS)
            for b in (bias, None):
                plain = nn.functional.linear(x, weight, b)
                if not torch.equal(_packed_product(x, packed, b), plain):
                    return False
    return True


def _packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None):
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _autocast_dtype() -> torch.dtype | None:
    """CPU autocast's dtype while it is on, else None."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None


def compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype ``F.linear`` computes ``weight``'s product in now: while CPU autocast is
    on, its dtype (autocast casts every float32, bf16 or fp16 operand), else the weight's."""
    autocast = _autocast_dtype()
    if autocast is not None and weight.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return autocast
    return weight.dtype


def can_pack(module: nn.Module, *, exact_only: bool = False) -> bool:
    """Whether :func:`packed_linears` packs ``module`` (see the module docstring);
    ``exact_only``: only where the packed product is bitwise ``F.linear``'s on this CPU
    (:func:`packs_exactly`)."""
    if not isinstance(module, nn.Linear) or type(module).forward is not nn.Linear.forward:
        return False
    if "forward" in vars(module):  # already routed elsewhere (another context, a patch)
        return False
    weight = module.weight
    if type(weight) not in (torch.Tensor, nn.Parameter) or weight.device.type != "cpu":
        return False
    if not torch.backends.mkldnn.is_available() or not torch.backends.mkldnn.enabled:
        return False
    dtype = compute_dtype(weight)
    if dtype not in SMALLEST_PACKED or weight.numel() < SMALLEST_PACKED[dtype]:
        return False
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    return not exact_only or packs_exactly(dtype)


class _PackedForward:
    """``module``'s forward on its packed weight, falling back to ``F.linear``."""

    def __init__(self, module: nn.Linear) -> None:
        self.module = module
        self.autocast = _autocast_dtype()
        self.dtype = compute_dtype(module.weight)
        with torch.no_grad():
            weight = module.weight.detach().to(self.dtype)
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, PACKING_ROWS)
            bias = module.bias
            self.bias = None if bias is None else bias.detach().to(self.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if (
            torch.is_grad_enabled()
            or _autocast_dtype() != self.autocast
            or not x.is_contiguous()
            or x.dtype not in (self.dtype, torch.float32)
            or (x.dtype != self.dtype and self.autocast is None)
        ):
            return nn.Linear.forward(self.module, x)
        # Under autocast F.linear casts a float32 input to the autocast dtype first.
        return _packed_product(x.to(self.dtype), self.weight, self.bias)


def _sharded(model: nn.Module) -> bool:
    """Whether any part of ``model`` is sharded by FSDP2 (``fully_shard``)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch build without distributed support
        return False
    return any(isinstance(m, FSDPModule) for m in model.modules())


@contextmanager
def packed_linears(model: nn.Module, *, exact_only: bool = False) -> Iterator[int]:
    """Run ``model``'s eligible ``nn.Linear`` layers on weights packed once, until exit;
    with ``exact_only``, only those whose results stay bitwise the same (bf16 compute).

    Enter it where the weights stay fixed and autocast is already in the state the
    forwards will run in (inside a rollout's generation context): the packed copies are
    taken from the weights and autocast state at entry. Yields the number of layers
    packed. On exit every layer runs ``F.linear`` again and the copies are freed.

    Memory: one copy of each packed weight in the compute dtype for the context's
    duration. Under autocast it replaces autocast's own bf16 copy, which ``F.linear``
    would have cached; in float32 it is a second copy of the linear weights.
    """
    routed = []
    try:
        if _sharded(model):
            yield 0  # a full copy of every layer would undo the sharding's memory saving
            return
        for module in model.modules():
            if can_pack(module, exact_only=exact_only):
                module.forward = _PackedForward(module)
                routed.append(module)
        yield len(routed)
    finally:
        for module in routed:
            del module.forward
