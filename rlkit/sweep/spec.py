"""A sweep, as written in a gin file, and its expansion into one run per grid point.

A sweep file binds :class:`SweepSpec` as ``Sweep.<field>``::

    Sweep.name = "demo_algorithms"
    Sweep.base_configs = ["experiments/demo.gin"]
    Sweep.grid = {
        "preset": ["grpo", "dr_grpo", "dapo"],     # algorithms/presets/<name>.gin
        "OptimConfig.lr": [1e-4, 3e-4],            # any gin binding
    }
    Sweep.seeds = [0, 1, 2]                        # replicates: every point once per seed
    Sweep.compare = "grpo_lr=0.0003"               # paired differences to this point
    Sweep.bindings = ["TrainerConfig.total_steps = 20"]
    Sweep.output_dir = "runs/sweeps/demo_algorithms"

Grid axes are expanded as a Cartesian product, in the order written. An axis is

- ``"preset"``: algorithm preset names, each adding ``algorithms/presets/<name>.gin``;
- ``"include"``: gin files, each added after the base configs;
- ``"Section.field"`` (anything with a dot): values bound as ``Section.field = value``.

Every run gets, in order: the base configs, its grid files, ``Sweep.bindings``,
its grid bindings, and ``TrainerConfig.output_dir = "<output_dir>/<run name>"``
(later bindings win in gin). A grid point's name joins the labels of the axes
that have more than one value, e.g. ``dapo_lr=0.0003``.

With ``Sweep.seeds``, every grid point runs once per seed, bound last as
``TrainerConfig.seed = <seed>``; the run name is ``<point>_seed=<seed>``
(``dapo_lr=0.0003_seed=1``). Seeds are replicates, not an axis: the tables give
their mean, spread and interval per point (:mod:`rlkit.sweep.aggregate`).
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from tokenize import TokenError
from typing import Any

import gin

REPO_ROOT = Path(__file__).resolve().parents[2]
PRESETS_DIR = REPO_ROOT / "algorithms" / "presets"
FILE_AXES = ("preset", "include")


class SweepError(ValueError):
    """A sweep that cannot run as written; the message names the problem and the fix."""


@gin.configurable("Sweep")
@dataclass
class SweepSpec:
    """What to run and where (bind as ``Sweep.<field>`` in a sweep gin file).

    Attributes:
        name: the sweep's name (figure title, table heading).
        base_configs: experiment gin files every run starts from (paths relative to the
            current directory, the sweep file's directory or the repository root).
        grid: axis -> list of values (see the module docstring for the axis kinds).
        bindings: gin bindings for every run, applied after all files.
        output_dir: the sweep directory; each run writes to ``<output_dir>/<run name>``.
        launcher: command prefix that starts ``-m rlkit.train`` (default: this Python),
            e.g. ``"accelerate launch --num_processes 8"`` on a multi-GPU node.
        run_timeout_s: a run still going after this many seconds is stopped and
            recorded as failed (``None``: no limit).
        metrics: metric names (``*`` suffix = prefix match) tabulated as final and best.
        curve_keys: metric names drawn in ``curves.png``.
        seeds: replicate seeds; every grid point runs once per seed (empty: once, with
            the experiment's own seed, tabulated per run as before).
        compare: a grid point's name; every other point gets its paired difference to
            it, seed by seed (empty: no comparison).
        max_parallel: how many runs go at once (each gets an equal share of the CPU
            cores as ``TrainerConfig.num_threads``); 1 runs them one after another.
    """

    name: str = "sweep"
    base_configs: Sequence[str] = ()
    grid: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    bindings: Sequence[str] = ()
    output_dir: str = "runs/sweeps/sweep"
    launcher: str = ""
    run_timeout_s: float | None = None
    metrics: Sequence[str] = ("val/*",)
    curve_keys: Sequence[str] = ("critic/score/mean", "val/*")
    seeds: Sequence[int] = ()
    compare: str = ""
    max_parallel: int = 1


@dataclass(frozen=True)
class RunSpec:
    """One grid point: a ``rlkit train`` invocation.

    Attributes:
        name: the run's directory name under the sweep directory.
        configs: gin files, in order.
        bindings: gin bindings, in order (without the output directory).
        axes: axis -> this run's value as text (a table column per axis).
        point: the grid point's name (the run name without ``_seed=<seed>``).
        seed: the replicate seed of a sweep with ``Sweep.seeds`` (else ``None``).
    """

    name: str
    configs: tuple[str, ...]
    bindings: tuple[str, ...]
    axes: dict[str, str]
    point: str = ""
    seed: int | None = None

    def train_args(self, run_dir: str | Path, leading: Sequence[str] = ()) -> list[str]:
        """Arguments of ``rlkit train`` for this run, writing into ``run_dir``.

        ``leading`` bindings go before the run's own, so that those win over them.
        """
        bindings = [
            *leading,
            *self.bindings,
            f"TrainerConfig.output_dir = {gin_literal(str(run_dir))}",
        ]
        return [*self.configs, *(arg for b in bindings for arg in ("--gin_param", b))]


def gin_literal(value: Any) -> str:
    """``value`` written as gin reads it: ``"grpo"``, ``0.5``, ``True``, ``[1, 2]``, ...

    Strings starting with ``@`` (configurable references) or ``%`` (macros) are kept as is.
    """
    if isinstance(value, str):
        if value.startswith(("@", "%")):
            return value
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return (
            "{" + ", ".join(f"{gin_literal(k)}: {gin_literal(v)}" for k, v in value.items()) + "}"
        )
    if isinstance(value, Sequence):
        return "[" + ", ".join(gin_literal(v) for v in value) + "]"
    raise SweepError(f"grid value {value!r} of type {type(value).__name__} cannot be a gin literal")


def find_config(path: str, sweep_dir: Path | None) -> Path:
    """Resolve a gin file against the current directory, the sweep file's and the repo root.

    Raises:
        SweepError: no candidate exists; the message lists those tried.
    """
    given = Path(path).expanduser()
    bases = [Path.cwd(), *([sweep_dir] if sweep_dir else []), REPO_ROOT, REPO_ROOT / "algorithms"]
    candidates = [given] if given.is_absolute() else [b / given for b in bases]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise SweepError(f"config file {path!r} not found (tried {tried})")


def _preset_file(name: str) -> Path:
    path = PRESETS_DIR / f"{name}.gin"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.gin")))
        raise SweepError(f"unknown algorithm preset {name!r} in Sweep.grid; known: {known}")
    return path


def _value_text(axis: str, value: Any) -> str:
    if axis == "include":
        return Path(str(value)).stem
    return value if isinstance(value, str) else gin_literal(value)


def _label(axis: str, text: str) -> str:
    """A run-name part: the value for file axes, ``field=value`` for bindings."""
    return text if axis in FILE_AXES else f"{axis.rsplit('.', 1)[-1]}={text}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", name).strip("-") or "run"


def _check_grid(grid: Mapping[str, Sequence[Any]]) -> None:
    for axis, values in grid.items():
        if axis not in FILE_AXES and "." not in axis:
            raise SweepError(
                f"Sweep.grid axis {axis!r} is neither 'preset', 'include' nor a gin binding "
                f"such as 'TrainerConfig.seed'"
            )
        if isinstance(values, str) or not isinstance(values, Sequence) or not values:
            raise SweepError(f"Sweep.grid[{axis!r}] must be a non-empty list, got {values!r}")


def _check_run_settings(spec: SweepSpec) -> None:
    """Seeds, and how many runs go at once (see :class:`SweepSpec`)."""
    if isinstance(spec.seeds, str) or not isinstance(spec.seeds, Sequence):
        raise SweepError(f"Sweep.seeds must be a list of integers, got {spec.seeds!r}")
    seeds = list(spec.seeds)
    if any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise SweepError(f"Sweep.seeds must be a list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"Sweep.seeds lists a seed twice: {seeds!r}")
    if seeds and "TrainerConfig.seed" in spec.grid:
        raise SweepError(
            "Sweep.seeds and a 'TrainerConfig.seed' grid axis both set the seed: keep "
            "Sweep.seeds (replicates, aggregated per point) and drop the axis"
        )
    if isinstance(spec.max_parallel, bool) or not isinstance(spec.max_parallel, int):
        raise SweepError(f"Sweep.max_parallel must be an integer >= 1, got {spec.max_parallel!r}")
    if spec.max_parallel < 1:
        raise SweepError(f"Sweep.max_parallel must be >= 1, got {spec.max_parallel}")


def _grid_points(spec: SweepSpec, sweep_dir: Path | None) -> list[RunSpec]:
    """One :class:`RunSpec` per grid point, named by its varying axes (no seed yet)."""
    base = tuple(str(find_config(c, sweep_dir)) for c in spec.base_configs)
    axes = list(spec.grid)
    points, seen = [], {}
    for values in itertools.product(*(spec.grid[a] for a in axes)):
        files, bindings, labels = [], [], {}
        for axis, value in zip(axes, values):
            labels[axis] = _value_text(axis, value)
            if axis == "preset":
                files.append(str(_preset_file(str(value))))
            elif axis == "include":
                files.append(str(find_config(str(value), sweep_dir)))
            else:
                bindings.append(f"{axis} = {gin_literal(value)}")
        varying = [_label(a, labels[a]) for a in axes if len(spec.grid[a]) > 1]
        name = _safe("_".join(varying) or spec.name)
        if name in seen:
            raise SweepError(f"grid points {seen[name]} and {labels} both make run name {name!r}")
        seen[name] = labels
        points.append(RunSpec(name, (*base, *files), (*spec.bindings, *bindings), labels, name))
    return points


def expand_grid(spec: SweepSpec, sweep_dir: Path | None = None) -> list[RunSpec]:
    """One :class:`RunSpec` per grid point and seed (Cartesian product, in written order).

    Args:
        spec: the sweep.
        sweep_dir: the sweep file's directory (to resolve relative config paths).

    Returns:
        The runs, each with a unique name; with ``Sweep.seeds``, a point's seeds are
        consecutive (``grpo_seed=0``, ``grpo_seed=1``, ``dapo_seed=0``, ...).

    Raises:
        SweepError: no base config, a malformed axis, an unknown preset or file, two
            grid points with the same run name, bad seeds, or a ``Sweep.compare`` that
            names no grid point.
    """
    if not spec.base_configs:
        raise SweepError("Sweep.base_configs is empty: name the experiment gin file(s) to sweep")
    _check_grid(spec.grid)
    _check_run_settings(spec)
    points = _grid_points(spec, sweep_dir)
    check_compare(spec, [p.name for p in points])
    if not spec.seeds:
        return points
    return [
        RunSpec(
            f"{p.name}_seed={seed}",
            p.configs,
            (*p.bindings, f"TrainerConfig.seed = {seed}"),
            p.axes,
            p.name,
            seed,
        )
        for p in points
        for seed in spec.seeds
    ]


def check_compare(spec: SweepSpec, point_names: Sequence[str]) -> None:
    """Raise :class:`SweepError` unless ``Sweep.compare`` is empty or a grid point's name."""
    if spec.compare and spec.compare not in point_names:
        raise SweepError(
            f"Sweep.compare = {spec.compare!r} is not a grid point; the points are: "
            f"{', '.join(point_names)}"
        )


class _QuietSearchMisses(logging.Filter):
    """Hide gin's "Path not found" for an include it then finds under a later search path."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Path not found:")


def parse_sweep_file(path: str | Path, bindings: Sequence[str] = ()) -> SweepSpec:
    """Read a sweep gin file (plus extra ``Sweep.*`` bindings) into a :class:`SweepSpec`.

    An ``include`` in the file is looked up in the current directory, then beside the
    sweep file (so one sweep file can extend another).

    Raises:
        SweepError: the file (or a file it includes) is missing, or is not valid gin
            for ``Sweep``.
    """
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file {str(path)!r} not found")
    gin.clear_config()
    gin.add_config_file_search_path(str(path.resolve().parent))
    quiet = _QuietSearchMisses()
    logging.getLogger().addFilter(quiet)
    try:
        gin.parse_config_files_and_bindings([str(path)], list(bindings))
        return SweepSpec()
    except (ValueError, KeyError, SyntaxError, TypeError, OSError, TokenError) as exc:
        message = " ".join(str(exc).split())  # gin adds the location on further lines
        raise SweepError(f"bad sweep file {path}: {message}") from exc
    finally:
        logging.getLogger().removeFilter(quiet)
        gin.clear_config()
