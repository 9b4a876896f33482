"""``rlkit train CONFIG.gin [CONFIG2.gin ...] [--gin_param 'Section.field = value' ...]``.

Also ``python -m rlkit.train``. Every knob is a gin binding (see
``rlkit/trainer/config.py``); misspelt or unknown bindings fail before any
work, naming the binding. The operative configuration is saved as
``<output_dir>/config.gin``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import gin

PRESETS_DIR = Path(__file__).resolve().parent.parent / "algorithms" / "presets"


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
    """Parse gin files and bindings; raise ``SystemExit`` with a clear message on a bad one."""
    register_configurables()
    for path in config_files:
        if not Path(path).is_file():
            raise SystemExit(f"rlkit train: config file {path!r} not found")
        gin.add_config_file_search_path(str(Path(path).resolve().parent))
    logging.getLogger().addFilter(_QuietSearchMisses())
    gin.add_config_file_search_path(str(PRESETS_DIR.parent))
    gin.add_config_file_search_path(str(PRESETS_DIR))
    try:
        gin.parse_config_files_and_bindings(config_files, bindings)
    except (ValueError, KeyError, SyntaxError, ImportError) as exc:
        raise SystemExit(f"rlkit train: bad gin configuration: {exc}") from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlkit train",
        description=__doc__,
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    gin.clear_config()
    parse_config(args.configs, args.gin_param)
    from rlkit.registry import UnknownNameError
    from rlkit.trainer.config import ExperimentConfig
    from rlkit.trainer.trainer import RLTrainer

    try:
        config = ExperimentConfig.from_gin()
        config.validate()
    except (ValueError, TypeError, UnknownNameError) as exc:
        raise SystemExit(f"rlkit train: {exc}") from exc
    from rewards.generative_judge import JudgeError

    try:
        RLTrainer(config).run()
    except JudgeError as exc:  # a judge that cannot grade: one message, not a traceback
        raise SystemExit(f"rlkit train: {exc}") from exc
    return 0


if __name__ == "__main__":
    sys.exit(main())
