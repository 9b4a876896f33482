"""``learning_curve.png``: one run's health at a glance, on a grid of panels.

| panel | what is drawn |
|---|---|
| training reward | ``critic/score/mean`` (its min..max as a band) and ``critic/acc/mean`` |
| held-out accuracy | per source, ``mean@n`` with its 95% interval as a band, and each ``pass@k`` that is a different curve (with one sample per prompt, ``mean@1``, ``pass@1`` and ``score/mean`` are the same number: drawn once) |
| response length | ``response_length/mean`` and ``/max`` |
| entropy | ``actor/entropy`` |
| clip fraction and KL | ``actor/pg_clipfrac`` and ``actor/ppo_kl`` (right axis); ``actor/kl_loss`` where a KL loss is on |
| gradient norm | ``actor/grad_norm`` |

A panel whose metrics the run does not log is left out. Sweeps compare runs with
:func:`~rlkit.logging.learning_curve.plot_learning_curves` instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlkit.logging.figures import use_headless_backend, write_png

use_headless_backend()
import matplotlib.pyplot as plt  # noqa: E402

from rlkit.logging.metrics_file import read_metrics  # noqa: E402

Records = list[dict[str, Any]]
_VAL = re.compile(r"val/(?P<source>.+)/(?P<name>mean@\d+|pass@\d+)$")


def series(records: Records, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` over the records that log it as a number."""
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), int | float)]
    return ([p[0] for p in points], [p[1] for p in points]) if points else ([], [])


def _line(ax: Any, records: Records, key: str, label: str, **style: Any) -> bool:
    xs, ys = series(records, key)
    if xs:
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label, **style)
    return bool(xs)


def _band(ax: Any, records: Records, low: str, high: str, **style: Any) -> None:
    xs, lows = series(records, low)
    xs_high, highs = series(records, high)
    if xs and xs == xs_high:
        ax.fill_between(xs, lows, highs, alpha=0.2, linewidth=0, **style)


def _reward(ax: Any, records: Records) -> bool:
    _band(ax, records, "critic/score/min", "critic/score/max", color="C0")
    drawn = _line(ax, records, "critic/score/mean", "score (mean, band: min..max)", color="C0")
    drawn |= _line(ax, records, "critic/acc/mean", "acc", color="C1")
    ax.set_title("training reward")
    return drawn


def held_out_keys(records: Records) -> dict[str, dict[str, str]]:
    """source -> {"mean@n" | "pass@k": metric name}, without a pass@k whose curve is the
    mean@n one (pass@1 equals mean@n when n = 1)."""
    found: dict[str, dict[str, str]] = {}
    for key in sorted({k for r in records for k in r}):
        m = _VAL.match(key)
        if m and not key.endswith(("_ci_low", "_ci_high")):
            found.setdefault(m["source"], {})[m["name"]] = key
    for names in found.values():
        mean = next((k for k in names if k.startswith("mean@")), None)
        if mean is None:
            continue
        for name in [k for k in names if k.startswith("pass@")]:
            if series(records, names[name]) == series(records, names[mean]):
                del names[name]
    return found


def _held_out(ax: Any, records: Records) -> bool:
    drawn = False
    for i, (source, names) in enumerate(held_out_keys(records).items()):
        color = f"C{i}"
        for name, key in sorted(
            names.items(), key=lambda kv: (not kv[0].startswith("mean@"), kv[0])
        ):
            if name.startswith("mean@"):
                _band(ax, records, f"{key}_ci_low", f"{key}_ci_high", color=color)
                drawn |= _line(ax, records, key, f"{source} {name} (band: 95%)", color=color)
            else:
                k = int(name.split("@")[1])
                drawn |= _line(ax, records, key, f"{source} {name}", color=color, alpha=0.5,
                               linestyle=(0, (1 + k, 2)))  # fmt: skip
    ax.set_title("held-out accuracy")
    return drawn


def _length(ax: Any, records: Records) -> bool:
    drawn = _line(ax, records, "response_length/mean", "mean", color="C0")
    drawn |= _line(ax, records, "response_length/max", "max", color="C0", linestyle="--")
    ax.set_title("response length (tokens)")
    return drawn


def _entropy(ax: Any, records: Records) -> bool:
    ax.set_title("entropy")
    return _line(ax, records, "actor/entropy", "actor/entropy", color="C2")


def _clip_and_kl(ax: Any, records: Records) -> bool:
    drawn = _line(ax, records, "actor/pg_clipfrac", "pg_clipfrac", color="C3")
    right = ax.twinx()
    kl = _line(right, records, "actor/ppo_kl", "ppo_kl (right)", color="C4")
    kl |= _line(right, records, "actor/kl_loss", "kl_loss (right)", color="C5")
    if kl:
        right.legend(fontsize=7, loc="upper right")
    else:
        right.remove()
    ax.set_title("clip fraction and KL")
    return drawn or kl


def _grad_norm(ax: Any, records: Records) -> bool:
    ax.set_title("gradient norm")
    return _line(ax, records, "actor/grad_norm", "actor/grad_norm", color="C7")


PANELS: Sequence[Callable[[Any, Records], bool]] = (
    _reward,
    _held_out,
    _length,
    _entropy,
    _clip_and_kl,
    _grad_norm,
)


def plot_run_dashboard(metrics: str | Path, out_png: str | Path, *, title: str = "") -> Path:
    """Draw ``learning_curve.png`` of one run from its ``metrics.jsonl`` (module docstring).

    Raises:
        ValueError: the run logs none of the panels' metrics.
    """
    records = read_metrics(metrics)
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5), squeeze=False)
    shown = 0
    for ax, panel in zip(axes.flat, PANELS):
        if panel(ax, records):
            shown += 1
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7, loc="upper left")
        else:
            ax.set_visible(False)
    if not shown:
        plt.close(fig)
        raise ValueError(f"{metrics} logs none of the metrics learning_curve.png draws")
    return write_png(fig, out_png, title)
