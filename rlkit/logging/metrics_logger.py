"""Write each step's metrics to TensorBoard, ``metrics.jsonl`` and the console."""

from __future__ import annotations

import json
import math
import os
import warnings
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
        keep_through_step: before appending, cut an existing ``metrics.jsonl`` back to the
            records of steps up to this one (see :func:`repair_metrics`): the resumed
            checkpoint's step, or -1 for a run that starts over. None: append as is.
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
    ) -> None:
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "metrics.jsonl"
        if keep_through_step is not None and path.exists():
            repair_metrics(path, keep_through_step=keep_through_step)
        # Unbuffered binary: each record reaches the file in one write() call, so a crash
        # leaves at most one partial last line (which repair_metrics cuts on resume).
        self._jsonl = open(path, "ab", buffering=0)  # noqa: SIM115
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # Events of steps this process re-logs (after the kept ones) are hidden.
            purge = (start_step or None) if keep_through_step is None else keep_through_step + 1
            self._tb = SummaryWriter(log_dir=str(self.dir / "tensorboard"), purge_step=purge)
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
        line = (json.dumps(record) + "\n").encode("utf-8")
        written = self._jsonl.write(line)
        while written < len(line):  # a raw write may be short (e.g. interrupted); finish it
            written += self._jsonl.write(line[written:])
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


def repair_metrics(path: str | Path, *, keep_through_step: int) -> None:
    """Make ``metrics.jsonl`` safe to append to after a crash or an interrupted run.

    A truncated last line (a crash or a full disk mid-write) is cut back to the last
    complete line, and records of steps after ``keep_through_step`` (logged after the
    checkpoint a run resumes from, so about to be logged again) are dropped, each with a
    warning. The file is rewritten atomically, and only when something changes.
    """
    path = Path(path)
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) < len(data):
        warnings.warn(
            f"{path}: cut an incomplete last line ({len(data) - len(complete)} bytes, from "
            "an interrupted write)",
            stacklevel=2,
        )
    lines = complete.splitlines(keepends=True)
    kept = [ln for ln in lines if not ln.strip() or _step_of(ln) <= keep_through_step]
    if len(kept) < len(lines):
        warnings.warn(
            f"{path}: dropped {len(lines) - len(kept)} record(s) of steps after "
            f"{keep_through_step}; they are logged again from the resumed checkpoint",
            stacklevel=2,
        )
    if len(complete) == len(data) and len(kept) == len(lines):
        return
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(b"".join(kept))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _step_of(line: bytes) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return -1  # not a record of this logger: keep it, read_metrics reports it
