"""Compose a correctness reward with shaping terms: score = base + sum of shaping.

Two equivalent spellings::

    reward = rewards.compose(
        "gsm8k",
        shaping=["format", ("overlong_buffer", {"max_response_length": 1024, "buffer_length": 256})],
    )
    reward(response, "18", response_length=900)

    # or, from a config that names rewards: the registered "combined" reward
    rewards.get("combined")(response, "18", base="gsm8k", shaping=[...], response_length=900)

Each term is a registered reward (or ``"pkg.module:function"``, or
``"path/to/file.py:function"``) with the usual per-response contract; its static
options come from the spec, the per-sample fields (``response_length``, ...) from the
call, and a static option wins over a per-sample field of the same name. Shaping terms
carry their own scale (``penalty_factor``, ``coef``, ``score``), so there are no extra
weights (:mod:`rewards.weighted` weighs its terms).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rewards.batched_reward import per_response_reward
from rlkit.registry import REWARDS

ShapingSpec = str | tuple[str, Mapping[str, Any]]


def _parse_shaping(shaping: Sequence[ShapingSpec]) -> list[tuple[str, dict[str, Any]]]:
    if isinstance(shaping, str):
        shaping = [shaping]
    parsed = []
    for item in shaping:
        if isinstance(item, str):
            parsed.append((item, {}))
        elif isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[1], Mapping):
            parsed.append((str(item[0]), dict(item[1])))
        else:
            raise TypeError(
                f"bad shaping term {item!r}: use a reward name or (name, {{option: value}})"
            )
    return parsed


def _record(out: dict[str, Any], name: str, value: Any, *, is_base: bool) -> float:
    """Store a term's score and extra fields in ``out``; return the score.

    The base reward's extra fields (``acc``, ``pred``) keep their names, so
    accuracy is logged the same with or without shaping; a shaping term's
    fields become ``"<term>/<field>"``.
    """
    key, n = name, 2
    while key in out:  # the same term twice: "format", "format#2"
        key, n = f"{name}#{n}", n + 1
    fields = dict(value) if isinstance(value, Mapping) else {"score": value}
    if "score" not in fields:
        raise ValueError(f"reward {name!r} returned a dict without a 'score' key")
    score = float(fields.pop("score"))
    out[key] = score
    out.update(fields if is_base else {f"{key}/{field}": v for field, v in fields.items()})
    return score


def check_options(options: Mapping[str, Any]) -> None:
    """Check ``DataConfig.reward_options`` of ``combined`` before any work: ``base`` and
    every shaping term name a per-response reward."""
    if "base" not in options:
        raise ValueError("the 'combined' reward needs the option 'base' (e.g. 'gsm8k')")
    for name in [
        options["base"],
        *(name for name, _ in _parse_shaping(options.get("shaping", ()))),
    ]:
        per_response_reward(name, used_by="combined")


@REWARDS.register(
    "combined",
    summary="a correctness reward plus shaping terms (summed)",
    check_options=check_options,
)
def combined(
    response: str,
    ground_truth: str,
    *,
    base: str,
    base_options: Mapping[str, Any] | None = None,
    shaping: Sequence[ShapingSpec] = (),
    **extra: Any,
) -> dict[str, Any]:
    """Sum a correctness reward and shaping terms, reporting each part.

    Args:
        response: the model's response text.
        ground_truth: the reference answer.
        base: name of the correctness reward (``"gsm8k"``, ``"math"``, a dotted path).
        base_options: static options of ``base`` (e.g. ``{"method": "flexible"}``).
        shaping: terms added to the score, each a reward name or
            ``(name, options)``, e.g. ``("overlong_buffer", {"max_response_length":
            1024, "buffer_length": 256})``.
        **extra: per-sample fields passed to every term (``response_length``, ...).

    Returns:
        ``{"score": total, base: base_score, <term>: term_score, ...}``, the
        base's extra fields as they are (``acc``, ``pred``) and a shaping term's
        as ``"<term>/<field>"``.
    """
    out: dict[str, Any] = {}
    call = {**extra, **(base_options or {})}
    fn = per_response_reward(base, used_by="combined")
    total = _record(out, base, fn(response, ground_truth, **call), is_base=True)
    for name, options in _parse_shaping(shaping):
        term = per_response_reward(name, used_by="combined")(
            response, ground_truth, **{**extra, **options}
        )
        total += _record(out, name, term, is_base=False)
    return {"score": total, **out}


def compose(
    base: str,
    shaping: Sequence[ShapingSpec] = (),
    base_options: Mapping[str, Any] | None = None,
) -> Callable[..., dict[str, Any]]:
    """A reward that is ``base`` plus ``shaping`` (see :func:`combined`).

    Names are checked now, so a typo fails when the reward is built rather than
    on the first batch. The result is picklable and so usable with
    ``score_batch(..., num_workers >= 1)``.

    Args:
        base: name of the correctness reward.
        shaping: shaping terms, each a name or ``(name, options)``.
        base_options: static options of ``base``.

    Returns:
        ``fn(response, ground_truth, **extra) -> dict`` with the reward contract.
    """
    terms = _parse_shaping(shaping)
    for name in [base, *(name for name, _ in terms)]:
        per_response_reward(name, used_by="combined")
    return functools.partial(
        combined, base=base, base_options=dict(base_options or {}), shaping=tuple(terms)
    )
