"""The experiment configuration: small dataclasses, every field bindable from gin.

A gin file sets fields as ``Section.field = value``, e.g.::

    AlgorithmConfig.adv_estimator = "grpo"
    RolloutConfig.n = 8

Algorithm presets (``algorithms/presets/*.gin``) only bind names and numbers
in :class:`AlgorithmConfig`; adding an algorithm never needs a trainer change.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import gin


@gin.configurable
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
    dtype: str = "float32"
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
    once for all the micro-batch's responses to it (``rlkit/trainer/prefix_sharing.py``):
    the same results as separate rows, to float rounding, with the prompt's FLOPs spent
    once. A group is packed (whole or in runs) only where that costs fewer FLOPs than
    its rows: long responses after a short prompt stay plain, since the packed sequence's
    attention grows with the group. Needs SDPA (``sdpa``, ``grouped_sdpa``) or ``eager``
    attention and text-only rows; otherwise the plain rows run (flash-attention,
    vision-language batches). Micro-batches and processes get
    whole groups where they can. Takes the place of ``use_remove_padding`` when both
    are on."""
    ulysses_sequence_parallel_size: int = 1
    """``k`` > 1: the ``k`` processes of a group split each packed micro-batch along the
    sequence and exchange heads for tokens around attention with all-to-all
    (DeepSpeed-Ulysses, verl's ``ulysses_sequence_parallel_size``), so a sequence ``k``
    times longer fits; FSDP2 still shards over all processes (``rlkit/trainer/ulysses.py``,
    docs/sequence_parallel.md). Needs ``use_remove_padding``; the token budget
    ``OptimConfig.max_token_len_per_micro_batch`` is per process, so a group's micro-batch
    holds up to ``k`` times it; ``share_prompt_prefix`` is off for the split passes."""
    freeze_vision_tower: bool = False
    """A vision-language policy (Qwen2-VL / Qwen2.5-VL) keeps its vision tower
    (transformers' ``visual`` module: patch embedding, blocks and patch merger) as loaded,
    and only the language model trains (verl's ``actor.freeze_vision_tower``). No effect
    on a text-only model."""
    lora_rank: int = 0
    """0 = full fine-tuning; > 0 trains LoRA adapters (peft) and uses the adapter-free
    model as the reference policy."""
    lora_alpha: int = 16
    lora_target_modules: str | tuple[str, ...] = "all-linear"
    kernel_overrides: dict[str, str] = field(default_factory=dict)
    """Force a kernel per op, e.g. ``{"rms_norm": "torch"}`` (see ``rlkit doctor``)."""
    critic_path: str | None = None
    """Critic initialisation (default: ``path``); only used when the estimator needs values."""


@gin.configurable
@dataclass
class DataConfig:
    """Prompts and how they become token ids."""

    train_files: str | list[str] = ""
    """JSON Lines / Parquet file, a shared set name (``gsm8k``), a list of them (read in
    order and concatenated, as verl's ``data.train_files``), or empty when ``dataset_fn``
    is given."""
    val_files: str | list[str] = ""
    dataset_fn: Any = None
    """A gin-configurable callable ``(split) -> datasets.Dataset`` in rlkit's prompt schema
    (columns id, prompt, ground_truth, data_source); overrides the files."""
    question_key: str = "question"
    answer_key: str = "answer"
    instruction: str | None = None
    system_prompt: str | None = None
    use_chat_template: bool = True
    train_batch_size: int = 8
    """Prompts per training step (global, across processes)."""
    gen_batch_size: int | None = None
    """DAPO dynamic sampling (``AlgorithmConfig.filter_groups``): prompts drawn per
    generation round (verl's ``data.gen_batch_size``; its DAPO recipe uses 3 x
    ``train_batch_size``); ``None`` = ``train_batch_size``. At least ``train_batch_size``.
    Without ``filter_groups`` every step draws ``train_batch_size`` prompts."""
    val_limit: int | None = None
    """Use only the first N validation prompts."""
    max_prompt_length: int = 512
    truncation: str = "error"
    """Prompt longer than ``max_prompt_length``: error | left (keep the end) | filter (drop)."""
    shuffle: bool = True
    on_error: str = "raise"
    """A malformed data row (bad JSON, no question or answer, duplicate id): ``raise`` names
    it and stops; ``skip`` drops it (the run prints how many, per split)."""
    reward: str = "default"
    """Reward function name (``rlkit list rewards``), ``package.module:function`` or
    ``path/to/file.py:function`` (relative to the working directory); see docs/rewards.md.
    ``default`` picks a scorer per row from its ``data_source``, as verl's default does
    (GSM8K, MATH, AIME, ...), and scores a row of any other source by ``gsm8k``;
    ``by_data_source`` is the same without that fallback.
    A function with verl's signature ``(data_source, solution_str, ground_truth,
    extra_info)`` is called by keyword."""
    custom_reward_path: str = ""
    """verl's ``custom_reward_function.path``: a Python file holding the reward; sets
    ``reward`` to ``"<custom_reward_path>:<custom_reward_name>"``."""
    custom_reward_name: str = "compute_score"
    """verl's ``custom_reward_function.name``: the function in ``custom_reward_path``."""
    reward_options: dict[str, Any] = field(default_factory=dict)
    reward_timeout_s: float = 10.0
    """Time limit of one reward call (a batched reward: this times its rows)."""
    reward_workers: int = 0
    """0 = score in the trainer's process (``SIGALRM`` limits, and a watchdog that ends
    the run when a C call hangs past ``reward_timeout_s + 5``); >= 1 = worker processes,
    whose hung calls are killed."""
    reward_deadline_s: float | None = 60.0
    """One limit for a step's whole reward phase in each process (its rows of a generation
    batch): calls unfinished then score 0 as timeouts and the run warns how many. A reward
    that hangs on every response so costs a step this, not ``reward_timeout_s`` once per
    response. At least ``reward_timeout_s``; raise it for slow rewards scored in the
    trainer's process, or score them in parallel (``reward_workers``). ``None``: no limit."""
    max_reward_failure_rate: float = 1.0
    """Stop the run when at least this fraction of a batch's reward calls failed (raised or
    timed out); 1.0 = when every call failed."""

    def __post_init__(self) -> None:
        if self.custom_reward_path:
            chosen = f"{self.custom_reward_path}:{self.custom_reward_name}"
            if self.reward not in ("default", chosen):  # "default": reward left unset
                raise ValueError(
                    f"DataConfig.custom_reward_path names the reward {chosen!r} but "
                    f"DataConfig.reward is {self.reward!r}: set one of the two"
                )
            self.reward = chosen


