"""``rlkit from-verl SCRIPT_OR_OVERRIDES... [-o FILE.gin] [--allow-unknown]``.

Reads a verl launch script as bash would (:mod:`rlkit.from_verl.shell`, starting from
this shell's environment) or the Hydra overrides themselves, and writes the gin experiment
that runs the same settings in rlkit, with the command that launches it.

Exit status: 0 translated; 2 nothing to translate, a value that cannot be translated (it
names the key), or a key that is not in verl's configuration (it names the nearest one;
``--allow-unknown`` lists such keys in the output instead).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from rlkit.from_verl.translation import (
    NOT_RL_TRAINING,
    Translation,
    entry_modules,
    overrides_of,
    translate,
)

USER_ERROR_EXIT = 2


def _read(inputs: list[str]) -> tuple[str, str] | None:
    """(source name, script text), or None after saying why the input is unreadable."""
    if len(inputs) == 1 and Path(inputs[0]).is_file():
        try:
            return inputs[0], Path(inputs[0]).read_text()
        except UnicodeDecodeError:
            print(
                f"rlkit from-verl: {inputs[0]} is not a text file (not UTF-8): give a verl "
                f"launch script or key=value overrides",
                file=sys.stderr,
            )
            return None
    return "command line", shlex.join(inputs)


def _unknown_message(result: Translation) -> str:
    keys = "; ".join(
        f"{key}" + (f" (did you mean {near}?)" if near != "none close" else "")
        for key, _, near in result.unknown
    )
    return (
        f"rlkit from-verl: not keys of verl's configuration: {keys}. Correct them, or add "
        f"--allow-unknown to list them in the output and go on"
    )


def _summary(result: Translation, output: str) -> str:
    lines = [
        f"rlkit from-verl: wrote {output} ({len(result.bindings)} settings, "
        f"{len(result.used)} folded into them, {len(result.unsupported)} not translated, "
        f"{len(result.unknown)} unknown)",
        f"run it with: {result.launch.command(output)}",
    ]
    options = result.bindings.get("RolloutConfig.engine_options")
    if options:
        lines.append(f"rollout server options: RolloutConfig.engine_options = {options!r}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``rlkit from-verl``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="rlkit from-verl", description=__doc__)
    parser.add_argument("inputs", nargs="+", help="a verl launch script, or key=value overrides")
    parser.add_argument("-o", "--output", default=None, help="gin file to write (default: stdout)")
    parser.add_argument(
        "--allow-unknown",
        action="store_true",
        help="list keys that are not in verl's configuration instead of stopping",
    )
    args = parser.parse_args(argv)
    read = _read(args.inputs)
    if read is None:
        return USER_ERROR_EXIT
    source, text = read
    other = [m for m in entry_modules(text, dict(os.environ)) if m in NOT_RL_TRAINING]
    if other:
        print(
            f"rlkit from-verl: {source} runs {other[0]}, not verl's RL trainer: "
            f"{NOT_RL_TRAINING[other[0]]}",
            file=sys.stderr,
        )
        return USER_ERROR_EXIT
    overrides = overrides_of(text, dict(os.environ))
    if not overrides:
        print("rlkit from-verl: no verl key=value overrides found", file=sys.stderr)
        return USER_ERROR_EXIT
    try:
        result = translate(overrides)
    except (ValueError, TypeError) as exc:
        print(f"rlkit from-verl: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT
    if result.unknown and not args.allow_unknown:
        print(_unknown_message(result), file=sys.stderr)
        return USER_ERROR_EXIT
    if args.output:
        Path(args.output).write_text(result.gin(source, args.output))
        print(_summary(result, args.output))
    else:
        print(result.gin(source), end="")
    return 0
