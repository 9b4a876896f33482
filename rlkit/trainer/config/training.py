"""How a run trains: the RL algorithm, the optimizer and batching, the run itself
(length, evaluation, checkpoints, logging, devices).

Each section registers with gin under ``rlkit.trainer.config``, the package that exports
it, so a binding's full name does not depend on which module defines the section.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gin

from rlkit.trainer.config.rules import (
    COUNT,
    FRACTION,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE,
    Choice,
    LoggerNames,
    Number,
    Pair,
    ResumeMode,
    TrackerName,
    checked,
)

OPTIMIZER_IMPLEMENTATIONS = ("torch", "fused", "foreach", "for_loop")
"""``OptimConfig.optimizer_implementation`` values (rlkit.trainer.optimizer)."""
ROLLOUT_MODES = ("sync", "one_step_off", "async")
"""``TrainerConfig.rollout_mode`` values (rlkit.trainer.rollout_ahead)."""


@gin.configurable(module="rlkit.trainer.config")
@dataclass
class AlgorithmConfig:
    """The RL algorithm as a composition of registered names and their settings."""

    adv_estimator: str = "grpo"
    estimator_options: dict[str, Any] = field(default_factory=dict)
    gamma: float = checked(1.0, FRACTION)
    lam: float = checked(1.0, FRACTION)
    norm_adv_by_std_in_grpo: bool = True
    policy_loss: str = "vanilla"
    loss_options: dict[str, Any] = field(default_factory=dict)
    loss_agg_mode: str = "token-mean"
    clip_ratio: float = checked(0.2, POSITIVE)
    clip_ratio_low: float | None = checked(None, Number(gt=0, optional=True))
    clip_ratio_high: float | None = checked(None, Number(gt=0, optional=True))
    # dual-clip lower bound, verl's requirement
    clip_ratio_c: float = checked(3.0, Number(gt=1))
    entropy_coeff: float = checked(0.0, Number())
    use_kl_loss: bool = False
    kl_loss_coef: float = checked(0.001, NON_NEGATIVE)
    kl_loss_type: str = "low_var_kl"
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl_type: str = checked("fixed", Choice(("fixed", "adaptive")))
    kl_coef: float = checked(0.001, NON_NEGATIVE)
    kl_target: float = checked(0.1, POSITIVE)
    kl_horizon: int = checked(10000, COUNT)
    rollout_is_level: str | None = checked(None, Choice((None, "token", "sequence")))
    """None = no rollout importance-sampling correction; ``token`` | ``sequence``."""
    rollout_is_mode: str = "truncate"
    """truncate (TIS) | mask (IcePop)."""
    rollout_is_threshold: float = checked(2.0, POSITIVE)
    rollout_is_threshold_low: float | None = checked(None, Number(gt=0, optional=True))
    filter_groups: bool = False
    """DAPO dynamic sampling: drop groups whose ``filter_metric`` has zero variance."""
    filter_metric: str = checked("acc", Choice(("acc", "score")))
    """acc | score."""
    max_num_gen_batches: int = checked(10, COUNT)
    overlong_buffer_len: int = checked(0, NON_NEGATIVE_INT)
    """DAPO overlong buffer (0 = off): responses longer than
    ``max_response_length - overlong_buffer_len`` are penalised linearly."""
    overlong_penalty_factor: float = checked(1.0, NON_NEGATIVE)
    critic_warmup: int = checked(0, NON_NEGATIVE_INT)
    """Steps during which only the critic is updated."""
    value_loss: str = "clipped"
    """Critic loss name (``rlkit list value_losses``: clipped | mse | ``pkg.module:fn``)."""
    roles: tuple[str, ...] = ()
    """Roles a step runs beside those whose tensors the configured pieces read
    (``rlkit.registry.ROLES``: a registered name or ``path/to/file.py:Class``), e.g. a
    teacher for distillation; a role named here also provides the inputs it declares
    before a built-in one would. See docs/extending.md."""
    math: str = checked("fused", Choice(("fused", "plain")))
    """``fused``: the policy losses and estimators that keep a faster version beside their
    plain math use it; ``plain``: every one runs its plain-torch version, to read or step
    through (``algorithms.set_math``, ``estimators.set_math``; the same results)."""
    role_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Settings of the roles in ``roles``, by the name given there: each role receives its
    own as ``self.options``, an instance of its ``options_type`` dataclass (checked
    before any model loads) or a dict when it declares none."""


