"""Load prompt datasets into rlkit's prompt schema and write them as Parquet.

Sources: a JSON Lines file (``.jsonl``, ``.ndjson``, ``.json`` with one object
per line), a Parquet file, a folder holding ``<split>.jsonl`` or
``<split>.parquet``, or a Hugging Face hub name (``datasets.load_dataset``).
Each row needs a question and an answer (``question_key`` / ``answer_key``)
and becomes ``id``, ``prompt`` (chat messages), ``ground_truth`` and
``data_source`` (see :mod:`rlkit.data.prompt_schema`). Rows already in that
schema, or in verl's (``prompt`` + ``reward_model.ground_truth``), are taken
as they are, so files written by :func:`write_parquet` load back unchanged.

A malformed row (invalid JSON, missing or empty question, missing, empty or
non-string answer, duplicate id) raises :class:`PromptDataError` naming the
file, the 1-based line (or row) and the problem; with ``on_error="skip"`` it
is skipped, and :func:`load_report` tells how many rows were skipped and why.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import datasets

from rlkit.data.images import ImageDataError, check_placeholders, decode_image, stored_image
from rlkit.data.prompt_schema import (
    COLUMNS,
    FEATURES,
    IMAGE_FEATURES,
    build_messages,
    decode_extra_info,
    encode_extra_info,
    message_problem,
)

logger = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet",)
ON_ERROR = ("raise", "skip")
_SPLIT_NAMES = ("train", "test", "validation", "val", "dev", "eval")
#: Names a held-out split goes by; asking for one reads the first of these a source has.
VALIDATION_SPLITS = ("validation", "val", "dev", "test", "eval")
_REPORT_KEY = "rlkit.load_report"
_MAX_REPORTED = 100


class PromptDataError(ValueError):
    """A prompt dataset that cannot be loaded: the message names the file and line."""


class DataUnavailableError(PromptDataError):
    """A dataset that could not be fetched: a hub dataset neither reachable nor cached,
    or a preset missing from ``$RLKIT_DATA_DIR``.

    A :class:`PromptDataError`, so the commands report it as a user error (exit status 2,
    one message, no traceback)."""


@dataclass(frozen=True)
class LoadReport:
    """What :func:`load_prompt_dataset` did with a source.

    Attributes:
        source: the file or hub name read.
        num_rows: rows in the returned dataset.
        num_skipped: malformed rows skipped (``on_error="skip"``).
        skipped: ``"<file>:<line>: <problem>"`` for the first 100 skipped rows.
    """

    source: str
    num_rows: int
    num_skipped: int
    skipped: tuple[str, ...] = ()


def load_report(dataset: datasets.Dataset) -> LoadReport:
    """The :class:`LoadReport` stored in a dataset by :func:`load_prompt_dataset`.

    It lives in ``dataset.info.description`` (JSON), so it survives ``map``,
    ``select`` and ``save_to_disk``.

    Raises:
        ValueError: the dataset was not made by :func:`load_prompt_dataset`.
    """
    try:
        data = json.loads(dataset.info.description or "")[_REPORT_KEY]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(
            "this dataset carries no load report (not from load_prompt_dataset)"
        ) from exc
    return LoadReport(data["source"], data["num_rows"], data["num_skipped"], tuple(data["skipped"]))


class _RowProblem(Exception):
    """One row's problem, turned into a PromptDataError or a skip by the caller."""


# -- reading sources: (location, raw row or problem) --------------------------
def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    # Split on b"\n" ourselves: str.splitlines would also split on U+2028 in strings.
    for lineno, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        where = f"{path}:{lineno}"
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            yield where, _RowProblem(f"not UTF-8 ({exc.reason} at byte {exc.start})")
            continue
        if not line:
            continue
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as exc:
            yield where, _RowProblem(f"invalid JSON ({exc.msg} at column {exc.colno})")


def _table_rows(rows: Any, label: str) -> Iterator[tuple[str, Any]]:
    for i, row in enumerate(rows, start=1):
        yield f"{label} row {i}", row


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    return _table_rows(pq.read_table(path).to_pylist(), str(path))


def _split_candidates(split: str) -> tuple[str, ...]:
    if split not in VALIDATION_SPLITS:
        return (split,)
    return (split, *(s for s in VALIDATION_SPLITS if s != split))


def _local_file(path: Path, split: str) -> Path:
    if not path.is_dir():
        return path
    for name in _split_candidates(split):
        for suffix in (*JSONL_SUFFIXES, *PARQUET_SUFFIXES):
            if (path / f"{name}{suffix}").is_file():
                return path / f"{name}{suffix}"
    have = ", ".join(sorted(p.name for p in path.iterdir())) or "nothing"
    raise FileNotFoundError(f"{path} has no {split}.jsonl or {split}.parquet (it has {have})")


