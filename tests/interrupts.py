"""Stopping a child process with Ctrl-C in tests, with its threads' stacks if it hangs."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest


def start_run(command: list[str], stderr_path: Path, **popen: object) -> subprocess.Popen:
    """Start ``python -X faulthandler command...`` with its stderr written to
    ``stderr_path``: a file, not a pipe, so a run that writes more than a pipe holds (64
    KiB) while the test waits for it never blocks on the write. Ctrl-C is the default
    action in the child, whatever this process inherited."""
    with open(stderr_path, "w") as err:
        return subprocess.Popen(
            [sys.executable, "-X", "faulthandler", *command],
            stderr=err,
            text=True,
            preexec_fn=_default_ctrl_c,
            **popen,
        )


def _default_ctrl_c() -> None:  # runs in the child between fork and exec
    # A test suite started in the background of a script inherits Ctrl-C ignored, and an
    # ignored SIGINT stays ignored in rlkit (as `nohup` asks): the child must take it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ctrl_c(proc: subprocess.Popen, stderr_path: Path, timeout_s: float) -> str:
    """Send SIGINT to ``proc`` (started by :func:`start_run`) and return its stderr; fail
    with every thread's stack if it has not exited after ``timeout_s``."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        proc.wait(timeout=30)
        stderr = Path(stderr_path).read_text(errors="replace")
        pytest.fail(
            f"Ctrl-C did not stop the run in {timeout_s:g} s; where it was:\n{stderr[-8000:]}"
        )
    return Path(stderr_path).read_text(errors="replace")
