"""rlkit's own batched sampling loop over a Hugging Face model's KV cache.

What it does that ``generate`` does not, for RL rollouts of ``n`` responses per prompt:

* **Shared prefill.** Each distinct prompt is run once; its KV cache is then repeated
  ``n`` times (``Cache.batch_repeat_interleave``), so prefill costs prompts, not rows.
* **Finished rows leave the batch.** A row that emitted a stop token is dropped from
  the cache (``Cache.batch_select_indices``); later decode steps run only the rows
  still generating. ``generate`` keeps computing every row until all have stopped.
* **Each prompt read once per group.** With ``n > 1`` and prompts of at least
  :data:`SHARED_PREFIX_MIN_TOKENS` tokens, under the ``grouped_sdpa`` attention kernel, the
  repeat keeps one copy of each prompt's keys and values
  (:class:`~rlkit.rollout.embedded.kv_cache.SharedPrefixLayer`), and each decode step's attention
  reads it once for the group's rows (cascade attention,
  :func:`~rlkit.kernels.shared_prefix_decode.shared_prefix_attention`).
* **No copy per token.** The KV cache is :class:`~rlkit.rollout.embedded.kv_cache.InPlaceLayer`
  buffers written in place (``DynamicLayer`` copies each layer's whole cache at every
  token); models whose decoder has other layer kinds keep transformers' own cache.
* **One uniform per row.** Tokens are drawn by inverse-CDF sampling (a cumulative sum
  and a binary search), exact for the categorical distribution; ``torch.multinomial``
  draws an exponential variate per vocabulary entry.

Each sampled token's log-prob is recorded under the distribution it was drawn from
(temperature, top-k, top-p applied), as :class:`~rlkit.rollout.base.RolloutBatch`
requires. Under FSDP (``synced=True``) every process runs the same number of forward
passes: a process whose rows have all stopped runs one-token dummy passes until every
process is done, as ``generate(synced_gpus=True)`` does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from rlkit.kernels.attention import GROUPED_SDPA
from rlkit.kernels.shared_prefix_decode import SHARED_PREFIX_KWARG
from rlkit.models.attention_features import attention_features
from rlkit.models.vision_language import (
    concat_images,
    image_embeddings,
    image_token_counts,
    is_vision_language,
    rope_positions,
    vision_trunk,
)
from rlkit.rollout.embedded.kv_cache import (
    check_prefixes_read,
    in_place_cache,
    prefix_reader,
    shared_prefix_cache,
)
from rlkit.rollout.sampling import TopLogProbs

Warp = Callable[[torch.Tensor], torch.Tensor]
"""(rows, vocab) float scores -> scores of the sampling distribution (-inf = excluded)."""


@dataclass
class DecodeResult:
    """Per prompt-row ``r`` (prompt ``r // n``): generated ids, their log-probs, why it ended."""

    response_ids: list[list[int]]
    log_probs: list[list[float]]
    finish_reasons: list[str]
    top_log_probs: list[TopLogProbs] | None = None


SHARED_PREFIX_MIN_TOKENS = 32
"""Prompt width from which the decode loop shares each prompt's KV cache by default.

``python benchmarks/shared_prefix_decode.py`` measures the crossover on a CPU, 8 prompts x
8 rows: one decode step's attention costs 1.19x (1 own token) and 0.98x (64) of the
copied cache's at 32 prompt tokens, 0.25x-0.32x at 206; the whole decode loop took 1.01x
at 6 prompt tokens, 0.97x at 32 and 0.79x at 206 (128 new tokens)."""

CDF_BUDGET = 1 << 23
"""float64 entries per inverse-CDF chunk (64 MiB): 55 rows at a 152k vocabulary."""


def sample_categorical(
    log_probs: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One index per row drawn from ``softmax`` weights ``exp(log_probs)``: (rows,) long.

    Inverse-CDF: ``u ~ U[0, total)`` per row, the first index whose cumulative mass
    exceeds ``u``. The cumulative sum is float64, so a vocabulary of 10^5 entries loses
    no mass to rounding; rows go in chunks of at most :data:`CDF_BUDGET` entries. An
    entry of probability 0 (``-inf``) is never drawn: its cumulative mass equals its
    predecessor's, so it is never the first to exceed ``u``, and scaling ``u`` by the
    row's total keeps ``u`` below the last positive entry's sum.
    """
    rows, vocab = log_probs.shape
    u = torch.rand((rows, 1), generator=generator, device=log_probs.device, dtype=torch.float64)
    out = torch.empty(rows, dtype=torch.long, device=log_probs.device)
    step = max(1, CDF_BUDGET // max(vocab, 1))
    for start in range(0, rows, step):
        cdf = log_probs[start : start + step].double().exp_().cumsum_(-1)
        picked = torch.searchsorted(cdf, u[start : start + step] * cdf[:, -1:], right=True)
        out[start : start + step] = picked.squeeze(-1).clamp_(max=vocab - 1)
    return out


def _left_padded(prompts: Sequence[Sequence[int]], pad_token_id: int):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


class _Stepper:
    """Forward passes of ``model`` over its KV cache, and the FSDP lock-step vote."""

    def __init__(
        self, model: torch.nn.Module, pad_token_id: int, synced: bool, shared: bool
    ) -> None:
        self.model, self.pad_token_id, self.synced = model, pad_token_id, synced
        self.shared = shared
        self.device = next(model.parameters()).device
        params = inspect.signature(type(model).forward).parameters
        # Only the last position's logits are needed after prefill (most HF models
        # take logits_to_keep; the rest compute them all, which is just slower).
        self.keep_last = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def prefill(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        max_new_tokens: int,
        images: Sequence[Mapping[str, torch.Tensor] | None] | None = None,
    ):
        """The prompts' last logits and their KV cache. Sets :attr:`delta`, (B,): how far
        each row's positions run from its token count (multimodal positions; else 0)."""
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        self.delta = torch.zeros(ids.shape[0], dtype=torch.long, device=self.device)
        inputs = {"input_ids": ids}
        batch = concat_images(images) if images else None
        config = getattr(self.model, "config", None)
        # Under FSDP every process runs the vision tower (one without images on a blank).
        in_step = self.synced and config is not None and is_vision_language(config)
        if batch is not None or in_step:  # the vision tower runs here, once per prompt
            trunk = vision_trunk(self.model)
            batch = None if batch is None else {k: v.to(self.device) for k, v in batch.items()}
            counts = image_token_counts(trunk, images or [None] * len(ids))
            grid = None if batch is None else batch["image_grid_thw"]
            positions, delta = rope_positions(trunk, ids, mask, grid, counts=counts)
            self.delta = delta.view(-1).to(self.device)
            embeds = image_embeddings(trunk, ids, batch, counts=counts, keep_tower=in_step)
            inputs = {"inputs_embeds": embeds}
        self.vision = batch is not None or in_step
        # Room for every token of the rollout, written in place (None: the model's own).
        make_cache = shared_prefix_cache if self.shared else in_place_cache
        cache = make_cache(config, ids.shape[1] + max_new_tokens) if config else None
        self.shared = self.shared and cache is not None
        out = self.model(
            **inputs,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **self.keep_last,
        )
        cache = out.past_key_values
        if not all(hasattr(cache, m) for m in ("batch_repeat_interleave", "batch_select_indices")):
            raise TypeError(
                f"{type(self.model).__name__} returned a {type(cache).__name__} KV cache, which "
                f"cannot be repeated or subset per row; use the hf engine's "
                f"decode_loop='generate' (RolloutConfig.engine_options)"
            )
        return out.logits[:, -1], cache

    def decode(self, tokens, mask, positions, cache):
        shared = {SHARED_PREFIX_KWARG: prefix_reader(cache)} if self.shared else {}
        positions = positions[:, None]
        if self.vision:  # a generated token advances time, height and width together
            positions = positions[None].expand(3, -1, -1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **shared,
        )
        if self.shared:
            check_prefixes_read(cache, self.model)
        return out.logits[:, -1]

    def dummy(self) -> None:
        """A one-token pass that joins FSDP's all-gathers and changes nothing."""
        ids = torch.full((1, 1), self.pad_token_id, dtype=torch.long, device=self.device)
        self.model(input_ids=ids, use_cache=False, **self.keep_last)

    def anyone_active(self, active: bool) -> bool:
        if not self.synced:
            return active
        from rlkit.distributed.collectives import same_everywhere

        return same_everywhere(int(active), "max") == 1


def _share_prefix(model: torch.nn.Module, requested: bool | None, n: int, width: int) -> bool:
    """Whether the decode loop shares each prompt's KV cache (see ``decode``)."""
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if requested and implementation != GROUPED_SDPA:
        raise ValueError(
            f"shared_prefix=True needs the grouped_sdpa attention kernel, which reads the "
            f"shared prompt; this model's attention is {implementation!r} (select "
            f"grouped_sdpa, or pass shared_prefix=None)"
        )
    if config is not None and attention_features(config).latent_kv_cache:
        # The cache holds latents that each layer expands after reading it: there are no
        # prompt keys in it for the shared-prefix attention to read.
        if requested:
            raise ValueError(
                f"shared_prefix=True: {type(model).__name__} caches attention latents, not "
                f"keys and values; pass shared_prefix=None"
            )
        return False
    if requested is None:
        return n > 1 and width >= SHARED_PREFIX_MIN_TOKENS and implementation == GROUPED_SDPA
    return requested and n > 1


@torch.no_grad()
def decode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    n: int,
    max_new_tokens: int,
    pad_token_id: int,
    stop_token_ids: Sequence[int],
    warp: Warp | None,
    greedy: bool = False,
    synced: bool = False,
    shared_prefix: bool | None = None,
    images: Sequence[Mapping[str, torch.Tensor] | None] | None = None,
    top_logprobs: int = 0,
) -> DecodeResult:
    """Sample ``n`` responses to each prompt (rows grouped by prompt, as the engine returns).

    Args:
        model: a Hugging Face causal LM in eval mode whose cache supports
            ``batch_repeat_interleave`` / ``batch_select_indices`` (``DynamicCache``).
        prompts: token ids of the distinct prompts; may be empty (then only the FSDP
            dummy passes run, when ``synced``).
        n: responses per prompt.
        max_new_tokens: the most tokens generated per response (stop token included).
        pad_token_id: left padding of prompts.
        stop_token_ids: ids that end a response (kept in it, reason ``"stop"``).
        warp: maps float32 logits to the sampling distribution's scores (temperature,
            top-k, top-p); ``None`` samples from the raw logits.
        greedy: take the argmax instead of sampling (log-probs still recorded).
        synced: keep every process of the FSDP group stepping until all are done.
        shared_prefix: hold each prompt's KV cache once per group and read it once per
            decode step (needs the ``grouped_sdpa`` attention kernel); ``None`` does so
            when ``n > 1``, the prompts are at least :data:`SHARED_PREFIX_MIN_TOKENS`
            wide and the model uses that kernel. Either way the result is the same up
            to float rounding.
        images: each prompt's image inputs (``pixel_values``, ``image_grid_thw``; ``None``
            for a text prompt) for a vision-language model. A prompt's first image tokens
            are its images' (later ones, sampled in an earlier turn, are text). The vision
            tower runs once per prompt, in the prefill, and the ``n`` rows share its
            result through the repeated cache. Image prompts never share their prefix's
            cache (``shared_prefix`` is taken as ``False``).
        top_logprobs: also record the ``top_logprobs`` most likely tokens of every step's
            sampling distribution (at most the vocabulary), for ``rlkit diagnose``.

    Returns:
        A :class:`DecodeResult` of ``len(prompts) * n`` rows.

    Raises:
        ValueError: ``shared_prefix=True`` with another attention implementation.
    """
    rows = len(prompts) * n
    if prompts:
        ids, mask = _left_padded(prompts, pad_token_id)
    else:  # nothing to generate, but the prefill still joins FSDP's all-gathers
        ids = torch.full((1, 1), pad_token_id, dtype=torch.long)
        mask = torch.ones_like(ids)
    if images is not None and any(i is not None for i in images):
        shared_prefix = False
    shared = _share_prefix(model, shared_prefix, n if prompts else 1, ids.shape[1])
    step = _Stepper(model, pad_token_id, synced, shared)
    logits, cache = step.prefill(ids, mask, max_new_tokens, images)
    mask = mask.to(step.device)
    # The next token's position: the prompts' real lengths (plus a multimodal offset).
    positions = mask.sum(-1) + step.delta
    if n > 1 and prompts:
        cache.batch_repeat_interleave(n)
        logits, mask = logits.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
        positions = positions.repeat_interleave(n, 0)
    stops = torch.tensor(sorted(set(stop_token_ids)), dtype=torch.long, device=step.device)
    tokens = torch.full((rows, max_new_tokens), pad_token_id, dtype=torch.long, device=step.device)
    log_probs = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=step.device)
    lengths = torch.full((rows,), max_new_tokens, dtype=torch.long, device=step.device)
    stopped_rows = torch.zeros((rows,), dtype=torch.bool, device=step.device)
    live = torch.arange(rows, device=step.device)  # the original row of each cache row
    top = _TopRecorder(rows, max_new_tokens, top_logprobs, step.device) if top_logprobs else None
    for t in range(max_new_tokens):
        if len(live):
            scores = logits.float()
            logp = torch.log_softmax(warp(scores) if warp is not None else scores, dim=-1)
            nxt = logp.argmax(-1) if greedy else sample_categorical(logp)
            tokens[live, t] = nxt
            log_probs[live, t] = logp.gather(-1, nxt[:, None]).squeeze(-1)
            if top is not None:
                top.record(live, t, logp)
            stopped = torch.isin(nxt, stops)
            lengths[live[stopped]] = t + 1
            stopped_rows[live[stopped]] = True
            if bool(stopped.any()):
                keep = (~stopped).nonzero().squeeze(-1)
                live, nxt, mask, positions = live[keep], nxt[keep], mask[keep], positions[keep]
                if len(keep):
                    cache.batch_select_indices(keep)
        # The same test on every process, so all of them leave the loop together.
        if t == max_new_tokens - 1 or not step.anyone_active(len(live) > 0):
            break
        if len(live):
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
            logits = step.decode(nxt, mask, positions, cache)
            positions = positions + 1
        else:
            step.dummy()
    tokens, log_probs, lengths = tokens.cpu(), log_probs.cpu(), lengths.tolist()
    return DecodeResult(
        [tokens[r, : lengths[r]].tolist() for r in range(rows)],
        [log_probs[r, : lengths[r]].tolist() for r in range(rows)],
        ["stop" if s else "length" for s in stopped_rows.tolist()],
        top.rows(lengths) if top is not None else None,
    )


class _TopRecorder:
    """The ``k`` most likely tokens of each row's sampling distribution at every step."""

    def __init__(self, rows: int, steps: int, k: int, device: torch.device) -> None:
        self.k = k
        self.ids = torch.full((rows, steps, k), -1, dtype=torch.long, device=device)
        self.values = torch.full((rows, steps, k), float("-inf"), device=device)

    def record(self, live: torch.Tensor, t: int, logp: torch.Tensor) -> None:
        k = min(self.k, logp.shape[-1])
        values, ids = logp.topk(k, dim=-1)
        self.ids[live, t, :k], self.values[live, t, :k] = ids, values

    def rows(self, lengths: list[int]) -> list[TopLogProbs]:
        ids, values = self.ids.cpu(), self.values.cpu()
        return [TopLogProbs(ids[r, :n], values[r, :n]) for r, n in enumerate(lengths)]
