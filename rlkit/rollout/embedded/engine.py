"""The embedded rollout engine: batched sampling from the trainer's own Hugging Face model.

It generates with the trainer's live module (no weight copy, so ``sync_weights``
costs nothing) and records each sampled token's log-prob under the sampling
distribution (temperature, top-k and top-p applied), which is what the rollout
importance-sampling correction needs.

Two decode loops, chosen by the ``decode_loop`` option:

* ``"rlkit"`` (default): :mod:`rlkit.rollout.embedded.kv_decode`, which prefills each prompt
  once for its ``n`` responses and drops finished rows from the batch.
* ``"generate"``: ``transformers``' ``generate``, for models whose KV cache cannot be
  repeated or subset per row.

Either loop can run the model's linear layers on weights packed once per rollout for
oneDNN on a CPU (:mod:`rlkit.kernels.packed_linear`): ``linear_weights="auto"`` (the
default) packs those computing in bf16, whose results stay bitwise the same;
``"packed"`` float32 ones too (faster, rounded differently); ``"plain"`` none.

For multi-turn loops, :meth:`HFEngine.turns` returns the ``rlkit`` loop's continuous
batcher (:mod:`rlkit.rollout.embedded.continuous_decode`: each trajectory's KV cache continued
across its turns) or, with ``generate``, turns batched through :meth:`generate`. Log-probs are gathered step by step by a logits
  processor, so memory holds one step's (rows x vocabulary) scores, not
  ``output_scores``' (rows x steps x vocabulary) stack.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rlkit.kernels.packed_linear import packed_linears
from rlkit.models.attention_features import attention_features
from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.base import PolicyWeights, RolloutBatch, RolloutEngine, SamplingParams
from rlkit.rollout.embedded.continuous_decode import ContinuousDecoder
from rlkit.rollout.embedded.kv_decode import Warp, decode
from rlkit.rollout.turns import BatchedTurns, TurnGenerator

DECODE_LOOPS = ("rlkit", "generate")
LINEAR_WEIGHTS = ("auto", "packed", "plain")
logger = logging.getLogger(__name__)


class SampledTokenLogProbs(LogitsProcessor):
    """The last logits processor: records log p(sampled token) under the final scores.

    ``generate`` calls it once per step with the step's processed scores, before
    sampling; the token sampled from them only appears in ``input_ids`` at the next
    call. So each call gathers the previous step's log-prob and keeps just this
    step's log-softmax: one (rows, vocabulary) tensor at a time.
    """

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []
        self._pending: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._gather_pending(input_ids[:, -1])
        self._pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _gather_pending(self, tokens: torch.Tensor) -> None:
        if self._pending is not None:
            # Stays on the device: a per-step copy to the host would sync every decode step.
            self.steps.append(self._pending.gather(-1, tokens[:, None]).squeeze(-1))
            self._pending = None

    def log_probs(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """(rows, steps) log-probs of ``new_tokens``, the sequences' generated part."""
        if new_tokens.shape[1] == 0:
            return torch.zeros(new_tokens.shape)
        if len(self.steps) < new_tokens.shape[1]:  # the last step's token is only here
            self._gather_pending(new_tokens[:, len(self.steps)].to(self._pending.device))
        # generate may have run (and then undone) a step past the end: drop it.
        return torch.stack(self.steps[: new_tokens.shape[1]], dim=1).cpu()


def sampling_warpers(params: SamplingParams) -> LogitsProcessorList:
    """Temperature, top-k, top-p, in ``generate``'s order (none when greedy)."""
    warpers = LogitsProcessorList()
    if params.temperature > 0:
        if params.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k > 0:
            warpers.append(TopKLogitsWarper(top_k=params.top_k))
        if params.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=params.top_p))
    return warpers


def sampling_processors(params: SamplingParams) -> LogitsProcessorList:
    """The warpers, then the log-prob recorder: ``generate``'s ``logits_processor``.

    Passed with the matching ``GenerationConfig`` fields neutral: ``generate`` merges
    a caller's processors before its own warpers, so leaving the warpers to it would
    record log-probs before temperature and top-k/p.
    """
    processors = sampling_warpers(params)
    processors.append(SampledTokenLogProbs())
    return processors


