"""Batched rewards: one call scores a whole step's responses (model judges, services).

A per-response reward is ``fn(response, ground_truth, **extra) -> float | dict``. A
*batched* reward is called once per scoring call with every response's context::

    fn(contexts: list[RewardContext], **options) -> list[float | dict]

and returns one result per context, in order. A reward says it is batched either
where it is registered or on the function itself (which also works for a function
named by ``"pkg.module:fn"`` or ``"path/to/file.py:fn"``)::

    @REWARDS.register("my_judge", batched=True)
    def my_judge(contexts, **options): ...

    @rewards.batched
    def my_judge(contexts, **options): ...

:func:`rewards.score_batch` (and so the trainer) calls it once; see docs/rewards.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from rlkit.registry import REWARDS, Entry

F = TypeVar("F", bound=Callable[..., Any])

BATCHED_ATTR = "__rlkit_batched_reward__"
"""The attribute :func:`batched` sets on a function."""


def batched(fn: F) -> F:
    """Mark ``fn`` as a batched reward: ``fn(contexts, **options) -> list[float | dict]``.

    Returns ``fn`` itself, so it stays a plain, picklable module-level function.
    """
    if not callable(fn):
        raise TypeError(f"@rewards.batched needs a function, got {fn!r}")
    setattr(fn, BATCHED_ATTR, True)
    return fn


def is_batched(fn: Callable[..., Any], entry: Entry[Any] | None = None) -> bool:
    """Whether ``fn`` is a batched reward: its registry entry (or ``entry``) says
    ``batched=True``, or it (or the function a ``functools.partial`` wraps) is marked
    with :func:`batched`."""
    if entry is not None and entry.extra.get("batched"):
        return True
    inner: Any = fn
    while True:
        if getattr(inner, BATCHED_ATTR, False):
            return True
        if not isinstance(inner, functools.partial):
            break
        inner = inner.func
    registered = REWARDS.entry_for(inner)
    return bool(registered is not None and registered.extra.get("batched"))


def resolve_reward(reward: str | Callable[..., Any]) -> tuple[Callable[..., Any], bool]:
    """``(function, is batched)`` for a reward name, path or callable.

    Raises:
        UnknownNameError: ``reward`` names no reward (or a path that does not import).
        TypeError: ``reward`` is neither a string nor a callable.
    """
    if isinstance(reward, str):
        entry = REWARDS.entry(reward)
        return entry.fn, is_batched(entry.fn, entry)
    if callable(reward):
        return reward, is_batched(reward)
    raise TypeError(f"reward must be a registered name or a callable, got {reward!r}")


def per_response_reward(name: str, *, used_by: str) -> Callable[..., Any]:
    """The per-response reward ``name`` names, for rewards built from others.

    Raises:
        UnknownNameError: ``name`` names no reward.
        TypeError: ``name`` is a batched reward, which a per-response ``used_by``
            cannot call for one response.
    """
    fn, is_batch = resolve_reward(name)
    if is_batch:
        raise TypeError(
            f"reward {name!r} is batched (it scores a whole batch in one call), so "
            f"{used_by!r} cannot call it for one response; use it as DataConfig.reward "
            f"itself, or call the per-response terms from inside the batched reward"
        )
    return fn
