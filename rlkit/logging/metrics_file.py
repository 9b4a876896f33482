"""``metrics.jsonl`` on disk: reading it back, and repairing it before a resumed run
appends to it.

The jsonl sink (:mod:`rlkit.logging.trackers`) repairs the file and the learning curves
read it. These functions live apart from :class:`~rlkit.logging.MetricsLogger`, which
imports the sinks to start them, so that the sinks need nothing of the logger.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Load a ``metrics.jsonl``; a later record for the same step replaces an earlier one
    (a resumed run re-logs the steps after its checkpoint)."""
    by_step: dict[tuple[int, tuple[str, ...]], dict[str, Any]] = {}
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({exc})") from exc
            by_step[(rec["step"], tuple(sorted(rec)))] = rec
    return sorted(by_step.values(), key=lambda r: r["step"])


QUARANTINE_SUFFIX = ".quarantined.jsonl"


def quarantine_unparsable(path: str | Path) -> int:
    """Move every complete line of ``metrics.jsonl`` that is not a JSON record with a
    ``step`` (garbage, a line that is not UTF-8) to ``metrics.quarantined.jsonl`` beside
    it, with one warning; return how many were moved. An incomplete last line is left to
    :func:`repair_metrics`. The file is rewritten atomically, only when a line moves."""
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    complete, tail = data[: data.rfind(b"\n") + 1], data[data.rfind(b"\n") + 1 :]
    lines = complete.splitlines(keepends=True)
    bad = [ln for ln in lines if ln.strip() and _step_of(ln) < 0]
    if not bad:
        return 0
    quarantine = path.with_name(path.name.removesuffix(".jsonl") + QUARANTINE_SUFFIX)
    with open(quarantine, "ab") as fh:  # kept, never overwritten: nothing is lost
        fh.write(b"".join(bad))
        fh.flush()
        os.fsync(fh.fileno())
    atomic_write(path, b"".join(ln for ln in lines if ln not in bad) + tail)
    warnings.warn(
        f"{path}: moved {len(bad)} line(s) that are not metric records (garbled, not "
        f"UTF-8 or not JSON) to {quarantine.name}",
        stacklevel=2,
    )
    return len(bad)


def repair_metrics(path: str | Path, *, keep_through_step: int) -> None:
    """Make ``metrics.jsonl`` safe to append to after a crash or an interrupted run.

    A truncated last line (a crash or a full disk mid-write) is cut back to the last
    complete line, and records of steps after ``keep_through_step`` (logged after the
    checkpoint a run resumes from, so about to be logged again) are dropped, each with a
    warning. The file is rewritten atomically, and only when something changes.
    """
    path = Path(path)
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) < len(data):
        warnings.warn(
            f"{path}: cut an incomplete last line ({len(data) - len(complete)} bytes, from "
            "an interrupted write)",
            stacklevel=2,
        )
    lines = complete.splitlines(keepends=True)
    kept = [ln for ln in lines if not ln.strip() or _step_of(ln) <= keep_through_step]
    if len(kept) < len(lines):
        warnings.warn(
            f"{path}: dropped {len(lines) - len(kept)} record(s) of steps after "
            f"{keep_through_step}; they are logged again from the resumed checkpoint",
            stacklevel=2,
        )
    if len(complete) == len(data) and len(kept) == len(lines):
        return
    atomic_write(path, b"".join(kept))


def atomic_write(path: Path, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` all at once (a temporary file, fsynced, renamed
    over it): a crash leaves the old file or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _step_of(line: bytes) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):  # UnicodeDecodeError is a ValueError
        return -1  # not a record of this logger: keep it, read_metrics reports it
