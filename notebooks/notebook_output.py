"""Where the notebooks put their figures and key numbers.

Every notebook writes into ``$RLKIT_NOTEBOOK_OUT/<notebook>/`` (default: a
directory ``rlkit_notebooks`` in the system's temp dir): one PNG per figure and
``summary.json`` with the numbers that ``tests/test_notebooks.py`` checks. The
notebooks are stored with their outputs (``scripts/execute_notebooks.py`` re-executes
them), so their figures show without running them.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt

ENV_VAR = "RLKIT_NOTEBOOK_OUT"


def output_dir(notebook: str) -> Path:
    """The (created) directory for ``notebook``'s figures: ``$RLKIT_NOTEBOOK_OUT/<notebook>``."""
    base = os.environ.get(ENV_VAR) or str(Path(tempfile.gettempdir()) / "rlkit_notebooks")
    directory = Path(base) / notebook
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def save_figure(fig: plt.Figure, directory: Path, name: str) -> Path:
    """Save ``fig`` as ``directory/<name>.png``, show it when running inline, then close it.

    Returns:
        The PNG's path.
    """
    path = directory / f"{name}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    if "inline" in matplotlib.get_backend():  # an interactive Jupyter session
        from IPython.display import display

        display(fig)
    plt.close(fig)
    return path


def write_summary(directory: Path, summary: dict[str, Any]) -> Path:
    """Write ``summary`` as ``directory/summary.json`` (non-finite floats as strings).

    Returns:
        The JSON file's path.
    """

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        return value

    path = directory / "summary.json"
    path.write_text(json.dumps(clean(summary), indent=2, sort_keys=True) + "\n")
    return path