@gin.configurable
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
    dtype: str = "float32"
    max_length: int | None = None
    """Truncate longer texts to this many tokens, dropping the start (the score is read at
    the end)."""
    max_token_len_per_micro_batch: int = 8192
    """Padded tokens per reward-model forward on each process."""


@gin.configurable
@dataclass
class PrimeConfig:
    """PRIME's implicit process reward model (PRM): built when the advantage estimator
    declares the ``process_rewards`` input (``prime``). See docs/prime.md."""

    model_path: str | None = None
    """The PRM's initialisation (a causal LM); ``None`` = ``ModelConfig.path``. Its
    reference is its own frozen initial copy (shared with the policy's reference when
    the paths agree)."""
    beta_train: float = 0.05
    """beta in r_t = beta * (log pi_prm - log pi_ref) and in the PRM's loss."""
    lr: float = 1e-6
    loss_type: str = "ce"
    """ce (cross-entropy on outcome correctness) | dpo (pairwise, detached opponents)."""
    granularity: str = "token"
    """token (a reward per token) | whole (the row's sum on its last token)."""
    norm: str = "batch_norm"
    """batch_norm (divide by the batch's largest |reverse cumulative sum|) | none."""
    update: str = "before"
    """verl's order of scoring and updating (the PRM takes one optimizer step per RL
    step): before (update, then the rewards from the updated PRM) | after (the rewards
    from the update's forward, i.e. the PRM before its step) | reverse (score, then
    update: the same rewards as after; the order dpo's opponents come from) | none (a
    frozen PRM)."""


@gin.configurable
@dataclass
class RolloutConfig:
    """Generation: engine and sampling."""

    engine: str = "hf"
    """Rollout engine name (``hf`` | ``sglang`` | ``package.module:factory``)."""
    engine_options: dict[str, Any] = field(default_factory=dict)
    n: int = 8
    """Responses per prompt (the group size)."""
    max_response_length: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    val_n: int = 1
    val_temperature: float = 0.0
    """0 = greedy validation."""
    val_top_p: float | None = None
    """Validation's nucleus threshold (verl's ``val_kwargs.top_p``); ``None`` = ``top_p``."""
    val_top_k: int | None = None
    """Validation's top-k (verl's ``val_kwargs.top_k``); ``None`` = ``top_k``."""
    val_do_sample: bool = True
    """False = greedy validation whatever ``val_temperature`` (verl's
    ``val_kwargs.do_sample``); then ``val_n`` must be 1."""
    agent_loop: str = "single_turn"
    """How a prompt becomes a trajectory (``rlkit list agent_loops``): ``single_turn`` or
    ``tool_agent`` (multi-turn tool calling), or ``pkg.module:fn``."""
    agent: dict[str, Any] = field(default_factory=dict)
    """Settings of a multi-turn loop (:class:`rlkit.rollout.agent_loop.AgentConfig`), e.g.
    ``{"tools": ["calculator"], "max_turns": 3}``. ``max_response_length`` is then the
    budget of the whole response: policy turns and tool results together."""


@gin.configurable
@dataclass
class AlgorithmConfig:
    """The RL algorithm as a composition of registered names and their settings."""

    adv_estimator: str = "grpo"
    estimator_options: dict[str, Any] = field(default_factory=dict)
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    policy_loss: str = "vanilla"
    loss_options: dict[str, Any] = field(default_factory=dict)
    loss_agg_mode: str = "token-mean"
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl_type: str = "fixed"
    kl_coef: float = 0.001
    kl_target: float = 0.1
    kl_horizon: int = 10000
    rollout_is_level: str | None = None
    """None = no rollout importance-sampling correction; ``token`` | ``sequence``."""
    rollout_is_mode: str = "truncate"
    """truncate (TIS) | mask (IcePop)."""
    rollout_is_threshold: float = 2.0
    rollout_is_threshold_low: float | None = None
    filter_groups: bool = False
    """DAPO dynamic sampling: drop groups whose ``filter_metric`` has zero variance."""
    filter_metric: str = "acc"
    """acc | score."""
    max_num_gen_batches: int = 10
    overlong_buffer_len: int = 0
    """DAPO overlong buffer (0 = off): responses longer than
    ``max_response_length - overlong_buffer_len`` are penalised linearly."""
    overlong_penalty_factor: float = 1.0
    critic_warmup: int = 0
    """Steps during which only the critic is updated."""
    value_loss: str = "clipped"
    """Critic loss name (``rlkit list value_losses``: clipped | mse | ``pkg.module:fn``)."""
    roles: tuple[str, ...] = ()
    """Roles a step runs beside those the algorithm needs (``rlkit.registry.ROLES``: a
    registered name or ``path/to/file.py:Class``), e.g. a teacher for distillation; see
    docs/extending.md."""
    math: str = "fused"
    """``fused``: the policy losses and estimators that keep a faster version beside their
    plain math use it; ``plain``: every one runs its plain-torch version, to read or step
    through (``algorithms.set_math``, ``estimators.set_math``; the same results)."""
    role_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Settings of the roles in ``roles``, by the name given there (each role reads its
    own: ``RoleContext.options``)."""


OPTIMIZER_IMPLEMENTATIONS = ("torch", "fused", "foreach", "for_loop")
ROLLOUT_MODES = ("sync", "one_step_off", "async")
"""``OptimConfig.optimizer_implementation`` values (rlkit.trainer.optimizer)."""


@gin.configurable
@dataclass
class OptimConfig:
    """Actor / critic optimisation and batching."""

    lr: float = 1e-6
    critic_lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    lr_schedule: str = "constant"
    """constant | cosine (after warm-up)."""
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0
    optimizer_implementation: str = "torch"
    """torch | fused | foreach | for_loop: which of PyTorch's AdamW kernels steps the
    optimizer, the same update to float rounding (rlkit.trainer.optimizer). torch = its own
    default (a loop on CPU, foreach on CUDA); fused is the fastest on CPU and CUDA."""
    ppo_epochs: int = 1
    ppo_mini_batch_size: int = 8
    """Prompts per optimizer step (global); the rollout's n responses each come along."""
    micro_batch_size: int = 8
    """Sequences per forward/backward on each process (ignored with dynamic batching)."""
    use_dynamic_bsz: bool = False
    """Split micro-batches by a token budget instead of a sequence count."""
    max_token_len_per_micro_batch: int = 8192
    shuffle: bool = True
    cliprange_value: float = 0.5
    logprob_chunk_size: int = 512
    """Tokens per chunk of the fused log-prob/entropy op (bounds the logits' memory)."""


