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
    tensor_parallel: Any = None,
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
    tp = tensor_parallel
    if tp is not None and tp.enabled:
        lines.append(
            f"ModelConfig.tensor_parallel_size: {tp.size} processes split every layer "
            f"({tp.dp_size} data-parallel group(s), FSDP2 across them); the log-probs read "
            f"the vocabulary-split LM head slice by slice"
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
    from rlkit.logging import plot_run_dashboard

    try:
        plot_run_dashboard(out_dir / "metrics.jsonl", out_dir / "learning_curve.png", title=title)
    except Exception as exc:  # noqa: BLE001 - any failure of the plot alone
        warnings.warn(f"learning_curve.png not written: {exc!r}", stacklevel=2)


def _accuracy_at(record: dict[str, Any], key: str) -> str:
    """``43.1% [38.0, 48.2] at step 0``: ``record[key]`` with its 95% interval, if logged."""
    low, high = record.get(f"{key}_ci_low"), record.get(f"{key}_ci_high")
    interval = f" [{100 * low:.1f}, {100 * high:.1f}]" if low is not None else ""
    return f"{100 * record[key]:.1f}%{interval} at step {record['step']}"


def _held_out_lines(first: dict[str, Any], last: dict[str, Any]) -> list[str]:
    """One line per held-out accuracy (``val/<source>/mean@n``): first value -> last, with
    their 95% intervals and the change in points."""
    keys = [k for k in last if k.startswith("val/") and "/mean@" in k and k in first]
    return [
        f"  held-out {key.removeprefix('val/')}: {_accuracy_at(first, key)} -> "
        f"{_accuracy_at(last, key)} ({100 * (last[key] - first[key]):+.1f} points)"
        for key in sorted(keys)
        if not key.endswith(("_ci_low", "_ci_high"))
    ]


def run_summary(out_dir: Path, steps: int, seconds: float, checkpoints: Path | None) -> str:
    """What a finished run prints last: its steps and time, held-out accuracy first ->
    last (from ``metrics.jsonl``, so a resumed run counts from its first validation), and
    where its curve, logs and checkpoints are."""
    from rlkit.logging import read_metrics

    metrics = out_dir / "metrics.jsonl"
    records = read_metrics(metrics) if metrics.exists() else []
    validated = [r for r in records if any(k.startswith("val/") for k in r)]
    minutes, rest = divmod(round(seconds), 60)
    lines = [f"rlkit: finished at step {steps} ({minutes} min {rest} s in this process)"]
    if len(validated) >= 2:
        lines += _held_out_lines(validated[0], validated[-1])
    places = [
        ("curve", out_dir / "learning_curve.png"),
        ("metrics", metrics),
        ("TensorBoard", out_dir / "tensorboard"),
        ("checkpoints", checkpoints),
    ]
    lines += [f"  {name}: {path}" for name, path in places if path is not None and path.exists()]
    return "\n".join(lines)
