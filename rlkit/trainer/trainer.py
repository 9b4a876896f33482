"""The RL trainer: one controller per process, SPMD under ``accelerate launch``.

A step reads top to bottom (:meth:`RLTrainer.step`)::

    rollout + reward -> forward passes -> advantages -> updates -> weight sync -> metrics

The :class:`~rlkit.trainer.algorithm.Algorithm` declares the roles a run needs (actor,
reference, critic, reward model, PRIME's implicit PRM, a user's own:
:mod:`rlkit.trainer.roles`) and computes advantages and losses; the trainer builds the
roles and calls their hooks in order, and never reads a role's or an estimator's own
settings. The rollout side is one component (:class:`~rlkit.trainer.rollout_source.
RolloutSource`: prompts -> scored batch); micro-batching, the FSDP lock-step and the
optimizer steps are another (:class:`~rlkit.trainer.updater.Updater`). Data between the
phases is typed: :class:`~rlkit.rollout.trajectory.Trajectory` rows, scored into a
:class:`~rlkit.trainer.scoring.ScoredRollout`, padded into a
:class:`~rlkit.trainer.batch.TrainBatch`.

Every process holds the whole global batch (rollouts are exchanged after generation),
so group statistics, filters, advantages and metrics are computed on the global batch,
identically everywhere; only forward and backward passes are sharded over processes.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from rlkit.data.image_prompts import ImagePromptRenderer
from rlkit.models.loading import check_model_dir, check_model_family
from rlkit.registry import AGENT_LOOPS, ROLES, ROLLOUT_ENGINES
from rlkit.rollout.agent_loop import agent_config
from rlkit.rollout.servers import cpu_split
from rlkit.rollout.servers.run import run_keywords, starts_cpu_servers
from rlkit.trainer import builders, resume, run_dir, run_log, validation
from rlkit.trainer.algorithm import Algorithm, Needs
from rlkit.trainer.checkpoint import CheckpointManager
from rlkit.trainer.config import ExperimentConfig, async_depth
from rlkit.trainer.data_contract import check_provided
from rlkit.trainer.frozen_heap import frozen_heap
from rlkit.trainer.logprob_guard import LogProbGuard, lowest_precision
from rlkit.trainer.prompts import PromptSampler
from rlkit.trainer.roles import Role, RoleContext
from rlkit.trainer.rollout_ahead import RolloutAhead
from rlkit.trainer.rollout_source import RolloutSettings, RolloutSource, no_update_error
from rlkit.trainer.step_metrics import batch_metrics
from rlkit.trainer.timing import PhaseTimer
from rlkit.trainer.updater import Updater


class RLTrainer:
    """Train a Hugging Face causal LM with any registered estimator and policy loss.

    Life cycle: ``setup()`` -> ``train()`` -> ``cleanup()`` (``run()`` does all three).
    """

    def __init__(self, config: ExperimentConfig) -> None:
        config.validate()
        self.cfg = config
        self.step_count = 0
        self.metrics_history: list[dict[str, float]] = []
        self.roles: dict[str, Role] = {}
        self.logger = None

    # ----------------------------------------------------------------- setup
    def setup(self) -> None:
        """Build everything a step needs, resume from a checkpoint if there is one."""
        cfg = self.cfg
        check_model_dir(cfg.model.path)  # before anything expensive
        check_model_family(cfg.model.path)
        self._setup_process()
        self.tokenizer = builders.load_tokenizer(cfg.model)
        self.agent = agent_config(cfg.rollout.agent)
        tools = builders.tool_schemas(self.agent)
        images = ImagePromptRenderer.for_model(cfg.model.path, self.tokenizer)
        self.train_prompts, skipped = builders.load_prompts(
            cfg.data, "train", self.tokenizer, tools, images
        )
        self._note_skipped("train", skipped)
        builders.check_batch_fits(cfg.data, len(self.train_prompts))
        cfg.trainer.total_steps = builders.total_steps_of(
            cfg.trainer, cfg.data, len(self.train_prompts)
        )
        self.val_prompts = None
        if cfg.data.val_files or cfg.data.dataset_fn:
            self.val_prompts, skipped = builders.load_prompts(
                cfg.data, "val", self.tokenizer, tools, images
            )
            self._note_skipped("val", skipped)
        self.sampler = PromptSampler(
            len(self.train_prompts), seed=cfg.trainer.seed, shuffle=cfg.data.shuffle
        )
        self.algorithm = Algorithm(cfg)
        self.updater = Updater(cfg, self.backend, self.algorithm, self._print)
        self._build_roles()
        self.weights = self.roles["actor"].weights
        self.cpu_split, self.placement = self._split_cores()
        self.engine = ROLLOUT_ENGINES.get(cfg.rollout.engine)(
            model_path=cfg.model.path,
            tokenizer=self.tokenizer,
            weights=self.weights,
            seed=cfg.trainer.seed,
            **run_keywords(cfg, self.cpu_split),
            **cfg.rollout.engine_options,
        )
        self.rollout = RolloutSource(
            RolloutSettings(
                config=cfg,
                engine=self.engine,
                agent_loop=AGENT_LOOPS.get(cfg.rollout.agent_loop),
                agent=self.agent,
                tokenizer=self.tokenizer,
                weights=self.weights,
                prompts=self.train_prompts,
                sampler=self.sampler,
                scorers=[r for r in self.roles.values() if type(r).score is not Role.score],
                needs=self.algorithm.needs,
                report=self._print,
                world=self.sampling_world,
                replicas=self.backend.tensor_parallel.size,
                # async: each prompt its own call, so a sync waits for calls, not steps
                concurrent_prompts=cfg.data.train_batch_size
                * (cfg.trainer.rollout_mode == "async"),
            )
        )
        self.rollout.num_skipped_rows = self.num_skipped_rows.get("train", 0)
        if cfg.trainer.rollout_mode == "one_step_off":
            self.rollout = RolloutAhead(self.rollout, cfg.trainer.total_steps)
        elif cfg.trainer.rollout_mode == "async":
            depth, bound = async_depth(cfg)
            self.rollout = RolloutAhead(
                self.rollout, cfg.trainer.total_steps, depth, bound, cfg.trainer.partial_rollout
            )
        r = cfg.rollout
        dtypes = [cfg.model.dtype, cfg.trainer.mixed_precision, r.engine_options.get("dtype")]
        self.logprob_guard = LogProbGuard(
            lowest_precision(dtypes), filtered_sampling=r.top_p < 1 or r.top_k > 0
        )
        self.checkpoint_record: dict[str, float] | None = None
        self.resumed_from = self._resume()
        if self.is_main:
            self._open_logger()

    def _setup_process(self) -> None:
        """Threads, platform, the distributed backend, seeds and the run directory."""
        from rlkit import device
        from rlkit.trainer.backend import TrainingBackend

        t = self.cfg.trainer
        if t.num_threads:
            torch.set_num_threads(t.num_threads)
        if t.platform:
            device.set_platform(t.platform)
        self.platform = device.current()
        self.host_memory_note = builders.configure_host_memory(
            t.keep_freed_host_memory, self.platform, builders.computes_in_low_precision(self.cfg)
        )
        self.backend = TrainingBackend(
            strategy=t.backend_strategy,
            mixed_precision=t.mixed_precision,
            cpu_offload=t.cpu_offload,
            seed=t.seed,
            sequence_parallel_size=self.cfg.model.ulysses_sequence_parallel_size,
            tensor_parallel_size=self.cfg.model.tensor_parallel_size,
        )
        self.rank, self.world = self.backend.process_index, self.backend.num_processes
        # A tensor-parallel group samples as one: the same prompts and seeds on each of its
        # processes. Otherwise every process samples its own share.
        tp = self.backend.tensor_parallel.enabled
        self.sampling_world = self.backend.data_parallel if tp else (self.rank, self.world)
        samplers = self.sampling_world[1]
        if self.cfg.data.train_batch_size % samplers:
            raise ValueError(
                f"DataConfig.train_batch_size ({self.cfg.data.train_batch_size}) must be "
                f"divisible by the number of processes that sample prompts ({samplers}: the "
                "processes, or the tensor-parallel groups)"
            )
        builders.seed_everything(t.seed + self.sampling_world[0])
        self.out_dir = Path(t.output_dir)
        self.is_main = self.backend.is_main_process
        self._lock_run_dir()
        self.checkpoints = CheckpointManager(
            self.out_dir / "checkpoints", self.backend, keep=t.max_checkpoints_to_keep
        )
        self.num_skipped_rows: dict[str, int] = {}
        self.resume_changes = resume.prepare_run_dir(
            self.cfg, self.out_dir, self.checkpoints, self.backend
        )

    def _lock_run_dir(self) -> None:
        """Hold ``output_dir``'s lock for the run (main process): an unwritable directory,
        or one another run writes into, stops every process here, before a model loads."""
        from rlkit.distributed.collectives import broadcast_object

        self.run_lock, problem = None, None
        if self.is_main:
            try:
                self.run_lock = run_dir.lock_run_dir(self.out_dir)
            except run_dir.RunDirError as exc:
                problem = str(exc)
        problem = broadcast_object(problem)
        if problem is not None:
            raise run_dir.RunDirError(problem)

    def _release_run_dir(self) -> None:
        lock = getattr(self, "run_lock", None)
        if lock is not None:
            lock.release()

    def _build_roles(self) -> None:
        """The roles the algorithm declared, in order; rlkit's kernels go into the actor."""
        from rlkit import kernels

        ctx = RoleContext(
            self.cfg,
            self.backend,
            self.algorithm,
            self.updater,
            self.tokenizer,
            self._print,
            lambda: self.step_count,
            self.roles,
        )
        for name in self.algorithm.roles:
            ctx.name = name
            self.roles[name] = ROLES.get(name)(ctx)
            if name == "actor":
                self.kernel_choices = kernels.apply_kernels(
                    self.roles["actor"].backbone,
                    overrides=self.cfg.model.kernel_overrides or None,
                )
                if self.backend.sequence_parallel.enabled:
                    # Ulysses' split segments are read by rlkit's grouped_sdpa attention
                    # only, whatever attention this platform would choose.
                    from rlkit.kernels.attention import grouped_sdpa_attention

                    grouped_sdpa_attention(self.roles["actor"].backbone)
                    self.kernel_choices["attention"] = "grouped_sdpa"

    def _resume(self) -> str | None:
        """Resume from ``TrainerConfig.resume_mode``'s checkpoint, if any; its path."""
        path = resume.resume_path(self.cfg.trainer.resume_mode, self.checkpoints)
        if path is None:
            return None
        self.step_count, self.checkpoint_record = resume.restore(self._checkpointed(), path)
        self.rollout.sync_weights()  # an external engine has the initial weights
        return str(path)

    def _open_logger(self) -> None:
        resumed_step = None if self.resumed_from is None else self.step_count
        self.logger = run_log.open_logger(self.cfg, self.out_dir, self.step_count, resumed_step)
        lines = run_log.startup_lines(
            self.cfg,
            platform=self.platform.name,
            world=self.world,
            algorithm=self.algorithm,
            kernels=self.kernel_choices,
            resumed_from=self.resumed_from,
            model_config=self.roles["actor"].backbone.config,
            sequence_parallel=self.backend.sequence_parallel,
            tensor_parallel=self.backend.tensor_parallel,
            host_memory_note=self.host_memory_note,
            resume_changes=self.resume_changes,
        )
        for line in lines:
            self._print(line)
        if self.resumed_from and resume.unlogged(
            self.out_dir, self.step_count, self.checkpoint_record
        ):
            self._print(f"step {self.step_count}: its metrics, saved with the checkpoint, logged")
            self._log(self.checkpoint_record, self.step_count)

    def _note_skipped(self, split: str, skipped: int) -> None:
        if skipped:
            self.num_skipped_rows[split] = skipped
            self._print(f"rlkit: {split} data: skipped {skipped} malformed rows (on_error=skip)")

    # ----------------------------------------------------------------- train
    def run(self) -> list[dict[str, float]]:
        """setup + train + cleanup; returns the logged metrics of every step."""
        try:
            self.setup()
        except BaseException:
            self._release_run_dir()  # a run that never started holds no directory
            raise
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
        t, started = self.cfg.trainer, time.perf_counter()
        if t.val_before_train and self.val_prompts is not None and self.resumed_from is None:
            val = self.validate()
            self._log(val, self.step_count)
            self._print("before RL: " + _fmt(val))
        if self.step_count >= t.total_steps and self.resumed_from is None:
            self._print(
                f"TrainerConfig.total_steps = {t.total_steps}: nothing to train"
                + (" (validation only)" if self.val_prompts is not None else "")
            )
        elif self.step_count >= t.total_steps:
            warnings.warn(
                f"{self.out_dir} already holds a run finished at step {self.step_count} "
                f"(TrainerConfig.total_steps={t.total_steps}): nothing to train. Raise "
                "total_steps to continue it, or choose another TrainerConfig.output_dir.",
                stacklevel=3,  # the caller of train()
            )
        first = len(self.metrics_history)  # this call's steps follow
        while self.step_count < t.total_steps:
            metrics = self.step()
            if self.is_main:
                self.logprob_guard.check(self.step_count, metrics)
            last = self.step_count == t.total_steps
            if self.val_prompts is not None and (
                (t.test_freq and self.step_count % t.test_freq == 0) or last
            ):
                metrics |= self.validate()
                if last:
                    self._print("after RL: " + _fmt(metrics))
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
        ran = self.metrics_history[first:]
        if ran and all(m.get("train/skipped_step") for m in ran):
            raise no_update_error(self.cfg)
        if t.export_hf_at_end:
            self.weights.save_pretrained(str(self.out_dir / "hf_model"))
        if self.is_main and t.plot_learning_curve and (self.out_dir / "metrics.jsonl").exists():
            run_log.plot_learning_curve(self.out_dir, self.algorithm.name)
        if self.is_main and ran:
            seconds = time.perf_counter() - started
            summary = run_log.run_summary(
                self.out_dir, self.step_count, seconds, self.checkpoints.root
            )
            self._print(summary)
        return self.metrics_history

    def step(self) -> dict[str, float]:
        """One RL iteration; returns its metrics."""
        timer = PhaseTimer()
        self.platform.reset_peak_memory_stats()
        with timer("step"):
            batch, metrics = self.rollout.next_batch(self.step_count, timer)
            if batch is None:  # group filtering kept nothing: no update
                self.step_count += 1
                return metrics | timer.metrics(0)
            for name, role in _having(self.roles, "forward"):
                phase = role.forward_phase or f"{name}_forward"
                timer.seconds.setdefault(phase, 0.0)  # 0 when the pass is not needed
                if role.forward_needed():
                    with timer(phase):
                        metrics |= role.forward(batch)
                    check_provided(name, type(role), batch, self.algorithm.plan)
            with timer("adv"):
                metrics |= self.algorithm.compute_advantages(batch)
            for name, role in sorted(
                _having(self.roles, "update"), key=lambda r: r[1].update_order
            ):
                with timer(role.update_phase or f"{name}_update"):
                    metrics |= role.update(batch)
            with timer("weight_sync"):  # one_step_off: at the next batch, see RolloutAhead
                metrics |= self.rollout.sync_weights()
        self.step_count += 1
        shares = self.updater.shares(batch)
        actor = self.roles["actor"]
        return metrics | batch_metrics(batch, timer, self.cfg, shares, actor, self.platform)

    # ------------------------------------------------------------ validation
    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Generate ``val_n`` responses per held-out prompt; mean@k and pass@k per data
        source, from validation's own random stream (:func:`validation.validate`)."""
        return validation.validate(
            self.rollout,
            self.val_prompts,
            self.platform,
            self.cfg.trainer.seed,
            self.sampling_world[0],
            self.step_count,
        )

    # ------------------------------------------------------- saving, logging
    def save_checkpoint(self, record: dict[str, float] | None = None) -> Path:
        """Checkpoint the run at its current step; ``record``: that step's metrics, logged
        on resume if the run stopped before logging them."""
        return resume.save(self._checkpointed(), self.step_count, record)

    def _checkpointed(self) -> resume.Checkpointed:
        return resume.Checkpointed(
            checkpoints=self.checkpoints,
            roles=self.roles,
            sampler=self.sampler,
            sampler_state=self.rollout.sampler_state,
            kl_ctrl=self.algorithm.kl_ctrl,
            weights=self.weights,
            platform=self.platform,
        )

    def _log(self, metrics: dict[str, float], step: int) -> None:
        if self.logger is not None:
            self.logger.log(metrics, step)

    def _split_cores(self) -> tuple[cpu_split.CpuSplit | None, cpu_split.Placement | None]:
        """Split the cores between this process and the servers the engine will start on
        this CPU (``RolloutConfig.server_cores``), and say how."""
        r = self.cfg.rollout
        split, _ = cpu_split.plan(
            r.server_cores,
            rollout_mode=self.cfg.trainer.rollout_mode,
            servers_on_cpu=starts_cpu_servers(r, self.platform.name == "cpu"),
            available=cpu_split.available_cores(),
            num_servers=int(r.engine_options.get("num_servers", 1)),
        )
        if split is None:
            return None, None
        placement = cpu_split.place_trainer(
            split,
            self.cfg.trainer.num_threads,
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            local_world=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        )
        self._print(
            f"rlkit: CPU split: {split.describe()}; this process on cores "
            f"{','.join(map(str, placement.cores))} with {placement.threads} torch "
            f"thread(s). RolloutConfig.server_cores = 'off' shares every core."
        )
        return split, placement

    def _print(self, text: str) -> None:
        if self.logger is not None:
            self.logger.print(text)
        elif getattr(self, "is_main", True):
            print(text, flush=True)

    def cleanup(self, *, finished: bool = True) -> None:
        """Close the engine, the logger and the backend (``finished=False`` after an error:
        the processes then skip the closing barrier, see ``TrainingBackend.close``); give
        the process back the cores a CPU split took."""
        rollout = getattr(self, "rollout", None)
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()  # first: it ends a generation running ahead
        if rollout is not None:
            rollout.close()
        placement = getattr(self, "placement", None)
        if placement is not None:
            cpu_split.restore(placement)
            self.placement = None
        if self.logger is not None:
            self.logger.close()
        backend = getattr(self, "backend", None)
        if backend is not None:
            backend.close(finished=finished)
        self._release_run_dir()

    # ------------------------------------------------------------ the roles
    @property
    def needs(self) -> Needs:
        """What this run's algorithm declared a step must compute."""
        return self.algorithm.needs

    @property
    def actor(self) -> Any:
        return self.roles["actor"].module

    @property
    def actor_opt(self) -> Any:
        return self.roles["actor"].optimizer

    @property
    def ref(self) -> Any:
        """The reference policy's own module (None: none, or the adapter-free actor)."""
        role = self.roles.get("reference")
        return None if role is None else role.module

    @property
    def critic(self) -> Any:
        role = self.roles.get("critic")
        return None if role is None else role.module

    @property
    def prm(self) -> Any:
        role = self.roles.get("implicit_prm")
        return None if role is None else role.module


def _having(roles: dict[str, Role], hook: str) -> list[tuple[str, Role]]:
    """The roles that implement ``hook`` (``forward`` or ``update``), in declared order."""
    return [(n, r) for n, r in roles.items() if getattr(type(r), hook) is not getattr(Role, hook)]


def _fmt(metrics: dict[str, float]) -> str:
    shown = []
    for key, value in sorted(metrics.items()):
        if not key.startswith("val/") or key.endswith(("_ci_low", "_ci_high")):
            continue
        low, high = metrics.get(f"{key}_ci_low"), metrics.get(f"{key}_ci_high")
        shown.append(
            f"{key}={value:.4f}" + (f" [{low:.4f}, {high:.4f}]" if low is not None else "")
        )
    return ", ".join(shown)
