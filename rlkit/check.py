"""``rlkit check TARGET``: run the property battery of ``rlkit.testing`` on an estimator or loss.

TARGET is a registered name (``grpo``, ``vanilla``), ``package.module:function``
(the current directory is put on the import path first, as ``python -m`` does) or
``path/to/file.py:function``, as every registry takes.
Whether it is an advantage estimator or a policy loss is read from the registry
that holds it, else from its first parameter (``token_level_rewards`` or
``old_log_prob``); ``--kind`` decides when neither tells (``gpg`` names both).

Prints one row per property (passed / FAILED, with the shrunk counterexample of
each failure). The battery runs in a child process, so that a function that crashes
the interpreter (a segfault) or never returns is reported as such: one message naming
the property and the input it was on, exit status 1. Each input has ``--timeout-s``
seconds. Exit status: 0 when every property passed, 1 when one failed, crashed or ran
out of time, 2 for a target that cannot be found or imported, or bad arguments, 130
when interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import inspect
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlkit.registry import (
    ESTIMATORS,
    POLICY_LOSSES,
    UnknownNameError,
    file_module_name,
    is_file_path,
    resolve_file,
)

KINDS = {"estimator": ESTIMATORS, "loss": POLICY_LOSSES}
#: Default time one input may take, in seconds.
DEFAULT_TIMEOUT_S = 60.0
#: Time the child process may take to start (imports) before its first input.
STARTUP_TIMEOUT_S = 300.0
#: Exit status after Ctrl-C.
INTERRUPTED = 130


class TargetError(Exception):
    """The target cannot be found, imported or classified (exit status 2)."""


def _import_module(module_name: str, path: str) -> Any:
    """The module ``module_name`` of ``path``: a dotted name, or a file (``dir/f.py``)."""
    if is_file_path(module_name):
        file = resolve_file(module_name)
        if not os.path.isfile(file):
            raise TargetError(f"file {file} does not exist ({path!r})")
        module_name = file_module_name(file)
    return importlib.import_module(module_name)


def _import_path(path: str) -> Callable[..., Any]:
    module_name, _, attr = path.rpartition(":") if is_file_path(path) else path.partition(":")
    if not module_name or not attr:
        raise TargetError(
            f"bad target {path!r}: expected a registered name or 'package.module:function'"
        )
    try:
        module = _import_module(module_name, path)
    except ImportError as exc:
        raise TargetError(
            f"cannot import module {module_name!r} ({path!r}): {exc}. Is it on PYTHONPATH "
            f"(or under the current directory)?"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - the user's module failed while importing
        raise TargetError(
            f"importing module {module_name!r} ({path!r}) raised {type(exc).__name__}: {exc}"
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TargetError(f"module {module_name!r} has no attribute {attr!r} ({path!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TargetError(f"{path!r} is a {type(obj).__name__}, not a function")
    return obj


def _kind_from_signature(fn: Callable[..., Any]) -> str | None:
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    first = params[0] if params else None
    return {"token_level_rewards": "estimator", "old_log_prob": "loss"}.get(first or "")


def resolve_target(target: str, kind: str | None) -> tuple[str, Any]:
    """(kind, what to pass to check_estimator / check_loss) for a command-line target.

    Raises:
        TargetError: unknown name, a path that does not import, or an undecidable kind.
    """
    if ":" in target:
        fn = _import_path(target)  # a clear message for any import failure
        if kind is not None:
            return kind, target
        registered = [k for k, registry in KINDS.items() if registry.entry_for(fn) is not None]
        if len(registered) == 1:
            return registered[0], target
        guessed = _kind_from_signature(fn)
        if guessed is None:
            raise TargetError(
                f"cannot tell whether {target!r} is an estimator or a loss (it is not registered "
                f"and its first parameter is neither token_level_rewards nor old_log_prob); "
                f"pass --kind estimator or --kind loss"
            )
        return guessed, target
    if kind is not None:
        try:
            KINDS[kind].entry(target)
        except UnknownNameError as exc:
            raise TargetError(str(exc)) from exc
        return kind, target
    found = [k for k, registry in KINDS.items() if target in registry]
    if len(found) > 1:
        raise TargetError(
            f"{target!r} names both an advantage estimator and a policy loss; pass --kind "
            f"estimator or --kind loss"
        )
    if not found:
        known = sorted({*ESTIMATORS.names(), *POLICY_LOSSES.names()})
        near = difflib.get_close_matches(target, known, n=1, cutoff=0.5)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise TargetError(
            f"no estimator or policy loss is registered as {target!r}.{hint} Known: "
            f"{', '.join(known)}. Pass 'package.module:function' for your own."
        )
    return found[0], target


def _option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value  # a plain string


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlkit check",
        description="Run rlkit's property battery (rlkit.testing) on an estimator or a policy loss.",
    )
    parser.add_argument(
        "target", help="registered name, package.module:function or path/to/file.py:function"
    )
    parser.add_argument(
        "--kind", choices=sorted(KINDS), help="estimator or loss (default: guessed)"
    )
    parser.add_argument("--max-examples", type=int, default=None, help="inputs per property")
    parser.add_argument("--seed", type=int, default=None, help="seed of the searches")
    parser.add_argument(
        "--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
        help=f"time limit of one input (default {DEFAULT_TIMEOUT_S:g})",
    )  # fmt: skip
    parser.add_argument(
        "--property", action="append", default=[], metavar="NAME",
        help="an optional property the function claims (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--exempt", action="append", default=[], metavar="NAME",
        help="a property the function does not have (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--only", action="append", default=None, metavar="NAME",
        help="check only this property (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--option", action="append", default=[], type=_option, metavar="KEY=VALUE",
        help="keyword option passed on every call (a Python literal or a string; repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--no-counterexamples", action="store_true", help="print the table without counterexamples"
    )
    return parser


def _resolve(args: argparse.Namespace) -> tuple[str, Any] | None:
    """(kind, target) or None after printing why the target cannot be checked."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return resolve_target(args.target, args.kind)
    except TargetError as exc:
        print(f"rlkit check: {exc}", file=sys.stderr)
        return None


