"""``by_data_source``: each row scored by the scorer its ``data_source`` names, as
verl 0.9.1's default reward (``default_compute_score``) does.

===============================================================  ==============================
``data_source``                                                  scorer
===============================================================  ==============================
``openai/gsm8k``                                                 ``gsm8k``, ``method="verl"``
``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``,      ``hendrycks_math``
``HuggingFaceH4/MATH-500``
``math_dapo``, ``math``, ``math_dapo_reasoning``, ``aime*``      ``math_dapo``
``numina_aops_forum``, ``numina_synthetic_math``,                ``prime_math``
``numina_amc_aime``, ``numina_synthetic_amc``, ``numina_cn_k12``,
``numina_olympiads``
``hiyouga/geometry3k``                                           ``geo3k``
``gsm8k`` (rlkit's shared set)                                   ``gsm8k``, ``method="strict"``
``math500`` (rlkit's shared set)                                 ``math``
``dapo_math_17k`` (rlkit's shared set)                           ``math_dapo``
===============================================================  ==============================

``aime*`` is any source starting with ``aime`` (case-sensitive, as verl's), so rlkit's
``aime2024`` and ``aime2025`` presets are scored by ``math_dapo``. The other sources are
matched exactly.

``DataConfig.reward_options`` reach the chosen scorer (a ``method`` option replaces the
table's). A source with no scorer is a configuration error: the trainer and
``rlkit eval`` check every row's source before any model loads
(:func:`check_data_sources`), and name the source and the setting.

``default``, ``DataConfig.reward``'s default, is the same table with one fallback: a row
whose ``data_source`` has no scorer is scored by ``gsm8k`` (``method="strict"``), rlkit's
reward for a numeric answer. Its ground truth must then read as a number; a row whose
does not stops the run before any model loads, naming the source and the setting.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rlkit.registry import REWARDS

logger = logging.getLogger(__name__)

#: verl 0.9.1's ``default_compute_score`` table (its math and GSM8K sources).
_VERL: dict[str, tuple[str, dict[str, Any]]] = {
    "openai/gsm8k": ("gsm8k", {"method": "verl"}),
    **dict.fromkeys(
        ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"),
        ("hendrycks_math", {}),
    ),
    **dict.fromkeys(("math_dapo", "math", "math_dapo_reasoning"), ("math_dapo", {})),
    **dict.fromkeys(
        (
            "numina_aops_forum",
            "numina_synthetic_math",
            "numina_amc_aime",
            "numina_synthetic_amc",
            "numina_cn_k12",
            "numina_olympiads",
        ),
        ("prime_math", {}),
    ),
    "hiyouga/geometry3k": ("geo3k", {}),
}
#: rlkit's own shared-set sources (``rlkit.data.SHARED_DATASETS``), which verl does not name.
_RLKIT: dict[str, tuple[str, dict[str, Any]]] = {
    "gsm8k": ("gsm8k", {"method": "strict"}),
    "math500": ("math", {}),
    # DAPO-Math-17k's prompts ask for a last line "Answer: ...": verl's DAPO rule reads it.
    "dapo_math_17k": ("math_dapo", {}),
}
_EXACT: dict[str, tuple[str, dict[str, Any]]] = {**_VERL, **_RLKIT}
#: Sources matched by their start (case-sensitive, as verl's ``startswith``).
_PREFIXES: tuple[tuple[str, str], ...] = (("aime", "math_dapo"),)
#: ``default``'s scorer for a source the table does not know.
FALLBACK: tuple[str, dict[str, Any]] = ("gsm8k", {"method": "strict"})


class UnknownDataSourceError(ValueError):
    """A row's ``data_source`` has no scorer under ``by_data_source``."""


def scorer_for(data_source: str) -> tuple[str, dict[str, Any]] | None:
    """``(registered reward name, its options)`` for ``data_source``, or ``None``."""
    if data_source in _EXACT:
        return _EXACT[data_source]
    for prefix, name in _PREFIXES:
        if data_source.startswith(prefix):
            return name, {}
    return None


