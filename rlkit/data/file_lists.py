"""``DataConfig.train_files`` / ``val_files`` as a list of sources.

A list may come as a list, or, from a command line, as one string written the way verl's
Hydra overrides write it: ``"['a.parquet', 'b.parquet']"`` or ``[a.parquet,b.parquet]``.
Such a string is read as the list it spells, not as the name of one hub dataset.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlkit.data.prompt_dataset import PromptDataError


def data_sources(value: str | Sequence[str] | None) -> list[str]:
    """The sources ``value`` names, in order (empty for ``""`` or ``None``).

    Raises:
        PromptDataError: a bracketed string with an empty entry (``"[a.parquet,]"``).
    """
    if not value:
        return []
    if not isinstance(value, str):
        return [str(v) for v in value]
    text = value.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return [value]
    entries = [entry.strip().strip("'\"").strip() for entry in text[1:-1].split(",")]
    if text[1:-1].strip() and not all(entries):
        raise PromptDataError(
            f"data files {value!r}: an entry of the list is empty; write them as "
            f"\"['a.parquet', 'b.parquet']\" or as a gin list ['a.parquet', 'b.parquet']"
        )
    return [entry for entry in entries if entry]