def _run_battery(args: argparse.Namespace, kind: str, what: Any) -> int:
    """Run the battery here and print the report; the exit status."""
    import rlkit.testing as kit

    run = kit.check_estimator if kind == "estimator" else kit.check_loss
    settings: dict[str, Any] = {}
    if args.max_examples is not None:
        settings["max_examples"] = args.max_examples
    if args.seed is not None:
        settings["seed"] = args.seed
    try:
        report = run(
            what,
            properties=args.property,
            exempt=args.exempt,
            only=args.only,
            options=dict(args.option),
            **settings,
        )
    except (ValueError, UnknownNameError) as exc:  # unknown property names, unknown target
        print(f"rlkit check: {exc}", file=sys.stderr)
        return 2
    examples = settings.get("max_examples", kit.DEFAULT_MAX_EXAMPLES)
    label = "advantage estimator" if kind == "estimator" else "policy loss"
    print(f"rlkit check: {label} {args.target} ({examples} examples per property)")
    print(report.table(counterexamples=not args.no_counterexamples))
    return 0 if report.ok else 1


# -- the child process that runs the battery ----------------------------------------
_CHILD = "import sys; from rlkit.check import child_main; sys.exit(child_main(sys.argv[1:]))"


def child_main(argv: list[str]) -> int:
    """The child's side: ``argv`` is the progress pipe's fd, then ``rlkit check``'s argv.

    Before each input it writes one JSON line (property, input number, the input) to
    the pipe, so that the parent can name the input a crash or a hang happened on.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent reports Ctrl-C, once
    pipe = os.fdopen(int(argv[0]), "w", buffering=1)
    args = _parser().parse_args(argv[1:])
    try:
        from rlkit.testing import runner
    except ImportError as exc:
        print(f"rlkit check: {exc}", file=sys.stderr)
        return 2
    resolved = _resolve(args)
    if resolved is None:
        return 2

    counts: dict[str, int] = {}

    def progress(name: str, case: Any) -> None:
        counts[name] = counts.get(name, 0) + 1
        try:
            text = runner.format_case(case) if case is not None else ""
        except Exception:  # noqa: BLE001 - an input that cannot be printed is still run
            text = "(an input that cannot be printed)"
        pipe.write(json.dumps({"property": name, "example": counts[name], "case": text}) + "\n")

    runner.PROGRESS = progress
    return _run_battery(args, *resolved)


@dataclass
class _Watch:
    """What the parent knows of the child: its output and the input it is on."""

    out: list[bytes] = field(default_factory=list)
    err: list[bytes] = field(default_factory=list)
    pending: bytes = b""
    current: dict[str, Any] | None = None
    since: float = field(default_factory=time.monotonic)

    def on_progress(self, data: bytes) -> None:
        lines = (self.pending + data).split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            try:
                self.current = json.loads(line)
            except ValueError:
                continue
            self.since = time.monotonic()

    def where(self) -> str:
        if self.current is None:
            return "while loading the target"
        c = self.current
        if not c["case"]:  # a check that draws no input
            return f"in property {c['property']!r}"
        case = "\n".join("    " + line for line in str(c["case"]).splitlines())
        return f"in property {c['property']!r} on input {c['example']}:\n{case}"


def _pump(proc: subprocess.Popen, progress_fd: int, timeout_s: float) -> tuple[_Watch, bool]:
    """Read the child's output and progress until it exits; (what was read, timed out)."""
    watch = _Watch()
    selector = selectors.DefaultSelector()
    sinks = {proc.stdout.fileno(): watch.out.append, proc.stderr.fileno(): watch.err.append}
    sinks[progress_fd] = watch.on_progress
    for fd in sinks:
        selector.register(fd, selectors.EVENT_READ)
    try:
        while selector.get_map():
            limit = timeout_s if watch.current is not None else STARTUP_TIMEOUT_S
            left = watch.since + limit - time.monotonic()
            if left <= 0:
                return watch, True
            for key, _ in selector.select(timeout=left):
                data = os.read(key.fd, 1 << 16)
                if data:
                    sinks[key.fd](data)
                else:
                    selector.unregister(key.fd)
        return watch, False
    finally:
        selector.close()