def _num_chunks(items: int, per_chunk: int, extra: dict[str, Any]) -> int:
    """Decode calls for ``items``: at least one, and under FSDP the most any process needs.

    Every process must run equally many forward passes (FSDP all-gathers weights in
    each), also one with fewer or no prompts: its spare calls decode nothing.
    """
    count = max(1, -(-items // per_chunk))
    if extra.get("synced_gpus"):
        from rlkit.distributed.collectives import same_everywhere

        count = same_everywhere(count, "max")
    return count


def _warp_function(params: SamplingParams) -> Warp | None:
    warpers = sampling_warpers(params)
    if not warpers:
        return None
    no_ids = torch.zeros((0, 0), dtype=torch.long)  # the warpers read scores only
    return lambda scores: warpers(no_ids, scores)


class HFEngine(RolloutEngine):
    """Generate with the trainer's model in micro-batches.

    Args:
        weights: the trainer's policy; its ``generation_context()`` yields the model.
        pad_token_id: id used to left-pad prompts (the tokenizer's pad id).
        eos_token_ids: ids that end a response (the tokenizer's EOS at least).
        generation_batch_size: sequences per decode call (prompts x n); bounds memory.
            The rlkit loop takes whole prompt groups: ``generation_batch_size // n``
            prompts per call, at least one.
        decode_loop: ``"rlkit"`` (shared prefill, finished rows dropped) or
            ``"generate"`` (``transformers``' ``generate``).
        continue_caches: multi-turn rollouts continue each trajectory's KV cache
            (:class:`ContinuousDecoder`, full-attention caches only); ``False`` batches
            the turns through :meth:`generate` instead (sliding-window models).
        linear_weights: which linear layers run on weights laid out once per rollout for
            oneDNN (CPU; :func:`~rlkit.kernels.packed_linear.packed_linears`): ``"auto"``
            those whose results stay bitwise the same (bf16 compute), ``"packed"`` float32
            ones too, ``"plain"`` none.
    """

    # generate emits no metric; the multi-turn ContinuousDecoder counts the context ids it
    # served from a trajectory's kept KV cache.
    runs_trainer_model = True
    counters: tuple[str, ...] = ("rollout/kv_reused_tokens",)

    def __init__(
        self,
        weights: PolicyWeights,
        *,
        pad_token_id: int,
        eos_token_ids: Sequence[int],
        generation_batch_size: int = 256,
        decode_loop: str = "rlkit",
        continue_caches: bool = True,
        linear_weights: str = "auto",
    ) -> None:
        if generation_batch_size < 1:
            raise ValueError(f"generation_batch_size must be >= 1, got {generation_batch_size}")
        if decode_loop not in DECODE_LOOPS:
            raise ValueError(
                f"hf engine: unknown decode_loop {decode_loop!r}; choose one of {DECODE_LOOPS}"
            )
        if linear_weights not in LINEAR_WEIGHTS:
            raise ValueError(
                f"hf engine: unknown linear_weights {linear_weights!r}; choose one of "
                f"{LINEAR_WEIGHTS}"
            )
        self.decode_loop = decode_loop
        self.continue_caches = continue_caches
        self.linear_weights = linear_weights
        self.weights = weights
        self.pad_token_id = pad_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.generation_batch_size = generation_batch_size

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        multimodal: Sequence[Mapping[str, torch.Tensor] | None] | None = None,
    ) -> RolloutBatch:
        """Sample ``params.n`` responses per prompt; ``multimodal``: each prompt's image
        inputs (``None`` for a text prompt). Image prompts always decode in rlkit's loop,
        which runs the vision tower once per prompt."""
        rows = [list(p) for p in prompt_ids for _ in range(params.n)]
        index = [i for i in range(len(prompt_ids)) for _ in range(params.n)]
        out = RolloutBatch([], [], [], [], [])
        images = multimodal if multimodal and any(m is not None for m in multimodal) else None
        with self.weights.generation_context() as (model, extra), self.linears(model):
            was_training = model.training
            model.eval()
            try:
                if self.decode_loop == "rlkit" or images is not None:
                    prompts = [list(p) for p in prompt_ids]
                    self._decode(model, prompts, params, extra, out, images)
                else:
                    size = self.generation_batch_size
                    for c in range(_num_chunks(len(rows), size, extra)):
                        chunk = rows[c * size : (c + 1) * size]
                        self._generate_chunk(model, chunk, params, extra, out)
            finally:
                model.train(was_training)
        out.prompt_ids, out.prompt_index = rows, index
        out.validate()
        return out

    def linears(self, model: torch.nn.Module) -> AbstractContextManager[object]:
        """The context a rollout's forwards run in: ``model``'s linear layers packed
        (:func:`~rlkit.kernels.packed_linear.packed_linears`) or left plain."""
        if self.linear_weights == "plain":
            return nullcontext()
        return packed_linears(model, exact_only=self.linear_weights == "auto")

    def _decode(
        self,
        model: torch.nn.Module,
        prompts: list[list[int]],
        params: SamplingParams,
        extra: dict[str, Any],
        out: RolloutBatch,
        images: Sequence[Mapping[str, torch.Tensor] | None] | None = None,
    ) -> None:
        """:func:`kv_decode.decode` over chunks of whole prompt groups."""
        per_chunk = max(1, self.generation_batch_size // params.n)
        warp = _warp_function(params)
        for c in range(_num_chunks(len(prompts), per_chunk, extra)):
            chunk = slice(c * per_chunk, (c + 1) * per_chunk)
            result = decode(
                model,
                prompts[chunk],
                n=params.n,
                max_new_tokens=params.max_new_tokens,
                pad_token_id=self.pad_token_id,
                stop_token_ids=self.eos_token_ids + tuple(params.stop_token_ids),
                warp=warp,
                greedy=params.temperature <= 0,
                synced=bool(extra.get("synced_gpus")),
                images=None if images is None else images[chunk],
                top_logprobs=params.top_logprobs,
            )
            if result.top_log_probs is not None:
                out.top_log_probs = (out.top_log_probs or []) + result.top_log_probs
            out.response_ids += result.response_ids
            out.rollout_log_probs += result.log_probs
            out.finish_reasons += result.finish_reasons

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
        # Every field that shapes the distribution is explicit and neutral, so nothing
        # is inherited from the checkpoint's generation_config.json (e.g. Qwen2.5's
        # repetition_penalty 1.05, top_k 20): the sampling distribution is exactly
        # softmax(logits / T) restricted by top-k/top-p, as the trainer assumes.
        sampling = params.temperature > 0
        # Greedy: no warper runs; None keeps transformers from warning about them.
        neutral = 1.0 if sampling else None
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=sampling,
            temperature=neutral,
            top_k=0 if sampling else None,
            top_p=neutral,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            repetition_penalty=1.0,
            encoder_repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            min_new_tokens=0,  # also overrides an inherited min_length
            renormalize_logits=False,
            output_scores=False,  # the recorder below replaces the (rows, steps, vocab) stack
            return_dict_in_generate=False,
            eos_token_id=list(self.eos_token_ids + tuple(params.stop_token_ids)),
            pad_token_id=self.pad_token_id,
        )
        processors = sampling_processors(params)
        gen = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=config,
            logits_processor=processors,
            **extra,
        )
        if dummy:
            return
        new_tokens = gen[:, width:].cpu()
        logprobs = processors[-1].log_probs(new_tokens)
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

    def turns(self, params: SamplingParams) -> TurnGenerator:
        """Multi-turn generation: the ``rlkit`` loop continues each trajectory's KV cache
        across its turns (:class:`ContinuousDecoder`); ``generate`` batches turns and
        prefills each one's context again."""
        if self.decode_loop != "rlkit" or not self.continue_caches:
            from rlkit.distributed.collectives import world

            return BatchedTurns(self, params, synced=world()[1] > 1)
        return ContinuousDecoder(
            self.weights,
            params,
            pad_token_id=self.pad_token_id,
            stop_token_ids=self.eos_token_ids + tuple(params.stop_token_ids),
            warp=_warp_function(params),
            linears=self.linears,
        )

    def image_turns(self, params: SamplingParams) -> TurnGenerator:
        """Image prompts' turns, batched through :meth:`generate` (each turn prefills its
        context, images included, again: the trajectory caches of
        :class:`ContinuousDecoder` hold text contexts only)."""
        from rlkit.distributed.collectives import world

        return BatchedTurns(self, params, synced=world()[1] > 1)

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
    decode_loop: str = "rlkit",
    linear_weights: str = "auto",
    **unused: Any,
) -> HFEngine:
    """Factory for :class:`HFEngine` (the trainer passes ``model_path``/``seed`` too; unused here)."""
    unknown = set(unused) - {"model_path", "seed"}
    if unknown:
        raise TypeError(
            f"hf rollout engine got unknown option(s) {sorted(unknown)}; "
            f"known: generation_batch_size, extra_eos_token_ids, decode_loop, linear_weights"
        )
    eos = [tokenizer.eos_token_id, *extra_eos_token_ids]
    continue_caches = not _windowed(unused.get("model_path"))
    if not continue_caches and decode_loop == "rlkit":
        logger.info(
            "hf engine: the model has sliding-window layers, whose KV cache transformers "
            "keeps to the window; multi-turn rollouts batch each turn through the decode "
            "loop instead of continuing every trajectory's cache"
        )
    return HFEngine(
        weights,
        pad_token_id=tokenizer.pad_token_id
        if tokenizer.pad_token_id is not None
        else tokenizer.eos_token_id,
        eos_token_ids=[e for e in eos if e is not None],
        generation_batch_size=generation_batch_size,
        decode_loop=decode_loop,
        continue_caches=continue_caches,
        linear_weights=linear_weights,
    )


def _windowed(model_path: str | None) -> bool:
    """Whether the model at ``model_path`` has sliding-window layers (False if unknown)."""
    if not model_path or not (Path(model_path) / "config.json").is_file():
        return False
    return attention_features(AutoConfig.from_pretrained(model_path)).windowed