def _known() -> str:
    return ", ".join(sorted(_EXACT)) + ", " + ", ".join(f"{p}*" for p, _ in _PREFIXES)


def _unknown(data_source: str) -> UnknownDataSourceError:
    return UnknownDataSourceError(
        f"DataConfig.reward = 'by_data_source' has no scorer for data_source "
        f"{data_source!r} (known: {_known()}); set DataConfig.reward to a reward for it "
        f"(`rlkit list rewards`, or 'path/to/file.py:compute_score')"
    )


def check_data_sources(
    sources: Sequence[str], ground_truths: Sequence[str] = (), *, reward: str = "by_data_source"
) -> None:
    """Say once per source (not once per row) which scorer its rows get; raise for a
    row that has none. Called when a dataset loads, before any model does.

    Args:
        sources: every row's ``data_source``.
        ground_truths: every row's ground truth (``default``: the rows that fall back to
            ``gsm8k`` must hold numbers).
        reward: ``by_data_source`` (a source without a scorer is an error) or
            ``default`` (it falls back to :data:`FALLBACK`).

    Raises:
        UnknownDataSourceError: naming the first source without a scorer (``default``: the
            first fallback row whose ground truth is not a number).
    """
    counts = Counter(sources)
    for source, count in counts.items():
        chosen = scorer_for(source)
        if chosen is None and reward != "default":
            raise _unknown(source)
        name, options = chosen or FALLBACK
        why = "" if chosen else " (no scorer of its own: the default for numeric answers)"
        line = (
            f"rlkit: {reward} reward: {count} {source!r} rows are scored by {name} {options}{why}"
        )
        logger.info(line)
        if os.environ.get("RANK", "0") == "0":  # one process of a launch says it
            print(line, flush=True)
    fallback = {source for source in counts if scorer_for(source) is None}
    if fallback:  # only reached with reward="default"
        _check_fallback_answers(sources, ground_truths, fallback)


def _check_fallback_answers(
    sources: Sequence[str], ground_truths: Sequence[str], fallback: set[str]
) -> None:
    """The rows ``default`` scores by ``gsm8k`` must have numeric ground truths: a MATH
    answer like ``\\frac{1}{2}`` under an unknown ``data_source`` would otherwise stop the
    run at its first reward call, blaming the data."""
    from rewards.gsm8k import extract_answer, parse_number

    for source, truth in zip(sources, ground_truths, strict=False):
        if source not in fallback:
            continue
        text = str(truth)
        if parse_number(text) is None and extract_answer(text, "strict") is None:
            raise UnknownDataSourceError(
                f"DataConfig.reward is not set, and data_source {source!r} has no scorer "
                f"(known: {_known()}), so its rows fall back to gsm8k, which needs a number; "
                f"a {source!r} row's ground truth is {text!r:.60}. Set DataConfig.reward to "
                f"the reward for this data (`rlkit list rewards`: math, exact_match, "
                f"'path/to/file.py:compute_score'), or give the rows a known data_source"
            )


@REWARDS.register(
    "by_data_source",
    summary="per-row scorer chosen by data_source, as verl 0.9.1's default_compute_score",
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
    return _score(chosen, response, ground_truth, data_source, extra)


@REWARDS.register(
    "default",
    summary="by_data_source where the row's data_source has a scorer, else gsm8k (strict)",
)
def default(
    response: str, ground_truth: str, *, data_source: str = "", **extra: Any
) -> float | dict[str, Any]:
    """``DataConfig.reward``'s default: the scorer ``data_source`` names, or
    :data:`FALLBACK` for a source without one; arguments and result as
    :func:`by_data_source`'s."""
    return _score(scorer_for(data_source) or FALLBACK, response, ground_truth, data_source, extra)


def _score(
    chosen: tuple[str, dict[str, Any]],
    response: str,
    ground_truth: str,
    data_source: str,
    extra: dict[str, Any],
) -> float | dict[str, Any]:
    name, options = chosen
    return REWARDS.get(name)(
        response, ground_truth, data_source=data_source, **{**options, **extra}
    )
