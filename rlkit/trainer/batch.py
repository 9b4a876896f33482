"""Rows of (prompt, response) as padded tensors, and how they are split.

Layout (as in verl): ``input_ids = [left-padded prompt | right-padded response]``
of width ``P + T``; per-token response quantities are (B, T) and aligned with
``responses``. Padding rows added to balance processes have an all-zero
``response_mask``, so they contribute exactly nothing to any loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rlkit.rollout.base import RolloutBatch

SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids")
"""The (B, P + T) tensors: prompt and response; every other 2-D tensor is (B, T)."""


@dataclass
class Batch:
    """A dict of tensors sharing the first (row) dimension, plus the prompt width."""

    tensors: dict[str, torch.Tensor]
    prompt_width: int
    meta: dict[str, list] = field(default_factory=dict)
    """Per-row Python values (e.g. data sources, ground truths), same row order."""

    def __len__(self) -> int:
        return int(self.tensors["responses"].shape[0])

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        if value.shape[0] != len(self):
            raise ValueError(f"{key} has {value.shape[0]} rows, batch has {len(self)}")
        self.tensors[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def get(self, key: str) -> torch.Tensor | None:
        return self.tensors.get(key)

    def select(self, rows: torch.Tensor | Sequence[int]) -> Batch:
        """The rows ``rows`` (an index tensor or list), in that order."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        tensors = {k: v.index_select(0, idx.to(v.device)) for k, v in self.tensors.items()}
        meta = {k: [v[i] for i in idx.tolist()] for k, v in self.meta.items()}
        return Batch(tensors, self.prompt_width, meta)

    def trimmed(self) -> Batch:
        """The same rows without columns that are padding in every row.

        Keeps the last ``P'`` prompt columns (``P'`` = the longest prompt here) and
        the first ``T'`` response columns (``T'`` = the longest response here, at
        least 1). Per-token tensors (B, T) and sequence tensors (B, P + T) are cut
        to match; every real token, its position id and its mask survive, so any
        masked sum over the rows is unchanged. A micro-batch of short rows then
        costs its own length, not the step's longest.
        """
        p, t = self.prompt_width, self.tensors["responses"].shape[1]
        if len(self) == 0:
            return self
        keep_p = int(self.tensors["prompt_lengths"].max().clamp(min=1, max=p))
        keep_t = int(self.tensors["response_lengths"].max().clamp(min=1, max=t))
        if keep_p == p and keep_t == t:
            return self
        tensors = {}
        for key, value in self.tensors.items():
            if key in SEQUENCE_KEYS:
                value = value[:, p - keep_p : p + keep_t]
            elif value.dim() > 1:
                if value.shape[1] != t:
                    raise ValueError(
                        f"Batch.trimmed: {key!r} is {tuple(value.shape)}; a 2-D tensor other "
                        f"than {SEQUENCE_KEYS} must be per response token, (B, T={t})"
                    )
                value = value[:, :keep_t]
            tensors[key] = value
        return Batch(tensors, keep_p, self.meta)

    def to(self, device: torch.device) -> Batch:
        return Batch(
            {k: v.to(device) for k, v in self.tensors.items()}, self.prompt_width, self.meta
        )


def build_batch(rollout: RolloutBatch, *, pad_token_id: int, response_width: int) -> Batch:
    """Pad a :class:`RolloutBatch` into tensors.

    Args:
        rollout: rows of prompt ids, response ids and rollout log-probs.
        pad_token_id: token used for padding (masked out everywhere).
        response_width: T, at least the longest response (the configured max length,
            so every step has the same shapes).

    Returns:
        A :class:`Batch` with ``input_ids``, ``attention_mask``, ``position_ids``
        (B, P+T), ``responses``, ``response_mask``, ``rollout_log_probs`` (B, T),
        ``prompt_lengths``, ``response_lengths``, ``index`` (B,).
    """
    rollout.validate()
    b = len(rollout)
    longest = max((len(r) for r in rollout.response_ids), default=0)
    if longest > response_width:
        raise ValueError(
            f"a response has {longest} tokens, more than response_width={response_width}"
        )
    p = max((len(x) for x in rollout.prompt_ids), default=1)
    # Padded as Python lists, then one tensor each: a per-row torch.tensor costs more
    # than the rest of the function at a few hundred rows.
    prompt_lengths = torch.tensor([len(x) for x in rollout.prompt_ids], dtype=torch.long)
    response_lengths = torch.tensor([len(r) for r in rollout.response_ids], dtype=torch.long)
    prompts = torch.tensor(
        [[pad_token_id] * (p - len(x)) + list(x) for x in rollout.prompt_ids], dtype=torch.long
    ).reshape(b, p)
    responses = torch.tensor(
        [list(r) + [pad_token_id] * (response_width - len(r)) for r in rollout.response_ids],
        dtype=torch.long,
    ).reshape(b, response_width)
    rollout_lp = torch.tensor(
        [list(lp) + [0.0] * (response_width - len(lp)) for lp in rollout.rollout_log_probs],
        dtype=torch.float32,
    ).reshape(b, response_width)
    prompt_mask = (torch.arange(p) >= (p - prompt_lengths)[:, None]).long()
    response_mask = (torch.arange(response_width) < response_lengths[:, None]).float()
    attention_mask = torch.cat([prompt_mask, response_mask.long()], dim=1)
    # Positions count real tokens only, so left padding does not shift them.
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    tensors = {
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "responses": responses,
        "response_mask": response_mask,
        "rollout_log_probs": rollout_lp,
        "prompt_lengths": prompt_lengths,
        "response_lengths": response_lengths,
        "index": torch.as_tensor(rollout.prompt_index, dtype=torch.long).reshape(b),
    }
    return Batch(tensors, p)


