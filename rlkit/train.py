"""``rlkit train CONFIG.gin [CONFIG2.gin ...] [--gin_param 'Section.field = value' ...]``.

Also ``python -m rlkit.train``. Every knob is a gin binding (see
``rlkit/trainer/config/``); misspelt or unknown bindings fail before any
work, naming the binding. The operative configuration is saved as
``<output_dir>/config.gin``.

Exit status: 0 done; 2 a user error (bad configuration, a missing model or data path,
bad data), reported as one message (``--debug`` shows the traceback); 130 interrupted
(Ctrl-C): the same command resumes from the latest checkpoint in
``TrainerConfig.output_dir``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from tokenize import TokenError
from typing import TYPE_CHECKING, Any

import gin

if TYPE_CHECKING:
    from rlkit.trainer.config import ExperimentConfig

PRESETS_DIR = Path(__file__).resolve().parent.parent / "algorithms" / "presets"

USER_ERROR_EXIT = 2
INTERRUPTED_EXIT = 130  # 128 + SIGINT, the shell's convention


class UserError(Exception):
    """A mistake in what the user gave (configuration, paths, data): reported as one
    message and exit status 2, without a traceback unless ``--debug``."""


def register_configurables() -> None:
    """Import every module that defines gin configurables used by experiment files."""
    import rlkit.device  # noqa: F401  (set_platform)
    import rlkit.kernels  # noqa: F401  (kernel overrides)
    import rlkit.models.smollm2  # noqa: F401  (smollm2_model_dir)
    import rlkit.tasks  # noqa: F401  (built-in tasks: datasets, model builders)
    import rlkit.trainer.config  # noqa: F401


class _QuietSearchMisses(logging.Filter):
    # gin logs an ERROR for every search-path candidate of an include that is not
    # there, even when a later candidate is found; a real miss still raises.
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Path not found:")


def parse_config(config_files: list[str], bindings: list[str]) -> None:
    """Parse gin files and bindings; raise :class:`UserError` naming a bad one."""
    register_configurables()
    from rlkit.from_verl import verl_binding_message

    for binding in bindings:
        message = verl_binding_message(binding)
        if message:
            raise UserError(message)
    for path in config_files:
        if not Path(path).is_file():
            raise UserError(f"config file {path!r} not found")
        gin.add_config_file_search_path(str(Path(path).resolve().parent))
    logging.getLogger().addFilter(_QuietSearchMisses())
    gin.add_config_file_search_path(str(PRESETS_DIR.parent))
    gin.add_config_file_search_path(str(PRESETS_DIR))
    try:
        gin.parse_config_files_and_bindings(config_files, bindings)
    except (ValueError, KeyError, SyntaxError, ImportError, OSError, TokenError) as exc:
        # OSError: an `include` of a file gin cannot open (its message names the file
        # and the folders searched); TokenError: a bracket left open at the end of a file.
        raise UserError(f"bad gin configuration: {exc}{did_you_mean(str(exc))}") from exc


def did_you_mean(message: str) -> str:
    """`` Did you mean 'X'?`` for gin's unknown-field or unknown-section message, naming the
    closest field of that configuration section (or the closest section); else ``""``."""
    import dataclasses
    import difflib
    import re

    from rlkit.trainer.config import ExperimentConfig

    sections = {
        f.default_factory.__name__: f.default_factory for f in dataclasses.fields(ExperimentConfig)
    }
    field = re.search(r"Configurable '(\w+)' doesn't have a parameter named '(\w+)'", message)
    section = re.search(r"No configurable matching '([\w.]+)'", message)
    if field and field.group(1) in sections:
        names = [f.name for f in dataclasses.fields(sections[field.group(1)])]
        close = difflib.get_close_matches(field.group(2), names, n=1)
        return f"\nDid you mean {field.group(1)}.{close[0]}?" if close else ""
    if section:
        close = difflib.get_close_matches(section.group(1), list(sections), n=1)
        return f"\nDid you mean {close[0]}?" if close else ""
    return ""


def build_parser() -> argparse.ArgumentParser:
    return experiment_parser("rlkit train", __doc__)


def experiment_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """A command's parser taking an experiment as ``rlkit train`` does: gin files,
    ``--gin_param`` bindings and ``--debug``."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("configs", nargs="+", help="gin experiment file(s)")
    parser.add_argument(
        "--gin_param",
        "--gin-param",
        action="append",
        default=[],
        metavar="BINDING",
        help="an extra binding, e.g. 'RolloutConfig.n = 4' (repeatable)",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of a user error too"
    )
    return parser


def build_config() -> ExperimentConfig:
    """The validated configuration of the parsed gin bindings, or :class:`UserError`."""
    from rlkit.registry import UnknownNameError
    from rlkit.trainer.config import ExperimentConfig

    try:
        config = ExperimentConfig.from_gin()
        config.validate()
    except (ValueError, TypeError, UnknownNameError, FileNotFoundError) as exc:
        raise UserError(str(exc)) from exc
    return config


