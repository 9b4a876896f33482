"""``rlkit diagnose CONFIG.gin [--gin_param ...]``: is the rollout engine sampling from the
distribution the trainer computes?

Builds the run's model, tokenizer, engine, data and agent loop as ``rlkit train`` does,
samples one batch and compares (see :mod:`rlkit.diagnose.run`). Writes ``report.md``,
``report.json`` and ``gap_by_position.png`` to ``--out`` (default: ``diagnose`` in the
run's ``TrainerConfig.output_dir``) and prints the report.

Exit status: 0 healthy; 1 a mismatch, its most likely cause named first; 2 a user error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gin

MISMATCH_EXIT = 1


def build_parser() -> argparse.ArgumentParser:
    from rlkit.train import experiment_parser

    parser = experiment_parser("rlkit diagnose", __doc__)
    parser.add_argument("--prompts", type=int, default=16, help="prompts sampled (default 16)")
    parser.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="top log-probs asked of the engine per token (default: the whole vocabulary "
        "for the embedded engine, 20 for a server)",
    )
    parser.add_argument("--out", default=None, help="report folder")
    return parser


def main(argv: list[str] | None = None) -> int:
    from rlkit.diagnose.run import DiagnoseError
    from rlkit.train import USER_ERROR_EXIT, UserError, build_config, parse_config, user_error_types

    args = build_parser().parse_args(argv)
    try:
        if args.prompts < 1 or (args.top_k is not None and args.top_k < 1):
            raise UserError("--prompts and --top-k must be at least 1")
        gin.clear_config()
        parse_config(args.configs, args.gin_param)
        config = build_config()
        out = Path(args.out or Path(config.trainer.output_dir) / "diagnose")
        return _diagnose(config, out, args)
    except UserError as exc:
        if args.debug:
            raise
        print(f"rlkit diagnose: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT
    except (*user_error_types(), DiagnoseError) as exc:
        if args.debug:
            raise
        print(f"rlkit diagnose: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT
    finally:
        gin.clear_config()  # as `rlkit train` does: no binding outlives the call


def _diagnose(config: object, out: Path, args: argparse.Namespace) -> int:
    from rlkit.diagnose import report
    from rlkit.diagnose.run import diagnose, scratch_output_dir

    config.trainer.output_dir = scratch_output_dir(out)
    config.trainer.resume_mode = "disable"
    config.trainer.overwrite = True  # the scratch folder is diagnose's own, rewritten each time
    found = diagnose(config, prompts=args.prompts, top_k=args.top_k)
    written = report.write(found, out)
    print(report.markdown(found))
    print("written: " + ", ".join(str(p) for p in written))
    return 0 if found.passed else MISMATCH_EXIT
