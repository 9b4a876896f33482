"""Named dataset presets: common math sets from a local folder or the Hugging Face hub.

=================  ==============  =========  ========================================
name               splits          reward     hub dataset (config, split)
=================  ==============  =========  ========================================
``gsm8k``          train, test     gsm8k      ``openai/gsm8k`` (``main``; train, test)
``math500``        test            math       ``HuggingFaceH4/MATH-500`` (test)
``aime2024``       test            math       ``HuggingFaceH4/aime_2024`` (train)
``aime2025``       test            math       ``opencompass/AIME2025`` (``AIME2025-I``
                                              and ``AIME2025-II``; test)
``dapo_math_17k``  train           math_dapo  ``BytedTsinghua-SIA/DAPO-Math-17k`` (train)
=================  ==============  =========  ========================================

Where the rows come from:

- ``$RLKIT_DATA_DIR`` set: only from that folder, as ``<name>/<split>.jsonl`` or
  ``<name>/<split>.parquet`` (JSON Lines with ``question`` / ``answer``, or files in
  verl's layout such as ``rlkit data prepare NAME --out $RLKIT_DATA_DIR/NAME`` writes);
  nothing is downloaded, so a run never depends on the network by surprise.
- otherwise: from the hub with ``datasets.load_dataset`` (cached in the usual
  Hugging Face cache, so later runs work offline). ``$RLKIT_HUB_MIRROR`` names a
  folder holding hub repositories as ``<owner>/<name>/`` (e.g. snapshots made by
  ``huggingface-cli download --repo-type dataset``), read instead of the hub.

Hub rows are normalised to ``question`` / ``answer`` / ``id`` (GSM8K's ``#### N``
answer becomes ``N``; the full solution goes to ``extra_info``), with ids matching
the local files': ``gsm8k-test-00000``, ``aime2024-I-1``, ``test/precalculus/807.json``.
A preset that is neither local nor cached, offline, raises
:class:`DataUnavailableError`: one message naming the hub id and ``$RLKIT_DATA_DIR``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.data.instructions import BOXED_INSTRUCTION, GSM8K_INSTRUCTION
from rlkit.data.prompt_dataset import JSONL_SUFFIXES, PARQUET_SUFFIXES, DataUnavailableError

ENV_VAR = "RLKIT_DATA_DIR"
HUB_MIRROR_VAR = "RLKIT_HUB_MIRROR"

_AIME_URL = re.compile(r"AIME_(I{1,2})_Problems/Problem_(\d+)")


def gsm8k_final_answer(solution: str) -> str:
    """The reference number of a GSM8K solution: the text after the last ``####``,
    without thousands commas (``"...\\n#### 1,000"`` -> ``"1000"``), as verl's
    preprocessing extracts it; text without ``####`` is returned stripped."""
    if "####" not in solution:
        return solution.strip()
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


# -- hub rows -> question / answer / id (+ extra_info) ------------------------
def _gsm8k_row(row: Mapping[str, Any], split: str, index: int, _config: str | None) -> dict:
    return {
        "id": f"gsm8k-{split}-{index:05d}",
        "question": row["question"],
        "answer": gsm8k_final_answer(row["answer"]),
        "extra_info": {"solution": row["answer"]},
    }


def _math500_row(row: Mapping[str, Any], split: str, index: int, _config: str | None) -> dict:
    extra = {k: row[k] for k in ("solution", "subject", "level") if k in row}
    return {
        "id": row.get("unique_id") or f"math500-{index}",
        "question": row["problem"],
        "answer": str(row["answer"]),
        "extra_info": extra,
    }


def _integer_answer(value: Any) -> str:
    # AIME answers are integers 0-999, sometimes written with leading zeros ("025").
    text = str(value).strip()
    return str(int(text)) if text.isdigit() else text


def _aime2024_row(row: Mapping[str, Any], split: str, index: int, _config: str | None) -> dict:
    match = _AIME_URL.search(str(row.get("url", "")))
    ident = f"aime2024-{match.group(1)}-{match.group(2)}" if match else f"aime2024-{index}"
    extra = {"source_id": row.get("id"), "url": row.get("url")}
    return {
        "id": ident,
        "question": row["problem"],
        "answer": _integer_answer(row["answer"]),
        "extra_info": extra,
    }


def _aime2025_row(row: Mapping[str, Any], split: str, index: int, config: str | None) -> dict:
    part = (config or "").rsplit("-", 1)[-1]  # "AIME2025-II" -> "II"
    return {
        "id": f"aime2025-{part}-{index + 1}",
        "question": row["question"],
        "answer": _integer_answer(row["answer"]),
    }


def _dapo_row(row: Mapping[str, Any], split: str, index: int, _config: str | None) -> dict:
    # Already in verl's layout (prompt, reward_model, extra_info.index); the hub file
    # repeats each problem 100 times, so the position, not the problem, makes the id.
    return {**row, "id": f"dapo_math_17k-{index}"}


