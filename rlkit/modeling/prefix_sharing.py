"""Shared-prefix forward passes: each prompt computed once for all of its responses.

A GRPO-style batch holds ``n`` responses per prompt. Run as ``n`` separate rows, the
decoder computes the prompt ``n`` times. Here the rows of a micro-batch that share a
prompt are packed into one sequence, the prompt followed by every response,

    P R_1 R_2 ... R_n      (positions: P at 0..p-1, each R_i again from p)

under a mask that lets a response token see the prompt and the earlier tokens of its
own response only. Every response token then has exactly the context it has in its own
row (same tokens, same positions), so hidden states, log-probs, entropies, values and
the gradients reaching the prompt (the sum over the ``n`` responses, as the unshared
rows add up) equal the unshared computation up to float rounding; the prompt's matrix
products run once instead of ``n`` times. Where the packed sequence's attention is over
all of it (a 4D mask), a group is packed only in runs whose FLOPs come below its plain
rows' (:func:`cheapest_chunks`).

How the packed sequences of a micro-batch reach the decoder depends on the attention:

* rlkit's ``grouped_sdpa`` (the CPU default): one after another in a single row, each
  attending within itself under its own mask
  (:class:`~rlkit.kernels.segmented_attention.AttentionSegments`). The matrix products
  run on the real tokens only, and each response's queries attend over the prompt's and
  its own keys only, so a whole group always costs less packed than as plain rows.
* ``sdpa`` and ``eager``: as the padded rows of a batch under one 4D mask handed to the
  model as is. The products also run on each row's padding up to the longest.

Flash-attention and multimodal inputs fall back to the plain rows
(:func:`supports_prefix_sharing`).

**Sliding windows.** A response token at position ``p`` sees, in its own row, only the
keys at positions ``p - w < p_k`` of a layer with a window of ``w`` tokens, so each mask
is narrowed the same way, by position (prompt and response keep their row's positions):
in segments per layer, from the ``sliding_window`` the layer hands its attention
(:meth:`~rlkit.kernels.segmented_attention.AttentionSegments.windowed`); in the padded
rows, one 4D mask per layer type (:func:`padded_masks`), handed to the decoder as
transformers' ``{layer type: mask}`` mapping where layers differ.
"""

from __future__ import annotations

import inspect
import logging
from functools import cache
from typing import Any

import torch
from torch import nn

from rlkit.kernels.attention import GROUPED_SDPA
from rlkit.kernels.segmented_attention import AttentionSegments
from rlkit.metrics.flops import dense_parameters
from rlkit.models.attention_features import AttentionFeatures, attention_features

_MASKED_ATTENTION = ("sdpa", "eager", GROUPED_SDPA)
logger = logging.getLogger(__name__)


