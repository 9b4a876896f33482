"""Seeds as replicates: each grid point's mean, spread and t interval over its seeds, and
each point's paired difference to a baseline point.

Only completed runs count: a failed run stopped early, and its last value would be
one of an earlier step. Statistics come from :mod:`rlkit.metrics.intervals`.

A paired difference takes, for each seed both points completed, the baseline's run
and the other point's run of that seed, reads a metric at the same step in both (the
last step every one of these runs logged it), and tests the per-seed differences
with the paired t-test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.metrics.intervals import LEVEL, Estimate, PairedTest, paired_t_test, t_interval
from rlkit.sweep.results import METRICS_FILE, metric_series
from rlkit.sweep.runner import COMPLETED, RunRecord
from rlkit.sweep.spec import RunSpec

#: The per-run statistics aggregated over seeds (see :func:`rlkit.sweep.results.run_metrics`).
AGGREGATED_KINDS = ("final", "best")


@dataclass
class PointSummary:
    """One grid point over its seeds.

    Attributes:
        point: the grid point's name.
        axes: axis -> value label.
        seeds: the seeds it was run with (``[None]`` in a sweep without ``Sweep.seeds``).
        completed: the seeds whose run completed.
        estimates: ``"final <metric>"`` / ``"best <metric>"`` -> the :class:`Estimate`
            over the completed seeds that logged it.
    """

    point: str
    axes: dict[str, str]
    seeds: list[int | None]
    completed: list[int | None]
    estimates: dict[str, Estimate] = field(default_factory=dict)

    def csv_row(self) -> dict[str, Any]:
        """Point, axes, seed counts, then mean / std / n / interval of each statistic."""
        row: dict[str, Any] = {"point": self.point, **self.axes}
        row |= {"seeds": len(self.seeds), "completed": len(self.completed)}
        for stat, est in self.estimates.items():
            row |= {
                f"mean {stat}": est.mean,
                f"std {stat}": est.std,
                f"n {stat}": est.n,
                f"ci{round(100 * est.level)}_low {stat}": est.low,
                f"ci{round(100 * est.level)}_high {stat}": est.high,
            }
        return row


@dataclass
class PairedDifference:
    """A grid point against the baseline point for one metric, paired by seed.

    Attributes:
        point, baseline: the two grid points.
        metric: the metric name.
        step: the step both were read at (the last one every paired run logged).
        seeds: the seeds paired.
        point_values, baseline_values: the metric per paired seed.
        test: the paired t-test of ``point - baseline``.
    """

    point: str
    baseline: str
    metric: str
    step: int
    seeds: list[int | None]
    point_values: list[float]
    baseline_values: list[float]
    test: PairedTest

    def csv_row(self) -> dict[str, Any]:
        d = self.test.difference
        return {
            "point": self.point,
            "baseline": self.baseline,
            "metric": self.metric,
            "step": self.step,
            "n": d.n,
            "seeds": " ".join(str(s) for s in self.seeds),
            "mean point": sum(self.point_values) / d.n,
            "mean baseline": sum(self.baseline_values) / d.n,
            "mean difference": d.mean,
            "std difference": d.std,
            f"ci{round(100 * d.level)}_low": d.low,
            f"ci{round(100 * d.level)}_high": d.high,
            "t": self.test.t_statistic,
            "p_value": self.test.p_value,
            "reading": self.test.verdict,
        }


def _points(runs: Sequence[RunSpec]) -> dict[str, list[RunSpec]]:
    """Point name -> its runs, both in grid order."""
    out: dict[str, list[RunSpec]] = {}
    for run in runs:
        out.setdefault(run.point or run.name, []).append(run)
    return out


def aggregate_points(
    runs: Sequence[RunSpec], rows: Sequence[Mapping[str, Any]], level: float = LEVEL
) -> list[PointSummary]:
    """One :class:`PointSummary` per grid point, from the per-run table rows.

    Args:
        runs: every run of the sweep, in grid order.
        rows: the per-run rows (:func:`rlkit.sweep.results.collect_rows`) of the runs so far.
        level: the interval's confidence level.
    """
    by_run = {row["run"]: row for row in rows}
    stats = list(
        dict.fromkeys(
            k for row in rows for k in row if k.split(" ", 1)[0] in AGGREGATED_KINDS and " " in k
        )
    )
    summaries = []
    for point, members in _points(runs).items():
        done = [r for r in members if by_run.get(r.name, {}).get("status") == COMPLETED]
        summary = PointSummary(
            point, dict(members[0].axes), [r.seed for r in members], [r.seed for r in done]
        )
        for stat in stats:
            values = [by_run[r.name][stat] for r in done if by_run[r.name].get(stat) is not None]
            if values:
                summary.estimates[stat] = t_interval(values, level)
        summaries.append(summary)
    return summaries


def compare_points(
    runs: Sequence[RunSpec],
    records: Sequence[RunRecord],
    baseline: str,
    patterns: Sequence[str],
    level: float = LEVEL,
) -> list[PairedDifference]:
    """Every other point's paired difference to ``baseline``, per metric matching ``patterns``.

    Pairs are the seeds both points completed; a metric is compared at the last step
    that all of the paired runs logged (none in common: that metric is left out).
    """
    completed = {rec.name for rec in records if rec.status == COMPLETED}
    points = _points(runs)
    base_runs = {r.seed: r for r in points[baseline] if r.name in completed}
    series = {
        rec.name: metric_series(Path(rec.run_dir) / METRICS_FILE, patterns)
        for rec in records
        if rec.name in completed
    }
    out = []
    for point, members in points.items():
        if point == baseline:
            continue
        pairs = [
            (r, base_runs[r.seed]) for r in members if r.name in completed and r.seed in base_runs
        ]
        if pairs:
            out += _paired_metrics(point, baseline, pairs, series, level)
    return out


def _paired_metrics(
    point: str,
    baseline: str,
    pairs: list[tuple[RunSpec, RunSpec]],
    series: Mapping[str, Mapping[str, Mapping[int, float]]],
    level: float,
) -> list[PairedDifference]:
    names = [name for pair in pairs for name in (pair[0].name, pair[1].name)]
    keys = sorted(set.intersection(*(set(series[n]) for n in names)))
    out = []
    for key in keys:
        common = set.intersection(*(set(series[n][key]) for n in names))
        if not common:
            continue
        step = max(common)
        a = [series[p.name][key][step] for p, _ in pairs]
        b = [series[q.name][key][step] for _, q in pairs]
        test = paired_t_test(a, b, level)
        out.append(
            PairedDifference(point, baseline, key, step, [p.seed for p, _ in pairs], a, b, test)
        )
    return out
