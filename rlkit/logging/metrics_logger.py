"""Write each step's metrics to every configured sink: ``metrics.jsonl`` always, the
console, TensorBoard and experiment trackers (wandb, MLflow, SwanLab) by name."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlkit.logging.trackers import LoggerContext, Sink, flat_config
from rlkit.registry import LOGGERS


class LoggerStartWarning(RuntimeWarning):
    """A logger could not start, or failed while logging; the run goes on without it."""


def default_loggers(*, tensorboard: bool = True, progress_bar: bool = True) -> tuple[str, ...]:
    """The sinks of a run that names none: what the two flags switch on, and jsonl."""
    return (
        (("console",) if progress_bar else ())
        + ("jsonl",)
        + (("tensorboard",) if tensorboard else ())
    )


class MetricsLogger:
    """Append-only metric sinks for one run (main process only).

    ``metrics.jsonl`` is always written (plots, sweeps and resumes read it), whether
    ``loggers`` names it or not, and before any other sink. Any other sink that fails
    to start, or raises while logging, is dropped with one :class:`LoggerStartWarning`
    naming it and the fix; the run goes on with the rest.

    Args:
        output_dir: the run directory; ``metrics.jsonl`` and ``tensorboard/`` go there.
        total_steps: length of the progress bar.
        tensorboard: write real TensorBoard event files (``torch.utils.tensorboard``);
            False drops ``"tensorboard"`` from ``loggers`` too.
        progress_bar: show a console progress bar with a few key metrics; False drops
            ``"console"`` from ``loggers`` too.
        start_step: the first step this process will log (after a resume).
        keep_through_step: before appending, cut an existing ``metrics.jsonl`` back to the
            records of steps up to this one (see :func:`repair_metrics`): the resumed
            checkpoint's step, or -1 for a run that starts over. None: append as is.
        loggers: names in :data:`rlkit.registry.LOGGERS` (or ``"pkg.module:factory"``
            paths); None = :func:`default_loggers` of the two flags.
        project_name, experiment_name: the run's project and name in a tracker
            (``experiment_name=""`` = the run folder's name).
        config: the experiment configuration (a dataclass of sections, or a dict), which
            trackers record with the run.
    """

    def __init__(
        self,
        output_dir: str | Path,
        *,
        total_steps: int,
        tensorboard: bool = True,
        progress_bar: bool = True,
        start_step: int = 0,
        keep_through_step: int | None = None,
        loggers: Sequence[str] | None = None,
        project_name: str = "rlkit",
        experiment_name: str = "",
        config: Any = None,
    ) -> None:
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        names = default_loggers(tensorboard=tensorboard, progress_bar=progress_bar)
        if loggers is not None:
            off = {"tensorboard": not tensorboard, "console": not progress_bar}
            names = tuple(dict.fromkeys(n for n in ("jsonl", *loggers) if not off.get(n)))
        ctx = LoggerContext(
            output_dir=self.dir,
            total_steps=total_steps,
            start_step=start_step,
            keep_through_step=keep_through_step,
            project_name=project_name,
            experiment_name=experiment_name,
            config=flat_config(config) if config is not None else {},
        )
        # jsonl first and outside the guard: a run without its metrics file must not start.
        jsonl = LOGGERS.get("jsonl")(ctx)
        self._sinks: dict[str, Sink] = {"jsonl": jsonl}
        self._jsonl = jsonl.file  # the open metrics.jsonl, one write() per record
        for name in names:
            if name in self._sinks:
                continue
            try:
                self._sinks[name] = LOGGERS.get(name)(ctx)
            except Exception as exc:  # noqa: BLE001 - any failure: name it, go on
                self._drop(name, exc, "did not start")

    @property
    def loggers(self) -> list[str]:
        """The names of the sinks that are running."""
        return list(self._sinks)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Record ``metrics`` (numbers) at ``step``; non-finite values are kept as strings
        in ``metrics.jsonl``."""
        clean = {k: _number(v) for k, v in sorted(metrics.items())}
        self._sinks["jsonl"].log(clean, step)  # errors here stop the run: no silent loss
        for name, sink in list(self._sinks.items()):
            if name == "jsonl":
                continue
            try:
                sink.log(clean, step)
            except Exception as exc:  # noqa: BLE001
                del self._sinks[name]
                self._drop(name, exc, f"failed at step {step}")

    def print(self, text: str) -> None:
        """Print a line without breaking the progress bar."""
        console = self._sinks.get("console")
        if console is not None and hasattr(console, "print"):
            console.print(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        """Close every sink (jsonl last); a tracker failing to finish only warns."""
        for name, sink in reversed(list(self._sinks.items())):
            if name == "jsonl":
                continue
            try:
                sink.close()
            except Exception as exc:  # noqa: BLE001
                self._drop(name, exc, "failed to close")
        self._sinks["jsonl"].close()

    def _drop(self, name: str, exc: BaseException, what: str) -> None:
        try:
            fix = LOGGERS.entry(name).extra.get("fix")
        except Exception:  # noqa: BLE001 - a path that does not import has no advice
            fix = None
        kept = ", ".join(n for n in self._sinks if n != name)
        advice = (
            f"{fix}, or remove {name!r} from TrainerConfig.loggers"
            if fix
            else (f"fix it or remove {name!r} from TrainerConfig.loggers")
        )
        warnings.warn(
            f"rlkit: logger {name!r} {what} ({type(exc).__name__}: {exc}); the run goes on "
            f"with {kept}. Fix: {advice}.",
            LoggerStartWarning,
            stacklevel=3,
        )


def _number(value: Any) -> float:
    if hasattr(value, "item"):
        value = value.item()
    return float(value)