@gin.configurable(module="rlkit.trainer.config")
@dataclass
class OptimConfig:
    """Actor / critic optimisation and batching."""

    # 0 keeps the parameters fixed (used by gradient tests)
    lr: float = checked(1e-6, NON_NEGATIVE)
    critic_lr: float = checked(1e-5, NON_NEGATIVE)
    weight_decay: float = checked(0.0, NON_NEGATIVE)
    betas: tuple[float, float] = checked((0.9, 0.999), Pair(Number(ge=0, lt=1)))
    warmup_steps: int = checked(0, NON_NEGATIVE_INT)
    lr_schedule: str = checked("constant", Choice(("constant", "cosine")))
    """constant | cosine (after warm-up)."""
    min_lr_ratio: float = checked(0.0, FRACTION)
    grad_clip: float = checked(1.0, POSITIVE)
    optimizer_implementation: str = checked("torch", Choice(OPTIMIZER_IMPLEMENTATIONS))
    """torch | fused | foreach | for_loop: which of PyTorch's AdamW kernels steps the
    optimizer, the same update to float rounding (rlkit.trainer.optimizer). torch = its own
    default (a loop on CPU, foreach on CUDA); fused is the fastest on CPU and CUDA."""
    ppo_epochs: int = checked(1, COUNT)
    ppo_mini_batch_size: int = checked(8, COUNT)
    """Prompts per optimizer step (global); the rollout's n responses each come along."""
    micro_batch_size: int = checked(8, COUNT)
    """Sequences per forward/backward on each process (ignored with dynamic batching)."""
    use_dynamic_bsz: bool = False
    """Split micro-batches by a token budget instead of a sequence count."""
    max_token_len_per_micro_batch: int = checked(8192, COUNT)
    shuffle: bool = True
    cliprange_value: float = checked(0.5, POSITIVE)
    logprob_chunk_size: int = checked(512, COUNT)
    """Tokens per chunk of the fused log-prob/entropy op (bounds the logits' memory)."""


