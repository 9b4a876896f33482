"""``rlkit sweep SWEEP.gin [--gin_param 'Sweep.field = value' ...] [--dry-run]``.

Runs every point of the sweep's grid (once per seed of ``Sweep.seeds``) as its own
``rlkit train`` process (in turn, or ``Sweep.max_parallel`` at once;
``Sweep.launcher = "accelerate launch ..."`` on a cluster node), skips runs an
earlier invocation completed, resumes unfinished ones, and writes ``results.csv``,
``results.md`` and ``curves.png`` into ``Sweep.output_dir`` (with seeds also
``results_per_seed.csv``; with ``Sweep.compare`` also ``comparison.csv``).

Exit status: 0 every run completed; 1 some run failed (the tables still list it,
with its log); 2 a sweep that cannot run as written, reported as one message;
130 interrupted. See docs/sweeps.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

USER_ERROR_EXIT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlkit sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sweep_file", help="sweep gin file (binds Sweep.*)")
    parser.add_argument(
        "--gin_param",
        "--gin-param",
        action="append",
        default=[],
        metavar="BINDING",
        help="an extra sweep binding, e.g. 'Sweep.output_dir = \"runs/s2\"' (repeatable)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print each run's command only")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``rlkit sweep``; returns the exit status (see the module docstring)."""
    args = build_parser().parse_args(argv)
    from rlkit.sweep.driver import dry_run, run_sweep
    from rlkit.sweep.spec import SweepError, parse_sweep_file

    sweep_dir = Path(args.sweep_file).resolve().parent
    try:
        spec = parse_sweep_file(args.sweep_file, args.gin_param)
        if args.dry_run:
            print("\n".join(dry_run(spec, sweep_dir)))
            return 0
        result = run_sweep(spec, sweep_dir)
    except SweepError as exc:
        print(f"rlkit sweep: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT
    except KeyboardInterrupt:
        print("rlkit sweep: interrupted (the running runs were stopped); run the same command "
              "again to resume", file=sys.stderr)  # fmt: skip
        return 130
    print(result.markdown_path.read_text())
    extra = [result.per_seed_csv_path, result.comparison_csv_path]
    paths = [result.csv_path, *(p for p in extra if p), result.markdown_path]
    print(f"results: {', '.join(map(str, paths))}, {result.curves_path or 'no curves'}")
    for rec in result.failed:
        print(f"FAILED {rec.name}: {rec.error}; log: {rec.log}", file=sys.stderr)
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
