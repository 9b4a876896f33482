"""Running properties with hypothesis, and what every battery shares.

A property is a name, a strategy for its input and a check that returns None
when the property holds and a message when it does not. The runner asks
:func:`hypothesis.find` for the smallest drawn input whose check fails, with a
fixed seed and ``derandomize=True`` (the same run finds the same
counterexample), ``database=None`` (nothing is written to the working
directory) and health checks off.
"""

from __future__ import annotations

import inspect
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, Verbosity, find, settings
from hypothesis.errors import NoSuchExample
from hypothesis.strategies import SearchStrategy

from rlkit.registry import Entry, Registry
from rlkit.testing.report import PropertyResult

#: Default number of drawn inputs per property.
DEFAULT_MAX_EXAMPLES = 30
#: Seed of every search (with ``derandomize=True``).
DEFAULT_SEED = 20240601
#: Tolerances of the comparisons (inputs are float64).
RTOL = 1e-7
ATOL = 1e-9

Check = Callable[[Any], "str | None"]

#: Called with (property name, input) before each check of an input; ``rlkit check``
#: sets it in its child process, so that a crash or a hang can name the input.
PROGRESS: Callable[[str, Any], None] | None = None


class ContractError(Exception):
    """A function under test returned something of the wrong kind (not a tensor, a wrong shape)."""


@dataclass(frozen=True)
class Property:
    """One entry of a battery.

    Attributes:
        name: the property's name.
        description: what it asserts (one line, shown by ``rlkit check`` and the docs).
        optional: checked only when declared (``properties=``); otherwise checked
            unless exempt.
    """

    name: str
    description: str
    optional: bool = False


def qualified_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}:{getattr(fn, '__qualname__', repr(fn))}"


def resolve(
    registry: Registry[Any], fn_or_name: Any
) -> tuple[Callable[..., Any], Entry[Any] | None, str]:
    """(function, its registry entry or None, a display name) for a callable, name or dotted path.

    Raises:
        rlkit.registry.UnknownNameError: unknown name or a path that does not import.
        TypeError: neither a string nor a callable.
    """
    if isinstance(fn_or_name, str):
        entry = registry.entry(fn_or_name)
        return entry.fn, entry, fn_or_name
    if callable(fn_or_name):
        return fn_or_name, registry.entry_for(fn_or_name), qualified_name(fn_or_name)
    raise TypeError(
        f"expected a function, a registered {registry.kind} name or 'package.module:function', "
        f"got {type(fn_or_name).__name__}"
    )


def _names(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Mapping):  # {name: reason}
        return tuple(value)
    return tuple(value)


def declarations(
    entry: Entry[Any] | None,
    properties: Iterable[str] | None,
    exempt: Iterable[str] | None,
    battery: Mapping[str, Property],
    kind: str,
) -> tuple[set[str], set[str]]:
    """(declared optional properties, exempt properties): the registration's and the caller's.

    Raises:
        ValueError: a name that is not in the battery, or a generic property
            declared in ``properties`` (generic ones are checked anyway).
    """
    extra = entry.extra if entry is not None else {}
    declared = {*_names(extra.get("properties")), *_names(properties)}
    lacking = {*_names(extra.get("properties_exempt")), *_names(exempt)}
    for label, names in (("properties", declared), ("properties_exempt / exempt", lacking)):
        unknown = sorted(n for n in names if n not in battery)
        if unknown:
            raise ValueError(
                f"unknown {kind} propert{'y' if len(unknown) == 1 else 'ies'} {unknown} in "
                f"{label}; known: {', '.join(battery)}"
            )
    generic = sorted(n for n in declared if not battery[n].optional)
    if generic:
        raise ValueError(
            f"{generic} are checked for every {kind} unless exempt; declare only optional "
            f"properties ({', '.join(n for n, p in battery.items() if p.optional)})"
        )
    return declared, lacking


