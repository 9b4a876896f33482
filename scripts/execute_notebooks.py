"""Execute the notebooks in ``notebooks/`` and store them with their outputs.

Run from the repository root after changing a notebook or what it calls::

    .venv/bin/python scripts/execute_notebooks.py [NAME ...]

Each notebook runs top to bottom on the ``python3`` kernel with matplotlib's inline
backend, so its figures are stored in the file and show on GitHub or in any viewer
without running it. Its PNGs and ``summary.json`` go to a temporary folder
(``$RLKIT_NOTEBOOK_OUT``); execution times and the kernel's run metadata are not kept,
so a re-run changes the file only where an output changed. ``tests/test_notebooks.py``
still executes every notebook and checks that the stored outputs are there.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def execute(path: Path, out_dir: str) -> nbformat.NotebookNode:
    """``path`` executed in its own folder; the notebook with its outputs."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(path.parent)}}
    )
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # inline figures
    client.execute(env={**env, "RLKIT_NOTEBOOK_OUT": out_dir})
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # wall-clock timestamps: noise in the file
        for output in cell.get("outputs", []):
            _scrub(output, out_dir)
    nb.metadata.pop("widgets", None)
    return nb


def _scrub(output: nbformat.NotebookNode, out_dir: str) -> None:
    """Write the temporary output folder as ``$RLKIT_NOTEBOOK_OUT`` in printed text: a
    stored notebook names no folder of the machine that ran it."""
    if "text" in output:
        output["text"] = output["text"].replace(out_dir, "$RLKIT_NOTEBOOK_OUT")
    plain = output.get("data", {}).get("text/plain")
    if plain is not None:
        output["data"]["text/plain"] = plain.replace(out_dir, "$RLKIT_NOTEBOOK_OUT")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook names (default: all)")
    args = parser.parse_args(argv)
    paths = [NOTEBOOKS / f"{n}.ipynb" for n in args.names] or sorted(NOTEBOOKS.glob("*.ipynb"))
    with tempfile.TemporaryDirectory(prefix="rlkit-notebooks-") as out_dir:
        for path in paths:
            nb = execute(path, out_dir)
            nbformat.write(nb, path)
            print(f"{path.relative_to(NOTEBOOKS.parent)}: executed and stored with its outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
