"""Named presets for common evaluation sets read from a shared data folder.

=============  ==============  ======  =====================================
name           splits (rows)   reward  file(s) under the shared data folder
=============  ==============  ======  =====================================
``gsm8k``      train (7473),   gsm8k   ``gsm8k/train.jsonl``, ``gsm8k/test.jsonl``
               test (1319)
``aime2024``   test (30)       math    ``aime2024/test.jsonl``
``aime2025``   test (30)       math    ``aime2025/test.jsonl``
``math500``    test (500)      math    ``math500/test.jsonl``
=============  ==============  ======  =====================================

The folder is ``$RLKIT_SHARED_DATA`` when set, else the first existing
``shared/data`` next to (``../shared/data``) or inside the repository root, or
next to / inside the current directory or one of its parents.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.data.instructions import BOXED_INSTRUCTION, GSM8K_INSTRUCTION

ENV_VAR = "RLKIT_SHARED_DATA"
_REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class SharedDataset:
    """One shared evaluation set.

    Attributes:
        name: the preset name, also used as ``data_source``.
        splits: split name -> JSONL path relative to the shared data folder.
        reward: the registered reward that scores it (``gsm8k`` or ``math``).
        instruction: the instruction suffix its answers are expected to follow.
        num_rows: rows per split (checked by the tests).
    """

    name: str
    splits: Mapping[str, str]
    reward: str
    instruction: str
    num_rows: Mapping[str, int]


SHARED_DATASETS: dict[str, SharedDataset] = {
    "gsm8k": SharedDataset(
        "gsm8k",
        {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"},
        "gsm8k",
        GSM8K_INSTRUCTION,
        {"train": 7473, "test": 1319},
    ),
    "aime2024": SharedDataset(
        "aime2024", {"test": "aime2024/test.jsonl"}, "math", BOXED_INSTRUCTION, {"test": 30}
    ),
    "aime2025": SharedDataset(
        "aime2025", {"test": "aime2025/test.jsonl"}, "math", BOXED_INSTRUCTION, {"test": 30}
    ),
    "math500": SharedDataset(
        "math500", {"test": "math500/test.jsonl"}, "math", BOXED_INSTRUCTION, {"test": 500}
    ),
}


class UnknownSharedDatasetError(KeyError):
    """A name that is not one of :data:`SHARED_DATASETS`."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


def _candidates() -> list[Path]:
    cwd = Path.cwd().resolve()
    bases = [_REPO_ROOT, cwd, *cwd.parents]
    found = [
        p for base in bases for p in (base.parent / "shared" / "data", base / "shared" / "data")
    ]
    return list(dict.fromkeys(found))


def shared_data_dir() -> Path:
    """The shared data folder (see the module docstring for how it is found).

    Returns:
        An existing directory.

    Raises:
        FileNotFoundError: ``$RLKIT_SHARED_DATA`` names a missing folder, or no
            candidate folder exists.
    """
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"${ENV_VAR}={env!r} is not a directory; fix or unset it")
        return path
    candidates = _candidates()
    for path in candidates:
        if path.is_dir():
            return path
    tried = ", ".join(str(p) for p in candidates[:4])
    raise FileNotFoundError(
        f"no shared data folder found (tried {tried}, ...); set ${ENV_VAR} to the folder "
        f"holding gsm8k/, aime2024/, aime2025/ and math500/"
    )


def shared_dataset(name: str) -> SharedDataset:
    """The preset called ``name``.

    Raises:
        UnknownSharedDatasetError: (a ``KeyError``) no such preset; the message lists them.
    """
    if name not in SHARED_DATASETS:
        raise UnknownSharedDatasetError(
            f"unknown shared dataset {name!r}; choose one of {', '.join(SHARED_DATASETS)}"
        )
    return SHARED_DATASETS[name]


def shared_dataset_path(name: str, split: str = "test") -> Path:
    """The JSONL file of a shared set's split.

    Args:
        name: ``gsm8k``, ``aime2024``, ``aime2025`` or ``math500``.
        split: ``test`` (all sets) or ``train`` (gsm8k only).

    Returns:
        The path of an existing file.

    Raises:
        UnknownSharedDatasetError: unknown ``name`` (a ``KeyError``).
        ValueError: the set has no such split.
        FileNotFoundError: the shared folder or the file is missing.
    """
    preset = shared_dataset(name)
    if split not in preset.splits:
        raise ValueError(f"{name} has no split {split!r}; it has {', '.join(preset.splits)}")
    path = shared_data_dir() / preset.splits[split]
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; is ${ENV_VAR} pointing at the right folder?")
    return path


def load_shared_dataset(name: str, split: str = "test", **options: Any) -> Any:
    """Load a shared set in the prompt schema with its preset instruction.

    Args:
        name: the preset name.
        split: the split.
        **options: passed to :func:`rlkit.data.load_prompt_dataset`; ``instruction``
            defaults to the preset's, ``data_source`` to ``name``.

    Returns:
        The ``datasets.Dataset``.
    """
    from rlkit.data.prompt_dataset import load_prompt_dataset

    preset = shared_dataset(name)
    options.setdefault("instruction", preset.instruction)
    options.setdefault("data_source", name)
    return load_prompt_dataset(str(shared_dataset_path(name, split)), split=split, **options)
