"""``results.md`` of a sweep: per grid point over seeds, paired differences, and per run.

A sweep with ``Sweep.seeds`` gets three sections: the grid points (mean ± std over
seeds and the 95% t interval of the mean), the paired differences to
``Sweep.compare`` (when set), and the per-run table. A sweep without seeds keeps the
per-run table alone, plus the paired differences when ``Sweep.compare`` is set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlkit.metrics.intervals import Estimate
from rlkit.sweep.aggregate import AGGREGATED_KINDS, PairedDifference, PointSummary
from rlkit.sweep.results import markdown_table, short_names

POINTS_NOTE = (
    "Each cell: mean ± std over the seeds whose run completed [95% t interval of the mean: "
    "mean ± t(0.975, n-1) · std / √n]; `n` = those seeds. With n=1 there is no interval. "
    "Final = value at the last logged step; best = maximum over the run."
)
PAIRED_NOTE = (
    "Each row: point − {baseline} at the same step, paired seed by seed (the same seed in "
    "both runs), over the seeds both completed: the mean difference, the 95% t interval "
    "of the mean difference and the two-sided paired t-test's p-value. "
    '"not distinguishable" = the interval includes 0.'
)


def estimate_cell(est: Estimate | None, completed: int, digits: int = 4) -> str:
    """``mean ± std [low, high]``, ``mean (n=1: no interval)`` or ``-``; `` (n=k)`` is
    added when fewer than ``completed`` seeds logged the metric."""
    if est is None:
        return "-"
    if est.has_interval:
        text = f"{est.mean:.{digits}f} ± {est.std:.{digits}f} {est.interval_text(digits)}"
    else:
        text = f"{est.mean:.{digits}f} ({est.interval_text(digits)})"
    return text if est.n == completed else f"{text} (n={est.n})"


def points_table(summaries: Sequence[PointSummary], axis_names: Sequence[str]) -> str:
    """One row per grid point: axes, completed seeds, final and best of each metric."""
    metrics = list(
        dict.fromkeys(k.split(" ", 1)[1] for s in summaries for k in s.estimates if " " in k)
    )
    short = short_names(metrics)
    header = ["point", *(a.rsplit(".", 1)[-1] for a in axis_names), "n"]
    header += [f"{kind} {short[m]}" for m in metrics for kind in AGGREGATED_KINDS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in summaries:
        n = len(s.completed)
        seeds = f"{n}" if n == len(s.seeds) else f"{n} of {len(s.seeds)}"
        cells = [s.point, *(s.axes.get(a, "") for a in axis_names), seeds]
        cells += [
            estimate_cell(s.estimates.get(f"{kind} {m}"), n)
            for m in metrics
            for kind in AGGREGATED_KINDS
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def _p_text(p: float | None) -> str:
    if p is None:
        return "-"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def paired_table(differences: Sequence[PairedDifference]) -> str:
    """One row per (point, metric): step, n, means, difference, interval, p, reading."""
    short = short_names([d.metric for d in differences])
    header = ["point", "metric", "step", "n", "point mean", "baseline mean", "difference"]
    header += ["95% interval", "p (paired t)", "reading"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for d in differences:
        diff = d.test.difference
        cells = [d.point, short[d.metric], str(d.step), str(diff.n)]
        cells += [f"{sum(d.point_values) / diff.n:.4f}", f"{sum(d.baseline_values) / diff.n:.4f}"]
        cells += [f"{diff.mean:+.4f}", diff.interval_text(), _p_text(d.test.p_value)]
        cells.append(d.test.verdict)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _paired_section(baseline: str, differences: Sequence[PairedDifference]) -> str:
    head = f"## Paired differences to {baseline}\n\n{PAIRED_NOTE.format(baseline=baseline)}\n\n"
    if not differences:
        return head + "No point has a completed seed in common with the baseline yet.\n"
    return head + paired_table(differences) + "\n"


def write_report(
    path: str | Path,
    *,
    title: str,
    rows: Sequence[Mapping[str, Any]],
    axis_names: Sequence[str],
    summaries: Sequence[PointSummary] | None,
    baseline: str = "",
    differences: Sequence[PairedDifference] = (),
) -> Path:
    """Write ``results.md`` (see the module docstring); ``summaries`` is ``None`` without seeds."""
    path = Path(path)
    completed = sum(r["status"] == "completed" for r in rows)
    base_dir = path.parent.resolve()
    if summaries is None:
        parts = [
            f"# {title}\n\n{completed} of {len(rows)} runs completed. Final = last logged "
            f"value; best = maximum over the run.\n\n"
            f"{markdown_table(rows, axis_names, base_dir=base_dir)}\n"
        ]
    else:
        seeds = sorted({s for p in summaries for s in p.seeds if s is not None})
        parts = [
            f"# {title}\n\n{completed} of {len(rows)} runs completed: {len(summaries)} grid "
            f"point(s) x seeds {', '.join(map(str, seeds))}.\n\n## Grid points over seeds\n\n"
            f"{POINTS_NOTE}\n\n{points_table(summaries, axis_names)}\n"
        ]
    if baseline:
        parts.append(_paired_section(baseline, differences))
    if summaries is not None:
        table = markdown_table(rows, [*axis_names, "seed"], base_dir=base_dir)
        parts.append(f"## Runs (one per seed)\n\n{table}\n")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
