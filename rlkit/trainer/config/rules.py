"""The rule each configuration field obeys, kept on the field itself as dataclass metadata.

One rule per field with a range or a fixed set of values. A rule's ``problem(value)``
returns what the value must be (completing "Section.field must be ...") or None when
the value is allowed. Fields annotated ``bool`` or ``dict[...]`` get a type rule without
naming one. Free-form fields (paths, names a registry checks, prompt text) have none;
tests/test_config_validation.py keeps the list of those, so a new field without a rule
is noticed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol


class Rule(Protocol):
    """What a field's value must be: ``problem(value)`` describes the allowed values when
    ``value`` is not one of them, else returns None."""

    def problem(self, value: Any) -> str | None: ...


@dataclass(frozen=True)
class Number:
    """A finite number (an ``int`` when ``integer``) within the given bounds."""

    integer: bool = False
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    optional: bool = False
    """``None`` is allowed too."""

    def bounds(self) -> str:
        pairs = ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
        return " and ".join(f"{op} {bound:g}" for op, bound in pairs if bound is not None)

    def in_bounds(self, value: float) -> bool:
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def problem(self, value: Any) -> str | None:
        if value is None and self.optional:
            return None
        kinds = (int,) if self.integer else (int, float)
        right_type = isinstance(value, kinds) and not isinstance(value, bool)
        if right_type and math.isfinite(value) and self.in_bounds(value):
            return None
        if right_type and math.isfinite(value):
            return self.bounds() + (" or None" if self.optional else "")
        kind = "an integer" if self.integer else "a finite number"
        return " ".join(filter(None, (kind, self.bounds(), "or None" if self.optional else "")))


@dataclass(frozen=True)
class Choice:
    """One of a fixed set of values."""

    values: tuple[Any, ...]

    def problem(self, value: Any) -> str | None:
        allowed = any(value == v and type(value) is type(v) for v in self.values)
        return None if allowed else "|".join(map(str, self.values))


@dataclass(frozen=True)
class OfType:
    """Any value of one Python type (``bool`` for flags, ``dict`` for option mappings)."""

    kind: type
    description: str

    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, self.kind) else self.description


@dataclass(frozen=True)
class Pair:
    """Two numbers, each obeying ``item``."""

    item: Number

    def problem(self, value: Any) -> str | None:
        ok = isinstance(value, list | tuple) and len(value) == 2
        if ok and not any(self.item.problem(v) for v in value):
            return None
        return f"2 numbers {self.item.bounds()}"


@dataclass(frozen=True)
class ResumeMode:
    """``auto`` | ``disable`` | the path of an existing checkpoint directory."""

    def problem(self, value: Any) -> str | None:
        if value in ("auto", "disable") or (isinstance(value, str) and Path(value).exists()):
            return None
        return "auto|disable|an existing checkpoint path"


@dataclass(frozen=True)
class ServerCores:
    """``auto`` | ``off`` | a number of cores >= 1."""

    def problem(self, value: Any) -> str | None:
        if value in ("auto", "off") and isinstance(value, str):
            return None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return None
        return "'auto', 'off' or a number of cores >= 1"


@dataclass(frozen=True)
class LoggerNames(OfType):
    """A list or tuple of logger names: registered ones, or ``module:factory`` paths
    (imported when the run starts, not here)."""

    kind: type = tuple
    description: str = "a list of logger names"

    def problem(self, value: Any) -> str | None:
        from rlkit.registry import LOGGERS

        known = ", ".join(LOGGERS.names())
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            return f"a list of logger names ({known})"
        if any(":" not in v and v not in LOGGERS for v in value):
            return f"a list of {known} or 'pkg.module:factory' names"
        return None


@dataclass(frozen=True)
class TrackerName(OfType):
    """A name every tracker accepts as a project: letters, digits, ``_ - + .`` (SwanLab's
    rule, the strictest of the three), up to 100 characters."""

    kind: type = str
    description: str = "a name of letters, digits, '_', '-', '+' or '.' (at most 100)"
    empty: bool = False
    """``""`` is allowed too (a default chosen at run time)."""

    def problem(self, value: Any) -> str | None:
        if isinstance(value, str) and (
            (self.empty and value == "") or re.fullmatch(r"[0-9A-Za-z_\-+.]{1,100}", value)
        ):
            return None
        return self.description + (' or ""' if self.empty else "")


FLAG = OfType(bool, "True or False")
MAPPING = OfType(dict, "a dict")
COUNT = Number(integer=True, ge=1)
NON_NEGATIVE_INT = Number(integer=True, ge=0)
NON_NEGATIVE = Number(ge=0)
POSITIVE = Number(gt=0)
FRACTION = Number(ge=0, le=1)
DTYPE = Choice(("float32", "bfloat16", "float16"))


RULE = "rule"
"""The dataclass metadata key that holds a field's rule."""


def checked(default: Any, rule: Rule) -> Any:
    """A dataclass field defaulting to ``default`` whose value must obey ``rule``: the rule
    sits beside the field it governs, and :func:`rules_for` reads it from there."""
    return field(default=default, metadata={RULE: rule})


def rules_for(section: type) -> dict[str, Rule]:
    """Every rule of ``section``'s fields, in their order: the one a field names with
    :func:`checked`, else a type rule for a field annotated ``bool`` or ``dict[...]``."""
    rules: dict[str, Rule] = {}
    for f in fields(section):
        annotation = str(f.type)
        if RULE in f.metadata:
            rules[f.name] = f.metadata[RULE]
        elif annotation == "bool":
            rules[f.name] = FLAG
        elif annotation.startswith("dict["):
            rules[f.name] = MAPPING
    return rules


def field_problems(section: Any, values: dict[str, Any] | None = None) -> list[str]:
    """``"Section.field must be ..., got value"`` for every field of ``section`` (a
    section instance, or its class with ``values``, a subset of its fields) that breaks
    its rule."""
    cls = section if isinstance(section, type) else type(section)
    values = vars(section) if values is None else values
    problems = []
    for name, rule in rules_for(cls).items():
        if name not in values:
            continue
        allowed = rule.problem(values[name])
        if allowed is not None:
            problems.append(f"{cls.__name__}.{name} must be {allowed}, got {values[name]!r}")
    return problems