RowFn = Callable[[Mapping[str, Any], str, int, "str | None"], dict]


@dataclass(frozen=True)
class HubSource:
    """Where a preset lives on the Hugging Face hub.

    Attributes:
        repo: the dataset id, e.g. ``openai/gsm8k``.
        configs: the configs read and concatenated in order (``None``: the default).
        splits: preset split -> hub split.
        row: maps one hub row (with the preset split, its 0-based index within its
            config, and the config) to ``question`` / ``answer`` / ``id`` / ``extra_info``
            (or a row in verl's layout).
    """

    repo: str
    configs: tuple[str | None, ...]
    splits: Mapping[str, str]
    row: RowFn


@dataclass(frozen=True)
class SharedDataset:
    """One dataset preset.

    Attributes:
        name: the preset name, also used as ``data_source``.
        splits: split name -> file path relative to ``$RLKIT_DATA_DIR`` (``.jsonl``;
            a ``.parquet`` file of the same stem is read as well).
        reward: the registered reward that scores it (``gsm8k`` or ``math``).
        instruction: the instruction suffix its answers are expected to follow
            (``None``: the prompts already carry one).
        num_rows: rows per split in the published data.
        hub: where it lives on the hub.
        verl_data_source: the ``data_source`` verl's default reward dispatch expects,
            written by ``rlkit data prepare``.
        verl_extra_info: ``extra_info`` keys verl's own preprocessing writes, each taken
            from the row's ``extra_info`` field named (GSM8K: ``answer`` is the solution).
    """

    name: str
    splits: Mapping[str, str]
    reward: str
    instruction: str | None
    num_rows: Mapping[str, int]
    hub: HubSource
    verl_data_source: str = field(default="")
    verl_extra_info: Mapping[str, str] = field(default_factory=dict)