def pad_rows_to_multiple(batch: Batch, multiple: int) -> Batch:
    """Append copies of row 0 with an all-zero response mask until ``len % multiple == 0``.

    Such rows make every process run the same number of forward passes (FSDP's
    collectives need that) while adding nothing to losses or gradients.
    """
    missing = -len(batch) % multiple
    if missing == 0:
        return batch
    if len(batch) == 0:
        raise ValueError("cannot pad an empty batch: it has no row to copy")
    pad = batch.select([0] * missing)
    for key in ("response_mask", "advantages", "returns"):
        if key in pad:
            pad.tensors[key] = torch.zeros_like(pad.tensors[key])
    pad.meta = {k: [None] * missing for k in batch.meta}
    tensors = {k: torch.cat([v, pad.tensors[k]]) for k, v in batch.tensors.items()}
    meta = {k: v + pad.meta[k] for k, v in batch.meta.items()}
    return Batch(tensors, batch.prompt_width, meta)


def shard_rows(num_rows: int, rank: int, world: int) -> torch.Tensor:
    """Contiguous row indices of process ``rank`` when ``num_rows % world == 0``."""
    if num_rows % world:
        raise ValueError(f"{num_rows} rows do not split evenly over {world} processes")
    per = num_rows // world
    return torch.arange(rank * per, (rank + 1) * per)


def length_sorted_split(
    prompt_lengths: torch.Tensor, response_lengths: torch.Tensor, micro_batch_size: int
) -> list[torch.Tensor]:
    """Chunks of at most ``micro_batch_size`` rows, formed after sorting rows by length.

    Rows are ordered by response length, then prompt length (stable), so each
    chunk holds rows of similar length and :meth:`Batch.trimmed` cuts most of its
    padding. Which rows share a micro-batch does not change the gradient (losses
    are normalised by the whole mini-batch), only the floating-point summation order.

    Returns:
        Index tensors, each sorted ascending; together a permutation of the rows.
    """
    if not len(response_lengths):
        return []
    key = response_lengths * (int(prompt_lengths.max()) + 1) + prompt_lengths
    order = torch.argsort(key, stable=True)
    return [chunk.sort().values for chunk in order.split(micro_batch_size)]


def token_budget_split(
    seq_lengths: torch.Tensor, max_tokens: int, min_parts: int = 1
) -> list[torch.Tensor]:
    """Partition rows into micro-batches whose padded token count fits ``max_tokens``.

    Rows are placed longest first into the part with the fewest tokens (a
    balanced greedy partition); the number of parts is the smallest that fits
    but at least ``min_parts`` (so processes can agree on one count). A row
    longer than the budget gets a part of its own.

    Returns:
        Index tensors, one per part, each sorted ascending; together a permutation.
    """
    n = int(seq_lengths.numel())
    if n == 0:
        return [torch.zeros(0, dtype=torch.long) for _ in range(min_parts)]
    lengths = seq_lengths.tolist()
    total = sum(lengths)
    parts = max(min_parts, -(-total // max_tokens))
    while True:
        bins: list[list[int]] = [[] for _ in range(min(parts, n))]
        load = [0] * len(bins)
        for i in sorted(range(n), key=lambda j: -lengths[j]):
            k = min(range(len(bins)), key=load.__getitem__)
            bins[k].append(i)
            load[k] += lengths[i]
        # The padded cost of a part is rows x its longest row.
        fits = all(len(b) * max(lengths[i] for i in b) <= max_tokens or len(b) == 1 for b in bins)
        if fits or len(bins) == n:
            out = [torch.tensor(sorted(b), dtype=torch.long) for b in bins]
            out += [torch.zeros(0, dtype=torch.long)] * (min_parts - len(out))
            return out
        parts += 1
