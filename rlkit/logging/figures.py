"""Writing a matplotlib figure as a PNG file (the plots' common last step)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib


def use_headless_backend() -> None:
    """Draw off-screen (CI and servers have no display), unless a backend was chosen in
    ``MPLBACKEND`` (Jupyter's kernel sets its inline one: a notebook that imports rlkit
    keeps showing its figures)."""
    if not os.environ.get("MPLBACKEND"):
        matplotlib.use("Agg")


use_headless_backend()
import matplotlib.pyplot as plt  # noqa: E402


def write_png(fig: Any, out_png: str | Path, title: str = "") -> Path:
    """Title ``fig`` (if ``title``), lay it out, save it to ``out_png`` (parent folders
    created) at 100 dpi and close it; the path written."""
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
