"""``rlkit check TARGET``: run the property battery of ``rlkit.testing`` on an estimator or loss.

TARGET is a registered name (``grpo``, ``vanilla``) or ``package.module:function``
(the current directory is put on the import path first, as ``python -m`` does).
Whether it is an advantage estimator or a policy loss is read from the registry
that holds it, else from its first parameter (``token_level_rewards`` or
``old_log_prob``); ``--kind`` decides when neither tells (``gpg`` names both).

Prints one row per property (passed / FAILED, with the shrunk counterexample of
each failure). Exit status: 0 when every property passed, 1 when one failed,
2 for a target that cannot be found or imported, or bad arguments.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from rlkit.registry import ESTIMATORS, POLICY_LOSSES, UnknownNameError

KINDS = {"estimator": ESTIMATORS, "loss": POLICY_LOSSES}


class TargetError(Exception):
    """The target cannot be found, imported or classified (exit status 2)."""


def _import_path(path: str) -> Callable[..., Any]:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise TargetError(
            f"bad target {path!r}: expected a registered name or 'package.module:function'"
        )
    try:
        module = importlib.import_module(module_name)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rlkit check",
        description="Run rlkit's property battery (rlkit.testing) on an estimator or a policy loss.",
    )
    parser.add_argument("target", help="registered name or package.module:function")
    parser.add_argument(
        "--kind", choices=sorted(KINDS), help="estimator or loss (default: guessed)"
    )
    parser.add_argument("--max-examples", type=int, default=None, help="inputs per property")
    parser.add_argument("--seed", type=int, default=None, help="seed of the searches")
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
    args = parser.parse_args(argv)

    try:
        import rlkit.testing as kit
    except ImportError as exc:
        print(f"rlkit check: {exc}", file=sys.stderr)
        return 2
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        kind, what = resolve_target(args.target, args.kind)
    except TargetError as exc:
        print(f"rlkit check: {exc}", file=sys.stderr)
        return 2
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