@gin.configurable
@dataclass
class TrainerConfig:
    """The run: length, evaluation, logging, checkpoints, devices."""

    total_steps: int = 10
    total_epochs: int | None = None
    """Passes over the training prompts (verl's ``trainer.total_epochs``): the run takes
    ``total_epochs * prompts // train_batch_size`` steps once the prompts are loaded.
    ``total_steps`` must then be left at 10 or equal that number."""
    test_freq: int = 0
    """Validate every N steps (0 = only before and after training)."""
    val_before_train: bool = True
    save_freq: int = 0
    """Checkpoint every N steps (0 = never, except at the end when ``save_at_end``)."""
    save_at_end: bool = True
    max_checkpoints_to_keep: int = 2
    output_dir: str = "runs/default"
    resume_mode: str = "auto"
    """auto (latest checkpoint in output_dir if any) | disable | a checkpoint path."""
    overwrite: bool = False
    """With ``resume_mode="disable"``: delete a previous run's outputs in ``output_dir``
    (checkpoints, metrics, TensorBoard events, configs, plot, exported model) and start
    over. Without it, such a directory is refused rather than mixed with the new run."""
    on_corrupt_checkpoint: str = "fallback"
    """A resumed checkpoint whose files no longer match their saved checksums: ``fallback``
    (warn, naming it, and resume from the newest intact one) or ``stop`` (a user error)."""
    seed: int = 0
    rollout_mode: str = "sync"
    """sync (generate, then train) | one_step_off (the next step's batch is generated
    while this one trains, from weights one step older) | async (the next steps' batches
    are generated while this one trains, as far ahead as ``max_staleness`` allows):
    :mod:`rlkit.trainer.rollout_ahead`. Both need an engine with its own copy of the
    weights (``sglang``, ``vllm``), one process, and ``DataConfig.reward_workers >= 1``."""
    max_staleness: int | None = None
    """``async``: how many weight versions (optimizer steps) behind the weights that train
    on it a token may be; batches are generated ``max_staleness // u`` steps ahead, ``u``
    the optimizer steps of one step (``ppo_epochs * ceil(train_batch_size /
    ppo_mini_batch_size)``). None: ``2 * u`` (two steps ahead)."""
    partial_rollout: str = "finish"
    """``async``: what generation calls running when new weights arrive do. ``finish``:
    they finish under the weights they started with, and the sync waits for them.
    ``continue``: they are paused, the weights synced, and they continue under the new
    weights (engines with ``continues_in_flight=True``: ``sglang``). Either way new calls
    wait for the sync, and every token records the version that sampled it."""
    backend_strategy: str = "auto"
    """auto | fsdp2 | none (see rlkit.trainer.backend)."""
    mixed_precision: str = "no"
    """no | bf16 | fp16: the compute dtype of actor, reference and critic forwards and of
    the in-process engine's generation (FSDP2's MixedPrecisionPolicy when sharded,
    autocast otherwise). Parameters, gradients and optimizer state stay in
    ``ModelConfig.dtype``: keep that float32 and set bf16 here for the usual GPU recipe
    (pure-bf16 parameters lose updates below their ~3 significant digits, e.g. most of an
    lr=1e-6 step)."""
    platform: str | None = None
    """Force a platform (cpu | cuda | npu); None = detect."""
    export_hf_at_end: bool = False
    export_freq: int = 0
    """Write the actor as a Hugging Face model every N steps (0 = never), to
    ``<output_dir>/hf_exports/global_step_N`` (all kept; ``export_hf_at_end`` writes
    ``<output_dir>/hf_model``)."""
    balance_batch: bool = True
    """Give each process rows of near-equal total tokens (verl's ``balance_batch``), for the
    forward passes over the whole batch and for every update mini-batch; False: contiguous
    shards. Changes which process computes a row, not the result (losses are normalised
    over all processes), so one process is unaffected. See ``global_seqlen/*``."""
    cpu_offload: bool = False
    """Keep FSDP2's parameter, gradient and optimizer shards in host memory
    (``CPUOffloadPolicy``): less accelerator memory, slower steps. Needs an accelerator and
    sharding (several processes, or ``backend_strategy="fsdp2"``); refused otherwise."""
    tensorboard: bool = True
    """Write TensorBoard events; False also drops ``"tensorboard"`` from ``loggers``."""
    progress_bar: bool = True
    """Show a console progress bar; False also drops ``"console"`` from ``loggers``."""
    loggers: tuple[str, ...] = ("console", "jsonl", "tensorboard")
    """Metric sinks, by name in ``rlkit.registry.LOGGERS`` (console | jsonl | tensorboard |
    wandb | mlflow | swanlab) or ``"pkg.module:factory"``. ``metrics.jsonl`` is written
    whatever the list says; a tracker that fails to start is dropped with a warning
    (docs/tracking.md)."""
    project_name: str = "rlkit"
    """The project (wandb, SwanLab) or experiment (MLflow) a tracker files the run under."""
    experiment_name: str = ""
    """The run's name in a tracker; "" = the name of ``output_dir``."""
    plot_learning_curve: bool = True
    num_threads: int | None = None
    """torch intra-op threads (None = torch's default)."""
    keep_freed_host_memory: bool = True
    """On the CPU platform, make glibc's ``malloc`` keep freed memory for the next
    micro-batch instead of returning it to the kernel and faulting it in again
    (:mod:`rlkit.device.host_allocator`); the peak resident set is unchanged."""
    freeze_setup_objects: bool = True
    """While :meth:`RLTrainer.train` runs, keep the objects alive when it started out of
    Python's full garbage collections (``gc.freeze``; :mod:`rlkit.trainer.frozen_heap`):
    each would otherwise rescan the ~10^5-10^6 objects of imports, model and data."""