SHARED_DATASETS: dict[str, SharedDataset] = {
    "gsm8k": SharedDataset(
        "gsm8k",
        {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"},
        "gsm8k",
        GSM8K_INSTRUCTION,
        {"train": 7473, "test": 1319},
        HubSource("openai/gsm8k", ("main",), {"train": "train", "test": "test"}, _gsm8k_row),
        "openai/gsm8k",
        {"question": "question", "answer": "solution"},
    ),
    "math500": SharedDataset(
        "math500",
        {"test": "math500/test.jsonl"},
        "math",
        BOXED_INSTRUCTION,
        {"test": 500},
        HubSource("HuggingFaceH4/MATH-500", (None,), {"test": "test"}, _math500_row),
        "HuggingFaceH4/MATH-500",
    ),
    "aime2024": SharedDataset(
        "aime2024",
        {"test": "aime2024/test.jsonl"},
        "math",
        BOXED_INSTRUCTION,
        {"test": 30},
        # The hub copy calls its only split "train"; it is the 2024 test.
        HubSource("HuggingFaceH4/aime_2024", (None,), {"test": "train"}, _aime2024_row),
        "aime2024",
    ),
    "aime2025": SharedDataset(
        "aime2025",
        {"test": "aime2025/test.jsonl"},
        "math",
        BOXED_INSTRUCTION,
        {"test": 30},
        HubSource(
            "opencompass/AIME2025", ("AIME2025-I", "AIME2025-II"), {"test": "test"}, _aime2025_row
        ),
        "aime2025",
    ),
    "dapo_math_17k": SharedDataset(
        "dapo_math_17k",
        {"train": "dapo_math_17k/train.jsonl"},
        "math_dapo",
        None,
        # 17,917 distinct problems, each repeated 100 times in the published file.
        {"train": 1_791_700},
        HubSource("BytedTsinghua-SIA/DAPO-Math-17k", (None,), {"train": "train"}, _dapo_row),
        "math_dapo",
    ),
}


class UnknownSharedDatasetError(KeyError):
    """A name that is not one of :data:`SHARED_DATASETS`."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


def local_data_dir() -> Path | None:
    """The folder ``$RLKIT_DATA_DIR`` names, or ``None`` when it is unset (use the hub).

    Raises:
        DataUnavailableError: it is set but is not a directory.
    """
    env = os.environ.get(ENV_VAR)
    if not env:
        return None
    path = Path(env).expanduser()
    if not path.is_dir():
        raise DataUnavailableError(f"${ENV_VAR}={env!r} is not a directory; fix or unset it")
    return path


def shared_dataset(name: str) -> SharedDataset:
    """The preset called ``name``.

    Raises:
        UnknownSharedDatasetError: (a ``KeyError``) no such preset; the message lists them.
    """
    if name not in SHARED_DATASETS:
        raise UnknownSharedDatasetError(
            f"unknown dataset preset {name!r}; choose one of {', '.join(SHARED_DATASETS)}"
        )
    return SHARED_DATASETS[name]


def _checked_split(preset: SharedDataset, split: str) -> None:
    if split not in preset.splits:
        raise ValueError(f"{preset.name} has no split {split!r}; it has {', '.join(preset.splits)}")


def shared_dataset_path(name: str, split: str = "test") -> Path:
    """The local file of a preset's split under ``$RLKIT_DATA_DIR``.

    Args:
        name: a preset name (:data:`SHARED_DATASETS`).
        split: one of the preset's splits.

    Returns:
        The path of an existing ``<name>/<split>.jsonl`` or ``.parquet`` file.

    Raises:
        UnknownSharedDatasetError: unknown ``name`` (a ``KeyError``).
        ValueError: the preset has no such split.
        DataUnavailableError: ``$RLKIT_DATA_DIR`` is unset or lacks the file.
    """
    preset = shared_dataset(name)
    _checked_split(preset, split)
    folder = local_data_dir()
    if folder is None:
        raise DataUnavailableError(
            f"${ENV_VAR} is not set, so {name} has no local file; set "
            f"{ENV_VAR}=/path/to/data (holding {preset.splits[split]})"
        )
    relative = Path(preset.splits[split])
    for suffix in (*JSONL_SUFFIXES, *PARQUET_SUFFIXES):
        path = folder / relative.with_suffix(suffix)
        if path.is_file():
            return path
    raise DataUnavailableError(
        f"{folder / relative} (or .parquet) is missing; ${ENV_VAR}={str(folder)!r} should hold "
        f"{relative}; write it with `rlkit data prepare {name} --out {folder / name}` "
        f"(hub access needed once) or unset ${ENV_VAR} to read the hub"
    )


def _hub_location(repo: str) -> str:
    mirror = os.environ.get(HUB_MIRROR_VAR)
    return str(Path(mirror).expanduser() / repo) if mirror else repo


def _unavailable(preset: SharedDataset, split: str, config: str | None, exc: Exception) -> str:
    hub = preset.hub
    config_part = f"config {config}, " if config else ""
    return (
        f"dataset preset {preset.name!r} ({split}) reads the Hugging Face hub dataset "
        f"{hub.repo} ({config_part}split {hub.splits[split]}), which could not be loaded "
        f"({type(exc).__name__}: {exc}). Connect once so it is cached, or put local files in "
        f"a folder and set {ENV_VAR}=/path/to/data (it must hold {preset.splits[split]} or "
        f"the .parquet of that name, e.g. written by "
        f"`rlkit data prepare {preset.name} --out /path/to/data/{preset.name}`)"
    )


def hub_rows(name: str, split: str = "test") -> Iterator[dict[str, Any]]:
    """A preset's rows from the hub (or ``$RLKIT_HUB_MIRROR``), normalised.

    Args:
        name: a preset name.
        split: one of the preset's splits (mapped to the hub's split name).

    Returns:
        An iterator of ``question`` / ``answer`` / ``id`` / ``extra_info`` dicts (or
        rows in verl's layout, for sets published that way). Every config is loaded
        before the first row is returned, so a failure surfaces here, not mid-way.

    Raises:
        DataUnavailableError: the hub is unreachable and the set is not cached, or the
            mirror lacks it.
    """
    import datasets

    preset = shared_dataset(name)
    _checked_split(preset, split)
    hub = preset.hub
    loaded = []
    for config in hub.configs:
        try:
            loaded.append(
                (
                    config,
                    datasets.load_dataset(_hub_location(hub.repo), config, split=hub.splits[split]),
                )
            )
        except (OSError, ValueError, datasets.exceptions.DatasetNotFoundError) as exc:
            # OSError covers ConnectionError (offline) and missing mirror files; ValueError
            # a mirror folder without that config or split.
            raise DataUnavailableError(_unavailable(preset, split, config, exc)) from exc

    def rows() -> Iterator[dict[str, Any]]:
        for config, table in loaded:
            for index, row in enumerate(table):
                yield hub.row(row, split, index, config)

    return rows()


def load_shared_dataset(name: str, split: str = "test", **options: Any) -> Any:
    """Load a preset in the prompt schema with its instruction (see the module docstring
    for where the rows come from).

    Args:
        name: the preset name.
        split: the split.
        **options: passed to :func:`rlkit.data.load_prompt_dataset` /
            :func:`rlkit.data.prompt_dataset_from_rows`; ``instruction`` defaults to the
            preset's, ``data_source`` to ``name``.

    Returns:
        The ``datasets.Dataset``.

    Raises:
        DataUnavailableError: the rows are neither local nor reachable on the hub.
    """
    from rlkit.data.prompt_dataset import load_prompt_dataset, prompt_dataset_from_rows

    preset = shared_dataset(name)
    _checked_split(preset, split)
    if preset.instruction is not None:
        options.setdefault("instruction", preset.instruction)
    options.setdefault("data_source", name)
    if local_data_dir() is not None:
        return load_prompt_dataset(str(shared_dataset_path(name, split)), split=split, **options)
    source = f"{preset.hub.repo}[{preset.hub.splits[split]}]"
    return prompt_dataset_from_rows(hub_rows(name, split), source=source, **options)
