"""A run directory's life cycle: start, resume, overwrite.

A run directory (``TrainerConfig.output_dir``) holds one run: ``config.gin`` and
``resolved_config.json`` (the configuration it started with), ``metrics.jsonl``,
``tensorboard/``, ``checkpoints/``, ``learning_curve.png``, ``hf_model/``. Each resumed
segment adds ``config.resume_step_<N>.gin`` and ``resolved_config.resume_step_<N>.json``
(``N``: the checkpoint's step) beside the originals, which are never rewritten.

Auto-resume continues the run only with the configuration it started with, up to the
fields of :data:`RESUMABLE_CHANGES` (length, frequencies, logging, validation sampling):
anything else would silently train a different experiment under the old one's name.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from rlkit.data.file_lists import data_sources

RESOLVED_CONFIG = "resolved_config.json"
GIN_CONFIG = "config.gin"

RESUMABLE_CHANGES = frozenset(
    {
        "TrainerConfig.total_steps",
        "TrainerConfig.test_freq",
        "TrainerConfig.val_before_train",
        "TrainerConfig.save_freq",
        "TrainerConfig.save_at_end",
        "TrainerConfig.max_checkpoints_to_keep",
        "TrainerConfig.output_dir",  # the same directory, perhaps spelled another way
        "TrainerConfig.resume_mode",
        "TrainerConfig.overwrite",
        "TrainerConfig.on_corrupt_checkpoint",
        "TrainerConfig.export_hf_at_end",
        "TrainerConfig.export_freq",
        "TrainerConfig.cpu_offload",  # where the shards live, not what they compute
        "TrainerConfig.loggers",
        "TrainerConfig.project_name",
        "TrainerConfig.experiment_name",
        "TrainerConfig.tensorboard",
        "TrainerConfig.progress_bar",
        "TrainerConfig.plot_learning_curve",
        "TrainerConfig.num_threads",
        "RolloutConfig.server_cores",  # which cores compute, not what
        "TrainerConfig.keep_freed_host_memory",
        "TrainerConfig.freeze_setup_objects",
        "OptimConfig.optimizer_implementation",  # the same AdamW update, another kernel
        # Which process or packed row computes a token: the same result, to float rounding.
        "TrainerConfig.balance_batch",
        "ModelConfig.share_prompt_prefix",
        "ModelConfig.tensor_parallel_size",  # checkpoints reshard to any split
        # Validation draws from its own random stream, so these leave training unchanged.
        "RolloutConfig.val_n",
        "RolloutConfig.val_temperature",
        "DataConfig.val_files",
        "DataConfig.val_limit",
    }
)
"""``Section.field`` names that may differ between a run and its auto-resumed segments."""

# Files and folders a run writes into its directory (what ``overwrite`` deletes).
RUN_OUTPUTS = (
    "checkpoints",
    "metrics.jsonl",
    "tensorboard",
    GIN_CONFIG,
    RESOLVED_CONFIG,
    "config.resume_step_*.gin",
    "resolved_config.resume_step_*.json",
    "learning_curve.png",
    "hf_model",
    "hf_exports",
    "wandb",  # the trackers' offline folders (rlkit/logging/trackers.py)
    "mlruns",
    "swanlog",
)

# ``repr`` of functions and objects embeds a memory address that differs between processes.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def config_json(cfg: Any) -> str:
    """The resolved configuration as written to ``resolved_config.json``."""
    return json.dumps(dataclasses.asdict(cfg), indent=2, default=repr)


def _flatten(cfg_json: dict[str, Any], sections: dict[str, str]) -> dict[str, Any]:
    out = {}
    for section, fields in cfg_json.items():
        name = sections.get(section, section)
        if not isinstance(fields, dict):
            out[name] = fields
            continue
        for key, value in fields.items():
            out[f"{name}.{key}"] = _ADDRESS.sub("", value) if isinstance(value, str) else value
    return out


def config_differences(saved: dict[str, Any], cfg: Any) -> list[str]:
    """``Section.field: old -> new`` for every field of ``cfg`` (an ``ExperimentConfig``)
    that differs from the saved ``resolved_config.json`` contents, allowed or not."""
    sections = {f.name: type(getattr(cfg, f.name)).__name__ for f in dataclasses.fields(cfg)}
    old = _flatten(saved, sections)
    new = _flatten(json.loads(config_json(cfg)), sections)
    # A field the saved run did not have yet (a newer rlkit) left at its default changes
    # nothing: that run behaved as the default does.
    defaults = _flatten(json.loads(config_json(type(cfg)())), sections)
    missing = object()
    return [
        f"{key}: {old.get(key, '<absent>')!r} -> {new.get(key, '<absent>')!r}"
        for key in sorted(old.keys() | new.keys())
        if old.get(key, missing) != new.get(key, missing)
        and not (key not in old and new.get(key, missing) == defaults.get(key, missing))
    ]


def check_resume_config(out_dir: Path, cfg: Any, checkpoint: Path) -> list[str]:
    """Refuse to auto-resume ``checkpoint`` with a configuration that changed beyond
    :data:`RESUMABLE_CHANGES`; return the allowed differences (for the log).

    Raises:
        FileNotFoundError: a data file of ``cfg`` does not exist (checked first: a
            mistyped path is reported as such, not as a changed configuration).
        ConfigChangedError: listing every differing field that is not allowed to change.
    """
    check_data_files(cfg.data)
    path = out_dir / RESOLVED_CONFIG
    if not path.exists():  # written by every run; a directory without it predates the check
        return []
    changes = config_differences(json.loads(path.read_text()), cfg)
    refused = [c for c in changes if c.split(":", 1)[0] not in RESUMABLE_CHANGES]
    if refused:
        raise ConfigChangedError(
            f"{out_dir} holds a run whose configuration differs from this one, so it cannot "
            f"be resumed from {checkpoint.name} (resume_mode='auto'):\n  "
            + "\n  ".join(refused)
            + "\nUse another TrainerConfig.output_dir, restore those values, or start over "
            "with TrainerConfig.resume_mode='disable' and TrainerConfig.overwrite=True. "
            f"Fields that may change on resume: {', '.join(sorted(RESUMABLE_CHANGES))}."
        )
    return changes


_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def check_data_files(data: Any) -> None:
    """Raise ``FileNotFoundError`` for a ``train_files`` / ``val_files`` entry that names a
    data file (by its suffix) that does not exist; shared sets and hub names pass."""
    for setting in ("train_files", "val_files"):
        for name in data_sources(getattr(data, setting, "")):
            if name.endswith(_FILE_SUFFIXES) and not Path(name).expanduser().exists():
                raise FileNotFoundError(
                    f"DataConfig.{setting}: data file {name} does not exist (relative paths "
                    f"are read from the working directory {os.getcwd()})"
                )


def existing_run_outputs(out_dir: Path) -> list[Path]:
    """The outputs of a previous run in ``out_dir`` (empty for a fresh directory)."""
    found: list[Path] = []
    for pattern in RUN_OUTPUTS:
        found += sorted(out_dir.glob(pattern))
    return found


def holds_a_run(out_dir: Path) -> bool:
    """Whether ``out_dir`` holds a run's checkpoints or metrics."""
    ckpts = out_dir / "checkpoints"
    has_ckpt = ckpts.is_dir() and any(ckpts.glob("global_step_*"))
    return has_ckpt or (out_dir / "metrics.jsonl").exists()


