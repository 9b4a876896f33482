"""Attention within the segments of one packed row, each under its own mask.

A packed row (batch 1, ``N`` tokens) holds independent segments one after another.
Handing the decoder one ``N x N`` mask for it would make attention cost ``N^2`` per
layer, nearly all of it on blocked pairs; handing it the segments as padded rows of a
batch would make every matrix product run on the padding too. Here the matrix products
see exactly the ``N`` real tokens and attention runs within each segment, over that
segment's own ``l x l`` mask: one SDPA call for all segments, gathered into a padded batch
(the padding stays inside attention). :func:`per_segment_attention_reference` is the same
computation as one SDPA call per segment, kept beside it with a test that they agree.

The batch's rows are *query runs*: consecutive queries of a segment, each seeing every key
its predecessor sees (a causal stretch), attend together over the keys the run's last
query sees. A shared-prompt segment (a prompt, then responses that each see the prompt
and themselves) then costs one row of prompt + response keys per response, not its whole
``l x l`` square: ``p + r_1`` queries over as many keys, then ``r_i`` queries over
``p + r_i`` keys for each further response, where the square has ``(p + Σ r_i)^2``
entries. Runs are cut to at most ``Q`` queries (a piece's keys: its last query's), and
``Q`` is chosen with the layout (runs, or one row per segment) of the lowest estimated
cost: the padded batch's score entries plus its gathered query, key and value entries,
:data:`GATHER_COST` each (more rows of fewer queries mean fewer scores, but every row
gathers its keys and values again).

:meth:`AttentionSegments.run_decoder` hands a decoder the segments as the keyword
:data:`SEGMENTS_KWARG`, which Hugging Face decoders pass on to their attention function
untouched; rlkit's ``grouped_sdpa`` kernel (:mod:`rlkit.kernels.attention`) reads it,
and :attr:`AttentionSegments.calls` tells whether the model really did pass it on.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rlkit.kernels.attention_math import attend

#: The keyword a decoder's forward takes the segments under (passed on to attention).
SEGMENTS_KWARG = "rlkit_attention_segments"

#: What one gathered query, key or value entry costs against one attention score entry,
#: forward and backward. Fitted on a 2-core x86-64 CPU (head dim 128) with shared-prompt
#: segments of 6 + 8 x 64 and 206 + 8 x 128 tokens cut to 4-1,000 queries per row.
GATHER_COST = 12


class AttentionSegments:
    """Segments ``[start, end)`` of a packed row and, per segment, a boolean
    ``(1, 1, l, l)`` mask (``True``: the query at row ``i`` may see the key at ``j``).

    ``positions`` (N,) are the tokens' positions in the sequences they come from (the
    position ids the decoder is given; default: the index within the segment). A layer
    with a sliding window of ``w`` tokens attends under each mask narrowed to the keys
    fewer than ``w`` positions before the query (:meth:`windowed`), as transformers'
    sliding-window masks do for an unpacked row."""

    def __init__(
        self,
        bounds: Sequence[tuple[int, int]],
        masks: Sequence[torch.Tensor] | None,
        query_runs: bool = True,
        positions: torch.Tensor | None = None,
        device: torch.device | None = None,
    ) -> None:
        # masks=None: every segment causal (:meth:`causal`), no mask built unless asked.
        problems = [
            f"segment {i} [{s}, {e}) has a mask of shape {tuple(m.shape)}"
            for i, ((s, e), m) in enumerate(zip(bounds, masks or [], strict=masks is not None))
            if m.shape != (1, 1, e - s, e - s) or m.dtype != torch.bool
        ]
        if problems:
            raise ValueError(
                "each segment needs a (1, 1, l, l) boolean mask: " + "; ".join(problems)
            )
        self.bounds = list(bounds)
        self._masks = None if masks is None else list(masks)
        self.device = self._masks[0].device if self._masks else device
        starts = [0] + [e for _, e in self.bounds[:-1]]
        if [s for s, _ in self.bounds] != starts:
            raise ValueError(
                f"segments must follow one another from token 0 without gaps; got {self.bounds}"
            )
        self.calls = 0
        """How many attention layers have read these segments."""
        if positions is None:
            positions = torch.cat(
                [torch.arange(e - s, device=self.device) for s, e in self.bounds]
                or [torch.zeros(0, dtype=torch.long, device=self.device)]
            )
        self.positions = positions
        self._windowed: dict[int, AttentionSegments] = {}
        self.query_runs = query_runs
        """Whether rows may be query runs (else one row per segment, the plain layout)."""
        self._queries, self._keys, self._valid, self._batch_mask = self._batch_layout()
        self._causal = self._rows_are_causal()
        rows, width_q = self._queries.shape
        self.batch_shape = (rows, width_q, self._keys.shape[1])
        """The padded batch attention runs on: (rows, queries per row, keys per row)."""

    @property
    def masks(self) -> list[torch.Tensor]:
        """Each segment's (1, 1, l, l) boolean mask (built here for causal segments)."""
        if self._masks is None:
            self._masks = [
                torch.ones(e - s, e - s, dtype=torch.bool, device=self.device).tril()[None, None]
                for s, e in self.bounds
            ]
        return self._masks

    def _batch_layout(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch SDPA runs on (see the module docs): per row, the packed-row positions
        of its queries (R, Wq) and keys (R, Wk), which query entries are real (R, Wq), and
        the (R, 1, Wq, Wk) mask. A padding query sees the row's first key (a real one), so
        no row of the softmax is empty; its output is dropped."""
        device = self.device
        pieces = self._cheapest_pieces()
        width_q = max((b - a for _, a, b, _ in pieces), default=0)
        width_k = max((len(keys) for *_, keys in pieces), default=0)
        rows = len(pieces)
        queries = torch.zeros(rows, width_q, dtype=torch.long, device=device)
        keys_at = torch.zeros(rows, width_k, dtype=torch.long, device=device)
        valid = torch.zeros(rows, width_q, dtype=torch.bool, device=device)
        causal = self._masks is None  # whole causal segments: SDPA's flag, no mask
        mask = (
            None
            if causal
            else torch.zeros(rows, 1, width_q, width_k, dtype=torch.bool, device=device)
        )
        for row, (seg, a, b, keys) in enumerate(pieces):
            start = self.bounds[seg][0]
            queries[row, : b - a] = torch.arange(start + a, start + b, device=device)
            keys_at[row, : len(keys)] = keys + start
            valid[row, : b - a] = True
            if not causal:
                mask[row, 0, : b - a, : len(keys)] = self.masks[seg][0, 0][a:b][:, keys]
                mask[row, 0, b - a :, 0] = True
        return queries, keys_at, valid, mask

    def _rows_are_causal(self) -> bool:
        """Whether every row is a whole segment under a plain causal mask. SDPA then takes
        ``is_causal`` instead of the mask: no (rows, queries, keys) mask is built or kept
        for the backward pass. A shorter row's padding queries then see padding keys too;
        their outputs are dropped, and no real query sees a key after it."""
        if self._batch_mask is None:
            return True
        if self._batch_mask.shape[-2] != self._batch_mask.shape[-1]:
            return False
        for row, valid in enumerate(self._valid):
            n = int(valid.sum())
            own = self._batch_mask[row, 0, :n, :n]
            keys = self._keys[row, :n] - self._queries[row, 0]
            if not torch.equal(keys, torch.arange(n, device=keys.device)):
                return False
            if not torch.equal(own, torch.ones_like(own).tril()):
                return False
        return True

    def _cheapest_pieces(self) -> list[tuple[int, int, int, torch.Tensor]]:
        """(segment, first query, end query, the keys' positions in the segment) per row,
        in packed order: whole segments, or (with ``query_runs``) query runs cut to at most
        Q queries where that costs less (:func:`_layout_cost`)."""
        whole = [(i, 0, e - s, e - s) for i, (s, e) in enumerate(self.bounds)]
        if self._masks is None:  # causal: one run per segment, the whole segment
            return [(i, 0, n, torch.arange(n, device=self.device)) for i, _, n, _ in whole]
        best, best_cost = None, _layout_cost(whole)
        masks = [m[0, 0] for m in self.masks] if self.query_runs else []
        runs = [(i, a, b) for i, m in enumerate(masks) for a, b in _query_runs(m)]
        seen = [m.sum(dim=1).tolist() for m in masks]  # how many keys each query sees
        for q in sorted({b - a for _, a, b in runs}):
            cut = [(i, a, min(a + q, b)) for i, a0, b in runs for a in range(a0, b, q)]
            cost = _layout_cost([(i, a, b, seen[i][b - 1]) for i, a, b in cut])
            if cost < best_cost:
                best, best_cost = cut, cost
        if best is None:
            return [
                (i, 0, n, torch.arange(n, device=m.device))
                for (i, _, n, _), m in zip(whole, self.masks)
            ]
        return [(i, a, b, masks[i][b - 1].nonzero().flatten()) for i, a, b in best]

    @classmethod
    def from_masks(
        cls,
        masks: Sequence[torch.Tensor],
        query_runs: bool = True,
        positions: torch.Tensor | None = None,
    ) -> AttentionSegments:
        """Segments one after another from token 0, each as long as its (1, 1, l, l) mask."""
        bounds, start = [], 0
        for mask in masks:
            bounds.append((start, start + mask.shape[-1]))
            start += mask.shape[-1]
        return cls(bounds, masks, query_runs, positions)

    def windowed(self, window: int) -> AttentionSegments:
        """These segments for a layer with a sliding window of ``window`` tokens: each mask
        keeps the keys at positions ``p_q - window < p_k`` (the query included); ``self``
        where no mask lets a query see that far back. Built once per window."""
        if window not in self._windowed:
            narrowed, changed = [], False
            for (start, end), mask in zip(self.bounds, self.masks):
                pos = self.positions[start:end]
                near = (pos[:, None] - pos[None, :]) < window
                changed = changed or bool((mask[0, 0] & ~near).any())
                narrowed.append(mask & near)
            self._windowed[window] = (
                AttentionSegments(self.bounds, narrowed, self.query_runs, self.positions)
                if changed
                else self
            )
        return self._windowed[window]

    @classmethod
    def causal(
        cls, lengths: Sequence[int], device: torch.device | None = None
    ) -> AttentionSegments:
        """Rows of ``lengths`` tokens one after another, each causal within itself (rows of
        0 tokens take no segment; positions restart at 0 in each)."""
        bounds, start = [], 0
        for n in lengths:
            if n:
                bounds.append((start, start + n))
                start += n
        return cls(bounds, None, device=device)

    def run_decoder(
        self,
        decoder: nn.Module,
        input_ids: torch.Tensor | None,
        position_ids: torch.Tensor,
        setting: str,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``decoder``'s last hidden states over the packed row ``input_ids`` (1, N), or
        its embeddings ``inputs_embeds`` (1, N, H), attended within these segments: (N, H).

        Raises:
            RuntimeError: the decoder did not pass the segments on to its attention
                (:meth:`require_read`); ``setting`` names the option that avoids this path.
        """
        hidden = decoder(
            input_ids=input_ids,
            inputs_embeds=inputs_embeds,
            position_ids=position_ids,
            attention_mask=self.stand_in_mask(position_ids.device),
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
        window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """SDPA in every segment. query (1, H, N, D), key (1, H_kv, N, D) and value
        (1, H_kv, N, D_v) with ``H`` a multiple of ``H_kv``; returns (1, N, H, D_v), as
        transformers' attention functions do. ``window``: the layer's sliding window
        (:meth:`windowed`); ``softcap``: its score cap
        (:func:`~rlkit.kernels.attention_math.attend`)."""
        if query.shape[0] != 1 or query.shape[2] != self.length or key.shape[2] != self.length:
            raise ValueError(
                f"attention segments cover one packed row of {self.length} tokens; got query "
                f"{tuple(query.shape)} and key {tuple(key.shape)} (batch, heads, tokens, dim)"
            )
        self.calls += 1
        layout = self if window is None else self.windowed(window)

        def batched(x: torch.Tensor, at: torch.Tensor) -> torch.Tensor:  # -> (R, h, W, D)
            return x[0][:, at].transpose(0, 1)

        out = attend(
            batched(query, layout._queries),
            batched(key, layout._keys),
            batched(value, layout._keys),
            None if layout._causal else layout._batch_mask,
            dropout=dropout,
            scale=scale,
            softcap=softcap,
            is_causal=layout._causal,
        )  # (R, H, Wq, D_v)
        # The real entries, row by row, are the packed row's tokens in order.
        return out.transpose(1, 2)[layout._valid][None]


def _query_runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """[a, b) stretches of an (l, l) mask's queries in which every query sees all the keys
    its predecessor sees, so the last query's keys serve the whole stretch."""
    if mask.shape[0] == 0:
        return []
    loses = (mask[:-1] & ~mask[1:]).any(dim=1)  # query i + 1 misses a key query i sees
    starts = [0, *(loses.nonzero().flatten() + 1).tolist()]
    return list(zip(starts, [*starts[1:], mask.shape[0]]))


def _layout_cost(pieces: list[tuple[int, int, int, int]]) -> int:
    """Estimated cost of attending ``pieces`` (segment, first query, end query, keys) as
    one padded batch of R rows, Wq queries and Wk keys: R·Wq·Wk score entries plus
    :data:`GATHER_COST` per gathered entry, R·(Wq + 2·Wk)."""
    if not pieces:
        return 0
    rows = len(pieces)
    width_q = max(b - a for _, a, b, _ in pieces)
    width_k = max(k for *_, k in pieces)
    return rows * width_q * width_k + GATHER_COST * rows * (width_q + 2 * width_k)


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
