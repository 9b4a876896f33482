"""Experiment sweeps: a grid over algorithm / estimator / loss / any binding, each point run
once per seed, compared with intervals and paired tests.

``rlkit sweep SWEEP.gin`` (:func:`main`) expands the grid of a sweep gin file
(:class:`SweepSpec`) and the seeds of ``Sweep.seeds``, runs each as a ``rlkit train``
subprocess (``Sweep.max_parallel`` at a time), and writes per grid point the mean, std
and 95% t interval over seeds (``results.csv``, ``results.md``), each run's values
(``results_per_seed.csv``), each point's paired difference to ``Sweep.compare``
(``comparison.csv``), and the learning curves (``curves.png``). See docs/sweeps.md.
"""

from rlkit.sweep.aggregate import PairedDifference, PointSummary, aggregate_points, compare_points
from rlkit.sweep.cli import main
from rlkit.sweep.driver import SweepResult, dry_run, plan, run_sweep
from rlkit.sweep.results import collect_rows, markdown_table, run_metrics
from rlkit.sweep.runner import RunRecord, execute, train_command
from rlkit.sweep.spec import RunSpec, SweepError, SweepSpec, expand_grid, parse_sweep_file

__all__ = [
    "PairedDifference",
    "PointSummary",
    "RunRecord",
    "RunSpec",
    "SweepError",
    "SweepResult",
    "SweepSpec",
    "aggregate_points",
    "collect_rows",
    "compare_points",
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
