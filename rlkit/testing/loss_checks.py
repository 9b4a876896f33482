"""The property battery of policy losses: :func:`check_loss`.

A loss is called as the trainer calls it (``Algorithm.actor_loss``), with every
shared keyword::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=mode,
       clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
       rollout_is_weights=None, num_tokens=..., num_seqs=..., norm_length=...,
       **options)

where the normalisers are None (the micro-batch's own counts) unless a property
passes the mini-batch's (``algorithms.global_normalizers``) or explicit ones.
``log_prob`` is a fresh leaf tensor; gradients are taken with respect to it.
Torch's global RNG is seeded to 0 around each call (restored afterwards), so a
loss that draws random numbers without a generator is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

import algorithms
from rlkit.registry import AGGREGATIONS, POLICY_LOSSES
from rlkit.testing import strategies as S
from rlkit.testing.report import Report
from rlkit.testing.runner import (
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

SHARED_POSITIONAL = ("old_log_prob", "log_prob", "advantages", "response_mask")
SHARED_KEYWORDS = (
    "loss_agg_mode",
    "clip_ratio",
    "clip_ratio_low",
    "clip_ratio_high",
    "clip_ratio_c",
    "rollout_is_weights",
    "num_tokens",
    "num_seqs",
    "norm_length",
)
#: Metrics every loss reports (docs/metrics.md).
REQUIRED_METRICS = ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower")
#: The aggregation modes the battery exercises (rlkit's built-ins).
MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
UNKNOWN_OPTION = "rlkit_check_unknown_option"
#: seq-mean-token-mean keeps verl's n_b + 1e-8 guard: a 1e-8 relative difference.
SEQ_MEAN_RTOL = 1e-6

_P = Property
#: Every loss property, in battery order. ``optional`` ones are checked when declared.
LOSS_PROPERTIES: dict[str, Property] = {
    p.name: p
    for p in [
        _P("signature", "accepts the shared positional arguments and keywords (or **kwargs)"),
        _P("unknown_option_rejected", "an unknown keyword option raises TypeError"),
        _P("empty_batch", "B = 0 or T = 0 gives a finite 0-dim loss, in every mode"),
        _P(
            "outputs",
            "returns (0-dim loss with a gradient, metrics with pg_clipfrac, ppo_kl, "
            "pg_clipfrac_lower as 0-dim detached values)",
        ),
        _P("finite", "finite loss, gradient and metrics on any drawn batch, in every mode"),
        _P(
            "zero_grad_at_masked_tokens",
            "the gradient is exactly 0 at mask-0 tokens (even with -inf log-probs there)",
        ),
        _P(
            "masked_inputs_ignored",
            "log-probs and advantages at mask-0 tokens change neither loss nor gradient",
        ),
        _P(
            "padding_invariance",
            "appending fully masked rows and columns changes neither loss nor gradient "
            "(norm_length given)",
        ),
        _P(
            "row_permutation_invariance",
            "permuting rows leaves the loss unchanged and permutes the gradient",
        ),
        _P(
            "aggregation_semantics",
            "each mode is token-sum divided by its normaliser (token count, sequence count, "
            "norm_length), given or defaulted",
        ),
        _P(
            "microbatch_invariance",
            "micro-batch losses with the mini-batch's normalisers sum to the whole-batch "
            "loss and gradient, in every mode",
        ),
        # -- optional: checked when declared ------------------------------------------
        _P(
            "reduces_to_vanilla_at_ratio_one",
            "on-policy (log_prob == old_log_prob, one advantage per response) the gradient "
            "equals vanilla PPO's, in every mode",
            True,
        ),
    ]
}


@dataclass
class _Loss:
    fn: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)

    def raw(
        self,
        old: torch.Tensor,
        log_prob: torch.Tensor,
        adv: torch.Tensor,
        mask: torch.Tensor,
        mode: str,
        **norms: Any,
    ) -> tuple[torch.Tensor, Mapping[str, Any]]:
        kwargs = {
            "loss_agg_mode": mode,
            "clip_ratio": 0.2,
            "clip_ratio_low": None,
            "clip_ratio_high": None,
            "clip_ratio_c": 3.0,
            "rollout_is_weights": None,
            "num_tokens": norms.get("num_tokens"),
            "num_seqs": norms.get("num_seqs"),
            "norm_length": norms.get("norm_length"),
            **self.options,
        }
        out = seeded_call(self.fn, old, log_prob, adv, mask, **kwargs)
        if not (isinstance(out, tuple | list) and len(out) == 2):
            raise ContractError(f"returned {type(out).__name__}, expected (loss, metrics)")
        loss, metrics = out
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ContractError(f"loss is {shape}, expected a 0-dim tensor")
        if not isinstance(metrics, Mapping):
            raise ContractError(f"metrics is a {type(metrics).__name__}, expected a dict")
        return loss, metrics

    def value_and_grad(
        self, case: Mapping[str, Any], mode: str, **norms: Any
    ) -> tuple[torch.Tensor, torch.Tensor, Mapping[str, Any]]:
        """(loss, d loss / d log_prob, metrics), the gradient 0 where the loss does not depend on it."""
        leaf = case["log_prob"].detach().clone().requires_grad_(True)
        loss, metrics = self.raw(
            case["old_log_prob"], leaf, case["advantages"], case["response_mask"], mode, **norms
        )
        return loss.detach(), _grad(loss, leaf), metrics


def _grad(loss: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    if not loss.requires_grad:
        return torch.zeros_like(leaf)
    (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True)
    return torch.zeros_like(leaf) if grad is None else grad


def _norm(value: float) -> torch.Tensor:
    # The trainer passes the normalisers as 0-dim float64 tensors.
    return torch.tensor(float(value), dtype=torch.float64)


modes = st.sampled_from(MODES)


@S._composite
def _case(draw: Any, **kw: Any) -> dict[str, Any]:
    return {**S.loss_inputs.draw_in(draw, **kw), "mode": draw(modes)}


@st.composite
def _finite_case(draw: Any) -> dict[str, Any]:
    return _case.draw_in(draw, max_log_ratio=draw(st.sampled_from([1.0, 30.0])))


@st.composite
def _with_garbage(draw: Any) -> dict[str, Any]:
    case = _case.draw_in(draw, padding=("zero",))
    pad = ~case["response_mask"].bool()
    dirty = {}
    for key in ("old_log_prob", "log_prob", "advantages"):
        if key != "advantages" and draw(st.booleans()):
            junk = torch.full(pad.shape, -math.inf, dtype=case[key].dtype)
        else:
            junk = S.garbage_like.draw_in(
                draw, tuple(pad.shape), max_abs=50.0, dtype=case[key].dtype
            )
        dirty[key] = torch.where(pad, junk, case[key])
    return {**case, "dirty": dirty}


@st.composite
def _with_padding(draw: Any) -> dict[str, Any]:
    case = _case.draw_in(draw)
    b, t = case["response_mask"].shape
    extra_rows = draw(st.integers(0, 3))
    extra_cols = draw(st.integers(0 if extra_rows else 1, 3))
    shape = (b + extra_rows, t + extra_cols)
    padded = {}
    for key in ("old_log_prob", "log_prob", "advantages"):
        out = S.garbage_like.draw_in(draw, shape, max_abs=50.0, dtype=case[key].dtype)
        if key != "advantages" and draw(st.booleans()):
            out.fill_(-math.inf)
        out[:b, :t] = case[key]
        padded[key] = out
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[:b, :t] = case["response_mask"].bool()
    padded["response_mask"] = mask
    return {**case, "padded": padded}


@st.composite
def _with_permutation(draw: Any) -> dict[str, Any]:
    case = _case.draw_in(draw)
    b = case["response_mask"].shape[0]
    return {**case, "permutation": draw(st.permutations(list(range(b))))}


@st.composite
def _with_normalisers(draw: Any) -> dict[str, Any]:
    uniform = draw(st.booleans())
    case = _case.draw_in(draw, uniform_lengths=uniform)
    del case["mode"]  # every mode is checked
    positive = st.integers(1, 64).map(float)  # counts, as the trainer passes them
    return {
        **case,
        "num_tokens": draw(positive),
        "num_seqs": draw(positive),
        "norm_length": draw(positive),
    }


@st.composite
def _with_split(draw: Any) -> dict[str, Any]:
    case = _case.draw_in(draw)
    b = case["response_mask"].shape[0]
    return {**case, "micro_batches": S.micro_batch_splits.draw_in(draw, b)}


def _own_width(mask: torch.Tensor) -> int:
    """A micro-batch's padded width: up to its last valid column (at least 1), as the trainer cuts."""
    cols = torch.nonzero(mask.bool().any(dim=0)).flatten()
    return int(cols.max()) + 1 if cols.numel() else 1


