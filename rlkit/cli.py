"""The ``rlkit`` command: ``rlkit <command> [args...]``.

Each command lives in its own module and parses its own arguments; this file
only dispatches, so ``rlkit --help`` stays fast (nothing heavy is imported).
"""

from __future__ import annotations

import importlib
import sys

#: command -> ("module:function", one-line help). The function takes argv.
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("rlkit.listing:main", "list registered estimators, losses, KL penalties, ..."),
    "train": ("rlkit.train:main", "train from a gin experiment: rlkit train CONFIG.gin"),
    "eval": ("rlkit.evaluation.harness:main", "evaluate a model on gsm8k/aime/math500"),
    "data": ("rlkit.data_cli:main", "prepare a dataset preset as verl-layout Parquet files"),
    "export": ("rlkit.export:main", "export a checkpoint (see `rlkit export --help`)"),
    "sweep": ("rlkit.sweep:main", "run a grid of experiments and tabulate/plot them"),
    "doctor": ("rlkit.doctor:main", "show the platform and the kernel chosen per op"),
    "check": ("rlkit.check:main", "run the property battery on an estimator or loss"),
    "diagnose": (
        "rlkit.diagnose.cli:main",
        "compare the rollout engine's distribution with the trainer's, explain a gap",
    ),
    "from-verl": ("rlkit.from_verl:main", "translate a verl launch script into a gin file"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: rlkit <command> [args...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"rlkit: unknown command {command!r}.\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, _, func_name = COMMANDS[command][0].partition(":")
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(rest) or 0)


def console_main() -> None:
    """The ``rlkit`` console script: :func:`main`, then
    :func:`~rlkit.distributed.process_exit.exit_process` (no interpreter teardown when
    launched as one of several processes). ``rlkit train`` runs under
    :mod:`rlkit.supervisor`."""
    from rlkit import supervisor

    argv = sys.argv[1:]
    if argv[:1] == ["train"] and supervisor.applies():
        sys.exit(supervisor.supervise("rlkit.train", argv[1:]))
    from rlkit.distributed.process_exit import exit_process

    exit_process(main(argv))


if __name__ == "__main__":
    console_main()