@dataclass
class ExperimentConfig:
    """All sections, each filled from the active gin bindings."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    prime: PrimeConfig = field(default_factory=PrimeConfig)

    def sections(self) -> list[Any]:
        """Every section, in the order problems are reported."""
        return [
            self.model,
            self.data,
            self.rollout,
            self.algorithm,
            self.optim,
            self.trainer,
            self.reward_model,
            self.prime,
        ]

    @classmethod
    def from_gin(cls) -> ExperimentConfig:
        """Build every section from the parsed gin bindings.

        Registered names are checked before :class:`ModelConfig` is built, because
        building it may run work bound in gin (e.g. ``@arithmetic_sft_model()``).
        """
        algorithm, data, rollout = AlgorithmConfig(), DataConfig(), RolloutConfig()
        check_registered_names(algorithm, data, rollout)
        rest = OptimConfig(), TrainerConfig(), RewardModelConfig(), PrimeConfig()
        problems = field_problems(ModelConfig, bound_values(ModelConfig))
        problems += [p for s in (data, rollout, algorithm, *rest) for p in field_problems(s)]
        problems += batch_problems(data, rest[0])
        if problems:  # the remaining checks need ModelConfig.path, so they wait for validate()
            raise ValueError(format_problems(problems))
        return cls(ModelConfig(), data, rollout, algorithm, *rest)

    def validate(self) -> None:
        """Raise ``ValueError`` naming every inconsistent setting, before any work.

        Every field's own rule (:data:`FIELD_RULES`) is checked first; the checks that
        combine fields run only on fields that passed theirs."""
        problems = [p for section in self.sections() for p in field_problems(section)]
        problems += batch_problems(self.data, self.optim)
        problems += reward_time_problems(self.data)
        r = self.rollout
        if not r.val_do_sample and r.val_n != 1:
            problems.append(
                f"RolloutConfig.val_do_sample = False validates greedily: one response per "
                f"prompt, so RolloutConfig.val_n must be 1, got {r.val_n}"
            )
        if r.agent_loop != "single_turn" or r.agent:
            from rlkit.rollout.agent_loop import agent_config

            try:
                problems += agent_config(r.agent).problems()
            except (TypeError, ValueError) as exc:
                problems.append(str(exc))
        if not self.model.path:
            problems.append("ModelConfig.path is empty: give a local Hugging Face model directory")
        if self.model.chat_template is not None:
            from rlkit.data.chat_templates import resolve_chat_template

            try:
                resolve_chat_template(self.model.chat_template)
            except ValueError as exc:
                problems.append(str(exc))
        if not (self.data.train_files or self.data.dataset_fn):
            problems.append("set DataConfig.train_files or DataConfig.dataset_fn")
        problems += self._reward_model_problems()
        problems += self._prime_problems()
        problems += self._model_family_problems()
        problems += self._sequence_parallel_problems()
        problems += self._vision_language_problems()
        problems += rollout_mode_problems(self)
        if problems:
            raise ValueError(format_problems(problems))

    def _model_family_problems(self) -> list[str]:
        """Models whose forward rlkit cannot reproduce exactly (docs/models.md), read from
        each existing directory's ``config.json`` before anything loads."""
        from rlkit.models.attention_features import UnsupportedModelError
        from rlkit.models.loading import check_model_family

        problems = []
        for setting, path in (
            ("ModelConfig.path", self.model.path),
            ("ModelConfig.critic_path", self.model.critic_path),
            ("PrimeConfig.model_path", self.prime.model_path),
        ):
            try:
                if path:
                    check_model_family(path, setting)
            except UnsupportedModelError as exc:
                problems.append(str(exc))
        return problems

    def _vision_language_problems(self) -> list[str]:
        """A vision-language policy with an engine other than the embedded one, which
        rlkit does not roll image prompts out on (docs/vision_language.md)."""
        path = self.model.path
        if not path or not (Path(path) / "config.json").is_file():
            return []
        from transformers import AutoConfig

        from rlkit.models.vision_language import is_vision_language

        if not is_vision_language(AutoConfig.from_pretrained(path)):
            return []
        engine = self.rollout.engine
        if engine in ("hf", "transformers"):
            return []
        return [
            f"ModelConfig.path ({path}) is a vision-language model, which rlkit rolls out "
            f"on the embedded engine only; RolloutConfig.engine = {engine!r} cannot serve "
            f"it: set RolloutConfig.engine = 'hf'"
        ]

    def _sequence_parallel_problems(self) -> list[str]:
        """Ulysses settings it cannot honour: no packing, another attention kernel, a
        process count or head count it does not divide, a vision-language model."""
        k = self.model.ulysses_sequence_parallel_size
        if not isinstance(k, int) or k <= 1:
            return []
        from rlkit.distributed.process_exit import launched_world_size
        from rlkit.distributed.sequence_parallel import sequence_parallel_problem

        setting = f"ModelConfig.ulysses_sequence_parallel_size = {k}"
        problems = []
        if not self.model.use_remove_padding:
            problems.append(
                f"{setting} splits the packed sequence of use_remove_padding: set "
                f"ModelConfig.use_remove_padding = True"
            )
        attention = self.model.kernel_overrides.get("attention", "grouped_sdpa")
        if attention != "grouped_sdpa":
            problems.append(
                f"{setting} attends with rlkit's grouped_sdpa (it reads the split "
                f"segments), but ModelConfig.kernel_overrides sets attention = "
                f"{attention!r}: remove that override"
            )
        # Under a launcher the process count is known now; else the backend checks it.
        launched = "WORLD_SIZE" in os.environ
        problem = launched and sequence_parallel_problem(k, launched_world_size())
        if problem:
            problems.append(problem + " (accelerate launch --num_processes N)")
        for name, path in (
            ("ModelConfig.path", self.model.path),
            ("ModelConfig.critic_path", self.model.critic_path),
            ("PrimeConfig.model_path", self.prime.model_path),
        ):
            problems += _ulysses_model_problems(path, k, name)
        return problems

    def _reward_model_problems(self) -> list[str]:
        """A reward model that nothing reads, a reward that reads a missing one, a directory
        that is not a one-label sequence classifier."""
        rm, reward = self.reward_model, self.data.reward
        wants = reward_reads_reward_model(reward, self.data.reward_options)
        if not rm.path:
            return (
                [
                    f"DataConfig.reward {reward!r} reads the reward model's score: set "
                    "RewardModelConfig.path to a local AutoModelForSequenceClassification directory"
                ]
                if wants
                else []
            )
        problems = []
        if wants is False:
            problems.append(
                f"RewardModelConfig.path is set but DataConfig.reward {reward!r} does not use "
                "its score: use DataConfig.reward = 'reward_model', or a 'weighted' term "
                "{'reward': 'reward_model', 'weight': w}"
            )
        from rlkit.models.loading import check_reward_model_dir

        try:
            check_reward_model_dir(rm.path)
        except (FileNotFoundError, ValueError) as exc:
            problems.append(str(exc))
        if rm.chat_template is not None:
            from rlkit.data.chat_templates import resolve_chat_template

            try:
                resolve_chat_template(rm.chat_template)
            except ValueError as exc:
                problems.append(f"RewardModelConfig.chat_template: {exc}")
        return problems

    def _prime_problems(self) -> list[str]:
        p, problems = self.prime, []
        if p.model_path:
            from rlkit.models.loading import check_model_dir

            try:
                check_model_dir(p.model_path)
            except FileNotFoundError as exc:
                problems.append(f"PrimeConfig.model_path: {exc}")
        return problems