def _plans(loss: _Loss) -> dict[str, tuple[Any, Callable[[Any], str | None]]]:
    def fixed_case(b: int = 2, t: int = 3) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(0)
        old = -torch.rand(b, t, generator=gen, dtype=torch.float64)
        return {
            "old_log_prob": old,
            "log_prob": old + 0.1 * torch.randn(b, t, generator=gen, dtype=torch.float64),
            "advantages": torch.randn(b, 1, generator=gen, dtype=torch.float64).expand(b, t),
            "response_mask": torch.ones(b, t, dtype=torch.bool),
        }

    def signature(_: Any) -> str | None:
        return missing_keywords(loss.fn, SHARED_POSITIONAL, SHARED_KEYWORDS)

    def unknown_option(_: Any) -> str | None:
        c = fixed_case()
        probe = _Loss(loss.fn, {**loss.options, UNKNOWN_OPTION: 1})
        try:
            probe.raw(
                c["old_log_prob"], c["log_prob"], c["advantages"], c["response_mask"], "token-mean"
            )
        except TypeError:
            return None
        return (
            f"accepted the unknown option {UNKNOWN_OPTION}=1 silently: a misspelt option in "
            f"loss_options would be ignored"
        )

    def empty_batch(_: Any) -> str | None:
        for b, t in ((0, 4), (3, 0)):
            case = {
                "old_log_prob": torch.zeros(b, t, dtype=torch.float64),
                "log_prob": torch.zeros(b, t, dtype=torch.float64),
                "advantages": torch.zeros(b, t, dtype=torch.float64),
                "response_mask": torch.zeros(b, t, dtype=torch.bool),
            }
            for mode in MODES:
                try:
                    value, grad, _ = loss.value_and_grad(case, mode)
                except Exception as exc:  # noqa: BLE001
                    return f"(B, T) = ({b}, {t}), {mode}: raised {type(exc).__name__}: {exc}"
                if not bool(torch.isfinite(value)):
                    return f"(B, T) = ({b}, {t}), {mode}: loss {value.item()}"
        return None

    def outputs(case: Any) -> str | None:
        leaf = case["log_prob"].detach().clone().requires_grad_(True)
        value, metrics = loss.raw(
            case["old_log_prob"], leaf, case["advantages"], case["response_mask"], case["mode"]
        )
        if value.dtype != leaf.dtype:
            return f"loss dtype {value.dtype}, expected log_prob's {leaf.dtype}"
        if bool(case["response_mask"].bool().any()) and not value.requires_grad:
            return "the loss has no gradient with respect to log_prob"
        missing = [k for k in REQUIRED_METRICS if k not in metrics]
        if missing:
            return f"metrics lack {missing} (have {sorted(metrics)})"
        for key, m in metrics.items():
            if isinstance(m, torch.Tensor):
                if m.dim() != 0:
                    return f"metric {key!r} has shape {tuple(m.shape)}, expected 0-dim"
                if m.requires_grad:
                    return f"metric {key!r} requires grad (detach it)"
            elif not isinstance(m, int | float):
                return f"metric {key!r} is a {type(m).__name__}, expected a 0-dim tensor or float"
        return None

    def finite(case: Any) -> str | None:
        value, grad, metrics = loss.value_and_grad(case, case["mode"])
        if not bool(torch.isfinite(value)):
            return f"loss = {value.item()}"
        bad = ~torch.isfinite(grad)
        if bool(bad.any()):
            where = bad.nonzero()[0].tolist()
            return f"gradient[{where[0]}, {where[1]}] = {grad[tuple(where)].item()}"
        for key, m in metrics.items():
            if not math.isfinite(float(m)):
                return f"metric {key!r} = {float(m)}"
        return None

    def zero_grad(case: Any) -> str | None:
        _, grad, _ = loss.value_and_grad(case, case["mode"])
        pad = ~case["response_mask"].bool()
        leak = pad & (grad != 0)
        if bool(leak.any()):
            where = leak.nonzero()[0].tolist()
            return f"gradient[{where[0]}, {where[1]}] = {grad[tuple(where)].item():.6g} at a mask-0 token"
        return None

    def masked_ignored(case: Any) -> str | None:
        value, grad, _ = loss.value_and_grad(case, case["mode"])
        dirty_value, dirty_grad, _ = loss.value_and_grad({**case, **case["dirty"]}, case["mode"])
        valid = case["response_mask"].bool()
        return mismatch(
            dirty_value, value, "loss with garbage at mask-0 tokens vs zeros"
        ) or mismatch(
            dirty_grad[valid], grad[valid], "gradient on valid tokens, garbage vs zeros at mask-0"
        )

    def padding(case: Any) -> str | None:
        b, t = case["response_mask"].shape
        norms = {"norm_length": _norm(max(t, 1))}
        value, grad, _ = loss.value_and_grad(case, case["mode"], **norms)
        big_value, big_grad, _ = loss.value_and_grad(
            {**case, **case["padded"]}, case["mode"], **norms
        )
        msg = mismatch(big_value, value, "loss with appended fully masked rows / columns")
        msg = msg or mismatch(big_grad[:b, :t], grad, "gradient on the real tokens, padded vs not")
        if msg:
            return msg
        rest = big_grad.clone()
        rest[:b, :t] = 0
        if bool((rest != 0).any()):
            where = (rest != 0).nonzero()[0].tolist()
            return f"gradient[{where[0]}, {where[1]}] in the appended padding = {rest[tuple(where)].item():.6g}"
        return None

    def permutation(case: Any) -> str | None:
        perm = torch.tensor(case["permutation"], dtype=torch.long)
        value, grad, _ = loss.value_and_grad(case, case["mode"])
        keys = ("old_log_prob", "log_prob", "advantages", "response_mask")
        permuted = {**case, **{k: case[k][perm] for k in keys}}
        p_value, p_grad, _ = loss.value_and_grad(permuted, case["mode"])
        return mismatch(p_value, value, "loss of the permuted batch") or mismatch(
            p_grad, grad[perm], "gradient of the permuted batch vs the permuted gradient"
        )

    def aggregation(case: Any) -> str | None:
        mask = case["response_mask"].bool()
        lengths = mask.sum(-1)
        n_tokens = max(int(lengths.sum()), 1)
        n_seqs = max(int((lengths > 0).sum()), 1)
        width = max(mask.shape[-1], 1)
        k, s, length = case["num_tokens"], case["num_seqs"], case["norm_length"]
        base_value, base_grad, _ = loss.value_and_grad(case, "token-sum")
        relations: list[tuple[str, dict[str, Any], float, str, float]] = [
            ("token-mean", {}, n_tokens, f"token-sum / {n_tokens} valid tokens", 0.0),
            ("token-mean", {"num_tokens": _norm(k)}, k, f"token-sum / num_tokens={k:g}", 0.0),
            ("seq-mean-token-sum", {}, n_seqs, f"token-sum / {n_seqs} non-empty row(s)", 0.0),
            ("seq-mean-token-sum", {"num_seqs": _norm(s)}, s, f"token-sum / num_seqs={s:g}", 0.0),
            (
                "seq-mean-token-sum-norm",
                {},
                n_seqs * width,
                f"token-sum / ({n_seqs} non-empty row(s) x T={width})",
                0.0,
            ),
            (
                "seq-mean-token-sum-norm",
                {"num_seqs": _norm(s), "norm_length": _norm(length)},
                s * length,
                f"token-sum / (num_seqs={s:g} x norm_length={length:g})",
                0.0,
            ),
        ]
        present = lengths[lengths > 0]
        if present.numel() and bool((present == present[0]).all()):  # equal lengths n
            n = int(present[0])
            relations += [
                (
                    "seq-mean-token-mean",
                    {},
                    n * n_seqs,
                    f"token-sum / ({n_seqs} row(s) x {n} tokens each)",
                    SEQ_MEAN_RTOL,
                ),
                (
                    "seq-mean-token-mean",
                    {"num_seqs": _norm(s)},
                    n * s,
                    f"token-sum / (num_seqs={s:g} x {n} tokens each)",
                    SEQ_MEAN_RTOL,
                ),
            ]
        for mode, norms, divisor, what, rtol in relations:
            value, grad, _ = loss.value_and_grad(case, mode, **norms)
            tol = {"rtol": rtol} if rtol else {}
            given = (
                ", ".join(f"{k}={float(v):g}" for k, v in norms.items()) or "default normalisers"
            )
            msg = mismatch(value, base_value / divisor, f"{mode} ({given}) vs {what}", **tol)
            msg = msg or mismatch(
                grad, base_grad / divisor, f"gradient of {mode} ({given}) vs of {what}", **tol
            )
            if msg:
                return msg
        return None

    def microbatch(case: Any) -> str | None:
        mask = case["response_mask"]
        slices = case["micro_batches"]
        widths = [_own_width(mask[s]) for s in slices]
        norms = algorithms.global_normalizers([mask[s, :w] for s, w in zip(slices, widths)])
        leaf = case["log_prob"].detach().clone().requires_grad_(True)
        old, adv = case["old_log_prob"], case["advantages"]
        whole, _ = loss.raw(old, leaf, adv, mask, case["mode"], **norms)
        parts = [
            loss.raw(old[s, :w], leaf[s, :w], adv[s, :w], mask[s, :w], case["mode"], **norms)[0]
            for s, w in zip(slices, widths)
        ]
        summed = torch.stack(parts).sum()
        given = ", ".join(f"{k}={float(v):g}" for k, v in norms.items())
        msg = mismatch(
            summed.detach(), whole.detach(), f"sum of micro-batch losses ({given}) vs whole"
        )
        return msg or mismatch(
            _grad(summed, leaf), _grad(whole, leaf), "summed micro-batch gradient vs whole-batch"
        )

    vanilla = _Loss(algorithms.get_loss("vanilla"))

    def ratio_one(case: Any) -> str | None:
        _, grad, _ = loss.value_and_grad(case, case["mode"])
        _, expected, _ = vanilla.value_and_grad(case, case["mode"])
        return mismatch(grad, expected, f"gradient at ratio one vs vanilla's ({case['mode']})")

    dtypes = st.sampled_from([torch.float32, torch.float64])
    return {
        "signature": (None, signature),
        "unknown_option_rejected": (None, unknown_option),
        "empty_batch": (None, empty_batch),
        "outputs": (dtypes.flatmap(lambda d: _case(dtype=d, mask_dtypes=(torch.bool, d))), outputs),
        "finite": (_finite_case(), finite),
        "zero_grad_at_masked_tokens": (_case(), zero_grad),
        "masked_inputs_ignored": (_with_garbage(), masked_ignored),
        "padding_invariance": (_with_padding(), padding),
        "row_permutation_invariance": (_with_permutation(), permutation),
        "aggregation_semantics": (_with_normalisers(), aggregation),
        "microbatch_invariance": (_with_split(), microbatch),
        "reduces_to_vanilla_at_ratio_one": (
            _case(max_log_ratio=0.0, per_sequence_advantages=True),
            ratio_one,
        ),
    }


