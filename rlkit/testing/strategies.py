"""Hypothesis strategies for what advantage estimators and policy losses consume.

Every strategy draws small tensors (a handful of rows and tokens). Hypothesis
draws the *structure* — B, T, each row's length, its interior mask-0 span,
group labels, the kind of values — and a seed; a ``torch.Generator`` with that
seed fills the values, of a drawn kind (:data:`VALUE_KINDS`: 0/1, quarters,
normal rounded to 3 decimals, awkward decimals). So a draw costs a few dozen
hypothesis choices however large the tensors, and a failure shrinks to few
rows, short rows, one group and the simplest kind of values. Values have few
decimals, so a printed counterexample reproduces exactly.

All tensors are on the CPU, float64 unless a ``dtype`` is given, masks bool
unless ``mask_dtypes`` says otherwise. Narrow a strategy with its keywords, e.g.
``estimator_inputs(max_rows=4, interior_masks=False, reward_kind="outcome")``.

Layout conventions (the trainer's):

* a response occupies a left-aligned run of ``n_b`` tokens (right padding), so
  rows are ragged; ``n_b = 0`` is an empty (fully masked) row;
* with ``interior_masks=True`` rows of three or more tokens may have one
  interior mask-0 span (never their first or last token), as tool or user
  tokens inside a multi-turn trajectory produce;
* rewards are 0 on mask-0 tokens (where a reward manager never puts one);
  outcome rewards sit on each response's last valid token;
* group ids are int64 tensors: dense (0..G-1 in contiguous blocks), gappy
  (arbitrary, far-apart ids), shuffled (rows of a group interleaved) or
  singletons (every row its own group); groups of one row occur in all.

Functions taking ``mask`` return a strategy for tensors matching that mask:
use them inside ``@st.composite`` (``draw(token_rewards(mask))``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

#: The group-id layouts :func:`group_indices` draws from.
LAYOUTS = ("dense", "gappy", "shuffled", "singletons")
#: What a padded log-prob may hold in :func:`log_prob_pairs` (the losses must ignore it).
PADDING = ("zero", "garbage", "-inf")
REWARD_KINDS = ("outcome", "dense")
#: How reward values are drawn, simplest first (a failure shrinks towards the first):
#: 0/1 (ties, all-equal groups), quarters in [-4, 4], normal(0, 2) rounded to 3
#: decimals, and decimals that are not binary fractions (0.1 + 0.2 != 0.3).
VALUE_KINDS = ("binary", "grid", "normal", "awkward")
#: How advantages are drawn: all 0, quarters in [-3, 3], or normal(0, 1.5) to 3 decimals.
ADVANTAGE_KINDS = ("zero", "grid", "normal")

_AWKWARD = (0.1, 0.2, 0.3, 1 / 3, 0.7, 1e-3, 2.5e2)


_DISCOUNTS = st.sampled_from([(1.0, 1.0), (0.9, 1.0), (1.0, 0.95), (0.9, 0.95)])


def _composite(fn: Callable[..., Any]) -> Any:
    """``st.composite(fn)``, plus ``.draw_in(draw, ...)``: ``fn``'s draws inside another
    composite strategy, without building a nested strategy per draw (much cheaper)."""
    strategy = st.composite(fn)  # keeps fn's name, docstring and keywords
    strategy.draw_in = fn
    return strategy


def seeds() -> SearchStrategy[int]:
    """A seed for the ``torch.Generator`` that fills a tensor (shrinks towards 0)."""
    return st.integers(0, 2**32 - 1)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rounded(x: torch.Tensor, decimals: int) -> torch.Tensor:
    # Values with few decimals print short (repr round-trips) and reproduce exactly.
    scale = 10.0**decimals
    return torch.round(x * scale) / scale + 0.0  # + 0.0: no -0.0


def fill_values(
    kind: str, shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """A tensor of ``shape`` filled by ``kind`` (``VALUE_KINDS`` or ``ADVANTAGE_KINDS``) from ``seed``."""
    gen = _generator(seed)
    if kind == "zero":
        out = torch.zeros(shape, dtype=torch.float64)
    elif kind == "binary":
        out = torch.randint(0, 2, shape, generator=gen).to(torch.float64)
    elif kind == "grid":
        out = torch.randint(-16, 17, shape, generator=gen).to(torch.float64) / 4
    elif kind == "normal":
        out = _rounded(2.0 * torch.randn(shape, generator=gen, dtype=torch.float64), 3)
    elif kind == "awkward":
        table = torch.tensor(_AWKWARD, dtype=torch.float64)
        out = table[torch.randint(0, len(_AWKWARD), shape, generator=gen)]
    else:
        raise ValueError(f"unknown value kind {kind!r}; known: {VALUE_KINDS + ADVANTAGE_KINDS}")
    return out.to(dtype)


@_composite
def garbage_like(
    draw: Any, shape: tuple[int, ...], *, max_abs: float = 100.0, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """A tensor of finite garbage in ±max_abs (2 decimals): what must be ignored at mask-0 positions."""
    gen = _generator(draw(seeds()))
    values = (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * max_abs
    return _rounded(values, 2).to(dtype)


def _check_subset(name: str, chosen: tuple[str, ...], known: tuple[str, ...]) -> None:
    if not chosen or set(chosen) - set(known):
        raise ValueError(f"{name} must be a non-empty subset of {known}, got {chosen}")


def _rows_and_length(
    draw: Any,
    rows: int | None,
    length: int | None,
    min_rows: int,
    max_rows: int,
    min_len: int,
    max_len: int,
) -> tuple[int, int]:
    b = rows if rows is not None else draw(st.integers(min_rows, max_rows))
    t = length if length is not None else draw(st.integers(min_len, max_len))
    return b, t


@_composite
def response_masks(
    draw: Any,
    *,
    rows: int | None = None,
    length: int | None = None,
    min_rows: int = 1,
    max_rows: int = 8,
    min_len: int = 1,
    max_len: int = 6,
    interior_masks: bool = True,
    empty_rows: bool = True,
    uniform_lengths: bool = False,
    dtype: torch.dtype = torch.bool,
) -> torch.Tensor:
    """(B, T) response masks: left-aligned ragged runs, optional interior mask-0 spans.

    Args:
        rows, length: fix B or T; otherwise B in [min_rows, max_rows], T in
            [min_len, max_len].
        interior_masks: rows of >= 3 tokens may get one mask-0 span strictly
            inside their run (multi-turn tool / user tokens); False: none.
        empty_rows: allow fully masked rows (n_b = 0); False: every row has a token.
        uniform_lengths: every non-empty row has the same run length n (for the
            ``seq-mean-token-mean`` checks); interior spans are then off.
        dtype: torch.bool, or a float / int dtype for 0/1 masks.

    Returns:
        (B, T) tensor of ``dtype``.
    """
    b, t = _rows_and_length(draw, rows, length, min_rows, max_rows, min_len, max_len)
    low = 0 if empty_rows or t == 0 else 1
    if uniform_lengths:
        n = draw(st.integers(min(max(low, 1), t), t))
        present = (
            draw(st.lists(st.booleans(), min_size=b, max_size=b)) if empty_rows else [True] * b
        )
        lengths = [n if keep else 0 for keep in present]
    else:
        lengths = draw(st.lists(st.integers(low, t), min_size=b, max_size=b))
    rows_valid = [[col < n for col in range(t)] for n in lengths]
    if interior_masks and not uniform_lengths and draw(st.booleans()):
        rng = random.Random(draw(seeds()))
        for row, n in enumerate(lengths):
            if n >= 3 and rng.random() < 0.5:
                start = rng.randrange(1, n - 1)
                width = rng.randrange(1, n - start)
                rows_valid[row][start : start + width] = [False] * width
    mask = torch.tensor(rows_valid, dtype=torch.bool).reshape(b, t)
    return mask.to(dtype)


@_composite
def group_indices(
    draw: Any,
    rows: int | None = None,
    *,
    min_rows: int = 1,
    max_rows: int = 8,
    max_groups: int = 4,
    layouts: tuple[str, ...] = LAYOUTS,
) -> torch.Tensor:
    """(B,) int64 group ids in one of ``layouts`` (see the module docstring).

    Args:
        rows: B (else drawn in [min_rows, max_rows]).
        max_groups: at most this many distinct groups (except ``singletons``: B).
        layouts: a subset of ``LAYOUTS``; each draw picks one. Groups of one row
            occur in every layout.
    """
    _check_subset("layouts", tuple(layouts), LAYOUTS)
    b = rows if rows is not None else draw(st.integers(min_rows, max_rows))
    layout = draw(st.sampled_from(tuple(layouts)))
    if layout == "singletons":
        return torch.arange(b, dtype=torch.long)
    labels = draw(st.lists(st.integers(0, max(max_groups, 1) - 1), min_size=b, max_size=b))
    if layout == "dense":  # 0..G-1, each group a contiguous block of rows
        dense = {label: i for i, label in enumerate(sorted(set(labels)))}
        labels = sorted(dense[label] for label in labels)
    elif layout == "gappy":  # far-apart, possibly negative ids
        gen = _generator(draw(seeds()))
        ids = (torch.randint(1, 1000, (max(max_groups, 1),), generator=gen).cumsum(0) - 5).tolist()
        labels = [ids[label] for label in labels]
    return torch.tensor(labels, dtype=torch.long)


@_composite
def token_rewards(
    draw: Any,
    mask: torch.Tensor,
    *,
    kind: str | None = None,
    value_kinds: tuple[str, ...] = VALUE_KINDS,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """(B, T) token-level rewards for ``mask``, 0 on mask-0 tokens.

    Args:
        mask: (B, T) response mask.
        kind: ``"outcome"`` (one reward on each response's last valid token),
            ``"dense"`` (a reward on every valid token) or None (either).
        value_kinds: a subset of :data:`VALUE_KINDS` the values are drawn from.
    """
    kind = kind if kind is not None else draw(st.sampled_from(REWARD_KINDS))
    if kind not in REWARD_KINDS:
        raise ValueError(f"kind must be one of {REWARD_KINDS} or None, got {kind!r}")
    _check_subset("value_kinds", tuple(value_kinds), VALUE_KINDS)
    values = fill_values(
        draw(st.sampled_from(tuple(value_kinds))), tuple(mask.shape), draw(seeds())
    )
    valid = mask.bool()
    if kind == "outcome":
        valid = valid & (valid.cumsum(-1) == valid.sum(-1, keepdim=True))  # last valid token
    return torch.where(valid, values, 0.0).to(dtype)


@_composite
def critic_values(
    draw: Any,
    mask: torch.Tensor,
    *,
    value_kinds: tuple[str, ...] = VALUE_KINDS,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """(B, T) critic values V_t on every position (mask-0 ones included)."""
    _check_subset("value_kinds", tuple(value_kinds), VALUE_KINDS)
    kind = draw(st.sampled_from(tuple(value_kinds)))
    return fill_values(kind, tuple(mask.shape), draw(seeds()), dtype)


@_composite
def token_inputs(
    draw: Any,
    mask: torch.Tensor,
    *,
    value_kinds: tuple[str, ...] = VALUE_KINDS,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """(B, T) a declared extra input of an estimator (e.g. PRIME's ``process_rewards``).

    A value on every valid token, 0 on mask-0 tokens (as a model's token scores are
    masked); the properties that need garbage there add it themselves.
    """
    _check_subset("value_kinds", tuple(value_kinds), VALUE_KINDS)
    kind = draw(st.sampled_from(tuple(value_kinds)))
    values = fill_values(kind, tuple(mask.shape), draw(seeds()))
    return torch.where(mask.bool(), values, 0.0).to(dtype)


@_composite
def reward_baselines(
    draw: Any,
    rows: int,
    *,
    value_kinds: tuple[str, ...] = VALUE_KINDS,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """(B,) reward of each prompt's greedy response (ReMax's baseline)."""
    _check_subset("value_kinds", tuple(value_kinds), VALUE_KINDS)
    kind = draw(st.sampled_from(tuple(value_kinds)))
    return fill_values(kind, (rows,), draw(seeds()), dtype)


@_composite
def estimator_inputs(
    draw: Any,
    *,
    min_rows: int = 1,
    max_rows: int = 8,
    min_len: int = 1,
    max_len: int = 6,
    max_groups: int = 4,
    interior_masks: bool = True,
    empty_rows: bool = True,
    reward_kind: str | None = None,
    value_kinds: tuple[str, ...] = VALUE_KINDS,
    layouts: tuple[str, ...] = LAYOUTS,
    dtype: torch.dtype = torch.float64,
    mask_dtypes: tuple[torch.dtype, ...] = (torch.bool,),
    values: bool = True,
    baselines: bool = True,
    discounts: bool = True,
    extra_inputs: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Keyword inputs of an advantage estimator.

    Returns:
        dict with ``token_level_rewards`` (B, T) ``dtype``; ``response_mask``
        (B, T) (one of ``mask_dtypes``); ``index`` (B,) int64; ``values`` (B, T)
        or None (``values=False``); ``reward_baselines`` (B,) or None
        (``baselines=False``); ``gamma`` and ``lam`` (floats); and one (B, T)
        :func:`token_inputs` tensor per name in ``extra_inputs``.

    Args:
        min_rows, max_rows, min_len, max_len: bounds of B and T.
        max_groups, layouts: see :func:`group_indices`.
        interior_masks, empty_rows: see :func:`response_masks`.
        reward_kind: ``"outcome"``, ``"dense"`` or None (either).
        value_kinds: kinds of reward (and value, baseline) values, a subset of
            :data:`VALUE_KINDS`.
        dtype: of rewards, values and baselines; mask_dtypes: the mask's, one
            drawn per batch (bool and 0/1 floats are both legal).
        values, baselines: draw ``values`` / ``reward_baselines`` (else None).
        discounts: draw gamma in {1, 0.9} and lam in {1, 0.95} (else both 1).
        extra_inputs: names of the (B, T) inputs the estimator declares with
            ``inputs=(...)`` at registration (e.g. ``("process_rewards",)``).
    """
    mask = response_masks.draw_in(
        draw,
        min_rows=min_rows,
        max_rows=max_rows,
        min_len=min_len,
        max_len=max_len,
        interior_masks=interior_masks,
        empty_rows=empty_rows,
    )
    b = mask.shape[0]
    rewards = token_rewards.draw_in(
        draw, mask, kind=reward_kind, value_kinds=value_kinds, dtype=dtype
    )
    index = group_indices.draw_in(draw, b, max_groups=max_groups, layouts=layouts)
    mask_dtype = draw(st.sampled_from(tuple(mask_dtypes)))
    return {
        "token_level_rewards": rewards,
        "response_mask": mask if mask_dtype == torch.bool else mask.to(mask_dtype),
        "index": index,
        "values": critic_values.draw_in(draw, mask, value_kinds=value_kinds, dtype=dtype)
        if values
        else None,
        "reward_baselines": reward_baselines.draw_in(draw, b, value_kinds=value_kinds, dtype=dtype)
        if baselines
        else None,
        **dict(zip(("gamma", "lam"), draw(_DISCOUNTS) if discounts else (1.0, 1.0))),
        **{
            name: token_inputs.draw_in(draw, mask, value_kinds=value_kinds, dtype=dtype)
            for name in extra_inputs
        },
    }


@_composite
def log_prob_pairs(
    draw: Any,
    mask: torch.Tensor,
    *,
    max_log_ratio: float = 1.0,
    padding: tuple[str, ...] = PADDING,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(old_log_prob, log_prob), both (B, T), with a controllable ratio spread.

    On valid tokens log π_old is in [-6, 0] (3 decimals) and log π = log π_old + δ
    with δ = s·u, u uniform in [-1, 1] and the spread s drawn from
    {0, 0.05, 1}·max_log_ratio (s = 0: exactly on-policy, ratio 1; 0.05: inside
    a 0.2 clip; 1: often outside it). ``max_log_ratio=0`` gives on-policy pairs
    only. Padded positions hold what one of ``padding`` gives: ``"zero"``,
    ``"garbage"`` (finite values in ±50) or ``"-inf"`` (in both tensors).
    """
    _check_subset("padding", tuple(padding), PADDING)
    valid = mask.bool()
    gen = _generator(draw(seeds()))
    spread = draw(st.sampled_from([0.0, 0.05, 1.0])) * max_log_ratio
    old = _rounded(-6.0 * torch.rand(mask.shape, generator=gen, dtype=torch.float64), 3)
    step = _rounded(2.0 * torch.rand(mask.shape, generator=gen, dtype=torch.float64) - 1.0, 3)
    new = old.clone() if spread == 0 else _rounded(old + spread * step, 5)
    fill = draw(st.sampled_from(tuple(padding)))
    if fill == "-inf":
        old, new = old.masked_fill(~valid, -torch.inf), new.masked_fill(~valid, -torch.inf)
    elif fill == "garbage":
        junk = _rounded(
            (torch.rand((2, *mask.shape), generator=gen, dtype=torch.float64) - 0.5) * 100, 2
        )
        old, new = torch.where(valid, old, junk[0]), torch.where(valid, new, junk[1])
    else:
        old, new = torch.where(valid, old, 0.0), torch.where(valid, new, 0.0)
    return old.to(dtype), new.to(dtype)


@_composite
def advantages(
    draw: Any,
    mask: torch.Tensor,
    *,
    per_sequence: bool | None = None,
    value_kinds: tuple[str, ...] = ADVANTAGE_KINDS,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """(B, T) advantages for ``mask``, 0 on mask-0 tokens (as the estimators return them).

    Args:
        per_sequence: True: one value per row on all its valid tokens (outcome
            estimators); False: one value per token (GAE); None: either.
        value_kinds: a subset of :data:`ADVANTAGE_KINDS`.
    """
    _check_subset("value_kinds", tuple(value_kinds), ADVANTAGE_KINDS)
    per_seq = draw(st.booleans()) if per_sequence is None else per_sequence
    kind = draw(st.sampled_from(tuple(value_kinds)))
    b, t = mask.shape
    values = fill_values(kind, (b, 1) if per_seq else (b, t), draw(seeds()))
    if kind == "normal":
        values = _rounded(values * 0.75, 3)
    else:
        values = values.clamp(-3.0, 3.0)
    return torch.where(mask.bool(), values.expand(b, t), 0.0).to(dtype)


@_composite
def loss_inputs(
    draw: Any,
    *,
    min_rows: int = 1,
    max_rows: int = 6,
    min_len: int = 1,
    max_len: int = 6,
    interior_masks: bool = True,
    empty_rows: bool = True,
    uniform_lengths: bool = False,
    max_log_ratio: float = 1.0,
    per_sequence_advantages: bool | None = None,
    padding: tuple[str, ...] = PADDING,
    dtype: torch.dtype = torch.float64,
    mask_dtypes: tuple[torch.dtype, ...] = (torch.bool,),
) -> dict[str, torch.Tensor]:
    """Positional inputs of a policy loss (no gradient attached).

    Returns:
        dict with ``old_log_prob``, ``log_prob`` (see :func:`log_prob_pairs`),
        ``advantages`` (see :func:`advantages`), ``response_mask`` (see
        :func:`response_masks`), all (B, T).
    """
    mask = response_masks.draw_in(
        draw,
        min_rows=min_rows,
        max_rows=max_rows,
        min_len=min_len,
        max_len=max_len,
        interior_masks=interior_masks,
        empty_rows=empty_rows,
        uniform_lengths=uniform_lengths,
    )
    old, new = log_prob_pairs.draw_in(
        draw, mask, max_log_ratio=max_log_ratio, padding=padding, dtype=dtype
    )
    adv = advantages.draw_in(draw, mask, per_sequence=per_sequence_advantages, dtype=dtype)
    mask_dtype = draw(st.sampled_from(tuple(mask_dtypes)))
    return {
        "old_log_prob": old,
        "log_prob": new,
        "advantages": adv,
        "response_mask": mask if mask_dtype == torch.bool else mask.to(mask_dtype),
    }


@_composite
def micro_batch_splits(draw: Any, rows: int, *, max_parts: int = 4) -> list[slice]:
    """Row slices cutting ``rows`` rows into 1..max_parts contiguous, non-empty micro-batches."""
    if rows <= 1:
        return [slice(0, rows)]
    cuts = draw(st.lists(st.integers(1, rows - 1), max_size=max(max_parts - 1, 0), unique=True))
    bounds = [0, *sorted(cuts), rows]
    return [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])]


__all__ = [
    "ADVANTAGE_KINDS",
    "LAYOUTS",
    "PADDING",
    "REWARD_KINDS",
    "VALUE_KINDS",
    "advantages",
    "critic_values",
    "estimator_inputs",
    "fill_values",
    "garbage_like",
    "group_indices",
    "log_prob_pairs",
    "loss_inputs",
    "micro_batch_splits",
    "response_masks",
    "reward_baselines",
    "seeds",
    "token_inputs",
    "token_rewards",
]
