"""Experiment sweeps: a grid over algorithm / estimator / loss / seed, run and compared.

``rlkit sweep SWEEP.gin`` (:func:`main`) expands the grid of a sweep gin file
(:class:`SweepSpec`), runs each point as a ``rlkit train`` subprocess, and writes
the final and best validation metrics of every run to ``results.csv`` and
``results.md`` and all learning curves to ``curves.png``.
"""

from rlkit.sweep.cli import main
from rlkit.sweep.driver import SweepResult, dry_run, plan, run_sweep
from rlkit.sweep.results import collect_rows, markdown_table, run_metrics
from rlkit.sweep.runner import RunRecord, execute, train_command
from rlkit.sweep.spec import RunSpec, SweepError, SweepSpec, expand_grid, parse_sweep_file

__all__ = [
    "RunRecord",
    "RunSpec",
    "SweepError",
    "SweepResult",
    "SweepSpec",
    "collect_rows",
    "dry_run",
    "execute",
    "expand_grid",
    "main",
    "markdown_table",
    "parse_sweep_file",
    "plan",
    "run_metrics",
    "run_sweep",
    "train_command",
]
