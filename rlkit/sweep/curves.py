"""``curves.png`` of a sweep with seeds: per grid point, the mean over seeds as a line and
the min–max over seeds as a band, one panel per metric.

The band is the range of the seeds, not a confidence interval: with 2 or 3 seeds a
t interval of the mean is several times wider than the spread and would hide the
lines; the table gives the intervals. At each step the seeds that logged the metric
there count (all of them when every run logged at the same steps).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from rlkit.logging.figures import use_headless_backend, write_png

use_headless_backend()
import matplotlib.pyplot as plt  # noqa: E402

from rlkit.sweep.results import METRICS_FILE, metric_series  # noqa: E402
from rlkit.sweep.runner import RunRecord  # noqa: E402
from rlkit.sweep.spec import RunSpec  # noqa: E402

logger = logging.getLogger(__name__)
BAND_NOTE = "line: mean over seeds; band: min-max over seeds"


def _point_series(
    runs: Sequence[RunSpec], records: Sequence[RunRecord], keys: Sequence[str]
) -> dict[str, list[dict[str, dict[int, float]]]]:
    """Point -> one metric series per run of it that logged anything, in grid order."""
    dirs = {rec.name: Path(rec.run_dir) for rec in records}
    out: dict[str, list[dict[str, dict[int, float]]]] = {}
    for run in runs:
        if run.name not in dirs:
            continue
        series = metric_series(dirs[run.name] / METRICS_FILE, keys)
        if series:
            out.setdefault(run.point or run.name, []).append(series)
    return out


def _band(
    seeds: Sequence[Mapping[str, Mapping[int, float]]], key: str
) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps, mean, min and max over the seeds at each step any of them logged ``key``."""
    steps = sorted({s for one in seeds for s in one.get(key, {})})
    means, lows, highs = [], [], []
    for step in steps:
        values = [one[key][step] for one in seeds if step in one.get(key, {})]
        means.append(sum(values) / len(values))
        lows.append(min(values))
        highs.append(max(values))
    return steps, means, lows, highs


def plot_seed_bands(
    runs: Sequence[RunSpec],
    records: Sequence[RunRecord],
    path: str | Path,
    *,
    keys: Sequence[str],
    title: str,
) -> Path | None:
    """Draw ``curves.png``: one panel per metric of ``keys`` (``*`` = prefix), one mean
    line with a min–max band per grid point.

    Returns:
        The PNG path, or ``None`` when no run logged any of ``keys``.
    """
    points = _point_series(runs, records, keys)
    metrics = sorted({k for seeds in points.values() for one in seeds for k in one})
    # Keep the order of `keys` where they are exact names (the score curve first).
    metrics.sort(key=lambda k: keys.index(k) if k in keys else len(keys))
    if not metrics:
        logger.warning("no run logged any of %s: %s not drawn", list(keys), path)
        return None
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.6), squeeze=False)
    for ax, key in zip(axes[0], metrics):
        for point, seeds in points.items():
            steps, means, lows, highs = _band(seeds, key)
            if not steps:
                continue
            (line,) = ax.plot(steps, means, marker="o" if len(steps) < 30 else None,
                              label=f"{point} ({len(seeds)} seeds)")  # fmt: skip
            ax.fill_between(steps, lows, highs, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return write_png(fig, path, f"{title} ({BAND_NOTE})" if title else BAND_NOTE)
