"""Atomic, resumable checkpoints.

A checkpoint is a directory ``global_step_<k>/`` holding each model's (sharded)
weights and optimizer state, every process's RNG states and the trainer's state
(step, data-sampler position, schedulers, KL controller). It is written into a
temporary directory that is renamed into place only when complete, and the
pointer file ``latest`` is replaced atomically afterwards, so a kill at any
moment leaves the previous checkpoint intact and loadable; a failed write (e.g. a full
disk) also deletes the partial directory and says so. Assumes the output
directory is on a filesystem all processes share (as multi-node training does).
"""

from __future__ import annotations

import errno
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

COMPLETE = "COMPLETE"
LATEST = "latest"


def capture_rng_state(platform: Any) -> dict[str, Any]:
    """This process's RNG states (Python, NumPy, torch CPU, the accelerator's)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "device": platform.get_rng_state(),
    }


def restore_rng_state(state: dict[str, Any], platform: Any) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("device"):
        platform.set_rng_state(state["device"])


class CheckpointManager:
    """Save / find / load checkpoints under ``root`` (collective calls under FSDP).

    Args:
        root: the checkpoints directory (``<output_dir>/checkpoints``).
        backend: the :class:`~rlkit.trainer.backend.TrainingBackend`.
        keep: how many complete checkpoints to keep (older ones are deleted).
    """

    def __init__(self, root: str | Path, backend: Any, *, keep: int = 2) -> None:
        self.root = Path(root)
        self.backend = backend
        self.keep = max(1, keep)

    def save(
        self,
        step: int,
        modules: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]],
        trainer_state: dict[str, Any],
        rng_state: dict[str, Any],
    ) -> Path:
        """Write checkpoint ``step``; returns its final path.

        Raises:
            OSError: the write failed (``ENOSPC``: "no space left on device", naming the
                directory); the partial checkpoint is deleted and ``latest`` still names
                the previous one.
        """
        final = self.root / f"global_step_{step}"
        tmp = self.root / f".tmp-global_step_{step}"
        main = self.backend.is_main_process
        try:
            if main:
                shutil.rmtree(tmp, ignore_errors=True)
                for name in modules:
                    (tmp / name).mkdir(parents=True)
            self.backend.barrier()
            for name, (module, optimizer) in modules.items():
                self.backend.save_sharded(str(tmp / name), module, optimizer)
            torch.save(rng_state, tmp / f"rng_rank{self.backend.process_index}.pt")
            self.backend.barrier()
            if main:
                torch.save(trainer_state, tmp / "trainer_state.pt")
                (tmp / COMPLETE).write_text(str(step))
                _fsync_tree(tmp)
        except (OSError, RuntimeError) as exc:  # torch.save reports some I/O as RuntimeError
            # A partial checkpoint only takes space (it is never loaded: no COMPLETE marker
            # in a final directory); delete it so the disk holds what it did before.
            shutil.rmtree(tmp, ignore_errors=True)
            if _is_no_space(exc):
                raise OSError(
                    errno.ENOSPC,
                    f"no space left on device while writing checkpoint {final.name} into "
                    f"{tmp}; the partial checkpoint was deleted and {self.latest_name()} is "
                    "still the latest. Free space (or lower "
                    "TrainerConfig.max_checkpoints_to_keep) and resume",
                    str(tmp),
                ) from exc
            raise
        if main:
            if final.exists():  # re-saving the same step: move the old one aside first
                old = self.root / f".old-global_step_{step}"
                shutil.rmtree(old, ignore_errors=True)
                os.replace(final, old)
                os.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, final)
            _atomic_write(self.root / LATEST, final.name)
            self._prune()
        self.backend.barrier()
        return final

    def latest_name(self) -> str:
        """The latest complete checkpoint's directory name, for messages."""
        latest = self.latest()
        return "no checkpoint" if latest is None else latest.name

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        pointer = self.root / LATEST
        if pointer.exists():
            path = self.root / pointer.read_text().strip()
            if (path / COMPLETE).exists():
                return path
        complete = [p for p in self.root.glob("global_step_*") if (p / COMPLETE).exists()]
        return max(complete, key=_step_of, default=None)

    def load(
        self,
        path: str | Path,
        modules: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]],
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Load weights/optimizers into ``modules``; return (trainer_state, this rank's rng_state)."""
        path = Path(path)
        if not (path / COMPLETE).exists():
            raise FileNotFoundError(
                f"{path} is not a complete rlkit checkpoint (no {COMPLETE} marker)"
            )
        for name, (module, optimizer) in modules.items():
            if not (path / name).is_dir():
                raise FileNotFoundError(
                    f"checkpoint {path} has no '{name}' state; was it saved by this experiment?"
                )
            self.backend.load_sharded(str(path / name), module, optimizer)
        rng_file = path / f"rng_rank{self.backend.process_index}.pt"
        if not rng_file.exists():
            raise FileNotFoundError(
                f"{rng_file} missing: the checkpoint was written by fewer processes; resume "
                f"with the same number of processes for a bitwise-identical continuation"
            )
        trainer_state = torch.load(path / "trainer_state.pt", weights_only=False)
        rng_state = torch.load(rng_file, weights_only=False)
        return trainer_state, rng_state

    def _prune(self) -> None:
        complete = sorted(
            (p for p in self.root.glob("global_step_*") if (p / COMPLETE).exists()), key=_step_of
        )
        for old in complete[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob(".tmp-global_step_*"):
            shutil.rmtree(stale, ignore_errors=True)


def _is_no_space(exc: BaseException) -> bool:
    """A full disk (or quota), reported directly or as the cause of another error."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _step_of(path: Path) -> int:
    return int(path.name.rsplit("_", 1)[-1])


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fsync_tree(root: Path) -> None:
    # Data must be on disk before the rename makes the checkpoint visible.
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