def _in_child(argv: list[str], timeout_s: float) -> int:
    """Run the battery in a child process; relay its report, or say how it died."""
    read_fd, write_fd = os.pipe()
    command = [sys.executable, "-c", _CHILD, str(write_fd), *argv]
    try:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_fd,)
        )
    finally:
        os.close(write_fd)
    try:
        watch, timed_out = _pump(proc, read_fd, timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(read_fd)
    sys.stdout.write(b"".join(watch.out).decode("utf-8", "replace"))
    sys.stderr.write(b"".join(watch.err).decode("utf-8", "replace"))
    if timed_out:
        limit = timeout_s if watch.current is not None else STARTUP_TIMEOUT_S
        print(f"rlkit check: timed out after {limit:g} s {watch.where()}", file=sys.stderr)
        return 1
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        print(f"rlkit check: the function crashed ({name}) {watch.where()}", file=sys.stderr)
        return 1
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    """``rlkit check``: the exit status (module docstring)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parser().parse_args(argv)
        if not args.timeout_s > 0:
            print("rlkit check: --timeout-s must be > 0", file=sys.stderr)
            return 2
        # Everything else, the target's import included, happens in the child: a
        # module that crashes or hangs as it loads is reported like a function that does.
        return _in_child(argv, args.timeout_s)
    except KeyboardInterrupt:
        print("rlkit check: interrupted", file=sys.stderr)
        return INTERRUPTED
