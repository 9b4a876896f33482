"""Ulysses sequence parallelism for the actor, reference, critic and PRM passes.

With ``ModelConfig.ulysses_sequence_parallel_size = k`` the ``k`` processes of a
sequence-parallel group (:mod:`rlkit.distributed.sequence_parallel`) hold the same
micro-batch. Its rows are packed without padding into one sequence of ``N`` tokens (as
``use_remove_padding`` packs them), padded at the end to a multiple of ``k``, and cut
into ``k`` slices of ``n = N / k`` tokens: process ``r`` runs the decoder on slice
``r`` only. In every attention layer (:class:`UlyssesSegments`, read by rlkit's
``grouped_sdpa`` attention) an all-to-all gives each process ``H / k`` query heads for
all ``N`` tokens, attention runs within each row's segment over the whole sequence, and
a second all-to-all brings the process's own tokens back with all heads.

Grouped-query models whose ``k`` exceeds their key/value heads repeat each key/value
head ``k / H_kv`` times before the exchange (so every process gets the one its query
heads read), as DeepSpeed-Ulysses and verl do; a count that neither divides nor is
divided by ``k`` is refused (:func:`head_problems`).

The per-token outputs (log-probs, entropy, values) are computed on each process's slice,
then gathered, so every process of the group sees whole rows and computes the loss on
them: the loss, its five aggregation modes and the algorithm's normalisers are exactly
those of the unsplit run. Each process's backward sends the gradient of its own slice
back through the exchanges; FSDP's gradient average over all ``dp x k`` processes,
with the loss scaled by the process count as without Ulysses
(:meth:`~rlkit.trainer.updater.Updater.optimize`), then sums the group's partial
gradients and averages over data-parallel groups.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlkit.distributed.sequence_parallel import (
    SequenceParallel,
    gather_sequence,
    heads_to_sequence,
    sequence_to_heads,
)
from rlkit.kernels.segmented_attention import SEGMENTS_KWARG, AttentionSegments

SETTING = "ModelConfig.ulysses_sequence_parallel_size"


def head_problems(config: Any, size: int, setting: str = SETTING) -> list[str]:
    """Why a model with Hugging Face ``config`` cannot split its heads ``size`` ways."""
    if size <= 1:
        return []
    text = getattr(config, "get_text_config", lambda: config)()
    heads = getattr(text, "num_attention_heads", None)
    kv = getattr(text, "num_key_value_heads", None) or heads
    if heads is None:
        return [f"{setting} = {size}: the model's config has no num_attention_heads"]
    if heads % size:
        return [
            f"{setting} = {size} does not divide the model's {heads} attention heads: "
            f"choose a size that divides {heads}"
        ]
    if kv % size and size % kv:
        return [
            f"{setting} = {size}: the model's {kv} key/value heads can be neither split "
            f"{size} ways nor repeated to {size}: choose a size that divides {kv} or a "
            f"multiple of it that divides {heads}"
        ]
    return []


class UlyssesSegments:
    """The packed sequence's segments as seen by one process of the group.

    :meth:`attend` has the signature of :meth:`AttentionSegments.attend`, so rlkit's
    ``grouped_sdpa`` attention calls it with this process's slice: query (1, H, n, D),
    key and value (1, H_kv, n, D); it returns (1, n, H, D_v).
    """

    def __init__(self, whole: AttentionSegments, sp: SequenceParallel) -> None:
        self.whole, self.sp = whole, sp
        self.local_length = whole.length // sp.size

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
        k = self.sp.size
        if key.shape[1] % k:  # fewer key/value heads than processes: one copy each
            key = key.repeat_interleave(k // key.shape[1], dim=1)
            value = value.repeat_interleave(k // value.shape[1], dim=1)
        out = self.whole.attend(
            heads_to_sequence(query, self.sp),
            heads_to_sequence(key, self.sp),
            heads_to_sequence(value, self.sp),
            dropout=dropout,
            scale=scale,
            window=window,
            softcap=softcap,
        )  # (1, N, H / k, D_v)
        return sequence_to_heads(out, self.sp)


class UlyssesPacking:
    """A micro-batch packed, padded to a multiple of ``k`` and cut: this process's slice.

    Args:
        batch: :meth:`TrainBatch.model_inputs` (``input_ids``, ``attention_mask``,
            ``position_ids`` of (B, L)).
        sp: this process's place in the sequence-parallel grid.
    """

    def __init__(self, batch: dict[str, Any], sp: SequenceParallel) -> None:
        if batch.get("multimodal"):
            raise ValueError(f"{SETTING} > 1 does not split multimodal rows; set it to 1")
        self.sp = sp
        self.keep = batch["attention_mask"].bool()
        ids, device = batch["input_ids"], batch["input_ids"].device
        lengths = self.keep.sum(dim=1).tolist()
        self.total = int(sum(lengths))
        pad = -self.total % sp.size
        # Hidden state j predicts token j + 1 of its row; the last one predicts nothing.
        following = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], dim=1)
        filler = torch.zeros(pad, dtype=ids.dtype, device=device)
        whole_ids = torch.cat([ids[self.keep], filler])
        whole_next = torch.cat([following[self.keep], filler])
        whole_positions = torch.cat(
            [batch["position_ids"][self.keep], torch.arange(pad, device=device)]
        )
        # The padding is a segment of its own, so no real token attends to it.
        whole = AttentionSegments.causal([*lengths, pad], device)
        self.segments = UlyssesSegments(whole, sp)
        n = self.segments.local_length
        mine = slice(sp.rank * n, (sp.rank + 1) * n)
        self.input_ids = whole_ids[mine][None]
        self.position_ids = whole_positions[mine][None]
        self.next_tokens = whole_next[mine]
        """(n,) the token each local hidden state predicts (0 where none)."""

    def hidden(self, decoder: nn.Module) -> torch.Tensor:
        """The decoder's last hidden states on this process's slice: (n, H)."""
        n = self.segments.local_length
        stand_in = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=self.input_ids.device)
        out = decoder(
            input_ids=self.input_ids,
            position_ids=self.position_ids,
            # A 4D mask is passed on as it is: transformers builds no mask of its own.
            attention_mask=stand_in.expand(1, 1, n, n),
            use_cache=False,
            **{SEGMENTS_KWARG: self.segments},
        ).last_hidden_state[0]
        self.segments.whole.require_read(decoder, SETTING)
        return out

    def response_values(
        self, local: torch.Tensor, prompt_width: int, response_width: int
    ) -> torch.Tensor:
        """Per-token values of this slice (n, ...) -> the batch's response positions
        (B, T, ...): gathered over the group, unpacked into rows, cut to the responses."""
        whole = gather_sequence(local, self.sp)[: self.total]
        rows = whole.new_zeros(*self.keep.shape, *whole.shape[1:])
        rows = rows.index_put((self.keep,), whole)  # out of place: gradients reach `whole`
        return rows[:, prompt_width - 1 : prompt_width - 1 + response_width]
