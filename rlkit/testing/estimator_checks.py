"""The property battery of advantage estimators: :func:`check_estimator`.

An estimator is called as the trainer calls it (``Algorithm.compute_advantages``)::

    fn(token_level_rewards, response_mask, index=index, values=values,
       reward_baselines=reward_baselines, gamma=gamma, lam=lam, norm_by_std=True,
       **options)

with ``values`` drawn only for estimators that need them (registry extra
``needs_values``, e.g. ``gae``) and ``reward_baselines`` only for those that
need greedy baselines (``needs_reward_baselines``, e.g. ``remax``); otherwise
both are None, as in the trainer. ``epsilon`` is left at its default except
where a property says otherwise.

An estimator may declare extra inputs at registration,
``@ESTIMATORS.register("name", inputs=("process_rewards",))``: each is a (B, T)
float tensor on the token grid that the trainer passes by keyword. The battery
draws one per declared name (:func:`rlkit.testing.strategies.token_inputs`) and
treats it like the rewards: garbage at mask-0 tokens must change nothing, padding
rows and columns get garbage, rows are permuted and split with the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

from rlkit.registry import ESTIMATORS
from rlkit.testing import strategies as S
from rlkit.testing.report import Report
from rlkit.testing.runner import (
    ATOL,
    DEFAULT_MAX_EXAMPLES,
    DEFAULT_SEED,
    ContractError,
    Property,
    declarations,
    mismatch,
    missing_keywords,
    resolve,
    run_battery,
    seeded_call,
    selected,
)

SHARED_POSITIONAL = ("token_level_rewards", "response_mask")
SHARED_KEYWORDS = ("index", "values", "reward_baselines", "gamma", "lam", "norm_by_std", "epsilon")
UNKNOWN_OPTION = "rlkit_check_unknown_option"

_P = Property
#: Every estimator property, in battery order. ``optional`` ones are checked when declared.
ESTIMATOR_PROPERTIES: dict[str, Property] = {
    p.name: p
    for p in [
        _P("signature", "accepts the shared positional arguments and keywords (or **kwargs)"),
        _P("unknown_option_rejected", "an unknown keyword option raises TypeError"),
        _P("empty_batch", "B = 0 or T = 0 gives empty (B, T) outputs"),
        _P("shapes_and_dtypes", "returns (advantages, returns), both (B, T) in the rewards' dtype"),
        _P("finite", "no NaN or inf, on any drawn batch (degenerate ones included)"),
        _P("zero_at_masked_tokens", "advantages and returns are exactly 0 where the mask is 0"),
        _P("masked_inputs_ignored", "rewards (and values) at mask-0 tokens change nothing"),
        _P(
            "empty_rows_ignored",
            "appending fully masked rows and columns (garbage rewards) changes nothing on "
            "real tokens",
        ),
        _P("row_permutation_equivariance", "permuting rows (with their ids) permutes the outputs"),
        _P(
            "group_relabelling_invariance", "renaming group ids (any injective map) changes nothing"
        ),
        _P("singleton_group_zero", "a response alone in its group gets advantage 0"),
        _P("equal_scores_zero", "a group whose scores are all equal gets advantage 0"),
        # -- optional: checked when declared ------------------------------------------
        _P("group_zero_sum", "per-response advantages sum to 0 in each group", True),
        _P(
            "group_token_zero_sum",
            "advantages summed over all tokens of a group are 0 (length-weighted)",
            True,
        ),
        _P(
            "reward_scale_invariant",
            "rewards times 2**k give the same advantages (epsilon=0)",
            True,
        ),
        _P("reward_shift_invariant", "one constant added to every score changes nothing", True),
        _P(
            "group_shift_invariant",
            "a constant per group added to its scores changes nothing",
            True,
        ),
        _P(
            "group_local",
            "each group's advantages depend on that group's rows only (batch split by groups)",
            True,
        ),
    ]
}

#: Rewards and shifts on a grid of quarters: sums are exact in floating point, so
#: a shift-invariance check cannot fail (or pass) by rounding.
_GRID_KINDS = ("binary", "grid")
_QUARTERS = st.integers(-16, 16).map(lambda k: k / 4)
#: Scores given to a whole group (decimals that are not binary fractions included).
_SCORES = st.sampled_from([0.0, 1.0, 0.1, 0.3, 1 / 3, 0.7, -2.5, 250.0])


def declared_inputs(fn_or_name: Any) -> tuple[str, ...]:
    """The extra (B, T) inputs an estimator declares with ``inputs=(...)`` at registration.

    Args:
        fn_or_name: a function, a registered name or ``"package.module:function"``.

    Returns:
        The declared names, in order; () for an estimator without any (or unregistered).

    Raises:
        rlkit.registry.UnknownNameError: ``fn_or_name`` is not found.
    """
    _, entry, _ = resolve(ESTIMATORS, fn_or_name)
    return tuple(entry.extra.get("inputs", ())) if entry is not None else ()


@dataclass
class _Estimator:
    fn: Callable[..., Any]
    needs_values: bool
    needs_baselines: bool
    options: dict[str, Any] = field(default_factory=dict)
    extra_inputs: tuple[str, ...] = ()

    def inputs(self, **kw: Any) -> st.SearchStrategy[dict[str, Any]]:
        """The strategy of this estimator's inputs (values / baselines when it needs them)."""
        return S.estimator_inputs(
            values=self.needs_values,
            baselines=self.needs_baselines,
            extra_inputs=self.extra_inputs,
            **kw,
        )

    def draw_inputs(self, draw: Any, **kw: Any) -> dict[str, Any]:
        """Draw the inputs inside a composite strategy."""
        return S.estimator_inputs.draw_in(
            draw,
            values=self.needs_values,
            baselines=self.needs_baselines,
            extra_inputs=self.extra_inputs,
            **kw,
        )

    def zeros(self, b: int, t: int) -> dict[str, torch.Tensor]:
        """All-zero declared inputs of a (B, T) = (b, t) batch."""
        return {name: torch.zeros(b, t, dtype=torch.float64) for name in self.extra_inputs}

    def __call__(
        self, case: Mapping[str, Any], **overrides: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rewards = case["token_level_rewards"]
        kwargs = {
            "index": case["index"],
            "values": case.get("values"),
            "reward_baselines": case.get("reward_baselines"),
            "gamma": case.get("gamma", 1.0),
            "lam": case.get("lam", 1.0),
            "norm_by_std": True,
            **{name: case.get(name) for name in self.extra_inputs},
            **self.options,
            **overrides,
        }
        out = seeded_call(self.fn, rewards, case["response_mask"], **kwargs)
        return _outputs(out, rewards)


def _outputs(out: Any, rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(out, tuple | list) and len(out) == 2):
        raise ContractError(f"returned {type(out).__name__}, expected (advantages, returns)")
    for name, x in zip(("advantages", "returns"), out):
        if not isinstance(x, torch.Tensor):
            raise ContractError(f"{name} is a {type(x).__name__}, expected a tensor")
        if tuple(x.shape) != tuple(rewards.shape):
            raise ContractError(
                f"{name} has shape {tuple(x.shape)}, expected (B, T) = {tuple(rewards.shape)}"
            )
    return out[0], out[1]


def _with(case: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    return {**case, **changes}


_ROW_KEYS = ("token_level_rewards", "response_mask", "index", "values", "reward_baselines")


def _rows(
    case: Mapping[str, Any], rows: torch.Tensor, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The case restricted to (or reordered by) ``rows`` (``extra``: declared inputs too)."""
    out = dict(case)
    for key in (*_ROW_KEYS, *extra):
        if isinstance(case.get(key), torch.Tensor):
            out[key] = case[key][rows]
    return out


def _scale(*tensors: torch.Tensor) -> float:
    return 1.0 + max((float(t.detach().abs().max()) for t in tensors if t.numel()), default=0.0)


def _group_ids(index: torch.Tensor) -> tuple[torch.Tensor, int]:
    uniques, inverse = torch.unique(index, return_inverse=True)
    return inverse, uniques.numel()


def _set_score(rewards: torch.Tensor, mask: torch.Tensor, row: int, score: float) -> None:
    """Row ``row``'s rewards become ``score`` on its last valid token, 0 elsewhere."""
    valid = mask[row].nonzero().flatten()
    rewards[row] = 0.0
    rewards[row, int(valid.max())] = score


# -- strategies of the properties that draw more than the inputs --------------------
@st.composite
def _with_garbage(draw: Any, est: _Estimator) -> dict[str, Any]:
    case = est.draw_inputs(draw)
    pad = ~case["response_mask"]
    shape = tuple(pad.shape)
    rewards = torch.where(pad, S.garbage_like.draw_in(draw, shape), case["token_level_rewards"])
    changes = {"garbage_rewards": rewards}
    if case.get("values") is not None:
        changes["garbage_values"] = torch.where(
            pad, S.garbage_like.draw_in(draw, shape), case["values"]
        )
    if est.extra_inputs:
        changes["garbage_inputs"] = {
            name: torch.where(pad, S.garbage_like.draw_in(draw, shape), case[name])
            for name in est.extra_inputs
        }
    return {**case, **changes}


@st.composite
def _with_padding(draw: Any, est: _Estimator) -> dict[str, Any]:
    case = est.draw_inputs(draw)
    b, t = case["response_mask"].shape
    extra_rows = draw(st.integers(0, 3))
    extra_cols = draw(st.integers(0 if extra_rows else 1, 3))
    ids = case["index"].tolist()
    new_ids = draw(
        st.lists(
            st.sampled_from(ids) | st.integers(-3, 10) if ids else st.integers(-3, 10),
            min_size=extra_rows,
            max_size=extra_rows,
        )
    )
    shape = (b + extra_rows, t + extra_cols)

    def grown(x: torch.Tensor) -> torch.Tensor:
        out = S.garbage_like.draw_in(draw, shape, dtype=x.dtype)
        out[:b, :t] = x
        return out

    mask = torch.zeros(shape, dtype=torch.bool)
    mask[:b, :t] = case["response_mask"]
    padded = {
        "token_level_rewards": grown(case["token_level_rewards"]),
        "response_mask": mask,
        "index": torch.tensor(ids + new_ids, dtype=torch.long),
    }
    if case.get("values") is not None:
        padded["values"] = grown(case["values"])
    for name in est.extra_inputs:
        padded[name] = grown(case[name])
    if case.get("reward_baselines") is not None:
        more = S.garbage_like.draw_in(draw, (extra_rows,), dtype=case["reward_baselines"].dtype)
        padded["reward_baselines"] = torch.cat([case["reward_baselines"], more])
    return {**case, "padded": padded}


@st.composite
def _with_permutation(draw: Any, est: _Estimator) -> dict[str, Any]:
    case = est.draw_inputs(draw)
    b = case["response_mask"].shape[0]
    return {**case, "permutation": draw(st.permutations(list(range(b))))}


@st.composite
def _with_relabelling(draw: Any, est: _Estimator) -> dict[str, Any]:
    case = est.draw_inputs(draw)
    uniques = torch.unique(case["index"]).tolist()
    new = draw(
        st.lists(
            st.integers(-(10**6), 10**6),
            min_size=len(uniques),
            max_size=len(uniques),
            unique=True,
        )
    )
    mapping = dict(zip(uniques, new))
    relabelled = torch.tensor([mapping[i] for i in case["index"].tolist()], dtype=torch.long)
    return {**case, "relabelled_index": relabelled}


def _ensure_nonempty(draw: Any, case: dict[str, Any], row: int) -> None:
    mask, rewards = case["response_mask"], case["token_level_rewards"]
    if not bool(mask[row].any()):
        mask[row, 0] = True
        rewards[row, 0] = draw(_SCORES)


@st.composite
def _with_singleton(draw: Any, est: _Estimator) -> dict[str, Any]:
    case = est.draw_inputs(draw)
    case = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    b = case["response_mask"].shape[0]
    row = draw(st.integers(0, b - 1))
    _ensure_nonempty(draw, case, row)
    index = case["index"].clone()
    index[row] = int(index.max()) + 1 + draw(st.integers(0, 3))
    return {**case, "index": index, "singleton_row": row}


@st.composite
def _with_equal_group(draw: Any, est: _Estimator) -> dict[str, Any]:
    case = est.draw_inputs(draw, min_rows=2)
    case = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    b = case["response_mask"].shape[0]
    first = draw(st.integers(0, b - 1))
    second = draw(st.integers(0, b - 2))
    second += second >= first
    index = case["index"]
    index[second] = index[first]
    score = draw(_SCORES)
    rows = (index == index[first]).nonzero().flatten().tolist()
    for row in rows:
        _ensure_nonempty(draw, case, row)
        _set_score(case["token_level_rewards"], case["response_mask"], row, score)
    return {**case, "equal_rows": rows}


@st.composite
def _with_scale(draw: Any, est: _Estimator) -> dict[str, Any]:
    case = est.draw_inputs(draw)
    return {**case, "scale": 2.0 ** draw(st.integers(-10, 10))}


@st.composite
def _with_shift(draw: Any, est: _Estimator, per_group: bool) -> dict[str, Any]:
    case = est.draw_inputs(draw, value_kinds=_GRID_KINDS)
    _, groups = _group_ids(case["index"])
    count = groups if per_group else 1
    shifts = draw(st.lists(_QUARTERS, min_size=count, max_size=count))
    return {**case, "shifts": shifts}


@st.composite
def _with_group_split(draw: Any, est: _Estimator) -> dict[str, Any]:
    case = est.draw_inputs(draw)
    uniques = torch.unique(case["index"]).tolist()
    first = draw(st.lists(st.booleans(), min_size=len(uniques), max_size=len(uniques)))
    return {**case, "first_part_groups": [g for g, keep in zip(uniques, first) if keep]}


# -- the checks -----------------------------------------------------------------
def _plans(est: _Estimator) -> dict[str, tuple[Any, Callable[[Any], str | None]]]:
    def fixed_case() -> dict[str, Any]:
        rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.5, 0.0]], dtype=torch.float64)
        return {
            "token_level_rewards": rewards,
            "response_mask": torch.ones(3, 2, dtype=torch.bool),
            "index": torch.tensor([0, 0, 1]),
            "values": torch.zeros(3, 2, dtype=torch.float64) if est.needs_values else None,
            "reward_baselines": torch.zeros(3, dtype=torch.float64)
            if est.needs_baselines
            else None,
            **est.zeros(3, 2),
        }

    def signature(_: Any) -> str | None:
        return missing_keywords(est.fn, SHARED_POSITIONAL, (*SHARED_KEYWORDS, *est.extra_inputs))

    def unknown_option(_: Any) -> str | None:
        try:
            est(fixed_case(), **{UNKNOWN_OPTION: 1})
        except TypeError:
            return None
        return (
            f"accepted the unknown option {UNKNOWN_OPTION}=1 silently: a misspelt option in "
            f"estimator_options would be ignored"
        )

    def empty_batch(_: Any) -> str | None:
        for b, t in ((0, 4), (0, 0), (3, 0)):
            case = {
                "token_level_rewards": torch.zeros(b, t, dtype=torch.float64),
                "response_mask": torch.zeros(b, t, dtype=torch.bool),
                "index": torch.arange(b),
                "values": torch.zeros(b, t, dtype=torch.float64) if est.needs_values else None,
                "reward_baselines": torch.zeros(b, dtype=torch.float64)
                if est.needs_baselines
                else None,
                **est.zeros(b, t),
            }
            try:
                est(case)
            except Exception as exc:  # noqa: BLE001
                return f"(B, T) = ({b}, {t}): raised {type(exc).__name__}: {exc}"
        return None

    def shapes_and_dtypes(case: Any) -> str | None:
        rewards = case["token_level_rewards"]
        for name, out in zip(("advantages", "returns"), est(case)):
            if out.dtype != rewards.dtype:
                return f"{name} dtype {out.dtype}, expected the rewards' {rewards.dtype}"
        return None

    def finite(case: Any) -> str | None:
        for name, out in zip(("advantages", "returns"), est(case)):
            bad = ~torch.isfinite(out)
            if bool(bad.any()):
                where = bad.nonzero()[0].tolist()
                return f"{name}[{where[0]}, {where[1]}] = {out[tuple(where)].item()}"
        return None

    def zero_at_masked(case: Any) -> str | None:
        pad = ~case["response_mask"].bool()
        for name, out in zip(("advantages", "returns"), est(case)):
            leak = pad & (out != 0)
            if bool(leak.any()):
                where = leak.nonzero()[0].tolist()
                return f"{name}[{where[0]}, {where[1]}] = {out[tuple(where)].item():.6g} at a mask-0 token"
        return None

    def masked_ignored(case: Any) -> str | None:
        clean = est(case)
        dirty_case = _with(case, token_level_rewards=case["garbage_rewards"])
        if "garbage_values" in case:
            dirty_case["values"] = case["garbage_values"]
        dirty_case.update(case.get("garbage_inputs", {}))
        dirty = est(dirty_case)
        for name, a, b in zip(("advantages", "returns"), dirty, clean):
            msg = mismatch(a, b, f"{name} with garbage at mask-0 tokens vs zeros")
            if msg:
                return msg
        return None

    def empty_rows(case: Any) -> str | None:
        plain = est(case)
        padded = est(_with(case, **case["padded"]))
        b, t = case["response_mask"].shape
        for name, small, big in zip(("advantages", "returns"), plain, padded):
            msg = mismatch(big[:b, :t], small, f"padded {name} on the real tokens")
            if msg:
                return msg
            rest = big.clone()
            rest[:b, :t] = 0
            if bool((rest != 0).any()):
                where = (rest != 0).nonzero()[0].tolist()
                return f"padded {name}[{where[0]}, {where[1]}] = {rest[tuple(where)].item():.6g}, expected 0"
        return None

    def permutation(case: Any) -> str | None:
        perm = torch.tensor(case["permutation"], dtype=torch.long)
        plain = est(case)
        permuted = est(_rows(case, perm, est.extra_inputs))
        for name, p, q in zip(("advantages", "returns"), permuted, plain):
            msg = mismatch(p, q[perm], f"{name} of the permuted batch vs permuted {name}")
            if msg:
                return msg
        return None

    def relabelling(case: Any) -> str | None:
        plain = est(case)
        renamed = est(_with(case, index=case["relabelled_index"]))
        for name, p, q in zip(("advantages", "returns"), renamed, plain):
            msg = mismatch(p, q, f"{name} with renamed group ids")
            if msg:
                return msg
        return None

    def singleton(case: Any) -> str | None:
        adv, _ = est(case)
        row = case["singleton_row"]
        worst = float(adv[row].abs().max())
        if not worst <= ATOL:
            return f"row {row}, alone in its group, gets advantages {adv[row].tolist()}"
        return None

    def equal_scores(case: Any) -> str | None:
        adv, _ = est(case)
        rows = case["equal_rows"]
        worst = float(adv[rows].abs().max())
        if not worst <= 1e-6:
            return f"rows {rows} (equal scores, one group) get advantages {adv[rows].tolist()}"
        return None

    def row_means(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.bool().to(torch.float64)
        return (adv.to(torch.float64) * m).sum(-1) / m.sum(-1).clamp(min=1)

    def zero_sums(values: torch.Tensor, index: torch.Tensor, what: str, scale: float) -> str | None:
        ids, groups = _group_ids(index)
        sums = torch.zeros(groups, dtype=torch.float64).index_add_(0, ids, values)
        return mismatch(sums, torch.zeros_like(sums), what, atol=ATOL * scale * max(len(ids), 1))

    def group_zero_sum(case: Any) -> str | None:
        adv, _ = est(case)
        per_row = row_means(adv, case["response_mask"])
        return zero_sums(
            per_row, case["index"], "sum over a group of per-response advantages", _scale(adv)
        )

    def group_token_zero_sum(case: Any) -> str | None:
        adv, _ = est(case)
        per_row = (adv.to(torch.float64) * case["response_mask"].bool()).sum(-1)
        return zero_sums(per_row, case["index"], "sum of a group's token advantages", _scale(adv))

    def scale_invariant(case: Any) -> str | None:
        plain, _ = est(case, epsilon=0.0)
        scaled_rewards = case["token_level_rewards"] * case["scale"]
        scaled, _ = est(_with(case, token_level_rewards=scaled_rewards), epsilon=0.0)
        return mismatch(scaled, plain, f"advantages of rewards x {case['scale']:g} (epsilon=0)")

    def shifted_case(case: Any, per_group: bool) -> dict[str, Any]:
        rewards = case["token_level_rewards"].clone()
        mask = case["response_mask"]
        ids, _ = _group_ids(case["index"])
        for row in mask.bool().any(-1).nonzero().flatten().tolist():
            last = int(mask[row].bool().nonzero().max())
            rewards[row, last] += case["shifts"][int(ids[row]) if per_group else 0]
        return _with(case, token_level_rewards=rewards)

    def shift_invariant(per_group: bool) -> Callable[[Any], str | None]:
        def check(case: Any) -> str | None:
            plain, _ = est(case)
            shifted, _ = est(shifted_case(case, per_group))
            what = "per-group shifts" if per_group else "a common shift"
            return mismatch(shifted, plain, f"advantages with {what} of the scores")

        return check

    def group_local(case: Any) -> str | None:
        whole, _ = est(case)
        chosen = torch.tensor(case["first_part_groups"], dtype=torch.long)
        in_first = torch.isin(case["index"], chosen)
        for label, rows in (("first", in_first), ("second", ~in_first)):
            rows = rows.nonzero().flatten()
            if rows.numel() == 0:
                continue
            part, _ = est(_rows(case, rows, est.extra_inputs))
            msg = mismatch(
                part, whole[rows], f"advantages of the {label} part alone vs in the batch"
            )
            if msg:
                return msg
        return None

    dtypes = st.sampled_from([torch.float32, torch.float64])
    return {
        "signature": (None, signature),
        "unknown_option_rejected": (None, unknown_option),
        "empty_batch": (None, empty_batch),
        "shapes_and_dtypes": (
            dtypes.flatmap(lambda d: est.inputs(dtype=d, mask_dtypes=(torch.bool, d))),
            shapes_and_dtypes,
        ),
        "finite": (est.inputs(), finite),
        "zero_at_masked_tokens": (est.inputs(), zero_at_masked),
        "masked_inputs_ignored": (_with_garbage(est), masked_ignored),
        "empty_rows_ignored": (_with_padding(est), empty_rows),
        "row_permutation_equivariance": (_with_permutation(est), permutation),
        "group_relabelling_invariance": (_with_relabelling(est), relabelling),
        "singleton_group_zero": (_with_singleton(est), singleton),
        "equal_scores_zero": (_with_equal_group(est), equal_scores),
        "group_zero_sum": (est.inputs(), group_zero_sum),
        "group_token_zero_sum": (est.inputs(), group_token_zero_sum),
        "reward_scale_invariant": (_with_scale(est), scale_invariant),
        "reward_shift_invariant": (_with_shift(est, False), shift_invariant(False)),
        "group_shift_invariant": (_with_shift(est, True), shift_invariant(True)),
        "group_local": (_with_group_split(est), group_local),
    }


def check_estimator(
    fn_or_name: Any,
    *,
    properties: Iterable[str] | None = None,
    exempt: Iterable[str] | None = None,
    only: Iterable[str] | None = None,
    options: Mapping[str, Any] | None = None,
    needs_values: bool | None = None,
    needs_reward_baselines: bool | None = None,
    inputs: Iterable[str] | None = None,
    max_examples: int = DEFAULT_MAX_EXAMPLES,
    seed: int = DEFAULT_SEED,
    shrink: bool = True,
) -> Report:
    """Run the estimator property battery on ``fn_or_name``.

    Args:
        fn_or_name: a function, a registered estimator name (or alias), or
            ``"package.module:function"``.
        properties: optional properties (``ESTIMATOR_PROPERTIES`` entries marked
            optional) the function claims, on top of its registration's
            ``properties=(...)``.
        exempt: generic properties the function does not have, on top of its
            registration's ``properties_exempt=(...)``; they are reported as exempt.
        only: check just these properties (declared or not), e.g. while debugging.
        options: keyword options passed on every call (``estimator_options``).
        needs_values, needs_reward_baselines: draw critic values / greedy
            baselines; default: the registration's ``needs_values`` /
            ``needs_reward_baselines`` flags (False for an unregistered function).
        inputs: names of the extra (B, T) inputs to draw and pass by keyword;
            default: the registration's ``inputs=(...)`` (none for an unregistered
            function).
        max_examples: drawn inputs per property.
        seed: the search's seed (searches are derandomised: a run is reproducible).
        shrink: shrink a failing input to a small counterexample (False: report the
            first one found; faster when only pass / fail matters).

    Returns:
        A :class:`~rlkit.testing.Report`; ``report.ok`` is True when every
        checked property passed, ``report.assert_ok()`` raises with the table.

    Raises:
        rlkit.registry.UnknownNameError: ``fn_or_name`` is not found.
        ValueError: an unknown property name.
    """
    fn, entry, target = resolve(ESTIMATORS, fn_or_name)
    extra = entry.extra if entry is not None else {}
    declared, lacking = declarations(entry, properties, exempt, ESTIMATOR_PROPERTIES, "estimator")
    names, exempted = selected(ESTIMATOR_PROPERTIES, declared, lacking, only)
    est = _Estimator(
        fn,
        bool(extra.get("needs_values")) if needs_values is None else needs_values,
        bool(extra.get("needs_reward_baselines"))
        if needs_reward_baselines is None
        else needs_reward_baselines,
        dict(options or {}),
        tuple(extra.get("inputs", ())) if inputs is None else tuple(inputs),
    )
    results, seconds = run_battery(
        names,
        ESTIMATOR_PROPERTIES,
        _plans(est),
        max_examples=max_examples,
        seed=seed,
        shrink=shrink,
        defaults={"gamma": 1.0, "lam": 1.0},  # the trainer's defaults: not worth printing
    )
    return Report(target, "estimator", results, exempted, seconds)
