"""``rlkit list [group ...]``: a table of what each registry holds."""

from __future__ import annotations

import argparse

from rlkit.registry import LISTED, Registry


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkit list", description=__doc__)
    parser.add_argument(
        "groups",
        nargs="*",
        metavar="GROUP",
        help=f"any of: {', '.join(LISTED)} (default: the first four)",
    )
    args = parser.parse_args(argv)
    unknown = [g for g in args.groups if g not in LISTED]
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}; choose from {', '.join(LISTED)}")
    groups = args.groups or ["estimators", "losses", "kl", "aggregations"]
    for group in groups:
        registry = LISTED[group]
        print(f"== {group} ({registry.kind}) ==")
        print(format_table(registry))
        print()
    return 0
