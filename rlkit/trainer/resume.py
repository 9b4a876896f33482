"""A run directory's checkpoints: what a checkpoint holds besides the modules, how a run
resumes from one, and the step record a stopped run may not have logged."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.logging.metrics_file import quarantine_unparsable
from rlkit.trainer import run_dir
from rlkit.trainer.checkpoint import capture_rng_state, restore_rng_state, verify_checkpoint


def prepare_run_dir(cfg: Any, out_dir: Path, checkpoints: Any, backend: Any) -> list[str]:
    """Check ``output_dir`` against ``resume_mode`` before anything is loaded.

    ``disable``: a directory holding a run is refused, or cleared with
    ``TrainerConfig.overwrite``. ``auto`` with a checkpoint: the configuration must match
    the saved one up to :data:`~rlkit.trainer.run_dir.RESUMABLE_CHANGES`, the checkpoint
    must match its manifest (``TrainerConfig.on_corrupt_checkpoint``), and lines of
    ``metrics.jsonl`` that do not parse are quarantined. Nothing is written into the
    directory before these checks pass. Returns the (allowed) changed fields,
    ``Section.field: old -> new``.
    """
    t = cfg.trainer
    if t.resume_mode == "disable":
        run_dir.refuse_or_clear(out_dir, overwrite=t.overwrite, is_main=backend.is_main_process)
        backend.barrier()  # cleared before any process writes into it
        return []
    changes: list[str] = []
    if t.resume_mode == "auto":
        latest = checkpoints.latest_intact(t.on_corrupt_checkpoint)
        if latest is not None:
            changes = run_dir.check_resume_config(out_dir, cfg, latest)
    else:  # a checkpoint path: that one, intact, or nothing
        verify_checkpoint(Path(t.resume_mode))
    if backend.is_main_process:  # the logger appends to the file: only records in it
        quarantine_unparsable(out_dir / "metrics.jsonl")
    return changes


def resume_path(mode: str, checkpoints: Any) -> Path | None:
    """The checkpoint ``TrainerConfig.resume_mode`` resumes from, if any."""
    if mode == "disable":
        return None
    # The one prepare_run_dir verified (the newest intact checkpoint).
    return checkpoints.latest_intact("fallback") if mode == "auto" else Path(mode)


@dataclass(frozen=True)
class Checkpointed:
    """What a checkpoint holds beside its step and record.

    Attributes:
        checkpoints: the run's :class:`~rlkit.trainer.checkpoint.CheckpointManager`.
        roles: every role by name (modules, optimizers, own state).
        sampler: the prompt sampler, restored in place.
        sampler_state: the sampler's state to save (prompts drawn for batches generated
            ahead and not yet trained on are drawn again after a resume).
        kl_ctrl: the adaptive KL controller.
        weights: the policy weights whose version counts optimizer steps.
        platform: the device platform (its RNG streams).
    """

    checkpoints: Any
    roles: dict[str, Any]
    sampler: Any
    sampler_state: Callable[[], dict[str, Any]]
    kl_ctrl: Any
    weights: Any
    platform: Any


def save(parts: Checkpointed, step: int, record: dict[str, float] | None) -> Path:
    """Checkpoint the run at ``step``: every role's modules and state, the prompt sampler,
    the KL controller, every RNG; ``record``: the step's metrics."""
    state = {
        "record": None if record is None else dict(record),
        "step": step,
        "sampler": parts.sampler_state(),
        "kl_ctrl": parts.kl_ctrl.state_dict(),
        "roles": {name: role.state_dict() for name, role in parts.roles.items()},
    }
    return parts.checkpoints.save(
        step, modules(parts.roles), state, capture_rng_state(parts.platform)
    )


def restore(parts: Checkpointed, path: Path) -> tuple[int, dict[str, float] | None]:
    """Load checkpoint ``path`` into ``parts``; returns its step and the step record saved
    with it."""
    state, rng = parts.checkpoints.load(path, modules(parts.roles))
    parts.sampler.load_state_dict(state["sampler"])
    parts.kl_ctrl.load_state_dict(state["kl_ctrl"])
    for name, role in parts.roles.items():
        role.load_state_dict(state["roles"].get(name, {}))
    for _ in range(state["step"]):
        parts.weights.bump()
    restore_rng_state(rng, parts.platform)
    return state["step"], state.get("record")


def modules(roles: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Every role's checkpointed ``{name: (module, optimizer)}``."""
    return {k: v for role in roles.values() for k, v in role.checkpoint_modules().items()}


def unlogged(out_dir: Path, step: int, record: dict[str, float] | None) -> bool:
    """Whether ``metrics.jsonl`` lacks the resumed checkpoint's own step (the run was
    stopped after saving that step and before logging it) while its record is known."""
    if record is None:
        return False
    logged = out_dir / "metrics.jsonl"
    steps = set()
    if logged.exists():
        steps = {json.loads(line)["step"] for line in logged.read_text().splitlines() if line}
    return step not in steps