def rollout_mode_problems(config: ExperimentConfig) -> list[str]:
    """``one_step_off`` and ``async`` generate and score while the actor trains: they need
    an engine that samples from its own copy of the weights, one process (the rollout
    threads gather nothing), and reward worker processes (time limits by ``SIGALRM`` need
    the main thread). ``async`` also needs a ``max_staleness`` of at least one step's
    optimizer steps, and draws no prompts outside step order (no DAPO refills)."""
    mode, engine = config.trainer.rollout_mode, config.rollout.engine
    if mode != "async" and config.trainer.partial_rollout != "finish":
        return [
            f"TrainerConfig.partial_rollout = {config.trainer.partial_rollout!r} applies to "
            f"rollout_mode = 'async' (in {mode!r} no generation runs during a weight sync): "
            f"set rollout_mode = 'async', or leave partial_rollout at 'finish'"
        ]
    if mode not in ROLLOUT_MODES[1:]:
        return []
    from rlkit.registry import ROLLOUT_ENGINES, UnknownNameError

    setting = f"TrainerConfig.rollout_mode = {mode!r}"
    problems = []
    try:
        entry = ROLLOUT_ENGINES.entry(engine)
    except UnknownNameError:
        entry = None  # reported with the engine's own check
    if entry is not None and not entry.extra.get("holds_own_weights"):
        able = [e.name for e in ROLLOUT_ENGINES.describe() if e.extra.get("holds_own_weights")]
        problems.append(
            f"{setting} generates the next batch while the actor trains, but "
            f"RolloutConfig.engine = {engine!r} samples from the trainer's own weights; use an "
            f"engine with its own copy ({', '.join(able)}), or rollout_mode = 'sync'"
        )
    if config.data.reward_workers == 0:
        problems.append(
            f"{setting} scores rewards in its rollout threads, where the in-process reward "
            "time limits cannot run: set DataConfig.reward_workers >= 1 (worker processes, "
            "whose hung calls are killed)"
        )
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        problems.append(
            f"{setting} runs in one process; this launch has WORLD_SIZE="
            f"{os.environ['WORLD_SIZE']}: use rollout_mode = 'sync' with several"
        )
    if mode == "async":
        problems += _async_problems(config)
    return problems


