"""Stopping a child process with Ctrl-C in tests, with its threads' stacks if it hangs."""

from __future__ import annotations

import signal
import subprocess

import pytest


def ctrl_c(proc: subprocess.Popen, timeout_s: float) -> str:
    """Send SIGINT to ``proc`` (started with ``python -X faulthandler``, stderr piped)
    and return its stderr; fail with every thread's stack if it has not exited after
    ``timeout_s``."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=timeout_s)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        stderr = proc.communicate(timeout=30)[1]
        pytest.fail(
            f"Ctrl-C did not stop the run in {timeout_s:g} s; where it was:\n{stderr[-8000:]}"
        )
