"""The keys verl's configuration has (``verl_keys.txt``), to tell a misspelt key from a
real one and to name the nearest real one."""

from __future__ import annotations

import difflib
import functools
from importlib import resources


@functools.cache
def _table() -> tuple[frozenset[str], tuple[str, ...]]:
    text = resources.files(__package__).joinpath("verl_keys.txt").read_text()
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    leaves = frozenset(line for line in lines if not line.endswith(".*"))
    mappings = tuple(line[:-1] for line in lines if line.endswith(".*"))  # "a.b." prefixes
    return leaves, mappings


def is_verl_key(key: str) -> bool:
    """``key`` is in verl's configuration, or below one of its free-form mappings."""
    leaves, mappings = _table()
    return key in leaves or key.startswith(mappings)


def nearest(key: str) -> str | None:
    """The verl key closest in spelling to ``key``, or None if none is close."""
    leaves, _ = _table()
    found = difflib.get_close_matches(key, sorted(leaves), n=1, cutoff=0.8)
    return found[0] if found else None


def is_verl_root(key: str) -> bool:
    """``key`` starts with one of the top-level sections of verl's configuration
    (``data.``, ``actor_rollout_ref.``, ``trainer.`` ...)."""
    leaves, _ = _table()
    return key.split(".", 1)[0] in {leaf.split(".", 1)[0] for leaf in leaves}
