"""The embedded rollout engine: batched Hugging Face ``generate`` on the trainer's model.

It generates with the trainer's live module (no weight copy, so ``sync_weights``
costs nothing) and recovers each sampled token's log-prob under the sampling
distribution from ``generate``'s processed scores (temperature, top-k and top-p
already applied), which is what the rollout importance-sampling correction needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import GenerationConfig

from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.base import PolicyWeights, RolloutBatch, RolloutEngine, SamplingParams


class HFEngine(RolloutEngine):
    """Generate with ``transformers``' ``generate`` in micro-batches.

    Args:
        weights: the trainer's policy; its ``generation_context()`` yields the model.
        pad_token_id: id used to left-pad prompts (the tokenizer's pad id).
        eos_token_ids: ids that end a response (the tokenizer's EOS at least).
        generation_batch_size: sequences per ``generate`` call (prompts x n); bounds memory.
    """

    shares_trainer_module = True

    def __init__(
        self,
        weights: PolicyWeights,
        *,
        pad_token_id: int,
        eos_token_ids: Sequence[int],
        generation_batch_size: int = 256,
    ) -> None:
        if generation_batch_size < 1:
            raise ValueError(f"generation_batch_size must be >= 1, got {generation_batch_size}")
        self.weights = weights
        self.pad_token_id = pad_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.generation_batch_size = generation_batch_size

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutBatch:
        rows = [list(p) for p in prompt_ids for _ in range(params.n)]
        index = [i for i in range(len(prompt_ids)) for _ in range(params.n)]
        out = RolloutBatch([], [], [], [], [])
        with self.weights.generation_context() as (model, extra):
            was_training = model.training
            model.eval()
            try:
                for start in range(0, max(len(rows), 1), self.generation_batch_size):
                    chunk = rows[start : start + self.generation_batch_size]
                    # Every rank must call generate equally often under FSDP, even with no rows.
                    self._generate_chunk(model, chunk, params, extra, out)
            finally:
                model.train(was_training)
        out.prompt_ids, out.prompt_index = rows, index
        out.validate()
        return out

    @torch.no_grad()
    def _generate_chunk(
        self,
        model: torch.nn.Module,
        chunk: list[list[int]],
        params: SamplingParams,
        extra: dict[str, Any],
        out: RolloutBatch,
    ) -> None:
        device = next(model.parameters()).device
        if not chunk:  # a rank with nothing to do still joins the collective forwards
            chunk, dummy = [[self.pad_token_id]], True
        else:
            dummy = False
        width = max(len(r) for r in chunk)
        input_ids = torch.full((len(chunk), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, r in enumerate(chunk):  # left padding, as decoder-only generation needs
            input_ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            attention_mask[i, width - len(r) :] = 1
        # A complete GenerationConfig, so nothing is inherited from the model's own
        # defaults (e.g. top_k=50), which would change the sampling distribution.
        greedy = params.temperature <= 0
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=not greedy,
            temperature=None if greedy else params.temperature,
            top_p=None if greedy else params.top_p,
            top_k=None if greedy else max(params.top_k, 0),  # 0 disables top-k
            eos_token_id=list(self.eos_token_ids + tuple(params.stop_token_ids)),
            pad_token_id=self.pad_token_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        gen = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=config,
            **extra,
        )
        if dummy:
            return
        new_tokens = gen.sequences[:, width:].cpu()
        # scores[t] are the processed logits that step t sampled from.
        scores = torch.stack(gen.scores, dim=1).float().cpu()  # (N, steps, V)
        logprobs = (
            torch.log_softmax(scores, dim=-1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        )
        stops = set(self.eos_token_ids) | set(params.stop_token_ids)
        for tokens, lps in zip(new_tokens.tolist(), logprobs.tolist()):
            length, reason = len(tokens), "length"
            for t, tok in enumerate(tokens):
                if tok in stops:
                    length, reason = t + 1, "stop"
                    break
            out.response_ids.append(tokens[:length])
            out.rollout_log_probs.append(lps[:length])
            out.finish_reasons.append(reason)

    def sync_weights(self, weights: PolicyWeights) -> dict[str, float]:
        # The engine generates with the trainer's live module: nothing to copy.
        self.weights = weights
        return {"timing_s/weight_sync": 0.0}


@ROLLOUT_ENGINES.register(
    "hf", aliases=("transformers",), summary="Hugging Face generate on the trainer's live model"
)
def make_hf_engine(
    *,
    weights: PolicyWeights,
    tokenizer: Any,
    generation_batch_size: int = 256,
    extra_eos_token_ids: Sequence[int] = (),
    **unused: Any,
) -> HFEngine:
    """Factory for :class:`HFEngine` (the trainer passes ``model_path``/``seed`` too; unused here)."""
    unknown = set(unused) - {"model_path", "seed"}
    if unknown:
        raise TypeError(
            f"hf rollout engine got unknown option(s) {sorted(unknown)}; "
            f"known: generation_batch_size, extra_eos_token_ids"
        )
    eos = [tokenizer.eos_token_id, *extra_eos_token_ids]
    return HFEngine(
        weights,
        pad_token_id=tokenizer.pad_token_id
        if tokenizer.pad_token_id is not None
        else tokenizer.eos_token_id,
        eos_token_ids=[e for e in eos if e is not None],
        generation_batch_size=generation_batch_size,
    )
