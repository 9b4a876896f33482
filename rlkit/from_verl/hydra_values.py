"""The value of a Hydra command-line override (``key=value``), read as Hydra reads it.

After the shell has removed its quotes, Hydra's own grammar applies: ``[a, b]`` is a list
and ``{k: v}`` a mapping (elements nest; unquoted elements are strings with their outer
blanks trimmed), ``'text'`` / ``"text"`` is a string, ``null`` is None, ``true`` /
``false`` (any case) are booleans, integers (``1_000`` too) and floats (``1e-6``, ``0.``,
``inf``, ``nan``) are numbers, and anything else is the string as written.
"""

from __future__ import annotations

import re
from typing import Any

_INT = re.compile(r"[+-]?\d[\d_]*")
_FLOAT = re.compile(r"[+-]?(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][+-]?\d+)?|[+-]?(inf|nan)", re.I)


class HydraValueError(ValueError):
    """A value Hydra's grammar does not read (an unclosed bracket or quote)."""


def hydra_value(text: str) -> Any:
    """The Python value of one override's right-hand side (module docstring)."""
    text = text.strip()
    if text[:1] in "[{":
        return _container(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return _unquote(text)
    return _scalar(text)


def _scalar(text: str) -> Any:
    low = text.lower()
    if low == "null":
        return None
    if low in ("true", "false"):
        return low == "true"
    if _INT.fullmatch(text):
        return int(text.replace("_", ""))
    if _FLOAT.fullmatch(text):  # "1e-6", "0.", ".5", "inf"
        return float(text.replace("_", ""))
    return text


def _unquote(text: str) -> str:
    quote, body = text[0], text[1:-1]
    return body.replace("\\" + quote, quote).replace("\\\\", "\\")


def _container(text: str) -> list[Any] | dict[Any, Any]:
    closer = "]" if text[0] == "[" else "}"
    if not text.endswith(closer):
        raise HydraValueError(f"{text!r}: the {text[0]!r} is not closed by {closer!r}")
    elements = [e for e in _split_top_level(text[1:-1]) if e.strip()]
    if closer == "]":
        return [hydra_value(e) for e in elements]
    pairs = {}
    for element in elements:
        key, sep, value = element.partition(":")
        if not sep:
            raise HydraValueError(f"{text!r}: {element.strip()!r} is not 'key: value'")
        pairs[_scalar(key.strip())] = hydra_value(value)
    return pairs


def _split_top_level(body: str) -> list[str]:
    """``body`` split at the commas outside quotes and nested brackets."""
    parts, current, depth, quote = [], [], 0, ""
    for c in body:
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(c)
    if quote or depth:
        raise HydraValueError(f"[{body}]: a quote or bracket is not closed")
    parts.append("".join(current))
    return parts
