"""Metric sinks by name: the run folder's own (console, jsonl, tensorboard) and trackers.

Every sink is built by a factory registered in :data:`rlkit.registry.LOGGERS`, called
with a :class:`LoggerContext`, returning an object with ``log(metrics, step)`` and
``close()`` (:class:`Sink`). ``TrainerConfig.loggers`` names the factories; a name may
also be ``"pkg.module:factory"`` or ``"path/to/file.py:factory"`` for a sink of one's own.

The trackers (wandb, MLflow, SwanLab) are optional packages, imported only when their
sink starts; each registration carries ``fix=``, the advice a failure to start shows.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlkit.logging.metrics_file import repair_metrics
from rlkit.registry import LOGGERS

CONSOLE_KEYS = ("critic/score/mean", "actor/pg_loss", "actor/entropy", "response_length/mean")


class Sink(Protocol):
    """What a logger factory returns."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` (floats, possibly non-finite) at ``step``."""

    def close(self) -> None:
        """Flush and release; called once, at the end of the run."""


@dataclass(frozen=True)
class LoggerContext:
    """Everything a logger factory may use to start its sink."""

    output_dir: Path
    """The run folder; a tracker keeps its local files under it."""
    total_steps: int
    start_step: int = 0
    """The first step this process logs (after a resume)."""
    keep_through_step: int | None = None
    """See :class:`rlkit.logging.MetricsLogger`."""
    project_name: str = "rlkit"
    experiment_name: str = ""
    """The run's name in a tracker; ``""`` = the run folder's name."""
    config: dict[str, Any] = field(default_factory=dict)
    """The experiment configuration, flat (``"trainer.seed" -> 0``), JSON values only."""

    @property
    def run_name(self) -> str:
        return self.experiment_name or self.output_dir.resolve().name


def flat_config(config: Any, prefix: str = "") -> dict[str, Any]:
    """A dataclass (or a dict) of sections as ``{"section.field": value}``.

    Values a tracker cannot store (functions, partials, objects) become their ``repr``,
    so that every tracker shows the same configuration the run folder's ``config`` has.
    """
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        items = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    elif isinstance(config, dict):
        items = config
    else:
        return {prefix.rstrip("."): _plain(config)} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in items.items():
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple) and all(
        v is None or isinstance(v, bool | int | float | str) for v in value
    ):
        return list(value)
    try:  # a JSON-able dict stays one
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


# -- the run folder's own sinks ------------------------------------------------------
class JsonlSink:
    """``metrics.jsonl``: one JSON object per step, non-finite values as strings."""

    def __init__(self, ctx: LoggerContext) -> None:
        path = ctx.output_dir / "metrics.jsonl"
        if ctx.keep_through_step is not None and path.exists():
            repair_metrics(path, keep_through_step=ctx.keep_through_step)
        # Unbuffered binary: each record reaches the file in one write() call, so a crash
        # leaves at most one partial last line (which repair_metrics cuts on resume).
        self.file = open(path, "ab", buffering=0)  # noqa: SIM115

    def log(self, metrics: dict[str, float], step: int) -> None:
        record = {
            "step": step,
            **{k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()},
        }
        line = (json.dumps(record) + "\n").encode("utf-8")
        try:
            written = self.file.write(line)
            while written < len(line):  # a raw write may be short (e.g. interrupted)
                written += self.file.write(line[written:])
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise OSError(
                exc.errno,
                f"no space left on device while logging step {step} to {self.file.name}; the "
                "checkpoints already written are intact: free space and run the same command "
                "to resume (a partial last line is repaired then)",
            ) from exc

    def close(self) -> None:
        self.file.close()