def optimizer_steps_per_step(config: ExperimentConfig) -> int:
    """The actor's optimizer steps in one RL step (weight versions a step adds):
    ``ppo_epochs`` passes over ``ceil(train_batch_size / ppo_mini_batch_size)``
    mini-batches."""
    o = config.optim
    return o.ppo_epochs * -(-config.data.train_batch_size // o.ppo_mini_batch_size)


def async_depth(config: ExperimentConfig) -> tuple[int, int]:
    """``(steps generated ahead, max_staleness)`` of an ``async`` run."""
    per_step = optimizer_steps_per_step(config)
    bound = config.trainer.max_staleness
    bound = 2 * per_step if bound is None else bound
    return bound // per_step, bound


def _async_problems(config: ExperimentConfig) -> list[str]:
    per_step = optimizer_steps_per_step(config)
    depth, bound = async_depth(config)
    problems = []
    if config.trainer.partial_rollout == "continue":
        from rlkit.registry import ROLLOUT_ENGINES, UnknownNameError

        try:
            able = ROLLOUT_ENGINES.entry(config.rollout.engine).extra.get("continues_in_flight")
        except UnknownNameError:
            able = True  # reported with the engine's own check
        if not able:
            names = [
                e.name for e in ROLLOUT_ENGINES.describe() if e.extra.get("continues_in_flight")
            ]
            problems.append(
                f"TrainerConfig.partial_rollout = 'continue' syncs weights under running "
                f"generations, which RolloutConfig.engine = {config.rollout.engine!r} cannot "
                f"do; use {', '.join(names)}, or partial_rollout = 'finish'"
            )
    if depth < 1:
        problems.append(
            f"TrainerConfig.max_staleness = {bound} is below the {per_step} optimizer steps of "
            f"one step (OptimConfig.ppo_epochs x train_batch_size / ppo_mini_batch_size), so "
            f"rollout_mode = 'async' could not generate any batch ahead: set max_staleness "
            f">= {per_step} (one step ahead) or {2 * per_step} (two), or rollout_mode = 'sync'"
        )
    if config.algorithm.filter_groups and depth > 1:
        problems.append(
            "rollout_mode = 'async' with AlgorithmConfig.filter_groups: DAPO's extra "
            "generation rounds would draw prompts while later steps draw theirs, so a resume "
            "could not tell which were trained; use rollout_mode = 'one_step_off', or "
            f"max_staleness < {2 * per_step} (one step ahead)"
        )
    return problems


def reward_reads_reward_model(reward: str, options: dict[str, Any]) -> bool | None:
    """Whether the configured reward reads the reward model's score: ``True`` (the
    ``reward_model`` reward, or a ``weighted`` term of it), ``False`` (registered rewards
    that do not), ``None`` (a user function, which may read ``context``: unknown)."""
    from rlkit.registry import REWARDS

    if ":" in reward:
        return None
    if reward == "weighted":
        terms = options.get("terms", ())
        terms = terms if isinstance(terms, list | tuple) else ()
        names = [t.get("reward") if isinstance(t, dict) else t for t in terms]
        reads = [reward_reads_reward_model(n, {}) for n in names if isinstance(n, str)]
        return True if True in reads else (None if None in reads else False)
    try:
        entry = REWARDS.entry(reward)
    except LookupError:  # an unknown name is reported by check_registered_names
        return None
    return bool(entry.extra.get("needs_reward_model"))


IMPORT_CHECK_TIMEOUT_S = 120.0
"""How long importing a user's module in a child process may take at configuration."""


def check_imports_alone(name: str, setting: str) -> None:
    """Import the module of ``name`` (``path/to/file.py:fn`` or ``pkg.module:fn``) in a
    child process first: a module that ends the process while it is imported
    (``os._exit``, ``SystemExit``, a crash) is then named, instead of ending the run.

    Raises:
        ValueError: the child did not finish the import; the message names ``setting``,
            the exit status and the end of its output.
    """
    import subprocess
    import sys

    code = (
        "import sys\nfrom rlkit.registry import REWARDS\n"
        "try:\n    REWARDS.entry(sys.argv[1])\nexcept Exception:\n    pass\n"
        "print('rlkit: import finished', flush=True)\n"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, name],
            capture_output=True,
            text=True,
            timeout=IMPORT_CHECK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise ValueError(
            f"{setting} {name!r}: importing its module took over {IMPORT_CHECK_TIMEOUT_S:g} s; "
            f"a module should only define functions when imported"
        ) from None
    if "rlkit: import finished" not in proc.stdout:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ValueError(
            f"{setting} {name!r}: importing its module ended the process (exit status "
            f"{proc.returncode}){': ' + ' | '.join(tail) if tail else ''}; a module must not "
            f"exit or crash when imported (move that code under `if __name__ == '__main__':`)"
        )


def check_registered_names(
    algorithm: AlgorithmConfig, data: DataConfig, rollout: RolloutConfig
) -> None:
    """Resolve every registry name the configuration uses; an unknown one raises the
    registry's error (which lists the known names and the nearest match).

    The reward may be a file path (``"my_reward.py:score"``): a missing file or function,
    or a file that raises on import, stops here, before the model loads. A reward
    registered with ``check_options=fn`` (``combined``, ``weighted``, ``final_turn``)
    has ``DataConfig.reward_options`` checked by ``fn`` too (the rewards it names)."""
    from rlkit.registry import (
        AGENT_LOOPS,
        AGGREGATIONS,
        ESTIMATORS,
        KL_PENALTIES,
        POLICY_LOSSES,
        REWARDS,
        ROLES,
        ROLLOUT_CORRECTIONS,
        ROLLOUT_ENGINES,
        TOOLS,
        VALUE_LOSSES,
    )

    ESTIMATORS.entry(algorithm.adv_estimator)
    for role in algorithm.roles:  # a user's role file fails here, before the model loads
        ROLES.entry(role)
    POLICY_LOSSES.entry(algorithm.policy_loss)
    VALUE_LOSSES.entry(algorithm.value_loss)
    AGGREGATIONS.entry(algorithm.loss_agg_mode)
    if algorithm.use_kl_loss:
        KL_PENALTIES.entry(algorithm.kl_loss_type)
    if algorithm.use_kl_in_reward:
        KL_PENALTIES.entry(algorithm.kl_penalty)
    if ":" in data.reward:
        check_imports_alone(data.reward, "DataConfig.reward")
    reward = REWARDS.entry(data.reward)
    if ":" in data.reward and not reward.extra.get("batched"):
        # A user's function: a signature that cannot take the call fails now, not after
        # the model loads (verl's compute_score is recognised and called by keyword).
        from rewards.batched_reward import is_batched
        from rewards.verl_signature import check_reward_signature

        if not is_batched(reward.fn, reward):
            check_reward_signature(reward.fn, data.reward_options, label=data.reward)
    check_options = reward.extra.get("check_options")
    if check_options is not None:
        check_options(dict(data.reward_options))
    if algorithm.rollout_is_level is not None:
        ROLLOUT_CORRECTIONS.entry(algorithm.rollout_is_mode)
    engine_option_check(ROLLOUT_ENGINES.entry(rollout.engine).fn, rollout.engine_options)
    AGENT_LOOPS.entry(rollout.agent_loop)
    tools = rollout.agent.get("tools", ()) if isinstance(rollout.agent, dict) else ()
    for tool in (tools,) if isinstance(tools, str) else tools:
        TOOLS.entry(tool)


def engine_option_check(factory: Any, options: dict[str, Any]) -> None:
    """Refuse ``RolloutConfig.engine_options`` the engine factory does not take, before the
    model loads (the factory itself runs after it). A factory whose catch-all is
    ``**unused`` takes only its named options; one whose catch-all forwards options
    elsewhere (``**engine_options``) takes those its ``forwarded_options()`` names, or is
    left to check them itself when it names none."""
    import inspect

    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return
    rest = [p.name for p in params.values() if p.kind is p.VAR_KEYWORD]
    forwarded: set[str] = set()
    if rest and rest[0] != "unused":
        if not hasattr(factory, "forwarded_options"):
            return
        try:
            forwarded = set(factory.forwarded_options())
        except ImportError:  # the engine's packages are missing: it reports that itself
            return
    passed = {"model_path", "tokenizer", "weights", "seed"}  # the trainer's own arguments
    known = [n for n, p in params.items() if p.kind is not p.VAR_KEYWORD and n not in passed]
    known += sorted(forwarded - set(known))
    unknown = sorted(set(options) - set(known))
    if unknown:
        import difflib

        near = [m for u in unknown for m in difflib.get_close_matches(u, known, n=1)]
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise TypeError(
            f"RolloutConfig.engine_options has unknown option(s) {unknown}{hint}; the "
            f"engine takes: {', '.join(known) or 'none'}"
        )


# ------------------------------------------------------------------ field rules
# One rule per field with a range or a fixed set of values. A rule's ``problem(value)``
# returns what the value must be (completing "Section.field must be ...") or None when
# the value is allowed. Fields annotated ``bool`` or ``dict[...]`` get a type rule without
# being listed. Free-form fields (paths, names a registry checks, prompt text) have none;
# tests/test_config_validation.py keeps the list of those, so a new field without a rule
# is noticed.


class Rule(Protocol):
    def problem(self, value: Any) -> str | None: ...


@dataclass(frozen=True)
class Number:
    """A finite number (an ``int`` when ``integer``) within the given bounds."""

    integer: bool = False
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    optional: bool = False
    """``None`` is allowed too."""

    def bounds(self) -> str:
        pairs = ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
        return " and ".join(f"{op} {bound:g}" for op, bound in pairs if bound is not None)

    def in_bounds(self, value: float) -> bool:
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def problem(self, value: Any) -> str | None:
        if value is None and self.optional:
            return None
        kinds = (int,) if self.integer else (int, float)
        right_type = isinstance(value, kinds) and not isinstance(value, bool)
        if right_type and math.isfinite(value) and self.in_bounds(value):
            return None
        if right_type and math.isfinite(value):
            return self.bounds() + (" or None" if self.optional else "")
        kind = "an integer" if self.integer else "a finite number"
        return " ".join(filter(None, (kind, self.bounds(), "or None" if self.optional else "")))


@dataclass(frozen=True)
class Choice:
    """One of a fixed set of values."""

    values: tuple[Any, ...]

    def problem(self, value: Any) -> str | None:
        allowed = any(value == v and type(value) is type(v) for v in self.values)
        return None if allowed else "|".join(map(str, self.values))


@dataclass(frozen=True)
class OfType:
    """Any value of one Python type (``bool`` for flags, ``dict`` for option mappings)."""

    kind: type
    description: str

    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, self.kind) else self.description


