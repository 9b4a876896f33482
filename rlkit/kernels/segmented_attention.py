"""Attention within the segments of one packed row, each under its own mask.

A packed row (batch 1, ``N`` tokens) holds independent segments one after another.
Handing the decoder one ``N x N`` mask for it would make attention cost ``N^2`` per
layer, nearly all of it on blocked pairs; handing it the segments as padded rows of a
batch would make every matrix product run on the padding too. Here the matrix products
see exactly the ``N`` real tokens and attention runs within each segment, over that
segment's own ``l x l`` mask: one SDPA call for all segments, gathered into a batch of
``S`` rows padded to the longest segment (``S x W^2`` attention instead of ``N^2``; the
padding stays inside attention). :func:`per_segment_attention_reference` is the same
computation as one SDPA call per segment, kept beside it with a test that they agree.

:meth:`AttentionSegments.run_decoder` hands a decoder the segments as the keyword
:data:`SEGMENTS_KWARG`, which Hugging Face decoders pass on to their attention function
untouched; rlkit's ``grouped_sdpa`` kernel (:mod:`rlkit.kernels.attention`) reads it,
and :attr:`AttentionSegments.calls` tells whether the model really did pass it on.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

#: The keyword a decoder's forward takes the segments under (passed on to attention).
SEGMENTS_KWARG = "rlkit_attention_segments"


class AttentionSegments:
    """Segments ``[start, end)`` of a packed row and, per segment, a boolean
    ``(1, 1, l, l)`` mask (``True``: the query at row ``i`` may see the key at ``j``)."""

    def __init__(self, bounds: Sequence[tuple[int, int]], masks: Sequence[torch.Tensor]) -> None:
        problems = [
            f"segment {i} [{s}, {e}) has a mask of shape {tuple(m.shape)}"
            for i, ((s, e), m) in enumerate(zip(bounds, masks, strict=True))
            if m.shape != (1, 1, e - s, e - s) or m.dtype != torch.bool
        ]
        if problems:
            raise ValueError(
                "each segment needs a (1, 1, l, l) boolean mask: " + "; ".join(problems)
            )
        self.bounds = list(bounds)
        self.masks = list(masks)
        starts = [0] + [e for _, e in self.bounds[:-1]]
        if [s for s, _ in self.bounds] != starts:
            raise ValueError(
                f"segments must follow one another from token 0 without gaps; got {self.bounds}"
            )
        self.calls = 0
        """How many attention layers have read these segments."""
        self._index, self._valid, self._batch_mask = self._batch_layout()

    def _batch_layout(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Segment s's tokens as row s of an (S, W) batch: their positions in the packed
        row (``index``), which entries are real (``valid``), and the (S, 1, W, W) mask. A
        padding query sees the row's first key (a real one), so no row of the softmax is
        empty; its output is dropped."""
        device = self.masks[0].device if self.masks else None
        width = max((e - s for s, e in self.bounds), default=0)
        index = torch.zeros(len(self.bounds), width, dtype=torch.long, device=device)
        valid = torch.zeros(len(self.bounds), width, dtype=torch.bool, device=device)
        mask = torch.zeros(len(self.bounds), 1, width, width, dtype=torch.bool, device=device)
        for row, ((start, end), own) in enumerate(zip(self.bounds, self.masks)):
            n = end - start
            index[row, :n] = torch.arange(start, end, device=device)
            valid[row, :n] = True
            mask[row, :, :n, :n] = own[0]
            mask[row, :, n:, 0] = True
        return index, valid, mask

    @classmethod
    def from_masks(cls, masks: Sequence[torch.Tensor]) -> AttentionSegments:
        """Segments one after another from token 0, each as long as its (1, 1, l, l) mask."""
        bounds, start = [], 0
        for mask in masks:
            bounds.append((start, start + mask.shape[-1]))
            start += mask.shape[-1]
        return cls(bounds, masks)

    @classmethod
    def causal(
        cls, lengths: Sequence[int], device: torch.device | None = None
    ) -> AttentionSegments:
        """Rows of ``lengths`` tokens one after another, each causal within itself (rows of
        0 tokens take no segment)."""
        return cls.from_masks(
            [
                torch.ones(n, n, dtype=torch.bool, device=device).tril()[None, None]
                for n in lengths
                if n
            ]
        )

    def run_decoder(
        self, decoder: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, setting: str
    ) -> torch.Tensor:
        """``decoder``'s last hidden states over the packed row ``input_ids`` (1, N),
        attended within these segments: (N, H).

        Raises:
            RuntimeError: the decoder did not pass the segments on to its attention
                (:meth:`require_read`); ``setting`` names the option that avoids this path.
        """
        hidden = decoder(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=self.stand_in_mask(input_ids.device),
            use_cache=False,
            **{SEGMENTS_KWARG: self},
        ).last_hidden_state[0]
        self.require_read(decoder, setting)
        return hidden

    def require_read(self, model: object, setting: str) -> None:
        """Raise unless an attention layer read these segments during the last forward.

        Raises:
            RuntimeError: ``model``'s layers did not hand the keyword on to attention;
                ``setting`` names the configuration that turns this layout off.
        """
        if self.calls == 0:
            raise RuntimeError(
                f"{type(model).__name__} did not hand keyword arguments on to its attention "
                f"function, so its packed row cannot be attended within its segments; set "
                f"{setting}=False"
            )

    def stand_in_mask(self, device: torch.device | None = None) -> torch.Tensor:
        """A (1, 1, N, N) boolean view of one element, to hand the decoder as its
        ``attention_mask``: transformers passes a 4D mask on as it is, so it builds no
        ``N x N`` mask of its own, which the attention would not read (it reads the
        segments)."""
        n = self.length
        return torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device).expand(1, 1, n, n)

    @property
    def length(self) -> int:
        return self.bounds[-1][1] if self.bounds else 0

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        dropout: float = 0.0,
        scale: float | None = None,
    ) -> torch.Tensor:
        """SDPA in every segment. query (1, H, N, D), key and value (1, H_kv, N, D) with
        ``H`` a multiple of ``H_kv``; returns (1, N, H, D), as transformers' attention
        functions do."""
        if query.shape[0] != 1 or query.shape[2] != self.length or key.shape[2] != self.length:
            raise ValueError(
                f"attention segments cover one packed row of {self.length} tokens; got query "
                f"{tuple(query.shape)} and key {tuple(key.shape)} (batch, heads, tokens, dim)"
            )
        self.calls += 1

        def batched(x: torch.Tensor) -> torch.Tensor:  # (1, h, N, D) -> (S, h, W, D)
            return x[0][:, self._index].transpose(0, 1)

        out = torch.nn.functional.scaled_dot_product_attention(
            batched(query),
            batched(key),
            batched(value),
            attn_mask=self._batch_mask,
            dropout_p=dropout,
            scale=scale,
            enable_gqa=key.shape[1] != query.shape[1],
        )  # (S, H, W, D)
        # The real entries, row by row, are the packed row's tokens in order.
        return out.transpose(1, 2)[self._valid][None]


def per_segment_attention_reference(
    segments: AttentionSegments, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """:meth:`AttentionSegments.attend` as one SDPA call per segment, each on its own
    slice and mask (shapes as there): the plain version of the batched call."""
    grouped = key.shape[1] != query.shape[1]
    outs = [
        torch.nn.functional.scaled_dot_product_attention(
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            attn_mask=mask,
            enable_gqa=grouped,
        )
        for (start, end), mask in zip(segments.bounds, segments.masks)
    ]
    return torch.cat(outs, dim=2).transpose(1, 2)


def segmented_attention_reference(
    segments: AttentionSegments, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """The same result from one ``N x N`` mask over the whole row (the block-diagonal of
    the segments' masks): what :meth:`AttentionSegments.attend` avoids computing, kept
    to test it against. Returns (1, N, H, D)."""
    n = segments.length
    full = torch.zeros(1, 1, n, n, dtype=torch.bool, device=query.device)
    for (start, end), mask in zip(segments.bounds, segments.masks):
        full[..., start:end, start:end] = mask
    repeat = query.shape[1] // key.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key.repeat_interleave(repeat, dim=1),
        value.repeat_interleave(repeat, dim=1),
        attn_mask=full,
    )
    return out.transpose(1, 2)
