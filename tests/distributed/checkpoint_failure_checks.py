"""Checkpoint writes that fail on ONE of two processes: every process must raise.

Launched by tests/distributed/test_checkpoint_failures.py with ``accelerate launch
--multi_gpu --num_processes 2``. Step 1 saves normally. Step 2's save fails on rank 1
only, writing its RNG file (a part every process writes); step 3's fails on rank 0 only,
writing the trainer state (a part only the main process writes). Both failures are a full
disk. A process that did not fail would otherwise wait forever in the next collective.
Step 4 saves normally again. Writes OUT/result_rank{r}.json.
"""

from __future__ import annotations

import argparse
import errno
import json
from pathlib import Path

import torch
from tiny_actor import TinyActor

from rlkit.distributed.process_exit import exit_process
from rlkit.trainer.backend import TrainingBackend
from rlkit.trainer.checkpoint import CheckpointManager


def failing_save(real_save, fail_name: str):
    """``torch.save`` that fails as a full disk does, for files named ``fail_name``."""

    def save(obj, path, *args, **kwargs):
        if isinstance(path, str | Path) and Path(path).name == fail_name:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(obj, path, *args, **kwargs)

    return save


def attempt(manager: CheckpointManager, step: int, modules, rng_state) -> dict:
    try:
        path = manager.save(step, modules, {"step": step}, rng_state)
    except OSError as exc:
        return {"errno": exc.errno, "message": str(exc), "latest": manager.latest_name()}
    return {"saved": path.name, "latest": manager.latest_name()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    backend = TrainingBackend(strategy="auto", seed=0)
    actor, optimizer = backend.prepare(
        TinyActor(args.model), lambda ps: torch.optim.AdamW(ps, lr=1e-3)
    )
    out = Path(args.out)
    manager = CheckpointManager(out / "checkpoints", backend, keep=4)
    modules = {"actor": (actor, optimizer)}
    rank = backend.process_index
    real_save = torch.save
    results = {"step_1": attempt(manager, 1, modules, {"rank": rank})}
    if rank == 1:
        torch.save = failing_save(real_save, "rng_rank1.pt")
    results["step_2"] = attempt(manager, 2, modules, {"rank": rank})
    torch.save = failing_save(real_save, "trainer_state.pt") if rank == 0 else real_save
    results["step_3"] = attempt(manager, 3, modules, {"rank": rank})
    torch.save = real_save
    results["step_4"] = attempt(manager, 4, modules, {"rank": rank})
    (out / f"result_rank{rank}.json").write_text(json.dumps(results, indent=1))
    backend.close()


if __name__ == "__main__":
    main()
    exit_process(0)  # launched: no interpreter teardown racing gloo's threads
