"""Prompt datasets in verl's file layout, and ``rlkit data prepare``'s work.

verl's ``examples/data_preprocess`` scripts write one Parquet file per split whose rows
are::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "<question> <instruction>"}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, ...}}

:func:`load_prompt_dataset` reads such files as they are (``reward_model.ground_truth``
becomes ``ground_truth``, ``extra_info`` reaches rewards); :func:`write_verl` writes a
prompt-schema dataset back in that layout, with rlkit's ``id`` kept as
``extra_info["id"]`` (verl ignores it; rlkit reads it back as the row id), so files
move between the two tools in both directions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rlkit.data.prompt_schema import decode_extra_info

FORMATS = ("parquet", "jsonl")


def verl_rows(
    rows: Iterable[Mapping[str, Any]],
    *,
    split: str,
    data_source: str | None = None,
    ability: str = "math",
    extra_names: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Prompt-schema rows (``id``, ``prompt``, ``ground_truth``, ``data_source``,
    ``extra_info``) as verl rows.

    Args:
        rows: e.g. a dataset from :func:`rlkit.data.load_prompt_dataset`.
        split: written as ``extra_info["split"]``.
        data_source: every row's ``data_source`` (verl picks its default reward by it,
            e.g. ``openai/gsm8k``); ``None`` keeps each row's own.
        ability: verl's ``ability`` column.
        extra_names: verl ``extra_info`` key -> the row's ``extra_info`` field it copies
            (a preset's :attr:`~rlkit.data.shared_datasets.SharedDataset.verl_extra_info`).

    Returns:
        One dict per row; ``extra_info`` holds the row's own fields plus ``split``,
        ``index`` (0-based position) and ``id``.
    """
    out = []
    for index, row in enumerate(rows):
        extra = decode_extra_info(row.get("extra_info"))
        extra |= {verl: extra[ours] for verl, ours in (extra_names or {}).items() if ours in extra}
        out.append(
            {
                "data_source": data_source or row["data_source"],
                "prompt": [{"role": m["role"], "content": m["content"]} for m in row["prompt"]],
                "ability": ability,
                "reward_model": {"style": "rule", "ground_truth": row["ground_truth"]},
                "extra_info": {**extra, "split": split, "index": index, "id": row["id"]},
                # verl's vision-language column: each image as {"bytes", "path"}
                **({"images": list(row["images"])} if row.get("images") else {}),
            }
        )
    return out


def write_verl(
    rows: Iterable[Mapping[str, Any]],
    path: str | Path,
    *,
    split: str,
    data_source: str | None = None,
    ability: str = "math",
    extra_names: Mapping[str, str] | None = None,
) -> Path:
    """Write prompt-schema rows as a verl file: Parquet, or JSON Lines for a ``.jsonl`` path.

    Args:
        rows: prompt-schema rows (see :func:`verl_rows`).
        path: the file; parent folders are created.
        split, data_source, ability, extra_names: as for :func:`verl_rows`.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    records = verl_rows(
        rows, split=split, data_source=data_source, ability=ability, extra_names=extra_names
    )
    if path.suffix == ".jsonl":
        if any(image.get("bytes") for r in records for image in r.get("images", ())):
            raise ValueError(
                f"{path}: images held as bytes cannot be written to JSON Lines; write Parquet "
                f"(--format parquet)"
            )
        with path.open("w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def prepare_dataset(
    name: str, out: str | Path, *, fmt: str = "parquet", splits: Iterable[str] | None = None
) -> list[Path]:
    """Write a preset's splits in verl's layout, as ``<out>/<split>.parquet`` (or ``.jsonl``).

    The rows come from :func:`rlkit.data.load_shared_dataset` (``$RLKIT_DATA_DIR`` or the
    hub) with the preset's instruction in the prompt and the normalised ground truth
    (GSM8K's ``#### N`` becomes ``N``). ``data_source`` is the one verl's default reward
    dispatch expects (``openai/gsm8k``, ``HuggingFaceH4/MATH-500``, ...). A folder so
    written is a valid ``$RLKIT_DATA_DIR/<name>`` folder.

    Args:
        name: a preset name (:data:`rlkit.data.SHARED_DATASETS`).
        out: the output folder.
        fmt: ``parquet`` or ``jsonl``.
        splits: the splits to write; default all of the preset's.

    Returns:
        The files written.

    Raises:
        UnknownSharedDatasetError: unknown ``name``.
        ValueError: an unknown format or split.
        DataUnavailableError: the rows are neither local nor reachable on the hub.
    """
    from rlkit.data.shared_datasets import load_shared_dataset, shared_dataset

    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    preset = shared_dataset(name)
    written = []
    for split in splits or preset.splits:
        dataset = load_shared_dataset(name, split)
        path = Path(out) / f"{split}.{fmt}"
        written.append(
            write_verl(
                dataset,
                path,
                split=split,
                data_source=preset.verl_data_source or name,
                extra_names=preset.verl_extra_info,
            )
        )
    return written
