"""Pack each row's valid tokens to the front, and unpack results back.

Scans that skip mask-0 tokens (GAE over multi-turn observation spans,
discounted returns) are ordinary scans on the packed rows: consecutive packed
slots are consecutive valid tokens, so a decay exponent counted in slots counts
valid tokens only.

A row with k valid tokens occupies slots 0..k-1; slots k..T-1 are zero. Every
mask-0 token maps to slot T-1, which is always a zero slot in a row that has a
mask-0 token (such a row has k <= T-1), so packing zeros there is harmless and
unpacking reads 0 back for mask-0 tokens without another masking pass.

Right-padded masks (every row's valid tokens already a prefix) are detected
and packed by doing nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Largest T for which float32 sums of token positions are exact integers.
_EXACT_FLOAT32_LENGTH = 5792


@dataclass(frozen=True)
class Packing:
    """Where each token goes when a batch's valid tokens are packed to the front.

    Attributes:
        flat_targets: (B * T,) packed slot of every token in the flattened
            batch (row * T + rank; row * T + T - 1 for mask-0 tokens), int32
            where it fits, or None when the valid tokens already form a prefix
            of every row, so packing is the identity.
    """

    flat_targets: torch.Tensor | None

    @property
    def is_identity(self) -> bool:
        return self.flat_targets is None

    def pack(self, values_on_valid: torch.Tensor) -> torch.Tensor:
        """(B, T) valid tokens moved to the front, zero after them.

        Args:
            values_on_valid: (B, T) values that are already 0 on mask-0 tokens
                (all of a row's mask-0 tokens land on one slot and add up there).
        """
        if self.flat_targets is None:
            return values_on_valid
        flat = values_on_valid.new_zeros(values_on_valid.numel())
        flat.index_add_(0, self.flat_targets, values_on_valid.reshape(-1))
        return flat.view(values_on_valid.shape)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """(B, T) packed values back at their token positions, 0 on mask-0 tokens.

        Args:
            packed: (B, T) values on packed slots, zero after each row's valid tokens.
        """
        if self.flat_targets is None:
            return packed
        return packed.reshape(-1).index_select(0, self.flat_targets).view(packed.shape)


def is_prefix_mask(mask_f: torch.Tensor) -> bool:
    """True when every row's valid tokens are positions 0..k-1 (right padding).

    k distinct positions sum to at least 0 + 1 + ... + (k - 1), with equality
    only for exactly those positions; one matrix-vector product checks all rows.

    Args:
        mask_f: (B, T) 0/1 float mask.
    """
    length = mask_f.shape[-1]
    if mask_f.numel() == 0:
        return True
    exact = mask_f if mask_f.dtype == torch.float64 or length <= _EXACT_FLOAT32_LENGTH else None
    exact = exact if exact is not None else mask_f.double()
    positions = torch.arange(length, dtype=exact.dtype, device=exact.device)
    counts = exact.sum(dim=-1)
    return bool(torch.equal(exact @ positions, counts * (counts - 1) / 2))


def plan_packing(mask: torch.Tensor, mask_f: torch.Tensor) -> Packing:
    """The :class:`Packing` of a mask.

    Args:
        mask: (B, T) bool valid-token mask.
        mask_f: (B, T) the same mask as 0/1 floats.

    Returns:
        The packing (identity for right-padded masks).
    """
    if is_prefix_mask(mask_f):
        return Packing(None)
    batch, length = mask.shape
    # int32 indices halve the index traffic; index_add_ / index_select take them.
    dtype = torch.int32 if mask.numel() < 2**31 else torch.int64
    # rank - 1 on valid tokens and T - 1 on mask-0 tokens, as
    # (cumsum - T) * mask + (T - 1), plus each row's offset; in place throughout.
    slots = mask.cumsum(dim=-1, dtype=dtype)
    slots.sub_(length).mul_(mask).add_(length - 1)
    slots.add_(torch.arange(0, batch * length, length, dtype=dtype, device=mask.device)[:, None])
    return Packing(slots.view(-1))
