"""Faults struck at real servers: a process tree killed during a weight sync.

``killed_at_the_next_load`` arms an engine the test holds; ``sglang_killed_at_sync`` is an
engine factory a training run names (``RolloutConfig.engine =
"tests.sglang.server_faults:sglang_killed_at_sync"``), for runs launched as commands
(several processes under ``accelerate launch``), where no test holds the engine.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import psutil


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up after {timeout_s} s waiting until {what}"
        time.sleep(0.005)


def killed_at_load(engine: Any, victim: Any, at: int = 1) -> None:
    """``engine``'s ``at``-th ``_load`` from now first kills ``victim``'s whole process
    tree (a server dying during a weight sync), then runs as usual; every other load runs
    as usual. On a process that does not own the server (not the main one) nothing is
    killed."""
    original = engine._load
    loads = 0

    def kill_then_load(weights, version, targets):
        nonlocal loads
        loads += 1
        if loads == at:
            del engine._load  # once: the retry loads normally
            if victim.server is not None:
                os.killpg(victim.server.process.pid, signal.SIGKILL)
                wait_until(lambda: not victim.server.alive, 60, "the killed server is gone")
        return original(weights, version, targets)

    engine._load = kill_then_load


def killed_at_the_next_load(engine: Any, victim: Any) -> None:
    """``engine``'s next ``_load`` kills ``victim`` first (:func:`killed_at_load`)."""
    killed_at_load(engine, victim, at=1)


def sglang_killed_at_sync(*, kill_at_sync: int = 1, **options: Any) -> Any:
    """The ``sglang`` engine built from ``options``, whose first started server is killed
    at the start of weight sync number ``kill_at_sync``."""
    from rlkit.rollout.sglang.factory import make_sglang_engine

    engine = make_sglang_engine(**options)
    killed_at_load(engine, engine.sync_endpoints[0], at=kill_at_sync)
    return engine