def check_loss(
    fn_or_name: Any,
    *,
    properties: Iterable[str] | None = None,
    exempt: Iterable[str] | None = None,
    only: Iterable[str] | None = None,
    options: Mapping[str, Any] | None = None,
    max_examples: int = DEFAULT_MAX_EXAMPLES,
    seed: int = DEFAULT_SEED,
    shrink: bool = True,
) -> Report:
    """Run the policy-loss property battery on ``fn_or_name``.

    Args:
        fn_or_name: a function, a registered policy-loss name (or alias), or
            ``"package.module:function"``.
        properties: optional properties (``LOSS_PROPERTIES`` entries marked
            optional) the function claims, on top of its registration's
            ``properties=(...)``.
        exempt: generic properties the function does not have, on top of its
            registration's ``properties_exempt=(...)``; reported as exempt.
        only: check just these properties (declared or not).
        options: keyword options passed on every call (``loss_options``).
        max_examples: drawn inputs per property.
        seed: the search's seed (searches are derandomised: a run is reproducible).
        shrink: shrink a failing input to a small counterexample (False: report the
            first one found; faster when only pass / fail matters).

    Returns:
        A :class:`~rlkit.testing.Report`.

    Raises:
        rlkit.registry.UnknownNameError: ``fn_or_name`` is not found.
        ValueError: an unknown property name.
    """
    AGGREGATIONS.names()  # the built-in modes are registered
    fn, entry, target = resolve(POLICY_LOSSES, fn_or_name)
    declared, lacking = declarations(entry, properties, exempt, LOSS_PROPERTIES, "policy loss")
    names, exempted = selected(LOSS_PROPERTIES, declared, lacking, only)
    results, seconds = run_battery(
        names,
        LOSS_PROPERTIES,
        _plans(_Loss(fn, dict(options or {}))),
        max_examples=max_examples,
        seed=seed,
        shrink=shrink,
    )
    return Report(target, "loss", results, exempted, seconds)
