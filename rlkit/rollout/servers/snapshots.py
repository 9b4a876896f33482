"""Policy snapshots on disk for servers that reload weights from a folder.

The trainer writes a Hugging Face directory into a temporary folder, renamed into place
only when complete, so a server never reads a half-written checkpoint; a server
restarted after a crash starts from the newest one.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path


def snapshot_dir(root: str | Path, version: int) -> Path:
    """Where the snapshot of policy ``version`` lives under ``root``."""
    return Path(root) / f"policy_v{version:08d}"


def publish_snapshot(tmp_dir: Path, root: str | Path, version: int, keep: int) -> Path:
    """Rename a complete ``tmp_dir`` to its final name and delete older snapshots.

    The rename is atomic on one file system, so a reader sees either no
    directory or a complete one. The new snapshot and the ``keep - 1`` most recently
    published others are kept (a server may still be reading the previous one).

    Returns the snapshot's final path.
    """
    final = snapshot_dir(root, version)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp_dir, final)
    os.utime(final)  # publication time: what "most recent" means below
    others = [p for p in Path(root).glob("policy_v*") if p != final]
    others.sort(key=lambda p: p.stat().st_mtime)
    for old in others[: max(len(others) - (keep - 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def new_tmp_dir(root: str | Path) -> Path:
    """An empty, uniquely named folder under ``root`` for an in-progress snapshot."""
    path = Path(root) / f".tmp-{uuid.uuid4().hex}"
    path.mkdir(parents=True)
    return path
