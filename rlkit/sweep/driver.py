"""Drive a whole sweep: plan, run each point (skipping completed ones), tabulate, plot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.sweep.results import collect_rows, plot_sweep_curves, write_csv, write_markdown
from rlkit.sweep.runner import COMPLETED, RunRecord, execute, previous_record, train_command
from rlkit.sweep.spec import RunSpec, SweepSpec, expand_grid

#: Every run's first binding: a progress bar only garbles a log file (a sweep binding can undo it).
DEFAULT_RUN_BINDINGS = ("TrainerConfig.progress_bar = False",)


@dataclass
class SweepResult:
    """What :func:`run_sweep` produced.

    Attributes:
        records: one :class:`~rlkit.sweep.runner.RunRecord` per grid point, in grid order.
        rows: the table rows (see :func:`rlkit.sweep.results.collect_rows`).
        csv_path, markdown_path: ``results.csv`` and ``results.md`` in the sweep directory.
        curves_path: ``curves.png``, or ``None`` if no run logged a curve metric.
    """

    records: list[RunRecord]
    rows: list[dict[str, Any]]
    csv_path: Path
    markdown_path: Path
    curves_path: Path | None

    @property
    def failed(self) -> list[RunRecord]:
        return [r for r in self.records if r.status != COMPLETED]


def plan(spec: SweepSpec, sweep_dir: Path | None = None) -> list[RunSpec]:
    """The runs of ``spec``, with :data:`DEFAULT_RUN_BINDINGS` first in each."""
    runs = expand_grid(spec, sweep_dir)
    return [RunSpec(r.name, r.configs, (*DEFAULT_RUN_BINDINGS, *r.bindings), r.axes) for r in runs]


def run_sweep(
    spec: SweepSpec,
    sweep_dir: Path | None = None,
    *,
    echo: Callable[[str], None] = print,
) -> SweepResult:
    """Run every grid point in turn and write ``results.csv``, ``results.md``, ``curves.png``.

    A run that fails is recorded (status, exit code, log path) and the sweep goes
    on; a run completed by an earlier invocation is skipped. Tables and figure are
    rewritten after every run, so they are current even if the sweep is stopped.

    Args:
        spec: the sweep.
        sweep_dir: the sweep file's directory (resolves relative config paths).
        echo: where progress lines go.

    Returns:
        The :class:`SweepResult`.

    Raises:
        SweepError: a malformed spec, or a run directory holding a run with other
            settings -- all checked before the first run starts.
    """
    runs = plan(spec, sweep_dir)
    out = Path(spec.output_dir).resolve()
    previous = {r.name: previous_record(r, out / r.name) for r in runs}  # fail fast on conflicts
    out.mkdir(parents=True, exist_ok=True)
    records: list[RunRecord] = []
    for i, run in enumerate(runs, start=1):
        before = previous[run.name]
        if before is not None and before.status == COMPLETED:
            before.skipped = True
            records.append(before)
            echo(f"[sweep] {i}/{len(runs)} {run.name}: already completed, skipped")
            continue
        echo(f"[sweep] {i}/{len(runs)} {run.name}: running (log: {out / run.name / 'train.log'})")
        record = execute(run, out / run.name, launcher=spec.launcher, timeout_s=spec.run_timeout_s)
        records.append(record)
        outcome = record.status if not record.error else f"{record.status}: {record.error}"
        echo(f"[sweep] {i}/{len(runs)} {run.name}: {outcome} in {record.wall_s:.0f} s")
        if i < len(runs):  # partial tables, in case the sweep is stopped
            _write_outputs(spec, runs, records, out)
    return _write_outputs(spec, runs, records, out)


def _write_outputs(
    spec: SweepSpec, runs: list[RunSpec], records: list[RunRecord], out: Path
) -> SweepResult:
    axes = {r.name: r.axes for r in runs}
    axis_names = [a for a in spec.grid if len(spec.grid[a]) > 1]
    rows = collect_rows(records, axes, spec.metrics)
    csv_path = write_csv(rows, out / "results.csv")
    md_path = write_markdown(rows, out / "results.md", title=spec.name, axis_names=axis_names)
    png = plot_sweep_curves(records, out / "curves.png", keys=spec.curve_keys, title=spec.name)
    return SweepResult(records, rows, csv_path, md_path, png)


def dry_run(spec: SweepSpec, sweep_dir: Path | None = None) -> list[str]:
    """The command line of every run, without running anything."""
    import shlex

    out = Path(spec.output_dir).resolve()
    return [
        shlex.join(train_command(r, out / r.name, spec.launcher)) for r in plan(spec, sweep_dir)
    ]