def selected(
    battery: Mapping[str, Property],
    declared: set[str],
    lacking: set[str],
    only: Iterable[str] | None,
) -> tuple[list[str], tuple[str, ...]]:
    """(properties to check in battery order, exempt properties that would otherwise be checked)."""
    wanted = [n for n, p in battery.items() if not p.optional or n in declared]
    if only is not None:
        only = list(_names(only))
        unknown = sorted(set(only) - set(battery))
        if unknown:
            raise ValueError(f"unknown properties {unknown} in only=; known: {', '.join(battery)}")
        wanted = [n for n in battery if n in only]
    return [n for n in wanted if n not in lacking], tuple(n for n in wanted if n in lacking)


def search_settings(max_examples: int, shrink: bool = True) -> settings:
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        verbosity=Verbosity.quiet,
        phases=(Phase.generate, Phase.shrink) if shrink else (Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )


def guarded(check: Check, case: Any) -> str | None:
    """``check(case)``, with an exception turned into its message."""
    try:
        return check(case)
    except Exception as exc:  # noqa: BLE001 - a raising function fails the property
        return f"raised {type(exc).__name__}: {exc}"


def run_property(
    prop: Property,
    strategy: SearchStrategy[Any] | None,
    check: Check,
    *,
    max_examples: int,
    seed: int,
    shrink: bool = True,
    defaults: Mapping[str, Any] | None = None,
) -> PropertyResult:
    """Search ``strategy`` for a shrunk input failing ``check`` (once, on None, for a static check)."""
    if PROGRESS is not None:
        check = _announced(prop.name, check, PROGRESS)
    if strategy is None:
        message = guarded(check, None)
        return PropertyResult(prop.name, message is None, message, prop.description, 1)
    try:
        case = find(
            strategy,
            lambda c: guarded(check, c) is not None,
            settings=search_settings(max_examples, shrink),
            random=random.Random(seed),
        )
    except NoSuchExample:
        return PropertyResult(prop.name, True, None, prop.description, max_examples)
    message = guarded(check, case) or "failed while shrinking, passes on the shrunk input (flaky)"
    text = f"{format_case(case, defaults)}\n-> {message}"
    return PropertyResult(prop.name, False, text, prop.description, max_examples)


def _announced(name: str, check: Check, progress: Callable[[str, Any], None]) -> Check:
    def announced(case: Any) -> str | None:
        progress(name, case)
        return check(case)

    return announced


def run_battery(
    names: list[str],
    catalogue: Mapping[str, Property],
    plans: Mapping[str, tuple[SearchStrategy[Any] | None, Check]],
    *,
    max_examples: int,
    seed: int,
    shrink: bool = True,
    defaults: Mapping[str, Any] | None = None,
) -> tuple[list[PropertyResult], float]:
    """Run ``names`` in order; ``defaults``: case entries not printed when they hold these values."""
    start = time.perf_counter()
    results = []
    for name in names:
        strategy, check = plans[name]
        results.append(
            run_property(
                catalogue[name],
                strategy,
                check,
                max_examples=max_examples,
                seed=seed,
                shrink=shrink,
                defaults=defaults,
            )
        )
    return results, time.perf_counter() - start