@dataclass(frozen=True)
class Pair:
    """Two numbers, each obeying ``item``."""

    item: Number

    def problem(self, value: Any) -> str | None:
        ok = isinstance(value, list | tuple) and len(value) == 2
        if ok and not any(self.item.problem(v) for v in value):
            return None
        return f"2 numbers {self.item.bounds()}"


@dataclass(frozen=True)
class ResumeMode:
    """``auto`` | ``disable`` | the path of an existing checkpoint directory."""

    def problem(self, value: Any) -> str | None:
        if value in ("auto", "disable") or (isinstance(value, str) and Path(value).exists()):
            return None
        return "auto|disable|an existing checkpoint path"


@dataclass(frozen=True)
class LoggerNames(OfType):
    """A list or tuple of logger names: registered ones, or ``module:factory`` paths
    (imported when the run starts, not here)."""

    kind: type = tuple
    description: str = "a list of logger names"

    def problem(self, value: Any) -> str | None:
        from rlkit.registry import LOGGERS

        known = ", ".join(LOGGERS.names())
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            return f"a list of logger names ({known})"
        if any(":" not in v and v not in LOGGERS for v in value):
            return f"a list of {known} or 'pkg.module:factory' names"
        return None


@dataclass(frozen=True)
class TrackerName(OfType):
    """A name every tracker accepts as a project: letters, digits, ``_ - + .`` (SwanLab's
    rule, the strictest of the three), up to 100 characters."""

    kind: type = str
    description: str = "a name of letters, digits, '_', '-', '+' or '.' (at most 100)"
    empty: bool = False
    """``""`` is allowed too (a default chosen at run time)."""

    def problem(self, value: Any) -> str | None:
        if isinstance(value, str) and (
            (self.empty and value == "") or re.fullmatch(r"[0-9A-Za-z_\-+.]{1,100}", value)
        ):
            return None
        return self.description + (' or ""' if self.empty else "")


FLAG = OfType(bool, "True or False")
MAPPING = OfType(dict, "a dict")
COUNT = Number(integer=True, ge=1)
NON_NEGATIVE_INT = Number(integer=True, ge=0)
NON_NEGATIVE = Number(ge=0)
POSITIVE = Number(gt=0)
FRACTION = Number(ge=0, le=1)
DTYPE = Choice(("float32", "bfloat16", "float16"))

FIELD_RULES: dict[type, dict[str, Rule]] = {
    ModelConfig: {
        "dtype": DTYPE,
        "lora_rank": NON_NEGATIVE_INT,
        "lora_alpha": COUNT,
        "ulysses_sequence_parallel_size": COUNT,
    },
    DataConfig: {
        "train_batch_size": COUNT,
        "gen_batch_size": Number(integer=True, ge=1, optional=True),
        "val_limit": Number(integer=True, ge=0, optional=True),  # 0 = all, as None
        "max_prompt_length": COUNT,
        "truncation": Choice(("error", "left", "filter")),
        "on_error": Choice(("raise", "skip")),
        "reward_timeout_s": POSITIVE,
        "reward_workers": NON_NEGATIVE_INT,
        "reward_deadline_s": Number(gt=0, optional=True),
        "max_reward_failure_rate": Number(gt=0, le=1),
    },
    RewardModelConfig: {
        "dtype": DTYPE,
        "max_length": Number(integer=True, ge=1, optional=True),
        "max_token_len_per_micro_batch": COUNT,
    },
    PrimeConfig: {
        "beta_train": POSITIVE,
        "lr": NON_NEGATIVE,
        "loss_type": Choice(("ce", "dpo")),
        "granularity": Choice(("token", "whole")),
        "norm": Choice(("batch_norm", "none")),
        "update": Choice(("before", "after", "reverse", "none")),
    },
    RolloutConfig: {
        "n": COUNT,
        "max_response_length": COUNT,
        # Training samples n > 1 different responses and divides the actor's logits by
        # the temperature: 0 (greedy in the engines) would give n copies and inf logits.
        "temperature": POSITIVE,
        "top_p": Number(gt=0, le=1),
        "top_k": Number(integer=True, ge=-1),  # -1 (or 0) = no top-k filter
        "val_n": COUNT,
        "val_temperature": NON_NEGATIVE,  # 0 = greedy
        "val_top_p": Number(gt=0, le=1, optional=True),
        "val_top_k": Number(integer=True, ge=-1, optional=True),
    },
    AlgorithmConfig: {
        "math": Choice(("fused", "plain")),
        "gamma": FRACTION,
        "lam": FRACTION,
        "clip_ratio": POSITIVE,
        "clip_ratio_low": Number(gt=0, optional=True),
        "clip_ratio_high": Number(gt=0, optional=True),
        "clip_ratio_c": Number(gt=1),  # dual-clip lower bound, verl's requirement
        "entropy_coeff": Number(),
        "kl_loss_coef": NON_NEGATIVE,
        "kl_ctrl_type": Choice(("fixed", "adaptive")),
        "kl_coef": NON_NEGATIVE,
        "kl_target": POSITIVE,
        "kl_horizon": COUNT,
        "rollout_is_level": Choice((None, "token", "sequence")),
        "rollout_is_threshold": POSITIVE,
        "rollout_is_threshold_low": Number(gt=0, optional=True),
        "filter_metric": Choice(("acc", "score")),
        "max_num_gen_batches": COUNT,
        "overlong_buffer_len": NON_NEGATIVE_INT,
        "overlong_penalty_factor": NON_NEGATIVE,
        "critic_warmup": NON_NEGATIVE_INT,
    },
    OptimConfig: {
        "lr": NON_NEGATIVE,  # 0 keeps the parameters fixed (used by gradient tests)
        "critic_lr": NON_NEGATIVE,
        "weight_decay": NON_NEGATIVE,
        "betas": Pair(Number(ge=0, lt=1)),
        "warmup_steps": NON_NEGATIVE_INT,
        "lr_schedule": Choice(("constant", "cosine")),
        "min_lr_ratio": FRACTION,
        "grad_clip": POSITIVE,
        "optimizer_implementation": Choice(OPTIMIZER_IMPLEMENTATIONS),
        "ppo_epochs": COUNT,
        "ppo_mini_batch_size": COUNT,
        "micro_batch_size": COUNT,
        "max_token_len_per_micro_batch": COUNT,
        "cliprange_value": POSITIVE,
        "logprob_chunk_size": COUNT,
    },
    TrainerConfig: {
        "total_steps": NON_NEGATIVE_INT,  # 0 = only validate
        "total_epochs": Number(integer=True, ge=1, optional=True),
        "test_freq": NON_NEGATIVE_INT,
        "save_freq": NON_NEGATIVE_INT,
        "max_checkpoints_to_keep": COUNT,
        "resume_mode": ResumeMode(),
        "on_corrupt_checkpoint": Choice(("fallback", "stop")),
        "seed": Number(integer=True),
        "rollout_mode": Choice(ROLLOUT_MODES),
        "max_staleness": Number(integer=True, ge=0, optional=True),
        "partial_rollout": Choice(("finish", "continue")),
        "backend_strategy": Choice(("auto", "fsdp2", "none")),
        "mixed_precision": Choice(("no", "bf16", "fp16")),
        "num_threads": Number(integer=True, ge=1, optional=True),
        "loggers": LoggerNames(),
        "project_name": TrackerName(),
        "experiment_name": TrackerName(empty=True),
        "export_freq": NON_NEGATIVE_INT,  # 0 = only the end-of-run export, if any
    },
}
"""Section -> field -> rule; see :func:`rules_for` for the implied ``bool``/``dict`` ones."""


