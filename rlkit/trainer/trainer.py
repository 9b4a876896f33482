"""The RL trainer: one controller per process, SPMD under ``accelerate launch``.

Each step reads as one straight line::

    rollout + reward -> forward passes -> advantages -> update -> weight sync

The :class:`~rlkit.trainer.algorithm.Algorithm` declares which forward passes
(old / reference log-probs, critic values) and extra rollouts (greedy baselines)
a step needs, and computes advantages and losses; the trainer runs only what is
declared. Data between the phases is typed: rollouts become
:class:`~rlkit.rollout.trajectory.Trajectory` rows, scored into a
:class:`~rlkit.trainer.scoring.ScoredRollout`, padded into a
:class:`~rlkit.trainer.batch.TrainBatch`.

Every process holds the whole global batch (rollouts are exchanged after
generation), so group statistics, filters, advantages and metrics are computed
on the global batch, identically everywhere; only forward and backward passes
are sharded over processes. Estimators, losses, KL penalties, aggregations and
rollout engines are reached only through their registries.
"""

from __future__ import annotations

import json
import math
import random
import time
import warnings
from pathlib import Path
from typing import Any

import gin
import numpy as np
import torch

from rlkit.distributed import collectives as comm
from rlkit.models.attention_features import attention_features
from rlkit.models.loading import check_model_dir, check_model_family
from rlkit.registry import AGENT_LOOPS, ROLLOUT_ENGINES
from rlkit.rollout.agent_loop import AgentRequest, agent_config, loop_metrics
from rlkit.rollout.base import SamplingParams
from rlkit.trainer import run_dir
from rlkit.trainer.algorithm import Algorithm, Needs
from rlkit.trainer.balancing import (
    balanced_partitions,
    contiguous_partitions,
    seqlen_balance_metrics,
)
from rlkit.trainer.batch import (
    TrainBatch,
    length_sorted_split,
    pad_rows_to_multiple,
    token_budget_split,
)
from rlkit.trainer.checkpoint import CheckpointManager, capture_rng_state, restore_rng_state
from rlkit.trainer.config import ExperimentConfig
from rlkit.trainer.frozen_heap import frozen_heap
from rlkit.trainer.logprob_guard import LogProbGuard, lowest_precision
from rlkit.trainer.metrics import WeightedMeans, data_metrics
from rlkit.trainer.optimizer import adamw
from rlkit.trainer.prefix_sharing import (
    grouped_row_split,
    grouped_token_split,
    prompt_groups,
    whole_group_shares,
)
from rlkit.trainer.prompts import PromptSampler, PromptSet, tokenize_prompts
from rlkit.trainer.scoring import ScoredRollout, score_rollout
from rlkit.trainer.timing import PhaseTimer

ROLLOUT_COUNTERS = (
    "rollout/num_requests",
    "rollout/num_retries",
    "rollout/duplicates_dropped",
    "rollout/kv_reused_tokens",
)
"""Engine counts logged with each step (summed over processes and generation rounds)."""
ROLLOUT_GAUGES = ("rollout/servers_usable", "rollout/server_restarts")
"""Engine states logged with each step: the main process's engine after its last rollout
(they describe servers, which do not add up over processes)."""


