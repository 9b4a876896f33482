"""Atomic, resumable checkpoints.

A checkpoint is a directory ``global_step_<k>/`` holding each model's (sharded)
weights and optimizer state, every process's RNG states and the trainer's state
(step, data-sampler position, schedulers, KL controller). It is written into a
temporary directory that is renamed into place only when complete, and the
pointer file ``latest`` is replaced atomically afterwards, so a kill at any
moment leaves the previous checkpoint intact and loadable; a failed write (e.g. a full
disk) also deletes the partial directory and says so. Assumes the output
directory is on a filesystem all processes share (as multi-node training does).

A checkpoint loads into any number of processes, not only the number that saved it
(``torch.distributed.checkpoint`` reshards); see :meth:`CheckpointManager._rng_state` for
the random streams of ranks the saving run did not have, and ``rlkit export`` for reading
one in a single plain process.

The last file written into a checkpoint is ``MANIFEST.json``: a SHA-256 checksum of every
other file (every process's shards included), written atomically. Resuming and ``rlkit
export`` verify it, so a checkpoint whose bytes changed on disk (bit rot, a truncated copy)
is reported by name instead of loading changed weights.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pickle
import random
import shutil
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlkit.logging.metrics_file import atomic_write

COMPLETE = "COMPLETE"
LATEST = "latest"
MANIFEST = "MANIFEST.json"


class CheckpointError(Exception):
    """A checkpoint that cannot be trusted or read (its files changed since it was saved,
    or they do not load): a user-facing problem, reported as one message."""


class CheckpointSpaceError(OSError):
    """A checkpoint write that ran out of disk space (``ENOSPC``): the partial checkpoint
    was deleted, the previous one is still the latest. Reported as one message."""


FULL_DISK_BYTES = 1 << 20
"""Free bytes under which a failed write is put down to a full disk. Some writers do not
report ``ENOSPC`` itself: torch's zip writer says only ``unexpected pos``, and
``torch.distributed.checkpoint`` wraps it in its own exception."""


def file_digest(path: Path) -> str:
    """The SHA-256 hex digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(root: Path) -> None:
    """Checksum every file under ``root`` into ``root/MANIFEST.json``, atomically (temp
    file, fsync, rename): a manifest is either whole or absent."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)
    sums = {p.relative_to(root).as_posix(): file_digest(p) for p in files}
    text = json.dumps({"algorithm": "sha256", "files": sums}, indent=1, sort_keys=True)
    atomic_write(root / MANIFEST, text)


def manifest_problems(root: Path) -> list[str] | None:
    """What differs between the files under ``root`` and its manifest (empty: intact);
    ``None`` for a checkpoint saved before manifests existed (nothing to check against)."""
    path = root / MANIFEST
    if not path.exists():
        return None
    try:
        sums = json.loads(path.read_text())["files"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return [f"{MANIFEST} is unreadable"]
    problems = []
    for name, digest in sorted(sums.items()):
        file = root / name
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif file_digest(file) != digest:
            problems.append(f"{name} changed since it was saved (checksum mismatch)")
    return problems


def verify_checkpoint(root: Path) -> None:
    """Raise :class:`CheckpointError` naming the checkpoint and its bad files, if any; warn
    about a checkpoint without a manifest (saved by an older rlkit: not verified)."""
    problems = manifest_problems(root)
    if problems is None:
        warnings.warn(
            f"{root} has no {MANIFEST} (saved by an older rlkit): its files are not verified",
            stacklevel=2,
        )
    elif problems:
        raise CheckpointError(f"checkpoint {root} is corrupted: " + "; ".join(problems))


def capture_rng_state(platform: Any) -> dict[str, Any]:
    """This process's RNG states (Python, NumPy, torch CPU, the accelerator's)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "device": platform.get_rng_state(),
    }


def derived_rng_seed(rank0_state: dict[str, Any], rank: int) -> int:
    """A seed for ``rank`` from rank 0's saved RNG states: distinct per rank, and different
    for runs with different seeds (their rank-0 streams differ)."""
    digest = hashlib.sha256(rank0_state["torch"].numpy().tobytes()).digest()
    entropy = [int.from_bytes(digest[:8], "little"), rank]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] % 2**63)