def rules_for(section: type) -> dict[str, Rule]:
    """Every rule of ``section``'s fields: the listed ones, plus a type rule for each field
    annotated ``bool`` or ``dict[...]``."""
    implied: dict[str, Rule] = {}
    for f in fields(section):
        annotation = str(f.type)
        if annotation == "bool":
            implied[f.name] = FLAG
        elif annotation.startswith("dict["):
            implied[f.name] = MAPPING
    return implied | FIELD_RULES.get(section, {})


def _ulysses_model_problems(path: str | None, k: int, setting: str) -> list[str]:
    """A model directory whose heads do not split ``k`` ways, or a vision-language one."""
    if not path or not (Path(path) / "config.json").is_file():
        return []  # a missing directory is reported by the model checks
    from transformers import AutoConfig

    from rlkit.trainer.ulysses import head_problems

    config = AutoConfig.from_pretrained(path)
    if getattr(config, "vision_config", None) is not None:
        return [
            f"{setting} ({path}) is a vision-language model: ModelConfig."
            f"ulysses_sequence_parallel_size > 1 splits text-only sequences; set it to 1"
        ]
    return [f"{p} ({setting}: {path})" for p in head_problems(config, k)]


def field_problems(section: Any, values: dict[str, Any] | None = None) -> list[str]:
    """``"Section.field must be ..., got value"`` for every field of ``section`` (a
    section instance, or its class with ``values``, a subset of its fields) that breaks
    its rule."""
    cls = section if isinstance(section, type) else type(section)
    values = vars(section) if values is None else values
    problems = []
    for name, rule in rules_for(cls).items():
        if name not in values:
            continue
        allowed = rule.problem(values[name])
        if allowed is not None:
            problems.append(f"{cls.__name__}.{name} must be {allowed}, got {values[name]!r}")
    return problems


def batch_problems(data: DataConfig, optim: OptimConfig) -> list[str]:
    """The global batch splits into whole mini-batches (once both sizes are valid)."""
    batch, mini = data.train_batch_size, optim.ppo_mini_batch_size
    if field_problems(DataConfig, {"train_batch_size": batch}) or field_problems(
        OptimConfig, {"ppo_mini_batch_size": mini}
    ):
        return []
    if batch % mini:
        return [
            f"DataConfig.train_batch_size ({batch}) must be a multiple of "
            f"OptimConfig.ppo_mini_batch_size ({mini})"
        ]
    gen = data.gen_batch_size
    if isinstance(gen, int) and gen >= 1 and gen < batch:
        return [
            f"DataConfig.gen_batch_size ({gen}) must be at least DataConfig.train_batch_size "
            f"({batch}): each generation round draws it, a step trains on train_batch_size"
        ]
    return []


def reward_time_problems(data: DataConfig) -> list[str]:
    """The reward phase's deadline leaves room for one call's whole time limit."""
    limit, deadline = data.reward_timeout_s, data.reward_deadline_s
    checked = {"reward_timeout_s": limit, "reward_deadline_s": deadline}
    if deadline is None or limit is None or field_problems(DataConfig, checked):
        return []
    if deadline < limit:
        return [
            f"DataConfig.reward_deadline_s ({deadline:g}) is shorter than one call's limit, "
            f"DataConfig.reward_timeout_s ({limit:g}): raise the deadline or lower the limit"
        ]
    return []


def bound_values(section: type) -> dict[str, Any]:
    """The values gin binds to ``section``'s fields, without calling anything: a binding
    to a reference (``@arithmetic_sft_model()``) is left out, so checking these can run
    before the work such a reference does."""
    values = {}
    for f in fields(section):
        try:
            value = gin.query_parameter(f"{section.__name__}.{f.name}")
        except ValueError:  # not bound
            continue
        if not isinstance(value, gin.config.ConfigurableReference):
            values[f.name] = value
    return values


def format_problems(problems: list[str]) -> str:
    return "invalid experiment configuration:\n  - " + "\n  - ".join(problems)
