"""``rlkit data prepare NAME --out DIR [--format parquet|jsonl] [--split SPLIT]``
and ``rlkit data list``.

``prepare`` writes a dataset preset in verl's Parquet layout (``prompt`` as chat
messages, ``reward_model.ground_truth``, ``data_source``, ``ability``, ``extra_info``),
one file per split, like verl's ``examples/data_preprocess`` scripts: the files train
with rlkit and verl alike, and ``DIR`` can serve as ``$RLKIT_DATA_DIR/NAME`` for later
offline runs. ``list`` shows the presets and where each is read from.

Exit status: 0 done; 2 a user error (unknown preset or split, data that cannot be
fetched), reported as one message.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

USER_ERROR_EXIT = 2


def build_parser() -> argparse.ArgumentParser:
    from rlkit.data import SHARED_DATASETS
    from rlkit.data.verl_format import FORMATS

    parser = argparse.ArgumentParser(
        prog="rlkit data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="write a preset in verl's Parquet layout")
    prepare.add_argument(
        "name", help=f"a preset or built-in task: {', '.join([*SHARED_DATASETS, *TASKS])}"
    )
    prepare.add_argument("--out", required=True, help="output folder (<split>.<format> files)")
    prepare.add_argument("--format", default="parquet", choices=FORMATS, dest="fmt")
    prepare.add_argument(
        "--split", action="append", default=None, help="a split to write (repeatable; default all)"
    )
    commands.add_parser("list", help="the presets, their splits and hub datasets")
    return parser


TASKS = {"colour_shapes": ("rlkit.tasks.colour_shapes", "colour_dataset", ("train", "val"))}
"""Built-in tasks whose rows are made on the fly: name -> (module, dataset function,
splits). ``colour_shapes`` carries an ``images`` column (the vision-language demo)."""


def _prepare_task(name: str, out: str, fmt: str, splits: list[str] | None) -> list[Any]:
    """A built-in task's splits written in verl's layout, as ``prepare`` writes a preset."""
    import importlib
    from pathlib import Path

    from rlkit.data.verl_format import FORMATS, write_verl

    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    module, function, known = TASKS[name]
    unknown = sorted(set(splits or ()) - set(known))
    if unknown:
        raise ValueError(f"{name} has no split {unknown[0]!r}; choose from {', '.join(known)}")
    dataset_fn = getattr(importlib.import_module(module), function)
    return [
        write_verl(dataset_fn(split), Path(out) / f"{split}.{fmt}", split=split)
        for split in splits or known
    ]


def _list() -> None:
    from rlkit.data import SHARED_DATASETS
    from rlkit.data.shared_datasets import ENV_VAR, local_data_dir

    folder = local_data_dir()
    where = f"${ENV_VAR}={folder}" if folder else f"the hub (${ENV_VAR} is not set)"
    print(f"presets, read from {where}:")
    width = max(map(len, SHARED_DATASETS))
    for name, preset in SHARED_DATASETS.items():
        configs = ", ".join(c for c in preset.hub.configs if c)
        hub = preset.hub.repo + (f" ({configs})" if configs else "")
        splits = "/".join(preset.splits)
        print(f"  {name:<{width}}  {splits:<10}  reward={preset.reward:<6}  {hub}")
    for name, (_, _, splits) in TASKS.items():
        print(f"  {name}  {'/'.join(splits)}  built-in task, made on the fly (images)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    from rlkit.data import PromptDataError, UnknownSharedDatasetError
    from rlkit.data.verl_format import prepare_dataset

    try:
        if args.command == "list":
            _list()
            return 0
        if Path(args.out).exists() and not Path(args.out).is_dir():
            raise ValueError(
                f"--out {args.out} is a file; name a folder (the <split>.<format> files are "
                f"written into it)"
            )
        if args.name in TASKS:
            written = _prepare_task(args.name, args.out, args.fmt, args.split)
        else:
            written = prepare_dataset(args.name, args.out, fmt=args.fmt, splits=args.split)
    except (PromptDataError, UnknownSharedDatasetError, ValueError, FileNotFoundError) as exc:
        print(f"rlkit data: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT
    for path in written:
        print(f"rlkit data: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