def supports_prefix_sharing(backbone: nn.Module, batch: dict[str, Any]) -> bool:
    """True if ``backbone`` takes a custom 4D attention mask (one per layer type, where its
    layers' windows differ) and ``batch`` is text only."""
    config = getattr(backbone, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in _MASKED_ATTENTION or batch.get("multimodal"):
        return False
    if implementation == GROUPED_SDPA:  # segments read each layer's own window
        return True
    features = attention_features(config)
    if len(set(features.layer_windows)) <= 1 or _takes_mask_mapping(type(backbone)):
        return True
    _log_once(
        f"shared-prefix passes are off for {type(backbone).__name__}: its layers have "
        f"different sliding windows and its forward takes one attention mask for all of them"
    )
    return False


@cache
def _takes_mask_mapping(decoder_class: type) -> bool:
    """Whether the decoder's forward accepts ``{layer type: mask}`` as its attention mask
    (transformers' decoders with ``layer_types`` test ``isinstance(attention_mask, dict)``)."""
    try:
        source = inspect.getsource(decoder_class.forward)
    except (OSError, TypeError):
        return False
    return "causal_mask_mapping := attention_mask, dict" in source


@cache
def _log_once(message: str) -> None:
    logger.warning(message)


def prompt_groups(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int
) -> list[list[int]]:
    """Row indices grouped by identical prompt (the real tokens of the first
    ``prompt_width`` columns), each group ascending, groups by their first row."""
    keep = attention_mask[:, :prompt_width].bool()
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, (ids, real) in enumerate(zip(input_ids[:, :prompt_width], keep)):
        groups.setdefault(tuple(ids[real].tolist()), []).append(row)
    return list(groups.values())


def shared_prefix_hidden(
    decoder: nn.Module, batch: dict[str, Any], prompt_width: int
) -> torch.Tensor:
    """The hidden states predicting each response token, as ``_response_hidden`` returns
    them for plain rows: (B, T, H), from one packed sequence per prompt. Positions past a
    row's response are 0.

    Under rlkit's ``grouped_sdpa`` attention the packed sequences go one after another in
    a single row, each attending within itself (:mod:`rlkit.kernels.segmented_attention`),
    so no product runs on padding; under ``sdpa`` and ``eager`` they are the padded rows
    of a batch under one 4D mask."""
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    width = ids.shape[1] - prompt_width
    lengths = mask[:, prompt_width:].sum(dim=1).tolist()
    prompt_lengths = mask[:, :prompt_width].sum(dim=1).tolist()
    segmented = getattr(decoder.config, "_attn_implementation", None) == GROUPED_SDPA
    groups = [
        chunk
        for group in prompt_groups(ids, mask, prompt_width)
        for chunk in cheapest_chunks(
            group, prompt_lengths, lengths, decoder.config, per_response_attention=segmented
        )
    ]
    layout = _Layout(ids, mask, prompt_width, lengths, groups)
    if segmented:
        hidden, starts = _segmented_forward(decoder, layout)
    else:
        hidden, starts = _padded_forward(decoder, layout)
    out = hidden.new_zeros(ids.shape[0], width, hidden.shape[-1])
    group, position = layout.predicting_positions(width)
    valid = position >= 0
    rows, cols = valid.nonzero(as_tuple=True)
    picked = hidden[starts[group[rows, cols]] + position[rows, cols]]
    return out.index_put((rows, cols), picked)  # out of place: gradients reach `hidden`


def _segmented_forward(decoder: nn.Module, layout: _Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed sequences as segments of one row: (N, H) and each sequence's start."""
    device = layout.device
    segments = AttentionSegments.from_masks(
        [_allowed(torch.tensor(seg, device=device))[None, None] for seg in layout.segments],
        positions=torch.tensor(sum(layout.positions, []), device=device),
    )
    hidden = segments.run_decoder(
        decoder,
        torch.tensor([sum(layout.ids, [])], device=device),
        torch.tensor([sum(layout.positions, [])], device=device),
        "ModelConfig.share_prompt_prefix",
    )
    starts = torch.tensor([s for s, _ in segments.bounds], dtype=torch.long, device=device)
    return hidden, starts


def _padded_forward(decoder: nn.Module, layout: _Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed sequences as padded rows (G, L) under one 4D mask: (G * L, H) and each
    sequence's start in that flattening."""
    longest = max(len(s) for s in layout.ids)

    def padded(rows: list[list[int]], fill: int) -> torch.Tensor:
        return torch.tensor([r + [fill] * (longest - len(r)) for r in rows], device=layout.device)

    positions = padded(layout.positions, 0)
    masks = padded_masks(
        _allowed(padded(layout.segments, -1))[:, None],  # (G, 1, L, L)
        positions,
        attention_features(decoder.config),
        additive=getattr(decoder.config, "_attn_implementation", None) == "eager",
    )
    hidden = decoder(
        input_ids=padded(layout.ids, 0),
        attention_mask=masks,
        position_ids=positions,
        use_cache=False,
    ).last_hidden_state
    starts = torch.arange(hidden.shape[0], device=layout.device) * longest
    return hidden.flatten(0, 1), starts


def padded_masks(
    allowed: torch.Tensor, positions: torch.Tensor, features: AttentionFeatures, additive: bool
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The decoder's attention mask for packed rows: ``allowed`` (G, 1, L, L) narrowed to
    each layer's sliding window by ``positions`` (G, L), as one mask where every layer has
    the same window, else transformers' ``{layer type: mask}`` mapping. ``additive``:
    eager attention adds the mask to the scores, 0 where allowed and the lowest float32
    elsewhere (softmax then gives those keys weight 0)."""

    def mask(window: int | None) -> torch.Tensor:
        out = allowed
        if window is not None:
            out = out & ((positions[:, None, :, None] - positions[:, None, None, :]) < window)
        if additive:
            blocked = torch.finfo(torch.float32).min
            out = torch.zeros(out.shape, device=out.device).masked_fill(~out, blocked)
        return out

    windows = set(features.layer_windows)
    if len(windows) <= 1:
        return mask(next(iter(windows), None))
    return {kind: mask(w) for kind, w in features.windows_by_layer_type().items()}


def _allowed(seg: torch.Tensor) -> torch.Tensor:
    """(..., L) segment ids (0: the prompt, i: response i, -1: padding) -> (..., L, L):
    causal, and a response token sees only the prompt and its own response; a padding
    query sees itself (no row without a key)."""
    length = seg.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=seg.device).tril()
    q, k = seg[..., :, None], seg[..., None, :]
    allowed = causal & (k >= 0) & ((k == 0) | (k == q))
    return allowed | (torch.eye(length, dtype=torch.bool, device=seg.device) & (q < 0))


def cheapest_chunks(
    group: list[int],
    prompt_lengths: list[int],
    response_lengths: list[int],
    config: Any,
    per_response_attention: bool = False,
) -> list[list[int]]:
    """``group`` cut into runs of k rows, each run one packed sequence, for the k that
    costs the fewest FLOPs (k = 1: plain rows).

    Packing saves the prompt's matrix products. A packed row of L = p + Σ r_i tokens costs
    D·L in products (D = 2 FLOPs per weight of the decoder layers) and, with attention
    over the full L x L mask, A·L² (A = 4 · head_dim · heads · layers for the scores and
    the weighted sum), against Σ_i D·(p + r_i) + A·(p + r_i)² for the plain rows: short
    responses after a long prompt pack whole; responses much longer than the prompt stay
    plain (their attention would grow n-fold). With ``per_response_attention``
    (:class:`~rlkit.kernels.segmented_attention.AttentionSegments`, whose rows are the
    prompt with the first response, then each further response over the prompt's and its
    own keys) attention costs A·((p + r_1)² + Σ_{i>1} r_i·(p + r_i)), never more than
    the plain rows': the whole group packs.
    """
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    dense = 2 * (dense_parameters(config) - 2 * config.vocab_size * config.hidden_size)
    attention = 4 * head_dim * heads * config.num_hidden_layers
    prompt = prompt_lengths[group[0]]

    def attended(responses: list[int]) -> int:  # (query, key) pairs of one packed row
        if not per_response_attention:
            return (prompt + sum(responses)) ** 2
        first, *rest = responses
        return (prompt + first) ** 2 + sum(r * (prompt + r) for r in rest)

    def cost(k: int) -> float:
        runs = [[response_lengths[r] for r in group[i : i + k]] for i in range(0, len(group), k)]
        return sum(dense * (prompt + sum(run)) + attention * attended(run) for run in runs)

    best = min(range(1, len(group) + 1), key=lambda k: (cost(k), -k))
    return [group[i : i + best] for i in range(0, len(group), best)]


class _Layout:
    """Where each prompt and response sits in the packed sequences (one per prompt group):
    per sequence its token ids, segment ids (0: the prompt, i: response i) and positions."""

    def __init__(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        prompt_width: int,
        lengths: list[int],
        groups: list[list[int]],
    ) -> None:
        self.device = ids.device
        self.ids: list[list[int]] = []
        self.segments: list[list[int]] = []
        self.positions: list[list[int]] = []
        # row -> (group, prompt length, where its response starts, response length)
        self.starts: dict[int, tuple[int, int, int, int]] = {}
        for g, members in enumerate(groups):
            prompt = ids[members[0], :prompt_width][mask[members[0], :prompt_width]].tolist()
            seq, seg, pos = list(prompt), [0] * len(prompt), list(range(len(prompt)))
            for i, row in enumerate(members, start=1):
                n = lengths[row]
                self.starts[row] = (g, len(prompt), len(seq), n)
                seq += ids[row, prompt_width : prompt_width + n].tolist()
                seg += [i] * n
                pos += range(len(prompt), len(prompt) + n)
            self.ids.append(seq)
            self.segments.append(seg)
            self.positions.append(pos)

    def predicting_positions(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """For row b and response position t: the packed sequence and position in it whose
        hidden state predicts that token (the prompt's last token for t = 0), -1 past the
        end."""
        rows = len(self.starts)
        group = torch.zeros(rows, width, dtype=torch.long)
        position = torch.full((rows, width), -1, dtype=torch.long)
        for row, (g, prompt_length, start, n) in self.starts.items():
            group[row] = g
            if n:
                position[row, 0] = prompt_length - 1
                position[row, 1:n] = torch.arange(start, start + n - 1)
        return group.to(self.device), position.to(self.device)