class TensorBoardSink:
    """TensorBoard event files in ``tensorboard/`` (``torch.utils.tensorboard``)."""

    def __init__(self, ctx: LoggerContext) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # Events of steps this process re-logs (after the kept ones) are hidden.
        keep = ctx.keep_through_step
        purge = (ctx.start_step or None) if keep is None else keep + 1
        self._writer = SummaryWriter(log_dir=str(ctx.output_dir / "tensorboard"), purge_step=purge)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self._writer.add_scalar(k, v, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def step_line(metrics: dict[str, float], step: int) -> str:
    """One batch-job log line, as verl prints them: ``step:N - key:value - ...``.

    Every metric by its full name: the :data:`CONSOLE_KEYS` first, then the rest sorted.
    """
    first = [k for k in CONSOLE_KEYS if k in metrics]
    keys = first + sorted(k for k in metrics if k not in first)
    return " - ".join([f"step:{step}", *(f"{k}:{_value(metrics[k])}" for k in keys)])


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class ConsoleSink:
    """A tqdm progress bar showing a few key metrics; also prints lines above it.

    When standard output is not a terminal (a batch job's log file), there is no bar:
    every logged step prints one :func:`step_line` instead.
    """

    def __init__(self, ctx: LoggerContext) -> None:
        from tqdm.auto import tqdm

        self._bar = None
        if not sys.stdout.isatty():  # a log file: a bar would only write carriage returns
            return
        self._bar = tqdm(
            total=ctx.total_steps, initial=ctx.start_step, desc="rlkit", dynamic_ncols=True
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._bar is None:
            print(step_line(metrics, step), flush=True)
            return
        if any(k.startswith(("actor/", "critic/")) for k in metrics):
            self._bar.update(max(0, step - self._bar.n))
            shown = {k.split("/", 1)[-1]: f"{metrics[k]:.3g}" for k in CONSOLE_KEYS if k in metrics}
            self._bar.set_postfix(shown, refresh=True)

    def print(self, text: str) -> None:
        if self._bar is None:
            print(text, flush=True)
        else:
            self._bar.write(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


LOGGERS.add("jsonl", JsonlSink, fix="check that the run folder is writable")
LOGGERS.add("tensorboard", TensorBoardSink, fix="pip install tensorboard")
LOGGERS.add("console", ConsoleSink, fix="pip install tqdm")


# -- trackers ------------------------------------------------------------------------
class WandbSink:
    """Weights & Biases: one run per process start, its local files in ``<run>/wandb/``.

    The mode comes from wandb's own settings: ``WANDB_MODE=offline`` writes only the
    local run (``wandb sync <run>/wandb/offline-run-*`` uploads it later).
    """

    def __init__(self, ctx: LoggerContext) -> None:
        import wandb

        # "create_new": a run of the user's own in this process (a notebook) stays theirs.
        self._run = wandb.init(
            project=ctx.project_name,
            name=ctx.run_name,
            dir=str(ctx.output_dir),
            config=ctx.config,
            reinit="create_new",
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._run.finish()


def mlflow_key(key: str) -> str:
    """``key`` with the characters MLflow refuses in metric names (``@``, ...) as ``_``."""
    return re.sub(r"[^/\w.\- ]", "_", key)


class MlflowSink:
    """MLflow: one run per process start, in experiment ``project_name``.

    ``MLFLOW_TRACKING_URI`` chooses the server or store; unset, the run goes to a local
    file store in ``<run>/mlruns`` (``mlflow ui --backend-store-uri <run>/mlruns``).
    """

    def __init__(self, ctx: LoggerContext) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = (
            os.environ.get("MLFLOW_TRACKING_URI") or (ctx.output_dir / "mlruns").resolve().as_uri()
        )
        if uri.startswith("file:"):
            # MLflow 3 refuses file stores unless opted in; a store in the run folder
            # needs no server or database, which is the point of this default.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(ctx.project_name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else client.create_experiment(ctx.project_name)
        )
        self._run_id = client.create_run(experiment_id, run_name=ctx.run_name).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in ctx.config.items()]  # MLflow's limits
        for i in range(0, len(params), 100):
            client.log_batch(self._run_id, params=params[i : i + 100])

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_key(k), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):
            self._client.log_batch(self._run_id, metrics=batch[i : i + 1000])

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


class SwanlabSink:
    """SwanLab: one run per process start, its local files in ``<run>/swanlog/``.

    The mode comes from SwanLab's own settings: ``SWANLAB_MODE=offline`` writes only the
    local run (``swanlab sync`` uploads it later), ``local`` is for its local dashboard.
    """

    def __init__(self, ctx: LoggerContext) -> None:
        import swanlab

        self._run = swanlab.init(
            project=ctx.project_name,
            name=ctx.run_name,
            log_dir=str(ctx.output_dir / "swanlog"),
            config=ctx.config,
            reinit=True,
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._run.finish()


LOGGERS.add(
    "wandb",
    WandbSink,
    fix=(
        "pip install 'rlkit[wandb]'; without network set WANDB_MODE=offline, otherwise "
        "run `wandb login` (or set WANDB_API_KEY)"
    ),
)
LOGGERS.add(
    "mlflow",
    MlflowSink,
    fix=(
        "pip install 'rlkit[mlflow]'; check MLFLOW_TRACKING_URI (unset: a file store in "
        "the run folder)"
    ),
)
LOGGERS.add(
    "swanlab",
    SwanlabSink,
    fix=(
        "pip install 'rlkit[swanlab]'; without network set SWANLAB_MODE=offline (or "
        "local), otherwise run `swanlab login`"
    ),
)
