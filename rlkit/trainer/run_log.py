"""The run's log: the metrics logger of the main process and the lines a run starts with."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import gin

from rlkit.models.attention_features import attention_features
from rlkit.trainer import run_dir


def open_logger(cfg: Any, out_dir: Path, step: int, resumed_step: int | None) -> Any:
    """Write the run's configuration files and open its
    :class:`~rlkit.logging.MetricsLogger` (main process) at ``step``; ``resumed_step``:
    the checkpoint's step of a resumed run, else ``None``."""
    from rlkit.logging import MetricsLogger

    run_dir.write_configs(out_dir, gin.config_str(), cfg, resumed_step)
    return MetricsLogger(
        out_dir,
        total_steps=cfg.trainer.total_steps,
        tensorboard=cfg.trainer.tensorboard,
        progress_bar=cfg.trainer.progress_bar,
        start_step=step,
        # Resumed: steps after the checkpoint are logged again; a new run (in auto mode,
        # over an attempt that saved no checkpoint) starts the file over.
        keep_through_step=-1 if resumed_step is None else resumed_step,
        loggers=cfg.trainer.loggers,
        project_name=cfg.trainer.project_name,
        experiment_name=cfg.trainer.experiment_name,
        config=cfg,  # trackers record the configuration with the run
    )


def startup_lines(
    cfg: Any,
    *,
    platform: str,
    world: int,
    algorithm: Any,
    kernels: dict[str, str],
    resumed_from: str | None,
    model_config: Any,
    sequence_parallel: Any,
    host_memory_note: str | None,
    resume_changes: list[str],
) -> list[str]:
    """What the run is (platform, processes, estimator, loss, engine, kernels), what the
    model's features change, and what differs from the run being resumed."""
    lines = [
        f"rlkit: platform={platform} processes={world} "
        f"estimator={algorithm.estimator.name} loss={algorithm.policy_loss.name} "
        f"engine={cfg.rollout.engine} kernels={kernels}"
        + (f" resumed_from={resumed_from}" if resumed_from else "")
    ]
    lines += attention_features(model_config).notes()
    sp = sequence_parallel
    if sp.enabled:
        lines.append(
            f"ModelConfig.ulysses_sequence_parallel_size: {sp.size} processes split each "
            f"packed micro-batch ({sp.dp_size} data-parallel group(s)); attention is "
            f"grouped_sdpa; share_prompt_prefix is off for the split passes"
        )
    if host_memory_note:
        lines.append(f"TrainerConfig.keep_freed_host_memory: {host_memory_note}")
    if resume_changes:
        lines.append("changed since the run started: " + "; ".join(resume_changes))
    return lines


def plot_learning_curve(out_dir: Path, title: str) -> None:
    """``learning_curve.png`` from ``metrics.jsonl``; a plot is a convenience, so failing
    to draw it (no metric to show, a full disk, a matplotlib problem) warns and the run
    still succeeds."""
    from rlkit.logging import plot_learning_curves

    try:
        plot_learning_curves(
            {out_dir.name: out_dir / "metrics.jsonl"},
            out_dir / "learning_curve.png",
            keys=("critic/score/mean", "val/*"),
            title=title,
        )
    except Exception as exc:  # noqa: BLE001 - any failure of the plot alone
        warnings.warn(f"learning_curve.png not written: {exc!r}", stacklevel=2)