def seeded_rng_state(seed: int) -> dict[str, Any]:
    """Python, NumPy and torch CPU states after seeding each with ``seed`` (no accelerator
    state: :func:`restore_rng_state` then leaves the accelerator's stream as it is, seeded
    by the run's setup), without changing this process's own states."""
    torch_state = torch.Generator().manual_seed(seed).get_state()
    return {
        "python": random.Random(seed).getstate(),
        "numpy": np.random.RandomState(seed % 2**32).get_state(),
        "torch": torch_state,
        "device": None,
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
        self._intact: tuple[Path | None] | None = None  # latest_intact's answer, once found

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

        def make_dirs() -> None:
            if main:
                shutil.rmtree(tmp, ignore_errors=True)
                for name in modules:
                    (tmp / name).mkdir(parents=True)

        def write_shards() -> None:
            for name, (module, optimizer) in modules.items():
                self.backend.save_sharded(str(tmp / name), module, optimizer)
            torch.save(rng_state, tmp / f"rng_rank{self.backend.process_index}.pt")

        def finish() -> None:
            if main:
                torch.save(trainer_state, tmp / "trainer_state.pt")
                (tmp / COMPLETE).write_text(str(step))
                _fsync_tree(tmp)
                # Last, after every process's shards (the previous part ended where all
                # processes agreed): the checksums cover the whole checkpoint.
                write_manifest(tmp)

        # Each part ends where the processes agree: a process whose write failed tells
        # the others, so every process raises the same error instead of some waiting
        # forever in a collective the failed one never reaches.
        def publish() -> None:
            if main:
                self._publish(final, tmp, step)

        with _interrupt_after_write(final.name):
            for part in (make_dirs, write_shards, finish, publish):
                failure = self._agree(_attempt(part, tmp))
                if failure is not None:
                    # A partial checkpoint only takes space (it is never loaded: no
                    # COMPLETE marker in a final directory); delete it so the disk holds
                    # what it did.
                    if main:
                        shutil.rmtree(tmp, ignore_errors=True)
                    self._raise(failure, final, tmp)
        return final

    def _agree(self, failure: tuple[bool, str, BaseException] | None) -> tuple | None:
        """The first process's failure of this part, on every process (``None``: none)."""
        mine = None if failure is None else failure[:2]
        if self.backend.num_processes == 1:
            return failure
        from rlkit.distributed.collectives import gather_objects

        for rank, theirs in enumerate(gather_objects(mine)):
            if theirs is not None:
                return failure if rank == self.backend.process_index else (*theirs, None)
        return None

    def _raise(self, failure: tuple, final: Path, tmp: Path) -> None:
        no_space, message, exc = failure
        if no_space:
            raise CheckpointSpaceError(
                errno.ENOSPC,
                f"no space left on device while writing checkpoint {final.name} into "
                f"{tmp}; the partial checkpoint was deleted and {self.latest_name()} is "
                "still the latest. Free space (or lower "
                "TrainerConfig.max_checkpoints_to_keep) and resume",
                str(tmp),
            ) from exc
        if exc is not None:
            raise exc
        raise OSError(f"writing checkpoint {final.name} failed on another process: {message}")

    def _publish(self, final: Path, tmp: Path, step: int) -> None:
        """Rename the complete ``tmp`` into place and point ``latest`` at it."""
        if final.exists():  # re-saving the same step: move the old one aside first
            old = self.root / f".old-global_step_{step}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        atomic_write(self.root / LATEST, final.name)
        self._prune()

    def latest_name(self) -> str:
        """The latest complete checkpoint's directory name, for messages."""
        latest = self.latest()
        return "no checkpoint" if latest is None else latest.name

    def complete(self) -> list[Path]:
        """Every complete checkpoint, newest first."""
        found = [p for p in self.root.glob("global_step_*") if (p / COMPLETE).exists()]
        return sorted(found, key=_step_of, reverse=True)

    def latest_intact(self, on_corrupt: str) -> Path | None:
        """The newest complete checkpoint whose files match its manifest.

        A corrupted newer one is skipped with a warning naming it (``on_corrupt =
        "fallback"``) or raises :class:`CheckpointError` (``"stop"``); the result is kept,
        so every caller in a run resumes from the same checkpoint, checked once."""
        if self._intact is None:
            # The main process reads every byte once; the others take its answer (a
            # shared filesystem: the same files), or its error.
            found, problem = None, None
            if self.backend is None or self.backend.is_main_process:
                try:
                    found = self._find_intact(on_corrupt)
                except CheckpointError as exc:
                    problem = str(exc)
            if self.backend is not None and self.backend.num_processes > 1:
                from rlkit.distributed.collectives import broadcast_object

                found, problem = broadcast_object((found, problem))
            if problem is not None:
                raise CheckpointError(problem)
            self._intact = (found,)
        return self._intact[0]

    def _find_intact(self, on_corrupt: str) -> Path | None:
        damaged = []
        for path in self.complete():
            try:
                verify_checkpoint(path)
            except CheckpointError as exc:
                if on_corrupt == "stop":
                    raise CheckpointError(
                        f"{exc}. Delete it to resume from an older checkpoint, or set "
                        "TrainerConfig.on_corrupt_checkpoint = 'fallback'"
                    ) from None
                warnings.warn(f"{exc}; trying an older checkpoint", stacklevel=3)
                damaged.append(path.name)
                continue
            return path
        if damaged:
            # Falling back past the oldest would restart from step 0 and write over the
            # run's metrics: the user decides that, not the fallback.
            raise CheckpointError(
                f"every checkpoint in {self.root} is damaged ({', '.join(damaged)}): "
                f"resuming would start over from step 0 and drop the run's metrics. Move "
                f"the run aside, or start over in place with TrainerConfig.resume_mode = "
                f"'disable' and overwrite = True"
            )
        return None

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
        """Load weights/optimizers into ``modules``; return (trainer_state, this rank's rng_state).

        ``path`` may have been saved by another number of processes: see :meth:`_rng_state`.
        """
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
            with unreadable_as_error(path):
                self.backend.load_sharded(str(path / name), module, optimizer)
        with unreadable_as_error(path):
            trainer_state = torch.load(path / "trainer_state.pt", weights_only=False)
            return trainer_state, self._rng_state(path)

    def _rng_state(self, path: Path) -> dict[str, Any]:
        """This rank's saved RNG states; for a rank the saving run did not have, states
        seeded from rank 0's saved ones and the rank (with a warning).

        Weights and optimizer state reshard to any number of processes (DCP reads each
        process's part from whichever shards hold it), and the data sampler is global, so a
        run resumes with another process count; only its random streams cannot continue
        bitwise. The derived seed is deterministic: resuming the same checkpoint twice with
        the same process count gives the same run.
        """
        rank = self.backend.process_index
        saved = sorted(path.glob("rng_rank*.pt"))
        rng_file = path / f"rng_rank{rank}.pt"
        if len(saved) != self.backend.num_processes and self.backend.is_main_process:
            warnings.warn(
                f"{path.name} was saved by {len(saved)} process(es) and is resumed by "
                f"{self.backend.num_processes}: weights and optimizer state are resharded, and "
                "the continuation is not bitwise identical to a run with the saving process "
                "count",
                stacklevel=3,
            )
        if rng_file.exists():
            return torch.load(rng_file, weights_only=False)
        rank0 = path / "rng_rank0.pt"
        if not rank0.exists():
            raise FileNotFoundError(f"{rank0} missing: {path} holds no RNG state to resume from")
        seed = derived_rng_seed(torch.load(rank0, weights_only=False), rank)
        warnings.warn(
            f"{rng_file.name} missing (the checkpoint was written by fewer processes): rank "
            f"{rank} continues from seed {seed}, derived from rank 0's saved RNG state",
            stacklevel=3,
        )
        return seeded_rng_state(seed)

    def _prune(self) -> None:
        complete = sorted(
            (p for p in self.root.glob("global_step_*") if (p / COMPLETE).exists()), key=_step_of
        )
        for old in complete[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob(".tmp-global_step_*"):
            shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def unreadable_as_error(path: Path) -> Iterator[None]:
    """Turn a file of ``path`` that does not load (truncated, garbled: torch reports
    ``PytorchStreamReader failed reading ...``) into a :class:`CheckpointError` naming it."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except (RuntimeError, EOFError, pickle.UnpicklingError, ValueError, CheckpointException) as exc:
        first = _first_line(exc)
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({first}): it is damaged (delete it to "
            "resume from an older checkpoint) or was not saved by this experiment"
        ) from exc


def _first_line(exc: BaseException) -> str:
    """The first line of what went wrong; for ``torch.distributed.checkpoint``'s wrapper (a
    ``CheckpointException`` holding each rank's error), the first rank's error's."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        exc = next(iter(failures.values()))[0]
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def _interrupt_after_write(name: str) -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) that arrives while checkpoint ``name`` is written until the
    write is complete, then raise it.

    Why: a ``KeyboardInterrupt`` raised inside ``torch.distributed.checkpoint`` comes out
    wrapped in its ``CheckpointException`` (not an interrupt), and on several processes it
    would stop some of them inside a collective the others still wait in. Finishing the
    write instead also leaves the newest checkpoint to resume from. Only the main thread
    can install signal handlers; elsewhere the write runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # Started with Ctrl-C ignored (`nohup`, `&` in a script): a SIGINT stops nothing,
        # so nothing is held and no stop is announced.
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        if not caught:
            print(f"rlkit: stopping after checkpoint {name} is written", file=sys.stderr)
        caught.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and callable(previous):
        previous(signal.SIGINT, None)  # Python's default handler raises KeyboardInterrupt
    elif caught and previous == signal.SIG_DFL:
        raise KeyboardInterrupt


def _attempt(part: Any, where: Path) -> tuple[bool, str, BaseException] | None:
    """Run ``part()``; a write failure as ``(no space?, message, exception)``. A failure
    with less than :data:`FULL_DISK_BYTES` free at ``where`` counts as a full disk."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        part()
    # torch.save reports some I/O as RuntimeError; DCP wraps its writers' errors in
    # CheckpointException, a BaseException.
    except (OSError, RuntimeError, CheckpointException) as exc:
        return _is_no_space(exc) or _disk_full(where), f"{type(exc).__name__}: {exc}", exc
    return None


def _disk_full(where: Path) -> bool:
    path = where if where.exists() else where.parent
    try:
        return shutil.disk_usage(path).free < FULL_DISK_BYTES
    except OSError:
        return False


def _is_no_space(exc: BaseException) -> bool:
    """A full disk (or quota), reported directly or as the cause of another error."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _step_of(path: Path) -> int:
    return int(path.name.rsplit("_", 1)[-1])


def _fsync_tree(root: Path) -> None:
    # Data must be on disk before the rename makes the checkpoint visible.
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
