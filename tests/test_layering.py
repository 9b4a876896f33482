"""rlkit's units import each other without cycles and only downwards (docs/architecture.md).

A unit is a sub-package or top-level module of ``rlkit`` (``rlkit.device``,
``rlkit.train``), ``rlkit`` itself (its ``__init__``), or one of the packages
``algorithms``, ``estimators``, ``rewards``. Every ``import`` / ``from ... import``
statement is counted wherever it is: module level, inside functions and methods,
under ``if TYPE_CHECKING:``, in ``try`` blocks. Imports by name at run time
(``importlib.import_module``, registry ``home`` modules) are not.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rlkit", "algorithms", "estimators", "rewards")

#: unit -> layer; the table of docs/architecture.md, section "Layers".
LAYERS = {
    "rlkit": 1,
    "rlkit.registry": 1,
    "rlkit.device": 1,
    "rlkit.data": 1,
    "rlkit.models": 1,
    "rlkit.logging": 1,
    "rlkit.metrics": 1,
    "estimators": 2,
    "algorithms": 2,
    "rewards": 2,
    "rlkit.kernels": 2,
    "rlkit.distributed": 2,
    "rlkit.tasks": 2,
    "rlkit.tools": 2,
    "rlkit.interactions": 2,
    "rlkit.ops": 3,
    "rlkit.rollout": 3,
    "rlkit.testing": 3,
    "rlkit.evaluation": 4,
    "rlkit.trainer": 5,
    "rlkit.train": 6,
    "rlkit.cli": 6,
    "rlkit.doctor": 6,
    "rlkit.sweep": 6,
    "rlkit.listing": 6,
    "rlkit.check": 6,
    "rlkit.data_cli": 6,
    "rlkit.export": 6,
}


def unit_of(module: str) -> str | None:
    """The unit of a dotted module name (or of a name in it); None outside rlkit's packages."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return None
    if parts[0] != "rlkit":
        return parts[0]
    is_unit = len(parts) > 1 and any(
        (ROOT / "rlkit" / name).exists() for name in (parts[1], parts[1] + ".py")
    )
    return f"rlkit.{parts[1]}" if is_unit else "rlkit"  # `from rlkit import __version__`: rlkit


def imported_modules(path: Path) -> list[tuple[str, int]]:
    """(dotted module, line) of every import in ``path``; ``from a import b`` gives a.b too."""
    package = path.relative_to(ROOT).parent.parts  # what `from .` means in this file
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.append((module, node.lineno))
            # `from rlkit import ops` imports the sub-package rlkit.ops.
            found += [(f"{module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def import_graph() -> dict[str, dict[str, list[str]]]:
    """unit -> {imported unit -> ["file:line", ...]}, without a unit's imports of itself."""
    graph: dict[str, dict[str, list[str]]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            source = unit_of(".".join(rel.with_suffix("").parts).removesuffix(".__init__"))
            graph.setdefault(source, {})
            for module, line in imported_modules(path):
                target = unit_of(module)
                where = f"{rel}:{line}"
                if target not in (None, source) and where not in graph[source].get(target, []):
                    graph[source].setdefault(target, []).append(where)
    return graph


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Strongly connected components with more than one unit (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_units():
    graph = import_graph()
    problems = []
    for component in cycles(graph):
        edges = [
            f"  {a} -> {b}: {', '.join(graph[a][b][:3])}"
            for a in component
            for b in component
            if b in graph[a]
        ]
        problems.append("cycle: " + " <-> ".join(component) + "\n" + "\n".join(edges))
    assert not problems, "\n".join(problems)


def test_every_unit_imports_only_its_layer_or_below():
    graph = import_graph()
    undeclared = sorted(set(graph) - set(LAYERS))
    assert not undeclared, (
        f"units without a layer in LAYERS (and docs/architecture.md): {undeclared}"
    )
    upward = [
        f"{a} (layer {LAYERS[a]}) -> {b} (layer {LAYERS[b]}): {', '.join(where[:3])}"
        for a, targets in sorted(graph.items())
        for b, where in sorted(targets.items())
        if LAYERS[b] > LAYERS[a]
    ]
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_the_docs_layer_table_is_this_one():
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1]
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", section, flags=re.M)
    documented = {
        unit: int(layer) for layer, units in rows for unit in re.findall(r"`([^`]+)`", units)
    }
    assert documented == LAYERS