def _hub_split(name: str, split: str) -> str:
    """``split``, or for a held-out split the first of :data:`VALIDATION_SPLITS` the hub
    dataset has (``validation`` asked of a train/test set reads ``test``)."""
    candidates = _split_candidates(split)
    if len(candidates) == 1:
        return split
    have = datasets.get_dataset_split_names(name)
    for candidate in candidates:
        if candidate in have:
            return candidate
    raise PromptDataError(f"{name} has no held-out split ({', '.join(candidates)}); it has {have}")


def _hub_dataset(name: str, split: str) -> Any:
    try:
        return datasets.load_dataset(name, split=_hub_split(name, split))
    except PromptDataError:
        raise
    except (OSError, ValueError, datasets.exceptions.DatasetNotFoundError) as exc:
        # OSError includes ConnectionError (offline and not cached); ValueError a dataset
        # that needs a config name or lacks the split.
        raise DataUnavailableError(
            f"{name!r} is not a local file or folder, and the Hugging Face hub dataset of "
            f"that name could not be loaded ({type(exc).__name__}: {exc}); check the path, "
            f"or connect once so the hub dataset is cached"
        ) from exc


def _hub_layout(path: Path) -> bool:
    """A folder laid out like a hub dataset repository (a dataset card or ``data/``),
    e.g. a ``huggingface-cli download`` snapshot: read by ``datasets.load_dataset``."""
    return path.is_dir() and ((path / "README.md").is_file() or (path / "data").is_dir())


def _has_split_file(path: Path, split: str) -> bool:
    return any(
        (path / f"{name}{suffix}").is_file()
        for name in _split_candidates(split)
        for suffix in (*JSONL_SUFFIXES, *PARQUET_SUFFIXES)
    )


def _rows(path_or_name: str, split: str) -> tuple[str, Iterator[tuple[str, Any]]]:
    path = Path(path_or_name).expanduser()
    if _hub_layout(path) and not _has_split_file(path, split):
        hub = _hub_dataset(str(path), split)
        label = f"{path}[{hub.split or split}]"
        return label, _table_rows(hub, label)
    if path.exists():
        path = _local_file(path, split)
        if path.suffix in PARQUET_SUFFIXES:
            return str(path), _parquet_rows(path)
        if path.suffix in JSONL_SUFFIXES:
            return str(path), _jsonl_rows(path)
        raise PromptDataError(
            f"{path}: unsupported file type {path.suffix!r}; use JSON Lines "
            f"({', '.join(JSONL_SUFFIXES)}) or Parquet"
        )
    if path.suffix in (*JSONL_SUFFIXES, *PARQUET_SUFFIXES) or path_or_name.startswith(
        ("/", ".", "~")
    ):
        raise FileNotFoundError(f"{path_or_name}: no such file")
    hub = _hub_dataset(path_or_name, split)
    label = f"{path_or_name}[{hub.split or split}]"
    return label, _table_rows(hub, label)


# -- mapping one row to the schema -------------------------------------------
def _default_source(source: str) -> str:
    path = Path(source.split("[")[0])
    if path.suffix in (*JSONL_SUFFIXES, *PARQUET_SUFFIXES):
        # ".../gsm8k/test.jsonl" names its data set by the folder, not the split.
        return path.parent.name if path.stem in _SPLIT_NAMES and path.parent.name else path.stem
    return source.split("[")[0]


def _string_field(row: Mapping[str, Any], key: str, what: str, hint: str) -> str:
    if key not in row:
        raise _RowProblem(f"missing {what} key {key!r} (keys: {', '.join(map(str, row))}); {hint}")
    value = row[key]
    if not isinstance(value, str):
        raise _RowProblem(
            f"{what} {key!r} is {type(value).__name__} {value!r:.40}, expected a string; "
            f"write it as a JSON string"
        )
    if not value.strip():
        raise _RowProblem(f"empty {what} {key!r}")
    return value


