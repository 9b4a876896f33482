"""The keys verl's configuration has (``verl_keys.txt``, verl 0.9.1) and had
(``verl_older_keys.txt``, 0.3 to 0.8), to tell a misspelt key from a real one, to name the
nearest real one, and to say which release a key of an older script comes from."""

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


@functools.cache
def _older() -> dict[str, str]:
    text = resources.files(__package__).joinpath("verl_older_keys.txt").read_text()
    rows = [line.split("\t") for line in text.splitlines() if line and not line.startswith("#")]
    return {key: release for key, release in rows}


def older_release(key: str) -> str | None:
    """The newest earlier verl release whose configuration has ``key`` (one 0.9.1 no
    longer has), or None."""
    return _older().get(key)


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