@gin.configurable(module="rlkit.trainer.config")
@dataclass
class TrainerConfig:
    """The run: length, evaluation, logging, checkpoints, devices."""

    total_steps: int = checked(10, NON_NEGATIVE_INT)  # 0 = only validate
    total_epochs: int | None = checked(None, Number(integer=True, ge=1, optional=True))
    """Passes over the training prompts (verl's ``trainer.total_epochs``): the run takes
    ``total_epochs * prompts // train_batch_size`` steps once the prompts are loaded.
    ``total_steps`` must then be left at 10 or equal that number."""
    test_freq: int = checked(0, NON_NEGATIVE_INT)
    """Validate every N steps (0 = only before and after training)."""
    val_before_train: bool = True
    save_freq: int = checked(0, NON_NEGATIVE_INT)
    """Checkpoint every N steps (0 = never, except at the end when ``save_at_end``)."""
    save_at_end: bool = True
    max_checkpoints_to_keep: int = checked(2, COUNT)
    output_dir: str = "runs/default"
    resume_mode: str = checked("auto", ResumeMode())
    """auto (latest checkpoint in output_dir if any) | disable | a checkpoint path."""
    overwrite: bool = False
    """With ``resume_mode="disable"``: delete a previous run's outputs in ``output_dir``
    (checkpoints, metrics, TensorBoard events, configs, plot, exported model) and start
    over. Without it, such a directory is refused rather than mixed with the new run."""
    on_corrupt_checkpoint: str = checked("fallback", Choice(("fallback", "stop")))
    """A resumed checkpoint whose files no longer match their saved checksums: ``fallback``
    (warn, naming it, and resume from the newest intact one) or ``stop`` (a user error)."""
    seed: int = checked(0, Number(integer=True))
    rollout_mode: str = checked("sync", Choice(ROLLOUT_MODES))
    """sync (generate, then train) | one_step_off (the next step's batch is generated
    while this one trains, from weights one step older) | async (the next steps' batches
    are generated while this one trains, as far ahead as ``max_staleness`` allows):
    :mod:`rlkit.trainer.rollout_ahead`. Both need an engine with its own copy of the
    weights (``sglang``, ``vllm``), one process, and ``DataConfig.reward_workers >= 1``."""
    max_staleness: int | None = checked(None, Number(integer=True, ge=0, optional=True))
    """``async``: how many weight versions (optimizer steps) behind the weights that train
    on it a token may be; batches are generated ``max_staleness // u`` steps ahead, ``u``
    the optimizer steps of one step (``ppo_epochs * ceil(train_batch_size /
    ppo_mini_batch_size)``). None: ``2 * u`` (two steps ahead)."""
    partial_rollout: str = checked("finish", Choice(("finish", "continue")))
    """``async``: what generation calls running when new weights arrive do. ``finish``:
    they finish under the weights they started with, and the sync waits for them.
    ``continue``: they are paused, the weights synced, and they continue under the new
    weights (engines with ``continues_in_flight=True``: ``sglang``). Either way new calls
    wait for the sync, and every token records the version that sampled it."""
    backend_strategy: str = checked("auto", Choice(("auto", "fsdp2", "none")))
    """auto | fsdp2 | none (see rlkit.trainer.backend)."""
    mixed_precision: str = checked("no", Choice(("no", "bf16", "fp16")))
    """no | bf16 | fp16: the compute dtype of actor, reference and critic forwards and of
    the in-process engine's generation (FSDP2's MixedPrecisionPolicy when sharded,
    autocast otherwise). Parameters, gradients and optimizer state stay in
    ``ModelConfig.dtype``: keep that float32 and set bf16 here for the usual GPU recipe
    (pure-bf16 parameters lose updates below their ~3 significant digits, e.g. most of an
    lr=1e-6 step)."""
    platform: str | None = None
    """Force a platform (cpu | cuda | npu); None = detect."""
    export_hf_at_end: bool = False
    export_freq: int = checked(0, NON_NEGATIVE_INT)  # 0 = only the end-of-run export, if any
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
    loggers: tuple[str, ...] = checked(("console", "jsonl", "tensorboard"), LoggerNames())
    """Metric sinks, by name in ``rlkit.registry.LOGGERS`` (console | jsonl | tensorboard |
    wandb | mlflow | swanlab) or ``"pkg.module:factory"``. ``metrics.jsonl`` is written
    whatever the list says; a tracker that fails to start is dropped with a warning
    (docs/tracking.md)."""
    project_name: str = checked("rlkit", TrackerName())
    """The project (wandb, SwanLab) or experiment (MLflow) a tracker files the run under."""
    experiment_name: str = checked("", TrackerName(empty=True))
    """The run's name in a tracker; "" = the name of ``output_dir``."""
    plot_learning_curve: bool = True
    num_threads: int | None = checked(None, Number(integer=True, ge=1, optional=True))
    """torch intra-op threads (None = torch's default)."""
    keep_freed_host_memory: bool = True
    """On the CPU platform, make glibc's ``malloc`` keep freed memory for the next
    micro-batch instead of returning it to the kernel and faulting it in again
    (:mod:`rlkit.device.host_allocator`); the peak resident set is unchanged."""
    freeze_setup_objects: bool = True
    """While :meth:`RLTrainer.train` runs, keep the objects alive when it started out of
    Python's full garbage collections (``gc.freeze``; :mod:`rlkit.trainer.frozen_heap`):
    each would otherwise rescan the ~10^5-10^6 objects of imports, model and data."""
