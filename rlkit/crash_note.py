"""What the trainer's process was scoring, left where a supervisor can read it after a
native crash.

A reward that crashes inside C code (a segfault in an extension) ends the process it runs
in; with ``DataConfig.reward_workers = 0`` that is the trainer, and no Python code is left
to say which reward and which row did it. When :data:`ENV` names a file (``rlkit train``'s
supervisor sets it, :mod:`rlkit.supervisor`), every reward call made in this process first
writes one JSON line there, the reward and the row, and the batch clears it when done.
The supervisor reads it when the trainer dies from a signal. Without :data:`ENV` nothing is
written. A call costs one ``pwrite`` (microseconds, against a reward's milliseconds).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ENV = "RLKIT_CRASH_NOTE"
_fd: int | None = None
_path: str | None = None


def _descriptor() -> int | None:
    global _fd, _path
    path = os.environ.get(ENV)
    if not path:
        return None
    if _fd is None or path != _path:
        _fd, _path = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), path
    return _fd


def mark(reward: str, row: int, extra: Mapping[str, Any], response: str) -> None:
    """Note that ``reward`` is about to score row ``row`` of its batch."""
    fd = _descriptor()
    if fd is None:
        return
    note = {
        "reward": reward,
        "row": row,
        "data_source": str(extra.get("data_source", "")),
        "response": response[:80],
    }
    data = (json.dumps(note) + "\n").encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


def clear() -> None:
    """The batch is scored: nothing is in flight."""
    fd = _descriptor()
    if fd is not None:
        os.ftruncate(fd, 0)


def read(path: str | Path) -> dict[str, Any] | None:
    """The note left in ``path``: the reward call in flight, or None."""
    try:
        text = Path(path).read_text().strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None


def describe(note: Mapping[str, Any]) -> str:
    """``note`` as the words of a message."""
    source = f", data_source {note['data_source']!r}" if note.get("data_source") else ""
    return (
        f"the reward {note.get('reward')!r} while it scored row {note.get('row')} of its "
        f"batch{source} (response starting {note.get('response', '')!r})"
    )
