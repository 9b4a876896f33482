"""``rlkit list [group ...]``: a table of what each registry holds.

``rlkit list --markdown [group ...]`` prints the same as Markdown tables, and
``python -m rlkit.listing --update-readme`` rewrites the README's registry tables from the
registries: each sits between ``<!-- registry:KEY -->`` and ``<!-- /registry -->``, where
``KEY`` is one group of :data:`README_FULL_TABLES` (its whole table) or
:data:`README_INDEX_KEY` (one row per other group, with its names).
``--check-readme`` reports the tables that differ and exits 1 (the test
``tests/test_readme_registry_tables.py`` runs it).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from rlkit.registry import LISTED, Registry

#: Groups whose whole table (name, aliases, summary, paper) the README shows.
README_FULL_TABLES: tuple[str, ...] = ("estimators", "losses")
#: The README's table of every other group: one row per group, its names and aliases.
README_INDEX_KEY = "more"
#: The command that rewrites the README's tables.
REGENERATE_COMMAND = ".venv/bin/python -m rlkit.listing --update-readme"
#: The README of the checkout this package is imported from.
DEFAULT_README = Path(__file__).resolve().parents[1] / "README.md"

_BLOCK = re.compile(r"(<!-- registry:([A-Za-z0-9_-]+) -->\n)(.*?)(<!-- /registry -->)", re.S)
_OPENING = re.compile(r"<!-- registry:([A-Za-z0-9_-]+) -->")
_ARXIV = re.compile(r"arXiv:(\d{4}\.\d{4,5})")


def format_table(registry: Registry) -> str:
    """Render one registry as a fixed-width table (name, aliases, summary, paper)."""
    rows = [("name", "aliases", "summary", "paper")]
    for e in registry.describe():
        rows.append((e.name, ", ".join(e.aliases), e.summary, e.paper or ""))
    widths = [min(max(len(r[i]) for r in rows), 60) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        cells = [c if len(c) <= w else c[: w - 1] + "~" for c, w in zip(row[:3], widths)]
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths)) + "  " + row[3])
        if i == 0:
            lines.append("-" * (sum(widths) + 6 + len("paper")))
    return "\n".join(line.rstrip() for line in lines)


# -- Markdown ---------------------------------------------------------------------------
def _cell(text: str) -> str:
    """``text`` safe in a Markdown table cell: no column break, no HTML tag."""
    text = text.strip()
    text = text.removesuffix(".") if not text.endswith("..") else text
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _paper(paper: str | None) -> str:
    """``arXiv:NNNN.NNNNN`` as a link to the abstract; anything else as written."""
    if not paper:
        return "—"
    return _ARXIV.sub(lambda m: f"[arXiv:{m[1]}](https://arxiv.org/abs/{m[1]})", _cell(paper))


def _code_list(names: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def markdown_table(registry: Registry) -> str:
    """One registry as a Markdown table: name, aliases, what it computes, paper."""
    lines = ["| name | aliases | what it computes | paper |", "|---|---|---|---|"]
    for e in registry.describe():
        aliases = _code_list(e.aliases) or "—"
        lines.append(f"| `{e.name}` | {aliases} | {_cell(e.summary)} | {_paper(e.paper)} |")
    return "\n".join(lines)


def markdown_index(groups: list[str]) -> str:
    """One row per group: its kind, its ``rlkit list`` group and its names (aliases)."""
    lines = ["| registry | `rlkit list` group | names (aliases) |", "|---|---|---|"]
    for group in groups:
        registry = LISTED[group]
        names = ", ".join(
            f"`{e.name}`" + (f" ({_code_list(e.aliases)})" if e.aliases else "")
            for e in registry.describe()
        )
        lines.append(f"| {registry.kind} | `{group}` | {names} |")
    return "\n".join(lines)


def readme_tables() -> dict[str, str]:
    """The README's generated tables, by marker key."""
    tables = {group: markdown_table(LISTED[group]) for group in README_FULL_TABLES}
    rest = [group for group in LISTED if group not in README_FULL_TABLES]
    tables[README_INDEX_KEY] = markdown_index(rest)
    return tables