def user_error_types() -> tuple[type[BaseException], ...]:
    """The exceptions that mean a mistake in what the user gave (or a fault the message
    explains in full): reported as one message, not a traceback."""
    from rewards.by_data_source import UnknownDataSourceError
    from rewards.generative_judge import JudgeError
    from rlkit.data.prompt_dataset import PromptDataError
    from rlkit.device.onednn_cache import KernelCacheSettingError
    from rlkit.distributed.sequence_parallel import SequenceParallelError
    from rlkit.distributed.tensor_parallel import TensorParallelError
    from rlkit.models.tensor_parallel_plans import TensorParallelPlanError
    from rlkit.rollout.servers.errors import (
        ProbeMismatchError,
        ServerStartError,
        WeightMismatchError,
    )
    from rlkit.trainer.builders import StepsConflict
    from rlkit.trainer.checkpoint import CheckpointError, CheckpointSpaceError
    from rlkit.trainer.data_contract import DataContractError
    from rlkit.trainer.rollout_source import NoUpdateError
    from rlkit.trainer.run_dir import RunDirError
    from rlkit.trainer.scoring import RewardFailure

    return (
        FileNotFoundError,
        PromptDataError,
        JudgeError,
        RewardFailure,
        UnknownDataSourceError,
        StepsConflict,
        CheckpointError,  # a damaged checkpoint
        CheckpointSpaceError,  # a full disk while a checkpoint was written
        RunDirError,  # output_dir not writable, or in use by another run
        NoUpdateError,  # DAPO's group filter kept nothing in any step
        ServerStartError,  # an inference server not installed, unreachable or not starting
        SequenceParallelError,  # a Ulysses size the launched processes cannot form
        TensorParallelError,  # a tensor-parallel size the launched processes cannot form
        TensorParallelPlanError,  # a model family without a tensor-parallel plan
        DataContractError,  # a role that did not store what it declared it provides
        WeightMismatchError,  # a weight sync that did not reach a server
        ProbeMismatchError,  # a server computing other log-probs after a sync
        KernelCacheSettingError,  # a kernel cache's capacity in the environment it cannot take
    )


def run_training(config: ExperimentConfig, progress: dict[str, Any]) -> None:
    """Train; a missing path, bad data, a judge that cannot grade or a reward that fails on
    every response is a :class:`UserError` (:func:`user_error_types`).

    ``progress["trainer"]`` is the trainer once built, so an interrupt can name its step."""
    from rlkit.trainer.trainer import RLTrainer

    try:
        progress["trainer"] = trainer = RLTrainer(config)
        trainer.run()
    except user_error_types() as exc:
        raise UserError(str(exc)) from exc
    _close_launched_process_group()


def _close_launched_process_group() -> None:
    """After a finished run under ``accelerate launch``: wait for every process, then destroy
    the process group the launcher created. Left to interpreter exit, gloo's threads may be
    torn down while another process still talks to them, and a finished run aborts
    (``terminate called without an active exception``). Only on success: after an error
    the other processes may never reach the barrier. The group's threads still outlive it;
    ``python -m rlkit.train`` therefore ends through
    :func:`rlkit.distributed.process_exit.exit_process`."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def interrupted_message(argv: list[str], config: ExperimentConfig | None, trainer: Any) -> str:
    """One line: the step reached (when known) and how the same command carries on."""
    step = getattr(trainer, "step_count", None)
    where = f" at step {step}" if step is not None else ""
    again = shlex.join(["rlkit", "train", *argv])
    if config is None:
        return f"rlkit train: interrupted{where}; run `{again}` to start again"
    from rlkit.trainer.checkpoint import CheckpointManager

    t = config.trainer
    latest = CheckpointManager(Path(t.output_dir) / "checkpoints", backend=None).latest()
    if latest is None:
        return (
            f"rlkit train: interrupted{where}; no checkpoint in {t.output_dir} yet "
            f"(TrainerConfig.save_freq = {t.save_freq}): `{again}` starts over"
        )
    if t.resume_mode != "auto":  # "disable", or a fixed path: not the latest
        return (
            f"rlkit train: interrupted{where}; `{again}` with TrainerConfig.resume_mode = "
            f"'auto' resumes from the latest checkpoint in {t.output_dir} ({latest.name})"
        )
    return (
        f"rlkit train: interrupted{where}; `{again}` resumes from the latest checkpoint "
        f"in {t.output_dir} ({latest.name})"
    )


def _announce_sigterm(argv: list[str], state: dict[str, Any]) -> bool:
    """On SIGTERM, say where the run stopped and how to go on (as for Ctrl-C), then die of
    the signal as before (exit status 143 in a shell). Only where SIGTERM has its default
    action: a handler someone installed, or an ignored signal, is left alone. Returns
    whether the handler was installed (:func:`main` puts the default back when it
    returns)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return False

    def on_sigterm(signum: int, frame: Any) -> None:
        text = interrupted_message(argv, state.get("config"), state.get("trainer"))
        text = text.replace(": interrupted", ": terminated (SIGTERM)", 1)
        os.write(2, (text + "\n").encode())
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    progress: dict[str, Any] = {}
    announcing = _announce_sigterm(argv, progress)
    try:
        return _main(args, argv, progress)
    finally:
        # Called in a process that goes on (a notebook, a sweep, a test), the run's
        # bindings would otherwise reach every configuration built there afterwards.
        gin.clear_config()
        if announcing and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _main(args: argparse.Namespace, argv: list[str], progress: dict[str, Any]) -> int:
    config = None
    try:
        gin.clear_config()
        parse_config(args.configs, args.gin_param)
        config = progress["config"] = build_config()
        run_training(config, progress)
    except UserError as exc:
        if args.debug:
            raise
        print(f"rlkit train: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(interrupted_message(argv, config, progress.get("trainer")), file=sys.stderr)
        return INTERRUPTED_EXIT
    return 0


if __name__ == "__main__":
    from rlkit import supervisor

    if supervisor.applies():
        sys.exit(supervisor.supervise("rlkit.train", sys.argv[1:]))
    from rlkit.distributed.process_exit import exit_process

    exit_process(main())