def _standard_row(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The row as-is if it is already in rlkit's (or verl's) schema, else None."""
    truth = row.get("ground_truth")
    verl_layout = isinstance(row.get("reward_model"), Mapping)
    if truth is None and verl_layout:
        truth = row["reward_model"].get("ground_truth")
    if "prompt" in row and verl_layout and truth is None:
        # A verl row whose answer is missing: say so, rather than fall back to the
        # question/answer layout and report a missing question column.
        raise _RowProblem(
            "reward_model.ground_truth is missing or None; every verl row needs the answer "
            "the reward compares with"
        )
    if "prompt" not in row or truth is None:
        return None
    problem = message_problem(row["prompt"])
    if problem is not None:
        raise _RowProblem(problem)
    if not isinstance(truth, str) or not truth.strip():
        raise _RowProblem(f"ground_truth must be a non-empty string, got {truth!r:.40}")
    extra = _extra_info(row)
    return {
        # verl's files carry no id column: rlkit writes its id into extra_info["id"],
        # verl's own scripts only a per-split extra_info["index"].
        "id": row["id"] if row.get("id") is not None else extra.get("id", extra.get("index")),
        "prompt": [{"role": m["role"], "content": m["content"]} for m in row["prompt"]],
        "ground_truth": truth.strip(),
        "data_source": row.get("data_source"),
        "extra_info": encode_extra_info(extra),
    }


def _extra_info(row: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return decode_extra_info(row.get("extra_info"))
    except ValueError as exc:
        raise _RowProblem(str(exc)) from None


def _question_row_extra(row: Mapping[str, Any], keys: dict[str, str], question: str) -> dict:
    """A question/answer row's ``extra_info``: its own, the raw question (as verl's data
    preprocessing keeps it) and the row's other plain columns (GSM8K's ``solution``)."""
    extra = _extra_info(row)
    extra.setdefault("question", question)
    taken = {keys["question"], keys["answer"], keys["id"], "extra_info", "images"}
    for key, value in row.items():
        if key not in taken and isinstance(value, str | int | float | bool):
            extra.setdefault(key, value)
    return extra


def _to_example(row: Any, keys: dict[str, str], options: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(row, Mapping):
        raise _RowProblem(f"expected a JSON object, got {type(row).__name__}")
    example = None if keys["question"] in row else _standard_row(row)
    if example is None:
        question = _string_field(row, keys["question"], "question", "set question_key=")
        answer = _string_field(row, keys["answer"], "answer", "set answer_key=")
        example = {
            "id": row.get(keys["id"]),
            "prompt": build_messages(question, **options),
            "ground_truth": answer.strip(),
            "data_source": None,
            "extra_info": encode_extra_info(_question_row_extra(row, keys, question)),
        }
    if example["id"] is not None and not isinstance(example["id"], str | int):
        raise _RowProblem(f"id is {type(example['id']).__name__}, expected a string or integer")
    if row.get("images") is not None:
        example["images"] = _images(row["images"], example["prompt"])
    return example


def _images(values: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A row's images as stored records, each decoded once here so that an unreadable one
    stops the load at its row; the placeholders must match them."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise _RowProblem(f"images must be a list of images, got {type(values).__name__}")
    try:
        records = [stored_image(v) for v in values]
        for i, record in enumerate(records):
            try:
                decode_image(record)
            except ImageDataError as exc:
                raise ImageDataError(f"image {i}: {exc}") from None
        check_placeholders(messages, len(records))
    except ImageDataError as exc:
        raise _RowProblem(str(exc)) from None
    return records


def _collect(
    rows: Iterator[tuple[str, Any]],
    keys: dict[str, str],
    options: dict[str, Any],
    sources: tuple[str | None, str],
    on_error: str,
) -> tuple[list[dict[str, Any]], list[str]]:
    explicit, default = sources
    examples: list[dict[str, Any]] = []
    skipped: list[str] = []
    seen: dict[str, str] = {}
    for where, row in rows:
        try:
            if isinstance(row, _RowProblem):
                raise row
            example = _to_example(row, keys, options)
            source = explicit or example["data_source"] or default
            example["data_source"] = source
            if example["id"] is None:
                example["id"] = f"{source}-{len(examples)}"
            example["id"] = str(example["id"])
            if example["id"] in seen:
                raise _RowProblem(
                    f"duplicate id {example['id']!r} (first at {seen[example['id']]})"
                )
        except _RowProblem as problem:
            if on_error == "raise":
                raise PromptDataError(
                    f"{where}: {problem}; fix the row or pass on_error='skip'"
                ) from None
            skipped.append(f"{where}: {problem}")
            continue
        seen[example["id"]] = where
        examples.append(example)
    return examples, skipped


def load_prompt_dataset(
    path_or_name: str,
    *,
    split: str = "train",
    question_key: str = "question",
    answer_key: str = "answer",
    id_key: str = "id",
    data_source: str | None = None,
    instruction: str | None = None,
    system_prompt: str | None = None,
    on_error: str = "raise",
) -> datasets.Dataset:
    """Load prompts into rlkit's schema (``id``, ``prompt``, ``ground_truth``, ``data_source``,
    ``extra_info``: the row's own ``extra_info`` object, as verl's files carry it).

    Args:
        path_or_name: a JSON Lines or Parquet file, a folder with
            ``<split>.jsonl`` / ``<split>.parquet``, or a hub dataset name.
        split: the split of a folder or hub dataset (ignored for a file); a held-out
            name (``validation``, ``val``, ``dev``, ``test``, ``eval``) reads the first of
            those the source has, so ``validation`` finds a train/test set's ``test``.
        question_key: the column holding the question.
        answer_key: the column holding the reference answer (a string).
        id_key: the column holding the id; rows without one get
            ``"<data_source>-<i>"``, i the 0-based index among loaded rows.
        data_source: the ``data_source`` of every row; default: the row's own
            (schema rows), else the folder name for ``<folder>/<split>.jsonl``,
            the file stem for other files, or the hub name.
        instruction: appended to each question (or a template with ``{question}``),
            e.g. :data:`rlkit.data.GSM8K_INSTRUCTION`.
        system_prompt: a system message put before each question.
        on_error: ``"raise"`` on the first malformed row, or ``"skip"`` it
            (the count and reasons are in :func:`load_report`).

    Returns:
        A ``datasets.Dataset`` with the schema columns, rows in file order.

    Raises:
        PromptDataError: a malformed row (``on_error="raise"``), an unsupported
            file type, or no usable rows at all.
        FileNotFoundError: a path that does not exist.
        DataUnavailableError: (a ``PromptDataError``) a hub name that cannot be loaded
            (offline and not cached, or no such dataset).
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    source, rows = _rows(path_or_name, split)
    return _build(
        source,
        rows,
        keys={"question": question_key, "answer": answer_key, "id": id_key},
        options={"instruction": instruction, "system_prompt": system_prompt},
        data_source=data_source,
        on_error=on_error,
    )


