"""A sweep, as written in a gin file, and its expansion into one run per grid point.

A sweep file binds :class:`SweepSpec` as ``Sweep.<field>``::

    Sweep.name = "demo_algorithms"
    Sweep.base_configs = ["experiments/demo.gin"]
    Sweep.grid = {
        "preset": ["grpo", "dr_grpo", "dapo"],     # algorithms/presets/<name>.gin
        "TrainerConfig.seed": [0, 1],              # any gin binding
    }
    Sweep.bindings = ["TrainerConfig.total_steps = 20"]
    Sweep.output_dir = "runs/sweeps/demo_algorithms"

Grid axes are expanded as a Cartesian product, in the order written. An axis is

- ``"preset"``: algorithm preset names, each adding ``algorithms/presets/<name>.gin``;
- ``"include"``: gin files, each added after the base configs;
- ``"Section.field"`` (anything with a dot): values bound as ``Section.field = value``.

Every run gets, in order: the base configs, its grid files, ``Sweep.bindings``,
its grid bindings, and ``TrainerConfig.output_dir = "<output_dir>/<run name>"``
(later bindings win in gin). The run name joins the labels of the axes that
have more than one value, e.g. ``dapo_seed=1``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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


@dataclass(frozen=True)
class RunSpec:
    """One grid point: a ``rlkit train`` invocation.

    Attributes:
        name: the run's directory name under the sweep directory.
        configs: gin files, in order.
        bindings: gin bindings, in order (without the output directory).
        axes: axis -> this run's value as text (a table column per axis).
    """

    name: str
    configs: tuple[str, ...]
    bindings: tuple[str, ...]
    axes: dict[str, str]

    def train_args(self, run_dir: str | Path) -> list[str]:
        """Arguments of ``rlkit train`` for this run, writing into ``run_dir``."""
        bindings = [*self.bindings, f"TrainerConfig.output_dir = {gin_literal(str(run_dir))}"]
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


def expand_grid(spec: SweepSpec, sweep_dir: Path | None = None) -> list[RunSpec]:
    """One :class:`RunSpec` per point of ``spec.grid`` (Cartesian product, in written order).

    Args:
        spec: the sweep.
        sweep_dir: the sweep file's directory (to resolve relative config paths).

    Returns:
        The runs, each with a unique name.

    Raises:
        SweepError: no base config, a malformed axis, an unknown preset or file,
            or two grid points with the same run name.
    """
    if not spec.base_configs:
        raise SweepError("Sweep.base_configs is empty: name the experiment gin file(s) to sweep")
    _check_grid(spec.grid)
    base = tuple(str(find_config(c, sweep_dir)) for c in spec.base_configs)
    axes = list(spec.grid)
    runs, seen = [], {}
    for point in itertools.product(*(spec.grid[a] for a in axes)):
        files, bindings, labels = [], [], {}
        for axis, value in zip(axes, point):
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
        runs.append(RunSpec(name, (*base, *files), (*spec.bindings, *bindings), labels))
    return runs


def parse_sweep_file(path: str | Path, bindings: Sequence[str] = ()) -> SweepSpec:
    """Read a sweep gin file (plus extra ``Sweep.*`` bindings) into a :class:`SweepSpec`.

    Raises:
        SweepError: the file is missing or is not valid gin for ``Sweep``.
    """
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file {str(path)!r} not found")
    gin.clear_config()
    try:
        gin.parse_config_files_and_bindings([str(path)], list(bindings))
        return SweepSpec()
    except (ValueError, KeyError, SyntaxError, TypeError) as exc:
        raise SweepError(f"bad sweep file {path}: {exc}") from exc
    finally:
        gin.clear_config()
