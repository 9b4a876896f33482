"""A sweep's per-run results: final and best metrics per run as CSV and a Markdown table,
every run's curves as one PNG (seeded sweeps aggregate these: :mod:`rlkit.sweep.aggregate`).

"Final" is a metric's value at the last step that logged it; "best" is its
maximum over the run (every validation metric rlkit logs -- mean@k, pass@k,
score -- is better when higher) and ``best_step`` the first step reaching it.
Failed runs stay in the tables with their status and log, and with whatever
metrics they logged before failing.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlkit.logging import plot_learning_curves, read_metrics
from rlkit.sweep.runner import RunRecord

logger = logging.getLogger(__name__)
METRICS_FILE = "metrics.jsonl"


def matches(key: str, patterns: Sequence[str]) -> bool:
    """Whether metric ``key`` is one of ``patterns`` (a trailing ``*`` matches a prefix)."""
    return any(key.startswith(p[:-1]) if p.endswith("*") else key == p for p in patterns)


def metric_series(metrics_path: str | Path, patterns: Sequence[str]) -> dict[str, dict[int, float]]:
    """Metric -> step -> value of every finite metric matching ``patterns`` in a run's
    ``metrics.jsonl`` (an empty dict without the file)."""
    path = Path(metrics_path)
    if not path.is_file() or path.stat().st_size == 0:
        return {}
    series: dict[str, dict[int, float]] = {}
    for record in read_metrics(path):
        for key, value in record.items():
            if key == "step" or not matches(key, patterns):
                continue
            if isinstance(value, int | float) and math.isfinite(value):
                series.setdefault(key, {})[int(record["step"])] = float(value)
    return series


def run_metrics(
    metrics_path: str | Path, patterns: Sequence[str]
) -> tuple[int | None, dict[str, float]]:
    """Final, best and best-step values of every metric matching ``patterns``.

    Args:
        metrics_path: a run's ``metrics.jsonl`` (missing: no metrics).
        patterns: metric names; a trailing ``*`` matches a prefix.

    Returns:
        ``(last_step, values)`` with ``values["final <key>"]``, ``values["best <key>"]``
        and ``values["best_step <key>"]`` per matching key; ``(None, {})`` without a file.
    """
    path = Path(metrics_path)
    if not path.is_file():
        return None, {}
    records = read_metrics(path)
    values: dict[str, float] = {}
    keys = sorted({k for r in records for k in r if k != "step" and matches(k, patterns)})
    for key in keys:
        points = [
            (r["step"], float(r[key]))
            for r in records
            if isinstance(r.get(key), int | float) and math.isfinite(r[key])
        ]
        if not points:
            continue
        best_step, best = max(points, key=lambda p: (p[1], -p[0]))
        values[f"final {key}"] = points[-1][1]
        values[f"best {key}"] = best
        values[f"best_step {key}"] = float(best_step)
    return (records[-1]["step"] if records else None), values


def collect_rows(
    records: Sequence[RunRecord], axes: Mapping[str, Mapping[str, str]], patterns: Sequence[str]
) -> list[dict[str, Any]]:
    """One table row per run: name, status, axis labels, steps, wall time, metrics, log.

    Args:
        records: the runs' records, in grid order.
        axes: run name -> axis -> label.
        patterns: which metrics to tabulate (see :func:`run_metrics`).
    """
    rows = []
    for rec in records:
        last_step, values = run_metrics(Path(rec.run_dir) / METRICS_FILE, patterns)
        rows.append(
            {
                "run": rec.name,
                "status": rec.status,
                **dict(axes.get(rec.name, {})),
                "steps": last_step,
                "wall_s": round(rec.wall_s, 1),
                **values,
                "error": rec.error,
                "log": rec.log,
            }
        )
    return rows


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(k for row in rows for k in row))


def write_csv(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Every column of every row; a run without some metric leaves that cell empty."""
    path = Path(path)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=_columns(rows), restval="")
        writer.writeheader()
        writer.writerows(rows)
    return path


def short_names(keys: Sequence[str]) -> dict[str, str]:
    """``val/arithmetic/mean@4`` -> ``mean@4`` when all keys share one data source."""
    stripped = {k: k.removeprefix("val/") for k in keys}
    sources = {v.split("/", 1)[0] for v in stripped.values() if "/" in v}
    if len(sources) == 1 and all("/" in v for v in stripped.values()):
        return {k: v.split("/", 1)[1] for k, v in stripped.items()}
    return stripped


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value).replace("|", "\\|")


def _relative(path: str, base: Path | None) -> str:
    try:
        return str(Path(path).relative_to(base)) if base is not None else path
    except ValueError:
        return path


def markdown_table(
    rows: Sequence[Mapping[str, Any]], axis_names: Sequence[str], *, base_dir: Path | None = None
) -> str:
    """A Markdown table: run, status, axes, final and best of each metric, steps, wall time.

    Axis columns are headed by the binding's field name (``seed`` for
    ``TrainerConfig.seed``). Failed runs show ``failed`` and their log path
    (relative to ``base_dir`` when inside it) in the status cell.
    """
    metric_keys = list(
        dict.fromkeys(k.split(" ", 1)[1] for row in rows for k in row if k.startswith("final "))
    )
    short = short_names(metric_keys)
    header = ["run", "status", *(a.rsplit(".", 1)[-1] for a in axis_names)]
    header += [f"{kind} {short[k]}" for k in metric_keys for kind in ("final", "best")]
    header += ["steps", "wall (s)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        status = row["status"]
        if status == "failed":
            status = f"failed ({_relative(row['log'], base_dir)})"
        cells = [row["run"], status, *(row.get(a, "") for a in axis_names)]
        cells += [row.get(f"{kind} {k}") for k in metric_keys for kind in ("final", "best")]
        wall = row.get("wall_s")
        cells += [row.get("steps"), None if wall is None else f"{wall:.0f}"]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def plot_sweep_curves(
    records: Sequence[RunRecord], path: str | Path, *, keys: Sequence[str], title: str
) -> Path | None:
    """All runs' learning curves on one figure (runs without metrics are left out).

    Returns:
        The PNG path, or ``None`` when no run logged any of ``keys``.
    """
    runs = {
        rec.name: Path(rec.run_dir) / METRICS_FILE
        for rec in records
        if (Path(rec.run_dir) / METRICS_FILE).is_file()
        and (Path(rec.run_dir) / METRICS_FILE).stat().st_size > 0
    }
    if not runs:
        logger.warning("no run logged any metrics: %s not drawn", path)
        return None
    try:
        return plot_learning_curves(runs, path, keys=keys, title=title)
    except ValueError as exc:  # none of the keys was logged
        logger.warning("%s not drawn: %s", path, exc)
        return None
