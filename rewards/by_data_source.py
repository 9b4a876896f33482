"""``by_data_source``: each row scored by the scorer its ``data_source`` names, as
verl's default reward does.

=============================================================  ==========================
``data_source``                                                scorer
=============================================================  ==========================
``openai/gsm8k``                                               ``gsm8k``, ``method="verl"``
``gsm8k`` (rlkit's shared set)                                 ``gsm8k``, ``method="strict"``
``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``,    ``math``
``HuggingFaceH4/MATH-500``, ``math500``, ``math``,
``math_dapo``, ``dapo_math_17k``, ``aime*``, ``numina_*``
=============================================================  ==========================

``DataConfig.reward_options`` reach the chosen scorer (a ``method`` option replaces the
table's). A source with no scorer is a configuration error: the trainer and
``rlkit eval`` check every row's source before any model loads
(:func:`check_data_sources`), and name the source and the setting.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable
from typing import Any

from rlkit.registry import REWARDS

logger = logging.getLogger(__name__)

_EXACT: dict[str, tuple[str, dict[str, Any]]] = {
    "openai/gsm8k": ("gsm8k", {"method": "verl"}),
    "gsm8k": ("gsm8k", {"method": "strict"}),
    **{
        source: ("math", {})
        for source in (
            "lighteval/MATH",
            "DigitalLearningGmbH/MATH-lighteval",
            "HuggingFaceH4/MATH-500",
            "math500",
            "math",
            "math_dapo",
            "dapo_math_17k",
        )
    },
}
_PREFIXES: tuple[tuple[str, str], ...] = (("aime", "math"), ("numina_", "math"))


class UnknownDataSourceError(ValueError):
    """A row's ``data_source`` has no scorer under ``by_data_source``."""


def scorer_for(data_source: str) -> tuple[str, dict[str, Any]] | None:
    """``(registered reward name, its options)`` for ``data_source``, or ``None``."""
    if data_source in _EXACT:
        return _EXACT[data_source]
    for prefix, name in _PREFIXES:
        if data_source.lower().startswith(prefix):
            return name, {}
    return None


def _unknown(data_source: str) -> UnknownDataSourceError:
    known = ", ".join(sorted(_EXACT)) + ", aime*, numina_*"
    return UnknownDataSourceError(
        f"DataConfig.reward = 'by_data_source' has no scorer for data_source "
        f"{data_source!r} (known: {known}); set DataConfig.reward to a reward for it "
        f"(`rlkit list rewards`, or 'path/to/file.py:compute_score')"
    )


def check_data_sources(sources: Iterable[str]) -> None:
    """Say once per source (not once per row) which scorer its rows get; raise for a
    source with none. Called when a dataset loads, before any model does.

    Raises:
        UnknownDataSourceError: naming the first source without a scorer.
    """
    counts = Counter(sources)
    for source, count in counts.items():
        chosen = scorer_for(source)
        if chosen is None:
            raise _unknown(source)
        name, options = chosen
        line = f"rlkit: by_data_source: {count} {source!r} rows are scored by {name} {options}"
        logger.info(line)
        if os.environ.get("RANK", "0") == "0":  # one process of a launch says it
            print(line, flush=True)


@REWARDS.register(
    "by_data_source",
    summary="per-row scorer chosen by data_source, as verl's default (gsm8k, MATH, AIME)",
)
def by_data_source(
    response: str, ground_truth: str, *, data_source: str = "", **extra: Any
) -> float | dict[str, Any]:
    """Score ``response`` with the scorer ``data_source`` names (module docstring).

    Args:
        response: the model's response text.
        ground_truth: the row's reference answer.
        data_source: the row's data source.
        **extra: the other per-row fields and ``DataConfig.reward_options``, passed on.

    Returns:
        What the chosen scorer returns.

    Raises:
        UnknownDataSourceError: ``data_source`` has no scorer.
    """
    chosen = scorer_for(data_source)
    if chosen is None:
        raise _unknown(data_source)
    name, options = chosen
    return REWARDS.get(name)(
        response, ground_truth, data_source=data_source, **{**options, **extra}
    )
