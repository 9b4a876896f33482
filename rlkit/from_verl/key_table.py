"""Where each verl key goes: an rlkit field (:data:`KEYS`), or the reason it has none
(:data:`UNSUPPORTED`). Keys folded into a combined setting (engine options, offload, the
launch command, the overlong buffer) are handled by :mod:`rlkit.from_verl.translation`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Convert = Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


def _files(value: Any) -> Any:
    # verl takes one path or a list of them; rlkit takes the same (a list is concatenated).
    return list(value) if isinstance(value, list | tuple) else str(value)


def _loggers(value: Any) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else list(value)
    out = ["jsonl"] + [n for n in names if n in ("console", "wandb", "mlflow", "swanlab")]
    if "tensorboard" in names:
        out.append("tensorboard")
    return tuple(dict.fromkeys(out))


def _truncation(value: Any) -> str:
    if value not in ("error", "left"):
        raise ValueError(f"data.truncation={value!r}: rlkit truncates 'left' or refuses ('error')")
    return str(value)


def _filter_metric(value: Any) -> str:
    if value not in ("acc", "score"):
        raise ValueError(f"algorithm.filter_groups.metric={value!r}: rlkit filters on acc | score")
    return str(value)


def _max_gen(value: Any) -> int:
    if int(value) < 1:
        raise ValueError(
            "algorithm.filter_groups.max_num_gen_batches <= 0 (endless in verl): rlkit needs "
            "a limit >= 1"
        )
    return int(value)


def _engine(value: Any) -> str:
    if value not in ("vllm", "sglang", "hf"):
        raise ValueError(
            f"actor_rollout_ref.rollout.name={value!r}: rlkit's engines are 'hf' (its own "
            f"decode loop), 'vllm' and 'sglang'"
        )
    return str(value)


def _platform(value: Any) -> str:
    if value not in ("cuda", "npu", "cpu"):
        raise ValueError(f"trainer.device={value!r}: rlkit's platforms are cuda, npu and cpu")
    return str(value)


_DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}
_DTYPES.update({"fp16": "float16", "float16": "float16"})


def _dtype(value: Any) -> str:
    if str(value) not in _DTYPES:
        raise ValueError(f"fsdp_config.model_dtype={value!r}: rlkit takes one of {sorted(_DTYPES)}")
    return _DTYPES[str(value)]


def _is_level(value: Any) -> str | None:
    if value not in (None, "token", "sequence"):
        raise ValueError(
            f"algorithm.rollout_correction.rollout_is={value!r}: rlkit weighs per token or "
            f"per sequence (or not at all: null)"
        )
    return value


@dataclass(frozen=True)
class Key:
    """Where one verl key goes: an rlkit ``Section.field`` and how its value converts."""

    target: str
    convert: Convert = field(default=_same)
    note: str = ""


KEYS: dict[str, Key] = {
    # data
    "data.train_files": Key("DataConfig.train_files", _files, "a list is concatenated"),
    "data.val_files": Key("DataConfig.val_files", _files),
    "data.train_batch_size": Key("DataConfig.train_batch_size", int, "prompts per step"),
    "data.gen_batch_size": Key("DataConfig.gen_batch_size", int, "DAPO: prompts per round"),
    "data.max_prompt_length": Key("DataConfig.max_prompt_length", int),
    "data.max_response_length": Key("RolloutConfig.max_response_length", int),
    "data.truncation": Key("DataConfig.truncation", _truncation),
    "data.shuffle": Key("DataConfig.shuffle", bool),
    "data.seed": Key("TrainerConfig.seed", int),
    "custom_reward_function.path": Key("DataConfig.custom_reward_path", str),
    "custom_reward_function.name": Key("DataConfig.custom_reward_name", str),
    # model
    "actor_rollout_ref.model.path": Key("ModelConfig.path", str),
    "actor_rollout_ref.model.use_remove_padding": Key("ModelConfig.use_remove_padding", bool),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": Key(
        "ModelConfig.ulysses_sequence_parallel_size", int
    ),
    # verl splits layers only under its Megatron backend; rlkit does it on FSDP2 (DTensor).
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": Key(
        "ModelConfig.tensor_parallel_size", int
    ),
    "actor_rollout_ref.actor.freeze_vision_tower": Key("ModelConfig.freeze_vision_tower", bool),
    "actor_rollout_ref.model.enable_gradient_checkpointing": Key(
        "ModelConfig.gradient_checkpointing", bool
    ),
    "actor_rollout_ref.model.lora_rank": Key("ModelConfig.lora_rank", int),
    "actor_rollout_ref.model.lora_alpha": Key("ModelConfig.lora_alpha", int),
    "actor_rollout_ref.model.target_modules": Key("ModelConfig.lora_target_modules", _same),
    "critic.model.path": Key("ModelConfig.critic_path", str),
    # actor
    "actor_rollout_ref.actor.optim.lr": Key("OptimConfig.lr", float),
    "actor_rollout_ref.actor.optim.lr_warmup_steps": Key("OptimConfig.warmup_steps", int),
    "actor_rollout_ref.actor.optim.weight_decay": Key("OptimConfig.weight_decay", float),
    "actor_rollout_ref.actor.ppo_mini_batch_size": Key(
        "OptimConfig.ppo_mini_batch_size", int, "prompts per optimizer step, as in verl"
    ),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": Key(
        "OptimConfig.micro_batch_size", int, "sequences per forward on each process"
    ),
    "actor_rollout_ref.actor.use_dynamic_bsz": Key("OptimConfig.use_dynamic_bsz", bool),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": Key(
        "OptimConfig.max_token_len_per_micro_batch", int
    ),
    "actor_rollout_ref.actor.ppo_epochs": Key("OptimConfig.ppo_epochs", int),
    "actor_rollout_ref.actor.grad_clip": Key("OptimConfig.grad_clip", float),
    "actor_rollout_ref.actor.clip_ratio": Key("AlgorithmConfig.clip_ratio", float),
    "actor_rollout_ref.actor.clip_ratio_low": Key("AlgorithmConfig.clip_ratio_low", float),
    "actor_rollout_ref.actor.clip_ratio_high": Key("AlgorithmConfig.clip_ratio_high", float),
    "actor_rollout_ref.actor.clip_ratio_c": Key("AlgorithmConfig.clip_ratio_c", float),
    "actor_rollout_ref.actor.loss_agg_mode": Key("AlgorithmConfig.loss_agg_mode", str),
    "actor_rollout_ref.actor.policy_loss.loss_mode": Key("AlgorithmConfig.policy_loss", str),
    "actor_rollout_ref.actor.entropy_coeff": Key("AlgorithmConfig.entropy_coeff", float),
    "actor_rollout_ref.actor.use_kl_loss": Key("AlgorithmConfig.use_kl_loss", bool),
    "actor_rollout_ref.actor.kl_loss_coef": Key("AlgorithmConfig.kl_loss_coef", float),
    "actor_rollout_ref.actor.kl_loss_type": Key("AlgorithmConfig.kl_loss_type", str),
    # rollout
    "actor_rollout_ref.rollout.name": Key("RolloutConfig.engine", _engine),
    "actor_rollout_ref.rollout.n": Key("RolloutConfig.n", int),
    "actor_rollout_ref.rollout.temperature": Key("RolloutConfig.temperature", float),
    "actor_rollout_ref.rollout.top_p": Key("RolloutConfig.top_p", float),
    "actor_rollout_ref.rollout.top_k": Key("RolloutConfig.top_k", int),
    "actor_rollout_ref.rollout.val_kwargs.n": Key("RolloutConfig.val_n", int),
    "actor_rollout_ref.rollout.val_kwargs.temperature": Key("RolloutConfig.val_temperature", float),
    "actor_rollout_ref.rollout.val_kwargs.top_p": Key("RolloutConfig.val_top_p", float),
    "actor_rollout_ref.rollout.val_kwargs.top_k": Key("RolloutConfig.val_top_k", int),
    "actor_rollout_ref.rollout.val_kwargs.do_sample": Key("RolloutConfig.val_do_sample", bool),
    # algorithm
    "algorithm.adv_estimator": Key("AlgorithmConfig.adv_estimator", str),
    "algorithm.gamma": Key("AlgorithmConfig.gamma", float),
    "algorithm.lam": Key("AlgorithmConfig.lam", float),
    "algorithm.norm_adv_by_std_in_grpo": Key("AlgorithmConfig.norm_adv_by_std_in_grpo", bool),
    "algorithm.use_kl_in_reward": Key("AlgorithmConfig.use_kl_in_reward", bool),
    "algorithm.kl_penalty": Key("AlgorithmConfig.kl_penalty", str),
    "algorithm.kl_ctrl.type": Key("AlgorithmConfig.kl_ctrl_type", str),
    "algorithm.kl_ctrl.kl_coef": Key("AlgorithmConfig.kl_coef", float),
    "algorithm.kl_ctrl.target_kl": Key("AlgorithmConfig.kl_target", float),
    "algorithm.kl_ctrl.horizon": Key("AlgorithmConfig.kl_horizon", int),
    "algorithm.filter_groups.enable": Key("AlgorithmConfig.filter_groups", bool),
    "algorithm.filter_groups.metric": Key("AlgorithmConfig.filter_metric", _filter_metric),
    "algorithm.filter_groups.max_num_gen_batches": Key(
        "AlgorithmConfig.max_num_gen_batches", _max_gen
    ),
    "reward_model.overlong_buffer.len": Key(
        "AlgorithmConfig.overlong_buffer_len", int, "only with reward_model.overlong_buffer.enable"
    ),
    "reward_model.overlong_buffer.penalty_factor": Key(
        "AlgorithmConfig.overlong_penalty_factor", float
    ),
    # critic
    "critic.optim.lr": Key("OptimConfig.critic_lr", float),
    "critic.cliprange_value": Key("OptimConfig.cliprange_value", float),
    # trainer
    "trainer.total_epochs": Key("TrainerConfig.total_epochs", int),
    "trainer.total_training_steps": Key("TrainerConfig.total_steps", int),
    "trainer.test_freq": Key("TrainerConfig.test_freq", lambda v: max(0, int(v))),
    "trainer.save_freq": Key("TrainerConfig.save_freq", lambda v: max(0, int(v))),
    "trainer.val_before_train": Key("TrainerConfig.val_before_train", bool),
    "trainer.project_name": Key("TrainerConfig.project_name", str),
    "trainer.experiment_name": Key("TrainerConfig.experiment_name", str),
    "trainer.logger": Key("TrainerConfig.loggers", _loggers),
    "trainer.default_local_dir": Key("TrainerConfig.output_dir", str),
    "trainer.resume_mode": Key("TrainerConfig.resume_mode", str),
    "trainer.max_actor_ckpt_to_keep": Key("TrainerConfig.max_checkpoints_to_keep", int),
    "trainer.critic_warmup": Key("AlgorithmConfig.critic_warmup", int),
    "trainer.balance_batch": Key("TrainerConfig.balance_batch", bool),
    "trainer.device": Key("TrainerConfig.platform", _platform),
    "reward_model.model.path": Key("RewardModelConfig.path", str),
    "reward.reward_model.model_path": Key("RewardModelConfig.path", str),
    "reward_model.num_workers": Key(
        "DataConfig.reward_workers", int, "processes that score rewards beside the trainer"
    ),
    "algorithm.rollout_correction.rollout_is": Key("AlgorithmConfig.rollout_is_level", _is_level),
    "actor_rollout_ref.actor.fsdp_config.model_dtype": Key(
        "ModelConfig.dtype", _dtype, "the dtype the policy is loaded and trained in"
    ),
}
"""verl key -> rlkit field; see docs/from_verl.md for the table."""

_COLOCATED = (
    "verl's memory hand-over between the trainer and a colocated engine; rlkit's servers are "
    "processes of their own, sized by engine_options"
)
_CRITIC_BATCHES = (
    "the critic uses the actor's micro-batches (OptimConfig.use_dynamic_bsz, "
    "max_token_len_per_micro_batch, micro_batch_size)"
)

UNSUPPORTED: dict[str, str] = {
    "data.prompt_key": "rlkit reads the 'prompt' column of verl's rows (rename the column)",
    "data.return_raw_chat": "rlkit always keeps the chat messages",
    "actor_rollout_ref.model.use_fused_kernels": (
        "rlkit's log-prob/entropy op is chosen by AlgorithmConfig.math (fused | plain)"
    ),
    "actor_rollout_ref.model.use_liger": (
        "rlkit chooses its kernels per platform (ModelConfig.kernel_overrides, `rlkit doctor`)"
    ),
    "data.dataloader_num_workers": "prompts are tokenized once, in memory",
    "data.filter_overlong_prompts_workers": "prompts are measured once, in the trainer",
    "reward_model.enable": "a reward model is RewardModelConfig.path",
    "actor_rollout_ref.rollout.mode": (
        "verl's server mode switch; rlkit's engines need none (TrainerConfig.rollout_mode "
        "overlaps rollout and update)"
    ),
    "actor_rollout_ref.actor.ppo_micro_batch_size": "give the per-GPU size instead",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": "use OptimConfig.warmup_steps",
    "critic.ppo_micro_batch_size_per_gpu": "the critic uses OptimConfig.micro_batch_size",
    "critic.model.enable_gradient_checkpointing": "ModelConfig.gradient_checkpointing",
    "critic.model.use_remove_padding": "ModelConfig.use_remove_padding",
    "actor_rollout_ref.actor.use_torch_compile": (
        "rlkit does not torch.compile; its fused log-prob/entropy op takes that place "
        "(AlgorithmConfig.math)"
    ),
    "actor_rollout_ref.ref.use_torch_compile": (
        "rlkit does not torch.compile; its fused log-prob/entropy op takes that place "
        "(AlgorithmConfig.math)"
    ),
    "trainer.log_val_generations": "validation metrics only",
    "data.image_key": "rlkit reads the 'images' column of verl's rows (docs/vision_language.md)",
    "data.val_batch_size": (
        "rlkit validates the whole held-out set in one pass (DataConfig.val_limit caps it)"
    ),
    "actor_rollout_ref.rollout.load_format": (
        "rlkit's servers start from the model directory (or the last weight snapshot)"
    ),
    "actor_rollout_ref.rollout.layered_summon": _COLOCATED,
    "actor_rollout_ref.rollout.free_cache_engine": _COLOCATED,
    "actor_rollout_ref.rollout.multi_stage_wake_up": _COLOCATED,
    "actor_rollout_ref.model.use_shm": "rlkit loads the model from its directory",
    "actor_rollout_ref.rollout.over_sample_rate": (
        "rlkit waits for every response of a step (TrainerConfig.partial_rollout carries long "
        "ones over in async mode)"
    ),
    "critic.ppo_max_token_len_per_gpu": _CRITIC_BATCHES,
    "critic.forward_max_token_len_per_gpu": _CRITIC_BATCHES,
    "critic.use_dynamic_bsz": _CRITIC_BATCHES,
    "critic.optim.lr_warmup_steps_ratio": "use OptimConfig.warmup_steps",
    "trainer.val_only": "use `rlkit eval`",
}
"""verl keys with no rlkit field, and why (prefixes below are added)."""

_PREFIX_REASONS = (
    (
        ".fsdp_config.",
        "rlkit's FSDP2 layout is fixed (its settings: TrainerConfig.backend_strategy, "
        "cpu_offload, mixed_precision); this one is not offered",
    ),
    (".fsdp.", "rlkit's FSDP2 layout is fixed (TrainerConfig.backend_strategy, cpu_offload)"),
    (
        "reward_model.rollout.",
        "rlkit runs the reward model in the trainer's processes (RewardModelConfig), not on a "
        "rollout server",
    ),
    (
        "reward.reward_model.rollout.",
        "rlkit runs the reward model in the trainer's processes (RewardModelConfig), not on a "
        "rollout server",
    ),
    ("global_profiler.", "rlkit logs each phase's time (timing_s/*); profile with torch.profiler"),
    (
        "data.custom_cls.",
        "rlkit reads verl's files itself; a dataset of your own is DataConfig.dataset_fn",
    ),
    (
        "algorithm.rollout_correction.",
        "rlkit's rollout correction is AlgorithmConfig.rollout_is_level, rollout_is_mode "
        "(truncate | mask) and rollout_is_threshold(_low) (docs/algorithms.md)",
    ),
    (
        ".megatron.",
        "a Megatron-Core backend setting: rlkit trains with FSDP2 and, for "
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size, DTensor tensor "
        "parallelism (docs/scale.md says which models that covers)",
    ),
    (".checkpoint.", "checkpoints hold the whole training state"),
    (
        "actor_rollout_ref.rollout.multi_turn.",
        "multi-turn rollouts are RolloutConfig.agent_loop and RolloutConfig.agent "
        "(docs/tools.md); tool calls follow the model's chat template",
    ),
    ("actor_rollout_ref.model.fused_kernel_options.", "AlgorithmConfig.math (fused | plain)"),
    (
        ".override_config.",
        "rlkit loads the model's own config.json: set the value there (a copy of the model "
        "directory with the edited config)",
    ),
)


MATCHING: dict[str, tuple[Any, str]] = {
    "actor_rollout_ref.rollout.calculate_log_probs": (
        True,
        "rlkit's engines always return the sampled tokens' log-probs",
    ),
    "data.prompt_key": ("prompt", "rlkit reads the 'prompt' column of verl's rows"),
    "data.return_raw_chat": (True, "rlkit always keeps the chat messages"),
    "actor_rollout_ref.model.use_fused_kernels": (
        True,
        "rlkit's fused log-prob/entropy op is its default (AlgorithmConfig.math = 'fused')",
    ),
    "actor_rollout_ref.actor.use_torch_compile": (False, "rlkit does not torch.compile either"),
    "actor_rollout_ref.ref.use_torch_compile": (False, "rlkit does not torch.compile either"),
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": (
        -1,
        "FSDP2 shards over every process, as -1 asks",
    ),
    "actor_rollout_ref.ref.fsdp_config.fsdp_size": (
        -1,
        "FSDP2 shards over every process, as -1 asks",
    ),
    "critic.fsdp.fsdp_size": (-1, "FSDP2 shards over every process, as -1 asks"),
}
"""Keys whose value (only that one) is what rlkit does anyway, and how; another value of
the key falls to :data:`UNSUPPORTED` or :data:`_PREFIX_REASONS`."""


def reason(key: str) -> str | None:
    """Why ``key`` has no rlkit field, or None if the table does not say."""
    if key in UNSUPPORTED:
        return UNSUPPORTED[key]
    for part, why in _PREFIX_REASONS:
        if part in key:
            return why
    return None


def _overlong_aliases() -> dict[str, str]:
    # verl's DAPO reward manager reads its buffer from reward_kwargs as well.
    out = {}
    for root in ("reward_model.reward_kwargs", "reward.reward_kwargs"):
        for leaf in ("enable", "len", "penalty_factor", "log"):
            out[f"{root}.overlong_buffer_cfg.{leaf}"] = f"reward_model.overlong_buffer.{leaf}"
        out[f"{root}.max_resp_len"] = "reward_model.max_resp_len"
    return out


def _critic_fsdp_aliases() -> dict[str, str]:
    # verl <= 0.8 kept the critic's FSDP settings under critic.model.fsdp_config.
    return {
        f"critic.model.fsdp_config.{leaf}": f"critic.fsdp.{leaf}"
        for leaf in ("param_offload", "optimizer_offload", "fsdp_size", "model_dtype")
    }


ALIASES: dict[str, str] = {
    **_overlong_aliases(),
    **_critic_fsdp_aliases(),
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward.custom_reward_function.path": "custom_reward_function.path",
    "reward.custom_reward_function.name": "custom_reward_function.name",
}
"""Other spellings of a key, mapped to the one the tables use."""