class RLTrainer:
    """Train a Hugging Face causal LM with any registered estimator and policy loss.

    Life cycle: ``setup()`` -> ``train()`` -> ``cleanup()`` (``run()`` does all three).
    """

    def __init__(self, config: ExperimentConfig) -> None:
        config.validate()
        self.cfg = config
        self.step_count = 0
        self.metrics_history: list[dict[str, float]] = []
        self.rollout_gauges: dict[str, float] = {}  # the engine's server states (_note_gauges)
        self.num_skipped_rows: dict[str, int] = {}  # malformed data rows, per split (on_error)

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        from rlkit import device, kernels
        from rlkit.trainer.backend import TrainingBackend

        cfg = self.cfg
        check_model_dir(cfg.model.path)  # before anything expensive
        check_model_family(cfg.model.path)
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        if cfg.trainer.platform:
            device.set_platform(cfg.trainer.platform)
        self.platform = device.current()
        self.host_memory_note = self._configure_host_memory()
        self.backend = TrainingBackend(
            strategy=cfg.trainer.backend_strategy,
            mixed_precision=cfg.trainer.mixed_precision,
            cpu_offload=cfg.trainer.cpu_offload,
            seed=cfg.trainer.seed,
        )
        self.rank, self.world = self.backend.process_index, self.backend.num_processes
        if cfg.data.train_batch_size % self.world:
            raise ValueError(
                f"DataConfig.train_batch_size ({cfg.data.train_batch_size}) must be divisible by "
                f"the number of processes ({self.world})"
            )
        self._seed_everything(cfg.trainer.seed + self.rank)
        self.out_dir = Path(cfg.trainer.output_dir)
        self.is_main = self.backend.is_main_process
        if self.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoints = CheckpointManager(
            self.out_dir / "checkpoints", self.backend, keep=cfg.trainer.max_checkpoints_to_keep
        )
        self.resume_changes = self._prepare_run_dir()  # before anything expensive

        self.tokenizer = self._load_tokenizer()
        self.agent_loop = AGENT_LOOPS.get(cfg.rollout.agent_loop)
        self.agent = agent_config(cfg.rollout.agent)
        self.train_prompts = self._load_prompts("train")
        self.val_prompts = (
            self._load_prompts("val") if (cfg.data.val_files or cfg.data.dataset_fn) else None
        )
        self.sampler = PromptSampler(
            len(self.train_prompts), seed=cfg.trainer.seed, shuffle=cfg.data.shuffle
        )

        self.algorithm = Algorithm(cfg)

        self.actor, self.actor_opt, self.actor_sched, self.ref = self._build_actor()
        self.kernel_choices = kernels.apply_kernels(
            self.backend.unwrap(self.actor).backbone, overrides=cfg.model.kernel_overrides or None
        )
        self.critic = self.critic_opt = self.critic_sched = None
        if self.needs.values:
            self.critic, self.critic_opt, self.critic_sched = self._build_critic()
        self.prm = self.prm_opt = self.prm_sched = self.prm_ref = None
        if self.needs.process_rewards:
            self._build_prm()
        self.reward_model = None
        if cfg.reward_model.path:
            from rlkit.trainer.reward_model_role import RewardModelRole

            self.reward_model = RewardModelRole(cfg.reward_model, self.backend)

        from rlkit.trainer.policy_weights import TrainerPolicyWeights

        self.weights = TrainerPolicyWeights(self.backend, self.actor, self.tokenizer)
        self.engine = ROLLOUT_ENGINES.get(cfg.rollout.engine)(
            model_path=cfg.model.path,
            tokenizer=self.tokenizer,
            weights=self.weights,
            seed=cfg.trainer.seed,
            **cfg.rollout.engine_options,
        )
        self.logprob_guard = LogProbGuard(
            lowest_precision(
                [
                    cfg.model.dtype,
                    cfg.trainer.mixed_precision,
                    cfg.rollout.engine_options.get("dtype"),
                ]
            ),
            filtered_sampling=cfg.rollout.top_p < 1 or cfg.rollout.top_k > 0,
        )
        self.checkpoint_record: dict[str, float] | None = None  # set by a resume
        self.resumed_from = self._maybe_resume()
        if self.resumed_from is not None:
            self.engine.sync_weights(
                self.weights
            )  # an external engine still has the initial weights
        self.logger = None
        if self.is_main:
            from rlkit.logging import MetricsLogger

            resumed_step = None if self.resumed_from is None else self.step_count
            run_dir.write_configs(self.out_dir, gin.config_str(), cfg, resumed_step)
            self.logger = MetricsLogger(
                self.out_dir,
                total_steps=cfg.trainer.total_steps,
                tensorboard=cfg.trainer.tensorboard,
                progress_bar=cfg.trainer.progress_bar,
                start_step=self.step_count,
                # Resumed: steps after the checkpoint are logged again; a new run (in auto
                # mode, over an attempt that saved no checkpoint) starts the file over.
                keep_through_step=-1 if resumed_step is None else resumed_step,
                loggers=cfg.trainer.loggers,
                project_name=cfg.trainer.project_name,
                experiment_name=cfg.trainer.experiment_name,
                config=cfg,  # trackers record the configuration with the run
            )
            self._print(
                f"rlkit: platform={self.platform.name} processes={self.world} "
                f"estimator={self.algorithm.estimator.name} "
                f"loss={self.algorithm.policy_loss.name} "
                f"engine={cfg.rollout.engine} kernels={self.kernel_choices}"
                + (f" resumed_from={self.resumed_from}" if self.resumed_from else "")
            )
            for note in attention_features(self.backend.unwrap(self.actor).backbone.config).notes():
                self._print(note)
            if self.host_memory_note:
                self._print(f"TrainerConfig.keep_freed_host_memory: {self.host_memory_note}")
            if self.resume_changes:
                self._print("changed since the run started: " + "; ".join(self.resume_changes))
            self._log_lost_record()

    def _log_lost_record(self) -> None:
        """Log the resumed checkpoint's own step when ``metrics.jsonl`` lacks it: the run
        was stopped after saving that step and before logging it."""
        record = self.checkpoint_record
        if record is None or self.resumed_from is None:
            return
        logged = self.out_dir / "metrics.jsonl"
        steps = set()
        if logged.exists():
            steps = {json.loads(line)["step"] for line in logged.read_text().splitlines() if line}
        if self.step_count not in steps:
            self._print(f"step {self.step_count}: its metrics, saved with the checkpoint, logged")
            self._log(record, self.step_count)

    @property
    def needs(self) -> Needs:
        """What this run's algorithm declared a step must compute."""
        return self.algorithm.needs

    def _seed_everything(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    def _load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        m = self.cfg.model
        path = m.tokenizer_path or m.path
        tok = AutoTokenizer.from_pretrained(
            path, gguf_file=None if m.tokenizer_path else m.gguf_file
        )
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        if m.chat_template is not None:
            from rlkit.data.chat_templates import resolve_chat_template

            tok.chat_template = resolve_chat_template(m.chat_template)
        return tok

    def _load_prompts(self, split: str) -> PromptSet:
        from rlkit.data import (
            SHARED_DATASETS,
            load_prompt_dataset,
            load_report,
            load_shared_dataset,
        )

        d = self.cfg.data
        options = {
            "question_key": d.question_key,
            "answer_key": d.answer_key,
            "system_prompt": d.system_prompt,
        }
        if d.instruction is not None:
            options["instruction"] = d.instruction
        source = d.train_files if split == "train" else d.val_files
        options["on_error"] = d.on_error
        if d.dataset_fn is not None:
            dataset = d.dataset_fn(split)
        elif source in SHARED_DATASETS:  # e.g. "gsm8k": the preset, with its instruction
            preset_splits = SHARED_DATASETS[source].splits
            wanted = "train" if split == "train" or "test" not in preset_splits else "test"
            dataset = load_shared_dataset(source, wanted, **options)
        else:
            # A folder or hub val source reads its validation (or test) split, not train.
            wanted = "train" if split == "train" else "validation"
            dataset = load_prompt_dataset(source, split=wanted, **options)
        try:
            skipped = load_report(dataset).num_skipped
        except ValueError:  # a dataset_fn's own dataset carries no load report
            skipped = 0
        if skipped:
            # Kept per split (``{"train": n, "val": m}``) for the run's metrics and report.
            self.num_skipped_rows[split] = skipped
            self._print(f"rlkit: {split} data: skipped {skipped} malformed rows (on_error=skip)")
        if split == "val" and d.val_limit:
            dataset = dataset.select(range(min(d.val_limit, len(dataset))))
        return tokenize_prompts(
            dataset,
            self.tokenizer,
            max_prompt_length=d.max_prompt_length,
            truncation=d.truncation,
            use_chat_template=d.use_chat_template,
            name=split,
            tools=self._tool_schemas(),
        )

    def _configure_host_memory(self) -> str | None:
        """Apply ``TrainerConfig.keep_freed_host_memory`` where tensors live in host
        memory; returns why it could not be applied, if it could not."""
        if not self.cfg.trainer.keep_freed_host_memory or self.platform.device_type != "cpu":
            return None
        from rlkit.device.host_allocator import keep_freed_host_memory

        reason = keep_freed_host_memory()
        return None if reason is None else f"not applied: {reason}"

    def _tool_schemas(self) -> list[dict[str, Any]] | None:
        """The schemas of the agent loop's tools, rendered into every prompt."""
        if not self.agent.tools:
            return None
        from rlkit.tools import schemas

        return schemas(self.agent.tools)

    def _optimizer_factory(self, lr: float):
        o = self.cfg.optim

        def make(params):
            return adamw(
                params,
                lr=lr,
                betas=tuple(o.betas),
                weight_decay=o.weight_decay,
                implementation=o.optimizer_implementation,
            )

        return make

    def _scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        o, total = self.cfg.optim, max(1, self.cfg.trainer.total_steps)

        def factor(step: int) -> float:
            if step < o.warmup_steps:
                return (step + 1) / max(1, o.warmup_steps)
            if o.lr_schedule == "constant":
                return 1.0
            progress = min(1.0, (step - o.warmup_steps) / max(1, total - o.warmup_steps))
            return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    def _build_actor(self):
        from rlkit.models.loading import add_lora, load_causal_lm
        from rlkit.trainer.modules import ActorModule

        m, o = self.cfg.model, self.cfg.optim
        if m.dtype != "float32" and m.lora_rank == 0:
            warnings.warn(
                f"ModelConfig.dtype={m.dtype!r} trains {m.dtype} parameters and optimizer state: "
                "updates smaller than the parameters' resolution are lost (most of an lr=1e-6 "
                "step in bfloat16). For the usual recipe keep dtype='float32' and set "
                "TrainerConfig.mixed_precision='bf16'.",
                stacklevel=2,
            )
        backbone = load_causal_lm(
            m.path,
            dtype=m.dtype,
            gguf_file=m.gguf_file,
            gradient_checkpointing=m.gradient_checkpointing,
        )
        if m.lora_rank > 0:
            backbone = add_lora(
                backbone, rank=m.lora_rank, alpha=m.lora_alpha, target_modules=m.lora_target_modules
            )
        actor, opt = self.backend.prepare(
            ActorModule(
                backbone,
                chunk_size=o.logprob_chunk_size,
                remove_padding=m.use_remove_padding,
                share_prefix=m.share_prompt_prefix,
            ),
            self._optimizer_factory(o.lr),
        )
        ref = None
        if self.needs.ref_log_probs and m.lora_rank == 0:
            ref_backbone = load_causal_lm(m.path, dtype=m.dtype, gguf_file=m.gguf_file)
            ref_backbone.requires_grad_(False)
            ref, _ = self.backend.prepare(
                ActorModule(
                    ref_backbone,
                    chunk_size=o.logprob_chunk_size,
                    remove_padding=m.use_remove_padding,
                    share_prefix=m.share_prompt_prefix,
                ),
                None,
            )
        return actor, opt, self._scheduler(opt), ref

    def _build_critic(self):
        from rlkit.models.loading import load_critic_backbone
        from rlkit.trainer.modules import CriticModule

        m = self.cfg.model
        backbone = load_critic_backbone(
            m.critic_path or m.path, dtype=m.dtype, gguf_file=m.gguf_file
        )
        critic, opt = self.backend.prepare(
            CriticModule(
                backbone, remove_padding=m.use_remove_padding, share_prefix=m.share_prompt_prefix
            ),
            self._optimizer_factory(self.cfg.optim.critic_lr),
        )
        return critic, opt, self._scheduler(opt)

    def _build_prm(self) -> None:
        """PRIME's implicit PRM: a trained causal LM (the policy's initialisation unless
        ``PrimeConfig.model_path``) and, for another initialisation, its own reference."""
        from rlkit.models.loading import load_causal_lm
        from rlkit.trainer.modules import ActorModule

        m, o, p = self.cfg.model, self.cfg.optim, self.cfg.prime
        path = p.model_path or m.path
        gguf = m.gguf_file if path == m.path else None

        def module(trainable: bool) -> ActorModule:
            backbone = load_causal_lm(path, dtype=m.dtype, gguf_file=gguf)
            backbone.requires_grad_(trainable)
            return ActorModule(
                backbone,
                chunk_size=o.logprob_chunk_size,
                remove_padding=m.use_remove_padding,
                share_prefix=m.share_prompt_prefix,
            )

        self.prm, self.prm_opt = self.backend.prepare(module(True), self._optimizer_factory(p.lr))
        self.prm_sched = self._scheduler(self.prm_opt)
        if path != m.path:
            self.prm_ref, _ = self.backend.prepare(module(False), None)

    # ---------------------------------------------------------------- resume
    def _checkpoint_modules(
        self,
    ) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]]:
        modules = {"actor": (self.actor, self.actor_opt)}
        if self.critic is not None:
            modules["critic"] = (self.critic, self.critic_opt)
        if self.prm is not None:
            modules["prm"] = (self.prm, self.prm_opt)
        return modules

    def _prepare_run_dir(self) -> list[str]:
        """Check ``output_dir`` against ``resume_mode`` before anything is loaded.

        ``disable``: a directory holding a run is refused, or cleared with
        ``TrainerConfig.overwrite``. ``auto`` with a checkpoint: the configuration must
        match the saved one up to :data:`~rlkit.trainer.run_dir.RESUMABLE_CHANGES`.
        Returns the (allowed) changed fields, ``Section.field: old -> new``.
        """
        t = self.cfg.trainer
        if t.resume_mode == "disable":
            run_dir.refuse_or_clear(self.out_dir, overwrite=t.overwrite, is_main=self.is_main)
            self.backend.barrier()  # cleared before any process writes into it
            return []
        if t.resume_mode == "auto":
            latest = self.checkpoints.latest()
            if latest is not None:
                return run_dir.check_resume_config(self.out_dir, self.cfg, latest)
        return []

    def _maybe_resume(self) -> str | None:
        mode = self.cfg.trainer.resume_mode
        if mode == "disable":
            return None
        path = self.checkpoints.latest() if mode == "auto" else Path(mode)
        if path is None:
            return None
        state, rng = self.checkpoints.load(path, self._checkpoint_modules())
        self.step_count = state["step"]
        self.checkpoint_record = state.get("record")  # older checkpoints hold none
        self.sampler.load_state_dict(state["sampler"])
        self.algorithm.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.actor_sched.load_state_dict(state["actor_sched"])
        if self.critic_sched is not None:
            self.critic_sched.load_state_dict(state["critic_sched"])
        if self.prm_sched is not None:
            self.prm_sched.load_state_dict(state["prm_sched"])
        for _ in range(state["step"]):
            self.weights.bump()
        restore_rng_state(rng, self.platform)
        return str(path)

    def save_checkpoint(self, record: dict[str, float] | None = None) -> Path:
        """Checkpoint the run at its current step; ``record``: that step's metrics, logged
        on resume if the run stopped before logging them."""
        state = {
            "record": None if record is None else dict(record),
            "step": self.step_count,
            "sampler": self.sampler.state_dict(),
            "kl_ctrl": self.algorithm.kl_ctrl.state_dict(),
            "actor_sched": self.actor_sched.state_dict(),
            "critic_sched": self.critic_sched.state_dict() if self.critic_sched else None,
            "prm_sched": self.prm_sched.state_dict() if self.prm_sched else None,
        }
        return self.checkpoints.save(
            self.step_count, self._checkpoint_modules(), state, capture_rng_state(self.platform)
        )

    # ----------------------------------------------------------------- train
    def run(self) -> list[dict[str, float]]:
        """setup + train + cleanup; returns the logged metrics of every step."""
        self.setup()
        try:
            metrics = self.train()
        except BaseException:
            self.cleanup(finished=False)
            raise
        self.cleanup()
        return metrics

    def train(self) -> list[dict[str, float]]:
        """Run steps up to ``TrainerConfig.total_steps``, validating, saving and logging as
        configured; returns the logged metrics of every step."""
        if not self.cfg.trainer.freeze_setup_objects:
            return self._train_steps()
        with frozen_heap():
            return self._train_steps()

    def _train_steps(self) -> list[dict[str, float]]:
        t = self.cfg.trainer
        if t.val_before_train and self.val_prompts is not None and self.resumed_from is None:
            val = self.validate()
            self._log(val, self.step_count)
            self._print("before RL: " + _fmt(val))
        if self.step_count >= t.total_steps:
            warnings.warn(
                f"{self.out_dir} already holds a run finished at step {self.step_count} "
                f"(TrainerConfig.total_steps={t.total_steps}): nothing to train. Raise "
                "total_steps to continue it, or choose another TrainerConfig.output_dir.",
                stacklevel=3,  # the caller of train()
            )
        while self.step_count < t.total_steps:
            metrics = self.step()
            if self.is_main:
                self.logprob_guard.check(self.step_count, metrics)
            last = self.step_count == t.total_steps
            if self.val_prompts is not None and (
                (t.test_freq and self.step_count % t.test_freq == 0) or last
            ):
                val = self.validate()
                metrics |= val
                if last:
                    self._print("after RL: " + _fmt(val))
            save_s = 0.0
            if (t.save_freq and self.step_count % t.save_freq == 0) or (last and t.save_at_end):
                start = time.perf_counter()
                # The record goes into the checkpoint too: a run killed after the save and
                # before the log line below gets the line back when it resumes.
                self.save_checkpoint(record=metrics)
                save_s = time.perf_counter() - start
            metrics["timing_s/save_checkpoint"] = save_s
            self._log(metrics, self.step_count)
            self.metrics_history.append(metrics)
            if t.export_freq and self.step_count % t.export_freq == 0:
                export_dir = self.out_dir / "hf_exports" / f"global_step_{self.step_count}"
                self.weights.save_pretrained(str(export_dir))
        if t.export_hf_at_end:
            self.weights.save_pretrained(str(self.out_dir / "hf_model"))
        if self.is_main and t.plot_learning_curve and (self.out_dir / "metrics.jsonl").exists():
            self._plot_learning_curve()
        return self.metrics_history

    def _plot_learning_curve(self) -> None:
        """``learning_curve.png``; a plot is a convenience, so failing to draw it (no
        metric to show, a full disk, a matplotlib problem) warns and the run still succeeds."""
        from rlkit.logging import plot_learning_curves

        try:
            plot_learning_curves(
                {self.out_dir.name: self.out_dir / "metrics.jsonl"},
                self.out_dir / "learning_curve.png",
                keys=("critic/score/mean", "val/*"),
                title=self.algorithm.name,
            )
        except Exception as exc:  # noqa: BLE001 - any failure of the plot alone
            warnings.warn(f"learning_curve.png not written: {exc!r}", stacklevel=2)

    def step(self) -> dict[str, float]:
        """One RL iteration; returns its metrics."""
        timer = PhaseTimer()
        self.platform.reset_peak_memory_stats()
        with timer("step"):
            batch, metrics = self._collect_batch(timer)  # rollout + reward
            if batch is None:
                self.step_count += 1
                return metrics | timer.metrics(0)
            metrics |= self._forward_passes(batch, timer)
            with timer("adv"):
                metrics |= self.algorithm.compute_advantages(batch)
            metrics |= self._update(batch, timer)
            with timer("weight_sync"):
                metrics |= {
                    k: v
                    for k, v in self.engine.sync_weights(self.weights).items()
                    if not k.startswith("timing_s/")
                }
        self.step_count += 1
        metrics |= data_metrics(
            batch,
            max_response_length=self.cfg.rollout.max_response_length,
            max_prompt_length=self.cfg.data.max_prompt_length,
        )
        metrics |= self._seqlen_metrics(batch)
        metrics |= self._perf_metrics(batch, timer)
        return metrics

    def _seqlen_metrics(self, batch: TrainBatch) -> dict[str, float]:
        """``global_seqlen/*``: tokens per process of the whole-batch forward passes, for
        contiguous shards and (with ``balance_batch``) for the balanced ones used."""
        padded, shares = self._shares(batch)
        lengths = (padded.prompt_lengths + padded.response_lengths).tolist()
        out = seqlen_balance_metrics(lengths, shares)
        if not self.cfg.trainer.balance_batch:
            out = {k: v for k, v in out.items() if "/balanced_" not in k}
        return out

    def _forward_passes(self, batch: TrainBatch, timer: PhaseTimer) -> dict[str, float]:
        """The no-grad forwards the algorithm declared: old and reference log-probs, values."""
        metrics: dict[str, float] = {}
        timer.seconds.setdefault("old_log_prob", 0.0)  # logged as 0 when the pass is skipped
        if self.needs.old_log_probs:  # else the update's own forward gives them (detached)
            with timer("old_log_prob"):
                batch.old_log_probs, batch.entropy = self._forward_logprobs(
                    self.actor, batch, entropy=True
                )
            metrics["actor/entropy"] = _masked_mean(batch.entropy, batch.loss_mask)
        if self.needs.ref_log_probs:
            with timer("ref"):
                batch.ref_log_probs = self._reference_logprobs(batch)
        if self.needs.values:
            with timer("values"):
                batch.values = self._forward_rows(
                    self.critic, batch, lambda m, mb: m(mb.model_inputs(), mb.prompt_width)
                )
        if self.needs.process_rewards:
            with timer("prm"):
                metrics |= self._process_rewards(batch)
        return metrics

    def _process_rewards(self, batch: TrainBatch) -> dict[str, float]:
        """PRIME: the implicit PRM's token rewards into ``batch.process_rewards``, and the
        PRM's update on the step's outcomes, in verl's order (``PrimeConfig.update``).

        The PRM takes one optimizer step per RL step, on the whole batch, so the forward
        of its update is the PRM at its pre-step weights. ``before``: update, then score
        again with the updated PRM (the rewards; the update's forward gives the
        ``*_before`` accuracies); ``after``: the rewards are the update's forward;
        ``reverse``: score, then update (the rewards are that score); ``none``: score
        with a frozen PRM.
        """
        from algorithms import implicit_prm as prm

        p = self.cfg.prime
        if self.prm_ref is not None:
            batch.prm_ref_log_probs = self._forward_logprobs(self.prm_ref, batch)
        else:
            batch.prm_ref_log_probs = batch.ref_log_probs
        # The pre-step pass: with one PRM step per RL step, the values of the update's
        # own forward, computed once here.
        metrics, q = self._score_with_prm(batch, before_update=p.update in ("before", "after"))
        if p.update == "none":
            return metrics
        if p.loss_type == "dpo":
            batch.prm_opponent_q = prm.dpo_opponent_q(q, batch.acc, batch.loss_mask, batch.index)
        out, _ = self._optimize(
            "reward_model",
            self.prm,
            self.prm_opt,
            self.prm_sched,
            batch,
            self._prm_loss,
            minibatches=[batch],
        )
        metrics |= {prm.METRIC_LR if k == "reward_model/lr" else k: v for k, v in out.items()}
        if p.update == "before":
            metrics |= self._score_with_prm(batch, before_update=False)[0]
        return metrics

    def _score_with_prm(
        self, batch: TrainBatch, *, before_update: bool
    ) -> tuple[dict[str, float], torch.Tensor]:
        """Set ``batch.process_rewards`` from the PRM as it is now; return its metrics and
        the log-ratios q."""
        from algorithms import implicit_prm as prm

        p, mask = self.cfg.prime, batch.loss_mask
        logp = self._forward_logprobs(self.prm, batch)
        batch.process_rewards = prm.implicit_process_rewards(
            logp,
            batch.prm_ref_log_probs,
            mask,
            beta=p.beta_train,
            granularity=p.granularity,
            norm=p.norm,
        )
        q = prm.implicit_q(logp, batch.prm_ref_log_probs, mask)
        stats = prm.reward_model_metrics(
            batch.process_rewards, q, batch.acc, mask, batch.index, before_update=before_update
        )
        return {k: float(v) for k, v in stats.items()}, q

    def _prm_loss(self, micro: TrainBatch, norms: dict[str, Any]):
        from algorithms import implicit_prm as prm

        p = self.cfg.prime
        logp, _ = self.prm(
            micro.model_inputs(), micro.prompt_width, self.cfg.rollout.temperature, False
        )
        loss, parts = prm.implicit_prm_loss(
            logp,
            micro.prm_ref_log_probs,
            micro.loss_mask,
            micro.acc,
            beta=p.beta_train,
            loss_type=p.loss_type,
            opponent_q=micro.prm_opponent_q,
            num_seqs=norms["num_seqs"],
        )
        return loss, parts, {}

    def _update(self, batch: TrainBatch, timer: PhaseTimer) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if self.critic is not None:
            with timer("update_critic"):
                metrics |= self._update_critic(batch)
        if self.step_count >= self.cfg.algorithm.critic_warmup:
            with timer("update_actor"):
                metrics |= self._update_actor(batch)
        return metrics

    # -------------------------------------------------------------- rollout
    def _sampling(self, *, validation: bool = False, greedy_single: bool = False) -> SamplingParams:
        r = self.cfg.rollout
        if greedy_single:
            return SamplingParams(max_new_tokens=r.max_response_length, temperature=0.0, n=1)
        if validation:
            return SamplingParams(
                max_new_tokens=r.max_response_length,
                temperature=r.val_temperature,
                top_p=r.top_p,
                top_k=r.top_k,
                n=r.val_n,
            )
        return SamplingParams(
            max_new_tokens=r.max_response_length,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            n=r.n,
        )

    def _generate_and_score(
        self, prompts: PromptSet, indices: list[int], params: SamplingParams, timer: PhaseTimer
    ) -> ScoredRollout:
        """Generate for this process's share of ``indices``; return the global scored rollout."""
        with timer("gen"):
            per = -(-len(indices) // self.world)
            mine = indices[self.rank * per : (self.rank + 1) * per]
            requests = [
                AgentRequest(
                    prompts.token_ids[i],
                    prompts.messages[i],
                    ground_truth=prompts.ground_truths[i],
                    data_source=prompts.data_sources[i],
                    extra_info=prompts.extra_infos[i],
                )
                for i in mine
            ]
            with timer("generate_sequences"):  # the agent loop and engine alone
                trajectories, engine_metrics = self.agent_loop(
                    self.engine,
                    requests,
                    params,
                    tokenizer=self.tokenizer,
                    config=self.agent,
                    policy_version=self.weights.version,
                )
            # Group id = the prompt's position in this draw; prompt_index -> the PromptSet.
            groups = [self.rank * per + t.prompt_index for t in trajectories]
            for traj in trajectories:
                traj.prompt_index = mine[traj.prompt_index]
        model_scores = None
        if self.reward_model is not None:
            with timer("reward_model"):
                responses = self.tokenizer.batch_decode(
                    [t.response_ids for t in trajectories], skip_special_tokens=True
                )
                model_scores = self.reward_model.score(trajectories, responses, prompts)
        with timer("reward"):
            scored = score_rollout(
                trajectories, prompts, self.tokenizer, self.cfg, groups, model_scores
            )
        # Counters add up over processes and generation rounds, as reward counters do.
        scored.metrics |= {k: v for k, v in engine_metrics.items() if k in ROLLOUT_COUNTERS}
        self._note_gauges({k: v for k, v in engine_metrics.items() if k in ROLLOUT_GAUGES})
        return ScoredRollout.concat(comm.gather_objects(scored))

    def _note_gauges(self, gauges: dict[str, float]) -> None:
        """Keep the engine's server states for the step's metrics; warn when a server was
        restarted since the last rollout (a step slowed by a restart is otherwise silent)."""
        before = self.rollout_gauges.get("rollout/server_restarts")
        after = gauges.get("rollout/server_restarts")
        if before is not None and after is not None and after > before:
            servers = "; ".join(self.engine.restarted_servers()) or "see the engine's log"
            self._print(
                f"warning: step {self.step_count}: {int(after - before)} rollout server "
                f"restart(s) during this rollout, which slows the step "
                f"({gauges.get('rollout/servers_usable', float('nan')):g} usable now): {servers}"
            )
        self.rollout_gauges = gauges

    def _collect_batch(self, timer: PhaseTimer) -> tuple[TrainBatch | None, dict[str, float]]:
        """Rollout + reward (+ DAPO dynamic sampling) for one step's global batch."""
        a, d = self.cfg.algorithm, self.cfg.data
        kept: list[ScoredRollout] = []
        num_groups = num_gen = 0
        while True:
            num_gen += 1
            indices = self.sampler.next(d.train_batch_size)
            scored = self._generate_and_score(self.train_prompts, indices, self._sampling(), timer)
            if self.needs.greedy_baseline:
                base = self._generate_and_score(
                    self.train_prompts, indices, self._sampling(greedy_single=True), timer
                )
                scored.attach_baselines(base)
            if a.filter_groups:
                scored = scored.keep_varied_groups(a.filter_metric)
            kept.append(scored)
            num_groups += scored.num_groups()
            if (
                not a.filter_groups
                or num_groups >= d.train_batch_size
                or num_gen >= a.max_num_gen_batches
            ):
                break
        rollout = ScoredRollout.concat(kept).first_groups(d.train_batch_size)
        metrics = {
            "train/num_gen_batches": float(num_gen),
            "train/num_truncated_prompts": float(self.train_prompts.num_truncated),
            "train/num_filtered_prompts": float(self.train_prompts.num_filtered),
            "train/num_skipped_rows": float(self.num_skipped_rows.get("train", 0)),
            **rollout.metrics,
            **loop_metrics(rollout.trajectories),
            **self.rollout_gauges,
        }
        if a.filter_groups:
            metrics["train/num_kept_groups"] = float(rollout.num_groups())
        if len(rollout) == 0:
            self._print(
                f"step {self.step_count}: no group with varied {a.filter_metric} after "
                f"{num_gen} generation batches; update skipped"
            )
            metrics["train/skipped_step"] = 1.0
            return None, metrics
        return rollout.to_batch(pad_token_id=self.tokenizer.pad_token_id), metrics

    # -------------------------------------------------------- forward passes
    def _micro_batches(self, local: TrainBatch) -> list[torch.Tensor]:
        o = self.cfg.optim
        if self.cfg.model.share_prompt_prefix:
            return self._grouped_micro_batches(local)
        if not o.use_dynamic_bsz:
            return length_sorted_split(
                local.prompt_lengths, local.response_lengths, o.micro_batch_size
            )
        lengths = local.prompt_lengths + local.response_lengths
        parts = token_budget_split(lengths, o.max_token_len_per_micro_batch)
        agreed = comm.same_everywhere(len(parts), "max")  # FSDP needs equal forward counts
        return token_budget_split(lengths, o.max_token_len_per_micro_batch, min_parts=agreed)

    def _grouped_micro_batches(self, local: TrainBatch) -> list[torch.Tensor]:
        """Micro-batches that keep a prompt's rows together, so its forward is shared."""
        o = self.cfg.optim
        groups = prompt_groups(local.input_ids, local.attention_mask, local.prompt_width)
        prompts, responses = local.prompt_lengths.tolist(), local.response_lengths.tolist()
        if o.use_dynamic_bsz:
            budget = o.max_token_len_per_micro_batch
            parts = grouped_token_split(groups, prompts, responses, budget)
            agreed = comm.same_everywhere(len(parts), "max")
            return grouped_token_split(groups, prompts, responses, budget, min_parts=agreed)
        parts = grouped_row_split(groups, responses, o.micro_batch_size)
        agreed = comm.same_everywhere(len(parts), "max")  # FSDP needs equal forward counts
        return parts + [torch.zeros(0, dtype=torch.long)] * (agreed - len(parts))

    def _shares(self, batch: TrainBatch) -> tuple[TrainBatch, list[list[int]]]:
        """``batch`` padded to a multiple of the process count, and each process's rows of
        it: of near-equal token totals (``TrainerConfig.balance_batch``) or contiguous."""
        if self.world == 1:  # one process holds every row: nothing to pad, group or balance
            return batch, [list(range(len(batch)))]
        padded = pad_rows_to_multiple(batch, self.world)
        lengths = (padded.prompt_lengths + padded.response_lengths).tolist()
        if self.cfg.model.share_prompt_prefix:
            groups = prompt_groups(padded.input_ids, padded.attention_mask, padded.prompt_width)
            whole = whole_group_shares(groups, lengths, self.world, self.cfg.trainer.balance_batch)
            if whole is not None:
                return padded, whole
        if self.cfg.trainer.balance_batch:
            return padded, balanced_partitions(lengths, self.world)
        return padded, contiguous_partitions(len(padded), self.world)

    def _local_share(self, batch: TrainBatch) -> TrainBatch:
        padded, shares = self._shares(batch)
        return padded.select(shares[self.rank])

    @torch.no_grad()
    def _forward_rows(self, module, batch: TrainBatch, fn) -> torch.Tensor:
        """Apply ``fn(module, micro_batch) -> (b, T)`` to this process's share; gather globally."""
        padded, shares = self._shares(batch)
        local = padded.select(shares[self.rank]).to(self.backend.device)
        width = local.responses.shape[1]
        out: torch.Tensor | None = None
        for rows in self._micro_batches(local):
            # A dummy forward (no rows) keeps ranks in step.
            micro = local.select(rows if len(rows) else [0]).trimmed()
            value = fn(module, micro).float().cpu()  # (b, T', ...) with T' <= T
            if out is None:
                out = torch.zeros((len(local), width, *value.shape[2:]), dtype=torch.float32)
            if len(rows):
                out[rows, : value.shape[1]] = value
        gathered = comm.gather_rows(out)  # the processes' shares, one after another
        in_order = torch.empty_like(gathered)
        in_order[torch.tensor([i for rows in shares for i in rows])] = gathered
        return in_order[: len(batch)]

    def _forward_logprobs(self, module, batch: TrainBatch, *, entropy: bool = False):
        temp = self.cfg.rollout.temperature
        if not entropy:
            return self._forward_rows(
                module, batch, lambda m, mb: m(mb.model_inputs(), mb.prompt_width, temp, False)[0]
            )
        pair = self._forward_rows(
            module,
            batch,
            lambda m, mb: torch.stack(m(mb.model_inputs(), mb.prompt_width, temp, True), dim=-1),
        )  # (B, T, 2)
        return pair[..., 0].contiguous(), pair[..., 1].contiguous()

    def _reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        if self.ref is not None:
            return self._forward_logprobs(self.ref, batch)
        with self.backend.unwrap(self.actor).reference_context():  # LoRA: adapters off
            return self._forward_logprobs(self.actor, batch)

    # ---------------------------------------------------------------- updates
    def _minibatches(self, batch: TrainBatch) -> list[TrainBatch]:
        o = self.cfg.optim
        rows = o.ppo_mini_batch_size * self.cfg.rollout.n
        out = []
        for epoch in range(o.ppo_epochs):
            if o.shuffle:
                g = torch.Generator().manual_seed(
                    self.cfg.trainer.seed * 7919 + self.step_count * 101 + epoch
                )
                order = torch.randperm(len(batch), generator=g)
            else:
                order = torch.arange(len(batch))
            out += [batch.select(mb) for mb in order.split(rows)]
        return out

    def _optimizer_step(self, module, optimizer, finite: bool) -> tuple[float, bool]:
        """Clip, then step unless the loss or the gradient is not finite (decided globally)."""
        grad_norm = self.backend.clip_grad_norm_(module, self.cfg.optim.grad_clip)
        grad_norm = float(grad_norm)
        ok = comm.same_everywhere(int(finite and math.isfinite(grad_norm)), "min") == 1
        if ok:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, ok

    def _optimize(
        self,
        prefix: str,
        module,
        optimizer,
        scheduler,
        batch: TrainBatch,
        loss_fn,
        minibatches=None,
    ):
        """Mini-batch / micro-batch loop shared by the actor and the critic updates.

        ``loss_fn(micro, norms) -> (loss, additive, parts)``: ``loss`` is normalised by the
        global mini-batch (so micro-batch terms of all ranks add up to the mini-batch loss),
        ``additive`` holds such summable values (reported as their mini-batch total,
        averaged over mini-batches), ``parts`` token-mean metrics of the micro-batch.
        ``minibatches``: default, the actor's (``ppo_mini_batch_size``, ``ppo_epochs``).

        Returns:
            (metrics, number of optimizer steps applied).
        """
        means, skipped, totals = WeightedMeans(), 0, []
        minibatches = self._minibatches(batch) if minibatches is None else minibatches
        for mini in minibatches:
            norms = self.algorithm.normalisers(mini)
            local = self._local_share(mini).to(self.backend.device)
            finite, sums = True, {}
            for rows in self._micro_batches(local):
                micro = local.select(rows if len(rows) else [0]).trimmed()
                if not len(rows):  # a dummy pass keeps ranks in step and adds nothing
                    micro.loss_mask = torch.zeros_like(micro.loss_mask)
                loss, additive, parts = loss_fn(micro, norms)
                finite &= bool(torch.isfinite(loss))
                if finite:
                    self.backend.backward(loss * self.world)  # ranks' grads are averaged
                for key, value in additive.items():
                    sums[key] = sums.get(key, 0.0) + float(value)
                means.add(parts, weight=float(micro.loss_mask.sum()))
            grad_norm, ok = self._optimizer_step(module, optimizer, finite)
            skipped += int(not ok)
            keys = sorted(sums)
            packed = comm.all_reduce(torch.tensor([sums[k] for k in keys], dtype=torch.float64))
            totals.append(dict(zip(keys, packed.tolist())))
            means.add({f"{prefix}/grad_norm": grad_norm}, weight=1.0 / self.world)
        lr = scheduler.get_last_lr()[0]  # the rate this step's updates used, as verl logs
        with warnings.catch_warnings():
            # The schedule counts RL steps, including one whose updates were all skipped
            # (NaN loss); torch warns when that happens before any optimizer.step().
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step")
            scheduler.step()
        out = means.reduced(comm.all_reduce)
        for key in totals[0] if totals else ():
            out[key] = float(np.mean([t[key] for t in totals]))
        out[f"{prefix}/lr"] = lr
        out[f"{prefix}/nan_skipped_updates"] = float(skipped)
        if skipped:
            self._print(
                f"step {self.step_count}: {skipped} {prefix} update(s) skipped "
                f"(non-finite loss or gradient)"
            )
        return out, len(minibatches) - skipped

    def _update_actor(self, batch: TrainBatch) -> dict[str, float]:
        a = self.cfg.algorithm
        out, applied = self._optimize(
            "actor", self.actor, self.actor_opt, self.actor_sched, batch, self._actor_loss
        )
        for _ in range(applied):
            self.weights.bump()
        if a.use_kl_in_reward or a.use_kl_loss:
            kl_coef = self.algorithm.kl_ctrl.value if a.use_kl_in_reward else a.kl_loss_coef
            out["actor/kl_coef"] = kl_coef
        return out

    def _actor_loss(self, micro: TrainBatch, norms: dict[str, Any]):
        logp, entropy = self.actor(
            micro.model_inputs(),
            micro.prompt_width,
            self.cfg.rollout.temperature,
            self.needs.entropy,
        )
        return self.algorithm.actor_loss(micro, logp, entropy, norms)

    def _update_critic(self, batch: TrainBatch) -> dict[str, float]:
        out, _ = self._optimize(
            "critic", self.critic, self.critic_opt, self.critic_sched, batch, self._critic_loss
        )
        return out

    def _critic_loss(self, micro: TrainBatch, norms: dict[str, Any]):
        vpreds = self.critic(micro.model_inputs(), micro.prompt_width)
        return self.algorithm.critic_loss(micro, vpreds, norms)

    # ------------------------------------------------------------ validation
    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Generate ``val_n`` responses per held-out prompt; mean@k and pass@k per data source.

        Validation samples from its own random stream, seeded from (``TrainerConfig.seed``,
        rank, step), and the training streams (Python, NumPy, torch CPU and accelerator)
        are restored afterwards: ``test_freq``, ``val_n``, ``val_temperature`` and where a
        run was interrupted leave training bitwise unchanged, and validating at a step gives
        the same results in any run. (An SGLang server samples from its own generator,
        seeded once by ``--random-seed``; that stream is shared by training and validation
        requests, since per-request seeds are not sent.)
        """
        training_rng = capture_rng_state(self.platform)
        try:
            self._seed_everything(self._side_seed("validation"))
            return self._validate()
        finally:
            restore_rng_state(training_rng, self.platform)

    def _side_seed(self, purpose: str) -> int:
        """A seed for a side computation at this step, independent of the training stream
        and of other purposes (a hash of seed, rank, step and ``purpose``)."""
        tag = int.from_bytes(purpose.encode(), "little")
        entropy = [self.cfg.trainer.seed % 2**63, self.rank, self.step_count, tag]
        return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] >> 1)

    def _validate(self) -> dict[str, float]:
        from rlkit.metrics.pass_at_k import mean_and_pass_at_k

        prompts = self.val_prompts
        timer = PhaseTimer()
        with timer("testing"):
            scored = self._generate_and_score(
                prompts, list(range(len(prompts))), self._sampling(validation=True), timer
            )
        correct: dict[str, dict[int, list[bool]]] = {}
        scores: dict[str, list[float]] = {}
        tool_use: dict[str, list[float]] = {}
        for i, (p_idx, traj) in enumerate(zip(scored.prompt_index, scored.trajectories)):
            source = prompts.data_sources[p_idx]
            correct.setdefault(source, {}).setdefault(p_idx, []).append(bool(scored.acc[i]))
            scores.setdefault(source, []).append(scored.scores[i])
            if traj.stats is not None:
                tool_use.setdefault(source, []).append(float(traj.stats["tool_calls"] > 0))
        out: dict[str, float] = {"timing_s/testing": timer.seconds["testing"]}
        for source, per_prompt in correct.items():
            stats = mean_and_pass_at_k(list(per_prompt.values()))
            out |= {f"val/{source}/{k}": v for k, v in stats.items()}
            out[f"val/{source}/score/mean"] = float(np.mean(scores[source]))
            if source in tool_use:  # multi-turn loops: how often the policy called a tool
                out[f"val/{source}/tool_call_rate"] = float(np.mean(tool_use[source]))
        return out

    # --------------------------------------------------------------- metrics
    def _perf_metrics(self, batch: TrainBatch, timer: PhaseTimer) -> dict[str, float]:
        responses = int(batch.response_lengths.sum())
        tokens = int(batch.prompt_lengths.sum()) + responses
        out = timer.metrics(tokens, responses)
        step_s = timer.seconds.get("step", 0.0)
        out["perf/total_num_tokens"] = float(tokens)
        out["perf/time_per_step"] = step_s
        if step_s > 0:
            out["perf/throughput"] = tokens / step_s / self.world
        mem = self.platform.memory_stats()
        out |= {f"perf/{k}": float(v) for k, v in mem.items()}
        peak = self.platform.peak_flops(self._compute_dtype())
        update_s = timer.seconds.get("update_actor", 0.0)
        if peak and update_s > 0:
            from rlkit.metrics.flops import training_flops

            config = self.backend.unwrap(self.actor).backbone.config
            lengths = (batch.prompt_lengths + batch.response_lengths).tolist()
            flops = training_flops(config, lengths) * self.cfg.optim.ppo_epochs
            out["perf/mfu/actor"] = flops / (update_s * peak * self.world)
        return out

    def _compute_dtype(self) -> torch.dtype:
        """The dtype the actor's matmuls run in: the mixed-precision one if set, else the
        parameters' (bf16 compute over float32 parameters has bf16's peak, not fp32's)."""
        mixed = {"bf16": torch.bfloat16, "fp16": torch.float16}
        return mixed.get(self.cfg.trainer.mixed_precision, next(self.actor.parameters()).dtype)

    def _log(self, metrics: dict[str, float], step: int) -> None:
        if self.logger is not None:
            self.logger.log(metrics, step)

    def _print(self, text: str) -> None:
        if self.logger is not None:
            self.logger.print(text)
        elif self.is_main:
            print(text, flush=True)

    def cleanup(self, *, finished: bool = True) -> None:
        """Close the engine, the logger and the backend (``finished=False`` after an error:
        the processes then skip the closing barrier, see ``TrainingBackend.close``)."""
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()
        if getattr(self, "logger", None) is not None:
            self.logger.close()
        backend = getattr(self, "backend", None)
        if backend is not None:
            backend.close(finished=finished)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1))


def _fmt(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()) if k.startswith("val/"))
