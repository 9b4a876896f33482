"""A published effect tested on a sweep's runs: a per-run statistic of one metric, compared
between two grid points seed by seed, and a verdict.

A :class:`Claim` names the sweep, the baseline and treatment points (their runs are
``<point>_seed=<seed>``), the metric, how a run's curve becomes one number
(:data:`STATISTICS`) and which way the paper says the treatment moves it. :func:`evaluate`
reads the completed runs' ``metrics.jsonl`` (the sweep's ``sweep_run.json`` says which
completed), pairs the seeds both points completed, and applies the
paired t-test of treatment minus baseline (:func:`rlkit.metrics.intervals.paired_t_test`):

- **reproduced**: the 95% interval of the difference lies on the claimed side of 0;
- **contradicted**: it lies on the other side;
- **inconclusive at this scale**: it contains 0 (too few seeds, or too small an effect
  for this model and step count).

:func:`plot_claim` draws both points' curves (mean over seeds, band = min-max) beside the
per-seed values and the interval of their difference.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlkit.metrics.intervals import paired_t_test
from rlkit.sweep.results import METRICS_FILE, metric_series
from rlkit.sweep.runner import COMPLETED, STATUS_FILE

REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive at this scale"


def _tail_mean(series: Mapping[int, float], window: int) -> float:
    """Mean of the last ``window`` logged values."""
    values = [series[s] for s in sorted(series)][-window:]
    return sum(values) / len(values)


def _growth(series: Mapping[int, float], window: int) -> float:
    """Mean of the last ``window`` values minus mean of the first ``window``."""
    values = [series[s] for s in sorted(series)]
    return sum(values[-window:]) / len(values[-window:]) - sum(values[:window]) / len(
        values[:window]
    )


def _curve_mean(series: Mapping[int, float], window: int) -> float:
    """Mean over every logged value after the first (step 0's, before any update, is the
    same start for both points); ``window`` is unused."""
    values = [series[s] for s in sorted(series)]
    rest = values[1:] or values
    return sum(rest) / len(rest)


#: How a run's curve becomes the number compared: name -> (function, description).
STATISTICS = {
    "tail_mean": (_tail_mean, "mean of the last {window} logged values"),
    "growth": (_growth, "mean of the last {window} values minus mean of the first {window}"),
    "curve_mean": (_curve_mean, "mean over every evaluation after step 0"),
}


@dataclass(frozen=True)
class Claim:
    """One published effect, as a comparison of two grid points of a sweep.

    Attributes:
        name: short identifier (file names, table rows).
        statement: the claim in words, with its source.
        sweep: the sweep's directory name under the sweeps folder.
        baseline, treatment: grid point names.
        metric: the metric compared.
        statistic: a key of :data:`STATISTICS`.
        direction: +1 if the paper says the treatment raises the statistic, -1 lowers.
        window: logged values the statistic averages over.
    """

    name: str
    statement: str
    sweep: str
    baseline: str
    treatment: str
    metric: str
    statistic: str
    direction: int
    window: int = 10

    def describe_statistic(self) -> str:
        return STATISTICS[self.statistic][1].format(window=self.window)


@dataclass
class ClaimResult:
    """What the runs say about a :class:`Claim`.

    Attributes:
        claim: the claim tested.
        seeds: the seeds both points completed, in order.
        curves: point -> one ``{step: value}`` curve of ``claim.metric`` per seed.
        baseline_values, treatment_values: the statistic per seed.
        difference: mean, low and high of treatment minus baseline (95%), and the
            paired test's p-value.
        verdict: :data:`REPRODUCED`, :data:`CONTRADICTED` or :data:`INCONCLUSIVE`.
    """

    claim: Claim
    seeds: list[int]
    curves: dict[str, list[dict[int, float]]]
    baseline_values: list[float]
    treatment_values: list[float]
    difference: dict[str, float | None] = field(default_factory=dict)
    verdict: str = INCONCLUSIVE

    def report(self) -> str:
        """The claim's numbers in three lines: what was compared, per seed, the verdict."""
        c, d = self.claim, self.difference
        pairs = ", ".join(
            f"seed {s}: {b:.4g} -> {t:.4g}"
            for s, b, t in zip(self.seeds, self.baseline_values, self.treatment_values)
        )
        interval = f" [{d['low']:+.4g}, {d['high']:+.4g}]" if d.get("low") is not None else ""
        p = f", p = {d['p_value']:.3f}" if d.get("p_value") is not None else ""
        return (
            f"{c.name}: {c.metric}, {c.describe_statistic()}; {c.baseline} -> {c.treatment}\n"
            f"  {pairs}\n"
            f"  difference {d['mean']:+.4g}{interval}{p}: {self.verdict}"
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["claim"]["statistic_text"] = self.claim.describe_statistic()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClaimResult:
        claim = {k: v for k, v in data["claim"].items() if k != "statistic_text"}
        curves = {
            p: [{int(s): float(v) for s, v in c.items()} for c in runs]
            for p, runs in data["curves"].items()
        }
        return cls(
            Claim(**claim),
            list(data["seeds"]),
            curves,
            list(data["baseline_values"]),
            list(data["treatment_values"]),
            dict(data["difference"]),
            data["verdict"],
        )


def verdict(low: float | None, high: float | None, direction: int) -> str:
    """The reading of a difference's interval ``[low, high]`` for a claimed ``direction``."""
    if low is None or high is None or (low <= 0.0 <= high):
        return INCONCLUSIVE
    moved_up = low > 0.0
    return REPRODUCED if moved_up == (direction > 0) else CONTRADICTED


def _seed_of(run_dir: Path, point: str) -> int | None:
    prefix = f"{point}_seed="
    name = run_dir.name
    return int(name[len(prefix) :]) if name.startswith(prefix) else None


def _completed(run_dir: Path) -> bool:
    """Whether the sweep recorded ``run_dir``'s run as completed (a run still going, or
    stopped early, would compare an earlier step's values)."""
    status = run_dir / STATUS_FILE
    return status.is_file() and json.loads(status.read_text()).get("status") == COMPLETED


def _completed_curves(sweep_dir: Path, point: str, metric: str) -> dict[int, dict[int, float]]:
    """Seed -> the metric's curve, for each completed run of ``point`` that logged it."""
    out = {}
    for run_dir in sorted(sweep_dir.glob(f"{point}_seed=*")):
        seed = _seed_of(run_dir, point)
        curve = metric_series(run_dir / METRICS_FILE, [metric]).get(metric)
        if seed is not None and curve and _completed(run_dir):
            out[seed] = curve
    return out


def evaluate(claim: Claim, sweeps_dir: str | Path) -> ClaimResult:
    """Test ``claim`` on the runs under ``sweeps_dir/claim.sweep``.

    Raises:
        FileNotFoundError: the sweep has no run of both points with ``claim.metric``
            for at least two common seeds.
    """
    sweep_dir = Path(sweeps_dir) / claim.sweep
    base = _completed_curves(sweep_dir, claim.baseline, claim.metric)
    treat = _completed_curves(sweep_dir, claim.treatment, claim.metric)
    seeds = sorted(set(base) & set(treat))
    if len(seeds) < 2:
        raise FileNotFoundError(
            f"{sweep_dir}: {claim.metric!r} is logged for {len(seeds)} seed(s) of both "
            f"{claim.baseline!r} and {claim.treatment!r}; a paired test needs 2 or more "
            f"(run the sweep: rlkit sweep experiments/sweeps/{claim.sweep}.gin)"
        )
    stat = STATISTICS[claim.statistic][0]
    b = [stat(base[s], claim.window) for s in seeds]
    t = [stat(treat[s], claim.window) for s in seeds]
    test = paired_t_test(t, b)
    d = test.difference
    result = ClaimResult(
        claim,
        seeds,
        {claim.baseline: [base[s] for s in seeds], claim.treatment: [treat[s] for s in seeds]},
        b,
        t,
        {"mean": d.mean, "low": d.low, "high": d.high, "p_value": test.p_value},
    )
    result.verdict = verdict(d.low, d.high, claim.direction)
    return result


def plot_claim(result: ClaimResult) -> Any:
    """A figure: left, both points' curves of the metric (mean over seeds, band =
    min-max); right, the statistic per seed for both points, joined seed by seed, with the
    difference's interval in the title."""
    import matplotlib.pyplot as plt

    claim = result.claim
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), width_ratios=(2, 1))
    for colour, point in zip(("C0", "C3"), (claim.baseline, claim.treatment)):
        curves = result.curves[point]
        steps = sorted({s for c in curves for s in c})
        values = [[c[s] for c in curves if s in c] for s in steps]
        left.plot(steps, [sum(v) / len(v) for v in values], color=colour, label=point)
        left.fill_between(
            steps, [min(v) for v in values], [max(v) for v in values], color=colour, alpha=0.2
        )
    left.set_xlabel("step")
    left.set_ylabel(claim.metric)
    left.set_title(f"{claim.metric}: mean over {len(result.seeds)} seeds, band min-max")
    left.legend(fontsize=8)
    for seed, b, t in zip(result.seeds, result.baseline_values, result.treatment_values):
        right.plot([0, 1], [b, t], color="0.5", marker="o")
        right.annotate(f"seed {seed}", (1.02, t), fontsize=7, va="center")
    right.set_xticks([0, 1], [claim.baseline, claim.treatment], fontsize=8)
    right.set_xlim(-0.3, 1.4)
    right.set_ylabel(claim.describe_statistic(), fontsize=8)
    d = result.difference
    interval = (
        f"[{d['low']:+.3g}, {d['high']:+.3g}]" if d.get("low") is not None else "(no interval)"
    )
    right.set_title(f"difference {d['mean']:+.3g} {interval}\n{result.verdict}", fontsize=9)
    fig.suptitle(claim.statement, fontsize=9)
    fig.tight_layout()
    return fig


def write_results(results: Sequence[ClaimResult], path: str | Path) -> Path:
    """Every result as JSON (what the research notebook and docs read)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = [r.to_json() for r in results]
    text = json.dumps(data, indent=1, default=lambda v: None if not math.isfinite(v) else v)
    path.write_text(text + "\n")
    return path


def read_results(path: str | Path) -> list[ClaimResult]:
    """What :func:`write_results` wrote."""
    return [ClaimResult.from_json(d) for d in json.loads(Path(path).read_text())]
