"""rlkit's units import each other without cycles and only downwards, and the modules
inside a unit import each other without cycles (docs/architecture.md).

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
    "rlkit.math_switch": 1,
    "rlkit.crash_note": 1,
    "estimators": 2,
    "algorithms": 2,
    "rewards": 2,
    "rlkit.kernels": 2,
    "rlkit.distributed": 2,
    "rlkit.tasks": 2,
    "rlkit.tools": 2,
    "rlkit.interactions": 2,
    "rlkit.ops": 3,
    "rlkit.modeling": 3,
    "rlkit.rollout": 3,
    "rlkit.testing": 3,
    "rlkit.evaluation": 4,
    "rlkit.trainer": 5,
    "rlkit.train": 6,
    "rlkit.supervisor": 6,
    "rlkit.cli": 6,
    "rlkit.doctor": 6,
    "rlkit.sweep": 6,
    "rlkit.listing": 6,
    "rlkit.check": 6,
    "rlkit.data_cli": 6,
    "rlkit.export": 6,
    "rlkit.from_verl": 6,
    "rlkit.diagnose": 7,
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


def import_nodes(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``path``, wherever it is in the file."""
    tree = ast.parse(path.read_text(), str(path))
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def from_module(node: ast.ImportFrom, path: Path) -> str:
    """The absolute module of ``from <module> import ...`` in ``path`` (relative ones too)."""
    package = path.relative_to(ROOT).parent.parts  # what `from .` means in this file
    base = package[: len(package) - node.level + 1] if node.level else ()
    return ".".join([*base, *([node.module] if node.module else [])])


def imported_modules(path: Path) -> list[tuple[str, int]]:
    """(dotted module, line) of every import in ``path``; ``from a import b`` gives a.b too."""
    found = []
    for node in import_nodes(path):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        else:
            module = from_module(node, path)
            found.append((module, node.lineno))
            # `from rlkit import ops` imports the sub-package rlkit.ops.
            found += [(f"{module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def import_graph() -> dict[str, dict[str, list[str]]]:
    """unit -> {imported unit -> ["file:line", ...]}, without a unit's imports of itself."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in source_files():
        source = unit_of(module_of(path))
        graph.setdefault(source, {})
        for module, line in imported_modules(path):
            target = unit_of(module)
            where = f"{path.relative_to(ROOT)}:{line}"
            if target not in (None, source) and where not in graph[source].get(target, []):
                graph[source].setdefault(target, []).append(where)
    return graph


def source_files() -> list[Path]:
    """Every ``.py`` file of rlkit's packages."""
    return [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


def module_of(path: Path) -> str:
    """The dotted module of a file (a package's ``__init__.py``: the package)."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imported_project_modules(path: Path, modules: set[str]) -> list[tuple[str, int]]:
    """(module, line) for every import in ``path`` of one of ``modules``: the module whose
    code the statement runs. ``from a import b`` is ``a.b`` when that is a module, else
    ``a``; ``import a.b.c`` is the longest of ``a.b.c``, ``a.b``, ``a`` that is one.

    The ``__init__`` of the packages above it, which Python runs first, is not counted:
    a package whose ``__init__`` imports its own modules (to re-export them) would
    otherwise be in a cycle with each of them that imports a sibling.
    """

    def known(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        return ".".join(parts) or None

    found = []
    for node in import_nodes(path):
        if isinstance(node, ast.Import):
            targets = [known(alias.name) for alias in node.names]
        else:
            module = from_module(node, path)
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else known(module)
                for alias in node.names
            ]
        found += [(target, node.lineno) for target in targets if target is not None]
    return found


def module_graph() -> dict[str, dict[str, list[str]]]:
    """module -> {imported module -> ["file:line", ...]} over rlkit's packages."""
    files = source_files()
    modules = {module_of(path) for path in files}
    graph: dict[str, dict[str, list[str]]] = {}
    for path in files:
        source = module_of(path)
        graph.setdefault(source, {})
        for target, line in imported_project_modules(path, modules):
            where = f"{path.relative_to(ROOT)}:{line}"
            if target != source and where not in graph[source].get(target, []):
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


def describe(graph: dict[str, dict[str, list[str]]], component: list[str]) -> str:
    """A cycle and the imports that make it (three places per edge at most)."""
    edges = [
        f"  {a} -> {b}: {', '.join(graph[a][b][:3])}"
        for a in component
        for b in component
        if b in graph[a]
    ]
    return "cycle: " + " <-> ".join(component) + "\n" + "\n".join(edges)


def test_no_import_cycle_between_units():
    graph = import_graph()
    problems = [describe(graph, component) for component in cycles(graph)]
    assert not problems, "\n".join(problems)


#: Import cycles between the modules of one unit that are known and not broken yet, each
#: the sorted modules of the cycle, with a comment naming who breaks it. Keep it empty:
#: delete an entry once its cycle is broken (the test fails on an entry that is no
#: longer a cycle, so none outlives its cycle).
KNOWN_MODULE_CYCLES: tuple[tuple[str, ...], ...] = ()


def test_no_import_cycle_between_modules():
    graph = module_graph()
    found = {tuple(component) for component in cycles(graph)}
    problems = [describe(graph, list(c)) for c in sorted(found - set(KNOWN_MODULE_CYCLES))]
    assert not problems, "\n".join(problems)
    stale = sorted(set(KNOWN_MODULE_CYCLES) - found)
    assert not stale, f"KNOWN_MODULE_CYCLES entries that are no cycle any more: {stale}"


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
