"""Drive a whole sweep: plan, run each point and seed (skipping completed runs, several
at once with ``Sweep.max_parallel``), then tabulate, compare and plot."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.logging import read_metrics
from rlkit.sweep.aggregate import PairedDifference, PointSummary, aggregate_points, compare_points
from rlkit.sweep.curves import plot_seed_bands
from rlkit.sweep.report import write_report
from rlkit.sweep.results import METRICS_FILE, collect_rows, plot_sweep_curves, write_csv
from rlkit.sweep.runner import (
    COMPLETED,
    RunRecord,
    execute,
    previous_record,
    stop_running,
    train_command,
)
from rlkit.sweep.spec import RunSpec, SweepError, SweepSpec, expand_grid

#: Every run's first binding: a progress bar only garbles a log file (a sweep binding can undo it).
DEFAULT_RUN_BINDINGS = ("TrainerConfig.progress_bar = False",)


@dataclass
class SweepResult:
    """What :func:`run_sweep` produced.

    Attributes:
        records: one :class:`~rlkit.sweep.runner.RunRecord` per run, in grid order.
        rows: the per-run table rows (see :func:`rlkit.sweep.results.collect_rows`).
        csv_path, markdown_path: ``results.csv`` and ``results.md`` in the sweep directory
            (with ``Sweep.seeds``, ``results.csv`` has one row per grid point).
        curves_path: ``curves.png``, or ``None`` if no run logged a curve metric.
        per_seed_csv_path: ``results_per_seed.csv`` (one row per run) with ``Sweep.seeds``.
        comparison_csv_path: ``comparison.csv`` with ``Sweep.compare``.
        summaries: per grid point over seeds (with ``Sweep.seeds``).
        differences: paired differences to ``Sweep.compare``.
    """

    records: list[RunRecord]
    rows: list[dict[str, Any]]
    csv_path: Path
    markdown_path: Path
    curves_path: Path | None
    per_seed_csv_path: Path | None = None
    comparison_csv_path: Path | None = None
    summaries: list[PointSummary] = field(default_factory=list)
    differences: list[PairedDifference] = field(default_factory=list)

    @property
    def failed(self) -> list[RunRecord]:
        return [r for r in self.records if r.status != COMPLETED]


def plan(spec: SweepSpec, sweep_dir: Path | None = None) -> list[RunSpec]:
    """The runs of ``spec``, with :data:`DEFAULT_RUN_BINDINGS` first in each."""
    runs = expand_grid(spec, sweep_dir)
    return [
        RunSpec(r.name, r.configs, (*DEFAULT_RUN_BINDINGS, *r.bindings), r.axes, r.point, r.seed)
        for r in runs
    ]


def thread_share(max_parallel: int) -> int | None:
    """Each run's ``TrainerConfig.num_threads`` when ``max_parallel`` go at once (``None``
    for one at a time: the experiment's own setting stays)."""
    if max_parallel <= 1:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max_parallel)


def run_sweep(
    spec: SweepSpec,
    sweep_dir: Path | None = None,
    *,
    echo: Callable[[str], None] = print,
) -> SweepResult:
    """Run every grid point (once per seed) and write the tables and ``curves.png``.

    A run that fails is recorded (status, exit code, log path) and the sweep goes
    on; a run completed by an earlier invocation is skipped; one that did not finish
    runs again and resumes from its latest checkpoint. Tables and figure are
    rewritten after every run, so they are current even if the sweep is stopped.

    Args:
        spec: the sweep.
        sweep_dir: the sweep file's directory (resolves relative config paths).
        echo: where progress lines go.

    Returns:
        The :class:`SweepResult`.

    Raises:
        SweepError: a malformed spec, or a run directory holding a run with other
            settings -- all checked before the first run starts; or, once every run
            has ended, runs that completed without logging any metric of ``Sweep.metrics``.
    """
    runs = plan(spec, sweep_dir)
    out = Path(spec.output_dir).resolve()
    previous = {r.name: previous_record(r, out / r.name) for r in runs}  # fail fast on conflicts
    out.mkdir(parents=True, exist_ok=True)
    done: dict[str, RunRecord] = {}
    for i, run in enumerate(runs, start=1):
        before = previous[run.name]
        if before is not None and before.status == COMPLETED:
            before.skipped = True
            done[run.name] = before
            echo(f"[sweep] {i}/{len(runs)} {run.name}: already completed, skipped")
    pending = [r for r in runs if r.name not in done]
    for record in _execute_all(spec, runs, pending, out, echo, first_alone=not done):
        done[record.name] = record
        if len(done) < len(runs):  # partial tables, in case the sweep is stopped
            _write_outputs(spec, runs, _in_grid_order(runs, done), out)
    return _write_outputs(spec, runs, _in_grid_order(runs, done), out, final=True)


def _in_grid_order(runs: Sequence[RunSpec], done: dict[str, RunRecord]) -> list[RunRecord]:
    return [done[r.name] for r in runs if r.name in done]


