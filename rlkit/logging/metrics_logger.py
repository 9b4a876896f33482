"""Write each step's metrics to TensorBoard, ``metrics.jsonl`` and the console."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

CONSOLE_KEYS = ("critic/score/mean", "actor/pg_loss", "actor/entropy", "response_length/mean")


class MetricsLogger:
    """Append-only metric sinks for one run (main process only).

    Args:
        output_dir: the run directory; ``metrics.jsonl`` and ``tensorboard/`` go there.
        total_steps: length of the progress bar.
        tensorboard: write real TensorBoard event files (``torch.utils.tensorboard``).
        progress_bar: show a console progress bar with a few key metrics.
        start_step: the first step this process will log (after a resume).
    """

    def __init__(
        self,
        output_dir: str | Path,
        *,
        total_steps: int,
        tensorboard: bool = True,
        progress_bar: bool = True,
        start_step: int = 0,
    ) -> None:
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(
                log_dir=str(self.dir / "tensorboard"), purge_step=start_step or None
            )
        self._bar = None
        if progress_bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total_steps, initial=start_step, desc="rlkit", dynamic_ncols=True
            )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Record ``metrics`` (numbers) at ``step``; non-finite values are kept as strings."""
        clean = {k: _number(v) for k, v in sorted(metrics.items())}
        record = {
            "step": step,
            **{k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()},
        }
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, global_step=step)
            self._tb.flush()
        if self._bar is not None and any(k.startswith(("actor/", "critic/")) for k in clean):
            self._bar.update(max(0, step - self._bar.n))
            shown = {k.split("/", 1)[-1]: f"{clean[k]:.3g}" for k in CONSOLE_KEYS if k in clean}
            self._bar.set_postfix(shown, refresh=True)

    def print(self, text: str) -> None:
        """Print a line without breaking the progress bar."""
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._bar is not None:
            self._bar.close()


def _number(value: Any) -> float:
    if hasattr(value, "item"):
        value = value.item()
    return float(value)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Load a ``metrics.jsonl``; a later record for the same step replaces an earlier one
    (a resumed run re-logs the steps after its checkpoint)."""
    by_step: dict[tuple[int, tuple[str, ...]], dict[str, Any]] = {}
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({exc})") from exc
            by_step[(rec["step"], tuple(sorted(rec)))] = rec
    return sorted(by_step.values(), key=lambda r: r["step"])