# -- calling the function under test ------------------------------------------------
def seeded_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with torch's global RNG seeded to 0 (restored afterwards).

    Functions that draw random numbers without a generator of their own (e.g.
    ``clip_cov``) then give the same result for the same inputs.
    """
    state = torch.get_rng_state()
    # default_generator.manual_seed: torch.manual_seed would also seed (lazily) every
    # accelerator, recording a stack trace each time (slow).
    torch.default_generator.manual_seed(0)
    try:
        return fn(*args, **kwargs)
    finally:
        torch.set_rng_state(state)


def missing_keywords(
    fn: Callable[..., Any], positional: tuple[str, ...], keywords: tuple[str, ...]
) -> str | None:
    """Why ``fn`` cannot be called as ``fn(*positional, **keywords)``; None when it can."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        return f"cannot read the signature: {exc}"
    params = list(sig.parameters.values())
    kinds = inspect.Parameter
    has_var_kw = any(p.kind is kinds.VAR_KEYWORD for p in params)
    has_var_pos = any(p.kind is kinds.VAR_POSITIONAL for p in params)
    positional_params = [
        p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    ]
    problems = []
    if len(positional_params) < len(positional) and not has_var_pos:
        problems.append(
            f"takes {len(positional_params)} positional argument(s), the shared signature passes "
            f"{len(positional)} ({', '.join(positional)})"
        )
    by_name = {p.name: p for p in params}
    missing = [
        k
        for k in keywords
        if not (
            k in by_name and by_name[k].kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
        )
    ]
    if missing and not has_var_kw:
        problems.append(f"does not accept the shared keyword(s) {', '.join(missing)}")
    required = [
        p.name
        for p in params[len(positional) :]
        if p.default is kinds.empty
        and p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
        and p.name not in keywords
    ]
    if required:
        problems.append(f"requires argument(s) the trainer does not pass: {', '.join(required)}")
    if not problems:
        return None
    return f"signature {fn.__name__ if hasattr(fn, '__name__') else fn}{sig}: " + "; ".join(
        problems
    )


# -- comparing and describing tensors -----------------------------------------------
def as_float(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to(torch.float64)


def mismatch(
    actual: torch.Tensor,
    expected: torch.Tensor,
    what: str,
    *,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> str | None:
    """None if ``actual`` ≈ ``expected`` (NaN equal to NaN), else a message naming the worst entry."""
    if tuple(actual.shape) != tuple(expected.shape):
        return f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    a, e = as_float(actual), as_float(expected)
    both_nan = a.isnan() & e.isnan()
    close = torch.isclose(a, e, rtol=rtol, atol=atol) | both_nan
    if bool(close.all()):
        return None
    diff = torch.where(close, 0.0, (a - e).abs().nan_to_num(nan=math.inf))
    worst = int(diff.reshape(-1).argmax())
    where = (
        tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), a.shape)) if a.dim() else ()
    )
    got, want = a.reshape(-1)[worst].item(), e.reshape(-1)[worst].item()
    at = f" at {list(where)}" if where else ""
    return f"{what}{at}: {fmt(got)} != {fmt(want)}"


def fmt(x: float) -> str:
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and abs(x) < 1e15:
        return f"{x:.1f}"
    return f"{x:.6g}"


def format_value(value: Any) -> str:
    """A tensor as a nested list literal that reproduces it (bool as 0/1), others by repr."""
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu()
        if data.dtype == torch.bool:
            data = data.to(torch.int64)
        single = data.dtype in (torch.float32, torch.float16, torch.bfloat16)
        body = _nested(data.tolist(), single)
        suffix = (
            "" if value.dtype in (torch.float64, torch.bool, torch.int64) else f"  # {value.dtype}"
        )
        return body + suffix
    if isinstance(value, list) and value and all(isinstance(v, slice) for v in value):
        return "[" + ", ".join(f"rows {s.start}:{s.stop}" for s in value) + "]"
    return repr(value)


def _nested(data: Any, single: bool) -> str:
    if isinstance(data, list):
        return "[" + ", ".join(_nested(x, single) for x in data) + "]"
    if isinstance(data, float):
        if math.isnan(data) or math.isinf(data):
            return fmt(data)
        # The shortest literal that round-trips (in float32 for single-precision tensors).
        return str(np.float32(data)) if single else repr(data)
    return str(data)


_NO_DEFAULT = object()


def format_case(case: Any, defaults: Mapping[str, Any] | None = None) -> str:
    """One ``name = value`` line per input of a drawn case (None and ``defaults`` left out)."""
    if not isinstance(case, Mapping):
        return format_value(case)
    lines = []
    for key, value in case.items():
        default = (defaults or {}).get(key, _NO_DEFAULT)
        if not isinstance(value, torch.Tensor) and value == default:
            continue
        if isinstance(value, Mapping):
            lines += [f"{key}.{k} = {format_value(v)}" for k, v in value.items() if v is not None]
        elif value is not None:
            lines.append(f"{key} = {format_value(value)}")
    return "\n".join(lines)