def _execute_all(
    spec: SweepSpec,
    runs: Sequence[RunSpec],
    pending: Sequence[RunSpec],
    out: Path,
    echo: Callable[[str], None],
    *,
    first_alone: bool,
) -> Iterator[RunRecord]:
    """Run ``pending``, yielding each record as its run ends (completion order).

    With ``Sweep.max_parallel > 1`` and nothing completed yet, the first run goes alone:
    whatever the runs share and build on first use (the demo's warm-up model, a dataset
    cache) is then built once, not by several runs at the same time.
    """
    threads = thread_share(spec.max_parallel)
    index = {r.name: i for i, r in enumerate(runs, start=1)}

    def one(run: RunSpec) -> RunRecord:
        return _run_one(spec, run, out, threads, f"{index[run.name]}/{len(runs)}", echo)

    if spec.max_parallel <= 1 or len(pending) <= 1:
        yield from map(one, pending)
        return
    rest = list(pending)
    if first_alone:
        yield one(rest.pop(0))
    yield from _parallel(one, rest, spec.max_parallel)


def _parallel(
    one: Callable[[RunSpec], RunRecord], runs: Sequence[RunSpec], workers: int
) -> Iterator[RunRecord]:
    """``one(run)`` for every run, ``workers`` at a time; Ctrl-C stops all of them."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sweep-run")
    futures: set[Future] = {pool.submit(one, run) for run in runs}
    try:
        while futures:
            finished, futures = wait(futures, return_when=FIRST_COMPLETED)
            for future in finished:
                yield future.result()
    except BaseException:
        for future in futures:
            future.cancel()
        # Repeated: a run that was just starting may register its process a moment later.
        while not all(f.done() for f in futures):
            stop_running()
            wait(futures, timeout=0.5)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _run_one(
    spec: SweepSpec,
    run: RunSpec,
    out: Path,
    threads: int | None,
    where: str,
    echo: Callable[[str], None],
) -> RunRecord:
    log = out / run.name / "train.log"
    echo(f"[sweep] {where} {run.name}: running (log: {log})")
    record = execute(
        run, out / run.name, launcher=spec.launcher, timeout_s=spec.run_timeout_s, threads=threads
    )
    outcome = record.status if not record.error else f"{record.status}: {record.error}"
    if record.status != COMPLETED:
        outcome += f" (log: {record.log})"
    echo(f"[sweep] {where} {run.name}: {outcome} in {record.wall_s:.0f} s")
    return record


def _check_metrics_found(spec: SweepSpec, records: Sequence[RunRecord], rows: list[dict]) -> None:
    """Raise :class:`SweepError` when runs completed but none logged a ``Sweep.metrics`` key."""
    completed = [r for r in records if r.status == COMPLETED]
    if not completed or any(k.startswith("final ") for row in rows for k in row):
        return
    logged: set[str] = set()
    for rec in completed:
        path = Path(rec.run_dir) / METRICS_FILE
        if path.is_file() and path.stat().st_size > 0:
            logged |= {k for r in read_metrics(path) for k in r if k != "step"}
    # Grouped by family (`val/*`, `actor/*`): a run logs dozens of metrics.
    families = sorted({f"{k.split('/', 1)[0]}/*" if "/" in k else k for k in logged})
    listed = ", ".join(families)
    raise SweepError(
        f"no run logged a metric matching Sweep.metrics = {list(spec.metrics)}; the completed "
        f"runs logged: {listed or 'nothing'}. Set Sweep.metrics to some of these and run the "
        f"sweep again (completed runs are not run again)"
    )


def _row_columns(spec: SweepSpec, runs: Sequence[RunSpec]) -> dict[str, dict[str, str]]:
    """Run name -> the per-run table's identifying columns (point and seed with seeds)."""
    if not spec.seeds:
        return {r.name: dict(r.axes) for r in runs}
    return {r.name: {"point": r.point, **r.axes, "seed": str(r.seed)} for r in runs}


def _write_outputs(
    spec: SweepSpec,
    runs: list[RunSpec],
    records: list[RunRecord],
    out: Path,
    *,
    final: bool = False,
) -> SweepResult:
    rows = collect_rows(records, _row_columns(spec, runs), spec.metrics)
    if final:
        _check_metrics_found(spec, records, rows)
    result = SweepResult(records, rows, out / "results.csv", out / "results.md", None)
    if spec.compare:
        result.differences = compare_points(runs, records, spec.compare, spec.metrics)
        if result.differences:
            rows_out = [d.csv_row() for d in result.differences]
            result.comparison_csv_path = write_csv(rows_out, out / "comparison.csv")
    if spec.seeds:
        result.per_seed_csv_path = write_csv(rows, out / "results_per_seed.csv")
        result.summaries = aggregate_points(runs, rows)
        write_csv([s.csv_row() for s in result.summaries], result.csv_path)
        result.curves_path = plot_seed_bands(
            runs, records, out / "curves.png", keys=spec.curve_keys, title=spec.name
        )
    else:
        write_csv(rows, result.csv_path)
        result.curves_path = plot_sweep_curves(
            records, out / "curves.png", keys=spec.curve_keys, title=spec.name
        )
    write_report(
        result.markdown_path,
        title=spec.name,
        rows=rows,
        axis_names=[a for a in spec.grid if len(spec.grid[a]) > 1],
        summaries=result.summaries if spec.seeds else None,
        baseline=spec.compare,
        differences=result.differences,
    )
    return result


def dry_run(spec: SweepSpec, sweep_dir: Path | None = None) -> list[str]:
    """The command line of every run, without running anything."""
    import shlex

    out = Path(spec.output_dir).resolve()
    return [
        shlex.join(train_command(r, out / r.name, spec.launcher)) for r in plan(spec, sweep_dir)
    ]