def refuse_or_clear(out_dir: Path, *, overwrite: bool, is_main: bool) -> None:
    """``resume_mode="disable"``: refuse a directory that holds a run, or with ``overwrite``
    delete that run's outputs (only the files of :data:`RUN_OUTPUTS`; anything else a user
    or a sweep put there stays). Every process checks; only the main one deletes."""
    if not holds_a_run(out_dir):
        return
    if not overwrite:
        raise RunDirError(
            f"{out_dir} already holds a run (checkpoints or metrics.jsonl) and "
            "TrainerConfig.resume_mode='disable' would mix a new run into it. Set "
            "TrainerConfig.overwrite=True to delete the old run's outputs, "
            "resume_mode='auto' to continue it, or choose another TrainerConfig.output_dir."
        )
    if is_main:
        for path in existing_run_outputs(out_dir):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()


def write_configs(out_dir: Path, gin_text: str, cfg: Any, resumed_step: int | None) -> None:
    """The run's configuration files: the originals for a new run (or a directory without
    them), ``*.resume_step_<N>.*`` beside them for a resumed segment."""
    original = out_dir / GIN_CONFIG
    if resumed_step is None or not original.exists():
        gin_path, json_path = original, out_dir / RESOLVED_CONFIG
    else:
        gin_path = out_dir / f"config.resume_step_{resumed_step}.gin"
        json_path = out_dir / f"resolved_config.resume_step_{resumed_step}.json"
    gin_path.write_text(gin_text)
    json_path.write_text(config_json(cfg))


LOCK_FILE = ".rlkit.lock"
"""Held (``fcntl.flock``) by the run writing into a directory; it names that run's pid."""

# Locks this process holds, by directory: one process may build several trainers on a
# directory one after the other (a notebook, a test); only another process is refused.
_HELD: dict[Path, list[Any]] = {}


class RunDirError(Exception):
    """``TrainerConfig.output_dir`` cannot take this run (not writable, or another run is
    writing into it): a user error, reported as one message."""


class ConfigChangedError(RunDirError, ValueError):
    """``output_dir`` holds a run of another configuration: reported as one message."""


class RunLock:
    """The exclusive lock of a run directory, held until :meth:`release` or until the
    process ends (the kernel drops an ``flock`` with its process, so a crash never leaves
    a directory locked)."""

    def __init__(self, out_dir: Path) -> None:
        self.key = Path(out_dir).resolve()
        self.released = False

    def release(self) -> None:
        """Give the lock up (the last holder in this process unlocks the file)."""
        if self.released:
            return
        self.released = True
        held = _HELD.get(self.key)
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del _HELD[self.key]
            os.close(held[0])  # closing the descriptor drops the flock


def lock_run_dir(out_dir: Path) -> RunLock:
    """Create ``out_dir`` if needed and lock it for this run.

    Raises:
        RunDirError: the directory cannot be written, or another process holds its lock
            (the message names that process's pid).
    """
    lock = RunLock(out_dir)
    if lock.key in _HELD:
        _HELD[lock.key][1] += 1
        return lock
    try:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        fd = os.open(Path(out_dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise RunDirError(
            f"TrainerConfig.output_dir {out_dir} is not writable ({exc.strerror or exc}); "
            "choose a directory this user can write to"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunDirError(
            f"TrainerConfig.output_dir {out_dir} is in use by another rlkit run (pid "
            f"{holder}); wait for it to end, or choose another TrainerConfig.output_dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[lock.key] = [fd, 1]
    return lock