def prompt_dataset_from_rows(
    rows: Iterable[Mapping[str, Any]],
    *,
    source: str,
    question_key: str = "question",
    answer_key: str = "answer",
    id_key: str = "id",
    data_source: str | None = None,
    instruction: str | None = None,
    system_prompt: str | None = None,
    on_error: str = "raise",
) -> datasets.Dataset:
    """:func:`load_prompt_dataset` for rows already in memory (e.g. a hub dataset's,
    normalised by a preset): the same schema, checks, ids and load report.

    Args:
        rows: mappings with a question and an answer, or rows in rlkit's or verl's schema.
        source: the name error messages and the load report give the rows
            (``"<name>[<split>]"``); also the default ``data_source``.
        question_key, answer_key, id_key, data_source, instruction, system_prompt,
            on_error: as for :func:`load_prompt_dataset`.

    Raises:
        PromptDataError: a malformed row (``on_error="raise"``) or no usable rows.
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    return _build(
        source,
        _table_rows(rows, source),
        keys={"question": question_key, "answer": answer_key, "id": id_key},
        options={"instruction": instruction, "system_prompt": system_prompt},
        data_source=data_source,
        on_error=on_error,
    )


def _build(
    source: str,
    rows: Iterator[tuple[str, Any]],
    *,
    keys: dict[str, str],
    options: dict[str, Any],
    data_source: str | None,
    on_error: str,
) -> datasets.Dataset:
    sources = (data_source, _default_source(source))
    examples, skipped = _collect(rows, keys, options, sources, on_error)
    if not examples:
        why = f"; all {len(skipped)} rows were malformed, first: {skipped[0]}" if skipped else ""
        raise PromptDataError(f"{source}: no prompts to load{why}")
    if skipped:
        logger.warning("%s: skipped %d malformed rows; first: %s", source, len(skipped), skipped[0])
    report = LoadReport(source, len(examples), len(skipped), tuple(skipped[:_MAX_REPORTED]))
    description = json.dumps({_REPORT_KEY: asdict(report)})
    features = FEATURES
    if any("images" in e for e in examples):
        features = IMAGE_FEATURES
        for example in examples:
            example.setdefault("images", [])
    info = datasets.DatasetInfo(description=description, features=features)
    return datasets.Dataset.from_list(examples, features=features, info=info)


def write_parquet(dataset: datasets.Dataset, path: str | Path) -> Path:
    """Write a prompt-schema dataset to Parquet (as verl's preprocessing scripts do).

    Args:
        dataset: a dataset with at least the schema columns.
        path: the ``.parquet`` file to write; parent folders are created.

    Returns:
        The path written.

    Raises:
        ValueError: a schema column is missing.
    """
    missing = [c for c in COLUMNS if c not in dataset.column_names]
    if missing:
        raise ValueError(
            f"dataset lacks schema column(s) {', '.join(missing)}; build it with load_prompt_dataset"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dataset.to_parquet(str(path))
    return path