def _block_body(table: str) -> str:
    # The opening marker is an HTML block that ends on its own line, so the table may
    # follow at once; a blank line keeps the closing marker out of the table.
    return f"{table}\n\n"


def readme_drift(text: str) -> list[str]:
    """What differs between the README ``text`` and the registries, one message per table
    (empty when every table is current and each appears once)."""
    tables = readme_tables()
    problems: list[str] = []
    opened = _OPENING.findall(text)
    blocks = {m[2]: m[3] for m in _BLOCK.finditer(text)}
    for key in sorted(set(opened)):
        if opened.count(key) > 1:
            problems.append(f"registry table {key!r} appears {opened.count(key)} times")
        if key not in tables:
            problems.append(f"unknown registry table {key!r}; the tables are: {', '.join(tables)}")
        elif key not in blocks:
            problems.append(f"registry table {key!r} has no closing <!-- /registry -->")
    for key, table in tables.items():
        if key not in opened:
            problems.append(
                f"registry table {key!r} is missing: add <!-- registry:{key} --> and "
                f"<!-- /registry --> where it belongs"
            )
        elif key in blocks and blocks[key] != _block_body(table):
            problems.append(f"registry table {key!r} drifted from the registries")
    return problems


def update_readme(text: str) -> str:
    """``text`` with every registry table rewritten from the registries."""
    tables = readme_tables()

    def replace(m: re.Match[str]) -> str:
        key = m[2]
        if key not in tables:
            return m[0]
        return m[1] + _block_body(tables[key]) + m[4]

    return _BLOCK.sub(replace, text)


def _readme_main(path: Path, *, write: bool) -> int:
    if not path.is_file():
        print(f"rlkit list: no README at {path}", file=sys.stderr)
        return 2
    text = path.read_text(encoding="utf-8")
    if write:
        new = update_readme(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
    problems = readme_drift(path.read_text(encoding="utf-8"))
    if problems:
        for problem in problems:
            print(f"{path}: {problem}", file=sys.stderr)
        if not write:
            print(f"Regenerate the tables with: {REGENERATE_COMMAND}", file=sys.stderr)
        return 1
    print(f"{path}: registry tables {'written' if write else 'current'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rlkit list",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "groups",
        nargs="*",
        metavar="GROUP",
        help=f"any of: {', '.join(LISTED)} (default: the first four)",
    )
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    readme = parser.add_mutually_exclusive_group()
    readme.add_argument(
        "--update-readme",
        nargs="?",
        const=DEFAULT_README,
        type=Path,
        metavar="PATH",
        help="rewrite the registry tables of README.md (or PATH) from the registries",
    )
    readme.add_argument(
        "--check-readme",
        nargs="?",
        const=DEFAULT_README,
        type=Path,
        metavar="PATH",
        help="exit 1, naming each table, if README.md's (or PATH's) tables are not current",
    )
    args = parser.parse_args(argv)
    if args.update_readme is not None or args.check_readme is not None:
        if args.groups or args.markdown:
            parser.error("--update-readme / --check-readme take no GROUP and no --markdown")
        write = args.update_readme is not None
        return _readme_main(args.update_readme if write else args.check_readme, write=write)
    unknown = [g for g in args.groups if g not in LISTED]
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}; choose from {', '.join(LISTED)}")
    groups = args.groups or ["estimators", "losses", "kl", "aggregations"]
    for group in groups:
        registry = LISTED[group]
        if args.markdown:
            print(f"**{registry.kind}** (`rlkit list {group}`)\n")
            print(markdown_table(registry))
        else:
            print(f"== {group} ({registry.kind}) ==")
            print(format_table(registry))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
