"""Several rewards combined by weights: score = sum of weight * term score.

From a config that names one reward::

    DataConfig.reward = "weighted"
    DataConfig.reward_options = {"terms": [
        {"reward": "gsm8k", "weight": 1.0},
        {"reward": "path/to/fmt.py:fmt", "weight": 0.2, "options": {"tag": "answer"}},
    ]}

Each term is a per-response reward (a registered name, ``"pkg.module:function"`` or
``"path/to/file.py:function"``) with its own static ``options``; it receives the
per-sample fields and the reward-context fields its signature names, as it would
alone. The result holds every term's unweighted score under ``"weighted/<name>"``
(``<name>``: the term's ``name``, else the registered name or the function's name)
and its extra fields under ``"weighted/<name>/<field>"``, so the trainer logs each
term's mean (``reward/weighted/<name>/mean``); ``acc`` is the first term's ``acc``
that reports one, so accuracy means correctness, not the weighted score.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rewards.batched_reward import per_response_reward
from rewards.context import RewardContext, context_kwargs, fields_read
from rlkit.registry import REWARDS

PREFIX = "weighted"
"""Result keys of the terms: ``"weighted/<name>"``."""

_TERM_KEYS = ("reward", "weight", "options", "name")


@dataclass(frozen=True)
class Term:
    """One weighted term: ``weight * reward(response, ground_truth, **options)``."""

    name: str
    reward: str
    weight: float = 1.0
    options: Mapping[str, Any] = field(default_factory=dict)


def _default_name(reward: str) -> str:
    # "gsm8k" -> "gsm8k"; "pkg.mod:fn" and "path/to/fmt.py:fmt" -> the function's name.
    return reward.rpartition(":")[2].rpartition(".")[2] if ":" in reward else reward


def parse_terms(terms: Sequence[Mapping[str, Any] | str]) -> list[Term]:
    """Check the ``terms`` option and return its :class:`Term` s.

    Each term is a dict with ``reward`` (required), ``weight`` (a finite number,
    default 1.0), ``options`` (a dict of static options, default ``{}``) and ``name``
    (the key of its score, default the reward's name); a bare string is a term of
    weight 1.0.

    Raises:
        TypeError, ValueError: a term is malformed, or two terms have the same name.
    """
    if isinstance(terms, str | Mapping) or not isinstance(terms, Sequence) or not terms:
        raise TypeError(
            f"the 'weighted' reward needs terms=[{{'reward': name, 'weight': w}}, ...], "
            f"a non-empty list; got {terms!r}"
        )
    parsed: list[Term] = []
    for i, item in enumerate(terms):
        spec: Mapping[str, Any] = {"reward": item} if isinstance(item, str) else item
        if not isinstance(spec, Mapping) or not isinstance(spec.get("reward"), str):
            raise TypeError(
                f"weighted term {i} is {item!r}: use a reward name or "
                f"{{'reward': name, 'weight': w, 'options': {{...}}, 'name': key}}"
            )
        unknown = sorted(set(spec) - set(_TERM_KEYS))
        if unknown:
            raise ValueError(
                f"weighted term {i} ({spec['reward']!r}) has unknown keys {unknown}; "
                f"a term takes {', '.join(_TERM_KEYS)}"
            )
        weight = spec.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
            raise TypeError(
                f"weighted term {i} ({spec['reward']!r}): weight {weight!r} is not a number"
            )
        if not math.isfinite(weight):
            raise ValueError(
                f"weighted term {i} ({spec['reward']!r}): weight {weight} is not finite"
            )
        options = spec.get("options") or {}
        if not isinstance(options, Mapping):
            raise TypeError(
                f"weighted term {i} ({spec['reward']!r}): options must be a dict, got {options!r}"
            )
        name = spec.get("name") or _default_name(spec["reward"])
        if not isinstance(name, str):
            raise TypeError(f"weighted term {i}: name must be a string, got {name!r}")
        parsed.append(Term(name, spec["reward"], float(weight), dict(options)))
    names = [t.name for t in parsed]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"weighted terms {twice} are named twice; give each a distinct 'name' (its "
            f"score is logged as 'weighted/<name>')"
        )
    return parsed


def check_options(options: Mapping[str, Any]) -> None:
    """Check ``DataConfig.reward_options`` of ``weighted`` before any work: the terms'
    shape and that every term's reward resolves to a per-response reward."""
    for term in parse_terms(options.get("terms", ())):
        per_response_reward(term.reward, used_by="weighted")


@functools.lru_cache(maxsize=256)
def _reads(fn: Callable[..., Any]) -> tuple[str, ...]:
    return fields_read(fn)  # once per function: a signature costs more than most rewards


def _reads_of(fn: Callable[..., Any]) -> tuple[str, ...]:
    try:
        return _reads(fn)
    except TypeError:  # an unhashable callable
        return fields_read(fn)


def _split(name: str, value: Any) -> tuple[float, dict[str, Any]]:
    fields = dict(value) if isinstance(value, Mapping) else {"score": value}
    if "score" not in fields:
        raise ValueError(f"weighted term {name!r} returned a dict without a 'score' key")
    score = fields.pop("score")
    if isinstance(score, str | bytes) or not hasattr(score, "__float__"):
        raise TypeError(f"weighted term {name!r} returned {type(score).__name__}; expected a float")
    return float(score), fields


@REWARDS.register(
    "weighted",
    summary="a weighted sum of rewards, each term's score logged",
    check_options=check_options,
)
def weighted(
    response: str,
    ground_truth: str,
    *,
    terms: Sequence[Mapping[str, Any] | str],
    context: RewardContext | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Score = sum over terms of ``weight * score``; every term reported on its own.

    Args:
        response: the model's response text.
        ground_truth: the reference answer.
        terms: ``[{"reward": name, "weight": w, "options": {...}, "name": key}, ...]``
            (see :func:`parse_terms`).
        context: the :class:`~rewards.context.RewardContext` (passed by
            ``score_batch``); each term gets the fields its own signature names.
        **extra: per-sample fields passed to every term (``response_length``, ...);
            a term's ``options`` win over them.

    Returns:
        ``{"score": total, "weighted/<name>": term score, "weighted/<name>/<field>":
        ..., "acc": ...}``: ``acc`` only when a term reports one (the first that does).

    Raises:
        RuntimeError: a term raised (the message names the term and the exception).
    """
    out: dict[str, Any] = {}
    total = 0.0
    acc: Any = None
    for term in parse_terms(terms):
        fn = per_response_reward(term.reward, used_by="weighted")
        reads = context_kwargs(_reads_of(fn), context) if context is not None else {}
        try:
            value = fn(response, ground_truth, **{**extra, **reads, **term.options})
        except Exception as exc:
            raise RuntimeError(
                f"weighted term {term.name!r} ({term.reward}) raised {type(exc).__name__}: {exc}"
            ) from exc
        score, fields = _split(term.name, value)
        total += term.weight * score
        out[f"{PREFIX}/{term.name}"] = score
        out.update({f"{PREFIX}/{term.name}/{k}": v for k, v in fields.items()})
        if acc is None and "acc" in fields:
            acc = fields["acc"]
    if acc is not None:
        out["acc"] = acc
    return {"score": total, **out}
