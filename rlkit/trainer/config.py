"""The experiment configuration: small dataclasses, every field bindable from gin.

A gin file sets fields as ``Section.field = value``, e.g.::

    AlgorithmConfig.adv_estimator = "grpo"
    RolloutConfig.n = 8

Algorithm presets (``algorithms/presets/*.gin``) only bind names and numbers
in :class:`AlgorithmConfig`; adding an algorithm never needs a trainer change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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

    train_files: str = ""
    """JSON Lines / Parquet file, a shared set name (``gsm8k``), or empty when
    ``dataset_fn`` is given."""
    val_files: str = ""
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
    val_limit: int | None = None
    """Use only the first N validation prompts."""
    max_prompt_length: int = 512
    truncation: str = "error"
    """Prompt longer than ``max_prompt_length``: error | left (keep the end) | filter (drop)."""
    shuffle: bool = True
    reward: str = "gsm8k"
    """Reward function name (``rlkit list rewards``), ``package.module:function`` or
    ``path/to/file.py:function`` (relative to the working directory); see docs/rewards.md."""
    reward_options: dict[str, Any] = field(default_factory=dict)
    reward_timeout_s: float = 10.0
    reward_workers: int = 0


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
    seed: int = 0
    backend_strategy: str = "auto"
    """auto | fsdp2 | none (see rlkit.trainer.backend)."""
    mixed_precision: str = "no"
    """no | bf16 | fp16: the compute dtype of actor, reference and critic forwards (FSDP2's
    MixedPrecisionPolicy when sharded, autocast otherwise). Parameters, gradients and
    optimizer state stay in ``ModelConfig.dtype``: keep that float32 and set bf16 here
    for the usual GPU recipe (pure-bf16 parameters lose updates below their ~3 significant
    digits, e.g. most of an lr=1e-6 step)."""
    platform: str | None = None
    """Force a platform (cpu | cuda | npu); None = detect."""
    export_hf_at_end: bool = False
    tensorboard: bool = True
    progress_bar: bool = True
    plot_learning_curve: bool = True
    num_threads: int | None = None
    """torch intra-op threads (None = torch's default)."""


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

    @classmethod
    def from_gin(cls) -> ExperimentConfig:
        """Build every section from the parsed gin bindings.

        Registered names are checked before :class:`ModelConfig` is built, because
        building it may run work bound in gin (e.g. ``@arithmetic_sft_model()``).
        """
        algorithm, data, rollout = AlgorithmConfig(), DataConfig(), RolloutConfig()
        check_registered_names(algorithm, data, rollout)
        return cls(
            ModelConfig(),
            data,
            rollout,
            algorithm,
            OptimConfig(),
            TrainerConfig(),
            RewardModelConfig(),
            PrimeConfig(),
        )

    def validate(self) -> None:
        """Raise ``ValueError`` naming every inconsistent setting, before any work."""
        problems = []
        d, r, o, a = self.data, self.rollout, self.optim, self.algorithm
        if d.train_batch_size % o.ppo_mini_batch_size:
            problems.append(
                f"DataConfig.train_batch_size ({d.train_batch_size}) must be a multiple of "
                f"OptimConfig.ppo_mini_batch_size ({o.ppo_mini_batch_size})"
            )
        if d.truncation not in ("error", "left", "filter"):
            problems.append(
                f"DataConfig.truncation must be error|left|filter, got {d.truncation!r}"
            )
        if r.n < 1 or r.val_n < 1:
            problems.append("RolloutConfig.n and val_n must be >= 1")
        if a.filter_metric not in ("acc", "score"):
            problems.append(
                f"AlgorithmConfig.filter_metric must be acc|score, got {a.filter_metric!r}"
            )
        if o.lr_schedule not in ("constant", "cosine"):
            problems.append(
                f"OptimConfig.lr_schedule must be constant|cosine, got {o.lr_schedule!r}"
            )
        if self.trainer.mixed_precision not in ("no", "bf16", "fp16"):
            problems.append(
                "TrainerConfig.mixed_precision must be no|bf16|fp16, "
                f"got {self.trainer.mixed_precision!r}"
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
        if not (d.train_files or d.dataset_fn):
            problems.append("set DataConfig.train_files or DataConfig.dataset_fn")
        problems += self._reward_model_problems()
        problems += self._prime_problems()
        if problems:
            raise ValueError("invalid experiment configuration:\n  - " + "\n  - ".join(problems))

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
        if rm.dtype not in ("float32", "bfloat16", "float16"):
            problems.append(
                f"RewardModelConfig.dtype must be float32|bfloat16|float16, got {rm.dtype!r}"
            )
        if rm.max_token_len_per_micro_batch < 1:
            problems.append("RewardModelConfig.max_token_len_per_micro_batch must be >= 1")
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
        p = self.prime
        choices = {
            "loss_type": ("ce", "dpo"),
            "granularity": ("token", "whole"),
            "norm": ("batch_norm", "none"),
            "update": ("before", "after", "reverse", "none"),
        }
        problems = [
            f"PrimeConfig.{name} must be {'|'.join(allowed)}, got {getattr(p, name)!r}"
            for name, allowed in choices.items()
            if getattr(p, name) not in allowed
        ]
        if not p.beta_train > 0:
            problems.append(f"PrimeConfig.beta_train must be > 0, got {p.beta_train}")
        if p.model_path:
            from rlkit.models.loading import check_model_dir

            try:
                check_model_dir(p.model_path)
            except FileNotFoundError as exc:
                problems.append(f"PrimeConfig.model_path: {exc}")
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
        ROLLOUT_ENGINES,
        TOOLS,
        VALUE_LOSSES,
    )

    ESTIMATORS.entry(algorithm.adv_estimator)
    POLICY_LOSSES.entry(algorithm.policy_loss)
    VALUE_LOSSES.entry(algorithm.value_loss)
    AGGREGATIONS.entry(algorithm.loss_agg_mode)
    if algorithm.use_kl_loss:
        KL_PENALTIES.entry(algorithm.kl_loss_type)
    if algorithm.use_kl_in_reward:
        KL_PENALTIES.entry(algorithm.kl_penalty)
    reward = REWARDS.entry(data.reward)
    check_options = reward.extra.get("check_options")
    if check_options is not None:
        check_options(dict(data.reward_options))
    ROLLOUT_ENGINES.entry(rollout.engine)
    AGENT_LOOPS.entry(rollout.agent_loop)
    tools = rollout.agent.get("tools", ()) if isinstance(rollout.agent, dict) else ()
    for tool in (tools,) if isinstance(tools, str) else tools:
        TOOLS.entry(tool)
