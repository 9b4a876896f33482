"""The models a run loads: the policy (with its critic and reference), a reward model,
PRIME's implicit process reward model.

Each section registers with gin under ``rlkit.trainer.config``, the package that exports
it, so a binding's full name does not depend on which module defines the section.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gin

from rlkit.trainer.config.rules import (
    COUNT,
    DTYPE,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE,
    Choice,
    Number,
    checked,
)


@gin.configurable(module="rlkit.trainer.config")
@dataclass
class ModelConfig:
    """The policy (and critic / reference) model."""

    path: str = ""
    """Local Hugging Face model directory (``config.json`` + weights)."""
    gguf_file: str | None = None
    """A GGUF file inside ``path`` to load with transformers' ``gguf_file=`` (dequantised)."""
    tokenizer_path: str | None = None
    """Tokenizer directory if not ``path``."""
    chat_template: str | None = None
    """Replace the tokenizer's chat template: a built-in name
    (:data:`rlkit.data.chat_templates.CHAT_TEMPLATES`, e.g. ``smollm2_tools`` for a
    template that renders ``tools=``) or Jinja text; ``None`` keeps the tokenizer's own.
    Prompts, tool results and the exported model's tokenizer all use it."""
    dtype: str = checked("float32", DTYPE)
    """Parameter dtype: float32 | bfloat16 | float16."""
    gradient_checkpointing: bool = False
    use_remove_padding: bool = False
    """Run actor, reference and critic forwards on the real tokens only, packed into one
    sequence per micro-batch (verl's ``use_remove_padding``). Worth it with
    flash-attention's variable-length kernels (GPU); with SDPA or eager attention
    transformers builds a (tokens x tokens) block-causal mask, so on CPU leave it off
    unless micro-batches are small."""
    share_prompt_prefix: bool = True
    """Actor, reference, critic and PRM forwards (and their backward) compute each prompt
    once for all the micro-batch's responses to it (``rlkit/modeling/prefix_sharing.py``):
    the same results as separate rows, to float rounding, with the prompt's FLOPs spent
    once. A group is packed (whole or in runs) only where that costs fewer FLOPs than
    its rows: long responses after a short prompt stay plain, since the packed sequence's
    attention grows with the group. Needs SDPA (``sdpa``, ``grouped_sdpa``) or ``eager``
    attention and text-only rows; otherwise the plain rows run (flash-attention,
    vision-language batches). Micro-batches and processes get
    whole groups where they can. Takes the place of ``use_remove_padding`` when both
    are on."""
    ulysses_sequence_parallel_size: int = checked(1, COUNT)
    """``k`` > 1: the ``k`` processes of a group split each packed micro-batch along the
    sequence and exchange heads for tokens around attention with all-to-all
    (DeepSpeed-Ulysses, verl's ``ulysses_sequence_parallel_size``), so a sequence ``k``
    times longer fits; FSDP2 still shards over all processes (``rlkit/modeling/ulysses.py``,
    docs/sequence_parallel.md). Needs ``use_remove_padding``; the token budget
    ``OptimConfig.max_token_len_per_micro_batch`` is per process, so a group's micro-batch
    holds up to ``k`` times it; ``share_prompt_prefix`` is off for the split passes."""
    tensor_parallel_size: int = checked(1, COUNT)
    """``t`` > 1: the ``t`` processes of a group split every layer of the policy, its
    reference and critic (attention heads and MLP width column/row-wise, the embeddings
    and LM head by vocabulary; torch's DTensor tensor parallelism) and hold the same
    rows; FSDP2 shards over the ``processes / t`` groups, a 2-D mesh. The log-probs read
    the vocabulary-split head slice by slice. Needs a family with a plan
    (``rlkit/models/tensor_parallel_plans.py``), ``t`` dividing the processes and the
    heads, ``rollout_mode = 'sync'``, no LoRA and no Ulysses (docs/scale.md). Checkpoints
    resume at another ``t``."""
    freeze_vision_tower: bool = False
    """A vision-language policy (Qwen2-VL / Qwen2.5-VL) keeps its vision tower
    (transformers' ``visual`` module: patch embedding, blocks and patch merger) as loaded,
    and only the language model trains (verl's ``actor.freeze_vision_tower``). No effect
    on a text-only model."""
    lora_rank: int = checked(0, NON_NEGATIVE_INT)
    """0 = full fine-tuning; > 0 trains LoRA adapters (peft) and uses the adapter-free
    model as the reference policy."""
    lora_alpha: int = checked(16, COUNT)
    lora_target_modules: str | tuple[str, ...] = "all-linear"
    kernel_overrides: dict[str, str] = field(default_factory=dict)
    """Force a kernel per op, e.g. ``{"rms_norm": "torch"}`` (see ``rlkit doctor``)."""
    critic_path: str | None = None
    """Critic initialisation (default: ``path``); only used when the estimator needs values."""


@gin.configurable(module="rlkit.trainer.config")
@dataclass
class RewardModelConfig:
    """A frozen sequence-classification reward model, run by the trainer on every rollout.

    Its score reaches rewards as ``RewardContext.reward_model_score``; the
    ``reward_model`` reward returns it (alone, or as a ``weighted`` term beside rule
    rewards). See docs/reward_models.md.
    """

    path: str = ""
    """Local ``AutoModelForSequenceClassification`` directory with one label; empty = none."""
    tokenizer_path: str | None = None
    """The reward model's tokenizer directory if not ``path``."""
    chat_template: str | None = None
    """Replace the reward model's chat template (a built-in name or Jinja text); responses
    are re-rendered with it, never fed the policy's token ids."""
    dtype: str = checked("float32", DTYPE)
    max_length: int | None = checked(None, Number(integer=True, ge=1, optional=True))
    """Truncate longer texts to this many tokens, dropping the start (the score is read at
    the end)."""
    max_token_len_per_micro_batch: int = checked(8192, COUNT)
    """Padded tokens per reward-model forward on each process."""


@gin.configurable(module="rlkit.trainer.config")
@dataclass
class PrimeConfig:
    """PRIME's implicit process reward model (PRM): built when the advantage estimator
    declares the ``process_rewards`` input (``prime``). See docs/prime.md."""

    model_path: str | None = None
    """The PRM's initialisation (a causal LM); ``None`` = ``ModelConfig.path``. Its
    reference is its own frozen initial copy (shared with the policy's reference when
    the paths agree)."""
    beta_train: float = checked(0.05, POSITIVE)
    """beta in r_t = beta * (log pi_prm - log pi_ref) and in the PRM's loss."""
    lr: float = checked(1e-6, NON_NEGATIVE)
    loss_type: str = checked("ce", Choice(("ce", "dpo")))
    """ce (cross-entropy on outcome correctness) | dpo (pairwise, detached opponents)."""
    granularity: str = checked("token", Choice(("token", "whole")))
    """token (a reward per token) | whole (the row's sum on its last token)."""
    norm: str = checked("batch_norm", Choice(("batch_norm", "none")))
    """batch_norm (divide by the batch's largest |reverse cumulative sum|) | none."""
    update: str = checked("before", Choice(("before", "after", "reverse", "none")))
    """verl's order of scoring and updating (the PRM takes one optimizer step per RL
    step): before (update, then the rewards from the updated PRM) | after (the rewards
    from the update's forward, i.e. the PRM before its step) | reverse (score, then
    update: the same rewards as after; the order dpo's opponents come from) | none (a
    frozen PRM)."""
