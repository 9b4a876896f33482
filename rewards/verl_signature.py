"""Rewards written for verl, used unchanged.

verl calls a custom reward (``custom_reward_function.path`` / ``.name``, by default
``compute_score``) by keyword::

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return 1.0  # or {"score": 1.0, "acc": True, ...}

rlkit's own contract is ``fn(response, ground_truth, **extra)``. A function that names
``solution_str`` is taken to be verl's: :class:`VerlReward` calls it by keyword with the
row's ``data_source``, the response as ``solution_str``, ``ground_truth`` and the row's
``extra_info`` (``{}`` when the row has none), plus ``DataConfig.reward_options`` (verl's
``custom_reward_function.reward_kwargs``). A dict result's keys other than ``"score"``
are logged as metrics, as verl's reward managers log them.

:func:`check_reward_signature` checks either contract against the configured options
before any model loads.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rewards.context import READABLE

VERL_REQUIRED = ("data_source", "solution_str", "ground_truth")
"""The parameters verl passes to every custom reward."""

# Per-row fields rlkit passes to its own rewards that verl's functions do not expect:
# passed only when the function names them.
_RLKIT_ONLY = ("response_length", *READABLE, "context")


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return None


def is_verl_reward(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` has verl's reward signature (it names ``solution_str``)."""
    sig = _signature(fn)
    return sig is not None and "solution_str" in sig.parameters


def _accepts(sig: inspect.Signature) -> tuple[set[str], bool]:
    """(named keyword parameters, whether ``**kwargs`` takes the rest)."""
    params = sig.parameters.values()
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named, any(p.kind is p.VAR_KEYWORD for p in params)


@functools.lru_cache(maxsize=16)
def _resolve(spec: str) -> Callable[..., Any]:
    from rlkit.registry import REWARDS

    return REWARDS.get(spec)


@dataclass(frozen=True)
class VerlReward:
    """A verl-style reward with rlkit's contract ``(response, ground_truth, **extra)``.

    Picklable when ``spec`` is a name or path (worker processes resolve it themselves).

    Attributes:
        spec: the reward's name or ``"path/to/file.py:function"``, or the function.
    """

    spec: str | Callable[..., Any]

    @property
    def function(self) -> Callable[..., Any]:
        """The verl-style function itself."""
        return _resolve(self.spec) if isinstance(self.spec, str) else self.spec

    @property
    def __name__(self) -> str:  # how reports name the reward
        return getattr(self.function, "__name__", "compute_score")

    def __call__(self, response: str, ground_truth: str, **extra: Any) -> Any:
        fn = self.function
        sig = _signature(fn)
        named, takes_rest = _accepts(sig) if sig is not None else (set(), True)
        kwargs = {
            "data_source": extra.pop("data_source", ""),
            "solution_str": response,
            "ground_truth": ground_truth,
        }
        extra_info = extra.pop("extra_info", None)
        if "extra_info" in named or takes_rest:
            kwargs["extra_info"] = dict(extra_info or {})
        for key, value in extra.items():
            if key in named or (takes_rest and key not in _RLKIT_ONLY):
                kwargs[key] = value
        return fn(**kwargs)


def check_reward_signature(
    fn: Callable[..., Any], options: Mapping[str, Any], *, label: str
) -> None:
    """Stop before any model loads when ``fn`` cannot be called as a reward.

    Args:
        fn: a per-response reward: verl's ``(data_source, solution_str, ground_truth,
            extra_info)`` or rlkit's ``(response, ground_truth, **extra)``.
        options: ``DataConfig.reward_options``, passed to every call.
        label: how the configuration names the reward (for the message).

    Raises:
        TypeError: a verl-style function lacks one of verl's parameters, or does not
            take an option; an rlkit-style one cannot take two positional arguments
            plus the per-row keywords and the options.
    """
    sig = _signature(fn)
    if sig is None:
        return
    named, takes_rest = _accepts(sig)
    if is_verl_reward(fn):
        missing = [p for p in VERL_REQUIRED if p not in named]
        unknown = [k for k in options if k not in named and not takes_rest]
        if missing or unknown:
            raise TypeError(
                f"reward {label!r} has verl's signature (it names solution_str) but "
                + (f"lacks {missing}; " if missing else "")
                + (f"does not take the reward_options {unknown}; " if unknown else "")
                + "verl calls it as fn(data_source=, solution_str=, ground_truth=, "
                "extra_info=, **reward_options)"
            )
        return
    # The trainer passes data_source and response_length to every call.
    probe: dict[str, Any] = {"data_source": "", "response_length": 0}
    probe |= {k: None for k in (*READABLE, "context") if k in named}
    try:
        sig.bind("", "", **probe, **dict(options))
    except TypeError as exc:
        raise TypeError(
            f"reward {label!r} cannot be called as fn(response, ground_truth, "
            f"data_source=, response_length=, **reward_options) ({exc}); write it so, or "
            f"with verl's signature fn(data_source, solution_str, ground_truth, "
            f"extra_info=None) (see docs/rewards.md)"
        ) from None
