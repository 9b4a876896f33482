"""Learning-curve PNGs from ``metrics.jsonl`` files (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from rlkit.logging.figures import use_headless_backend, write_png

use_headless_backend()
import matplotlib.pyplot as plt  # noqa: E402

from rlkit.logging.metrics_file import read_metrics  # noqa: E402


def plot_learning_curves(
    runs: Mapping[str, str | Path],
    out_png: str | Path,
    *,
    keys: Sequence[str] = ("critic/score/mean",),
    title: str = "",
) -> Path:
    """One panel per metric key, one line per run.

    Args:
        runs: label -> path of the run's ``metrics.jsonl``.
        out_png: where to write the figure.
        keys: metric names; a key missing from every run is skipped. A key ending
            in ``*`` matches every metric with that prefix (e.g. ``val/*``).
    """
    records = {label: read_metrics(path) for label, path in runs.items()}
    expanded: list[str] = []
    for key in keys:
        if key.endswith("*"):
            found = {
                k for recs in records.values() for r in recs for k in r if k.startswith(key[:-1])
            }
            expanded += sorted(found)
        else:
            expanded.append(key)
    expanded = [k for k in expanded if any(k in r for recs in records.values() for r in recs)]
    if not expanded:
        raise ValueError(f"none of the metrics {list(keys)} occurs in the runs {list(runs)}")
    fig, axes = plt.subplots(1, len(expanded), figsize=(5 * len(expanded), 3.6), squeeze=False)
    for ax, key in zip(axes[0], expanded):
        for label, recs in records.items():
            pts = [(r["step"], r[key]) for r in recs if isinstance(r.get(key), (int, float))]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, label=label)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return write_png(fig, out_png, title)
