"""Cores for the trainer and for the server engines it starts on the same CPU.

When rollouts overlap training (``TrainerConfig.rollout_mode = "one_step_off"`` or
``"async"``) and the engine starts its servers on this machine's CPU, the trainer and the
servers compute at the same time. Left alone, each sizes its thread pools to every core:
the pools oversubscribe the cores, and OpenMP threads spinning at their barriers wait on
each other (on 2 cores the demo's ``one_step_off`` step took 3.3 s where ``sync`` took
0.94 s). A split gives each side cores of its own: the servers the upper part of the
cores this process may run on, the trainer the rest, each with as many threads as cores.

``RolloutConfig.server_cores`` chooses:

- ``"auto"`` (default): split when rollouts overlap training and the servers are started
  on the CPU; the servers get half the cores (rounded up), the trainer the rest. In
  ``sync`` each side waits while the other computes, so both keep every core.
- ``"off"``: never split.
- ``N``: the servers get ``N`` cores and the trainer the rest, in any mode.

The servers' cores reach them as :data:`SERVER_CPUS_ENV` (the server process sets its
own affinity before it starts, :mod:`rlkit.rollout.servers.process`) and
``OMP_NUM_THREADS``; a value the user gives in ``server_env`` wins. Once a server is
healthy its front-end processes (HTTP, tokenizer, detokenizer) move to the trainer's
cores (:func:`place_frontend`), leaving the servers' cores to the processes that run the
model. The trainer sets its affinity and torch's intra-op threads
(``TrainerConfig.num_threads`` wins for threads).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

AUTO, OFF = "auto", "off"
#: The variable a started server reads its cores from (comma-separated ids).
SERVER_CPUS_ENV = "RLKIT_SERVER_CPUS"
#: The cores a started server's front-end processes move to once it is healthy.
FRONTEND_CPUS_ENV = "RLKIT_SERVER_FRONTEND_CPUS"
#: Rollout modes in which the trainer computes while the servers generate.
OVERLAPPED_MODES = ("one_step_off", "async")


@dataclass(frozen=True)
class CpuSplit:
    """Which cores the servers and the trainer run on.

    Attributes:
        server_cpus: the cores every started server may run on (they share them).
        trainer_cpus: the cores the trainer's processes run on.
        server_threads: OpenMP threads of each server: its share of ``server_cpus``.
        how: why this split was chosen, for the log line.
    """

    server_cpus: tuple[int, ...]
    trainer_cpus: tuple[int, ...]
    server_threads: int
    how: str

    def server_env(self) -> dict[str, str]:
        """The variables that place a started server on :attr:`server_cpus` with
        :attr:`server_threads` OpenMP threads, and its front-end with the trainer
        (:func:`place_frontend`)."""
        return {
            SERVER_CPUS_ENV: ",".join(map(str, self.server_cpus)),
            FRONTEND_CPUS_ENV: ",".join(map(str, self.trainer_cpus)),
            "OMP_NUM_THREADS": str(self.server_threads),
        }

    def trainer_cores(self, local_rank: int = 0, local_world: int = 1) -> tuple[int, ...]:
        """The cores of one trainer process: a share of :attr:`trainer_cpus` when each of
        the ``local_world`` processes on this machine can have one, else all of them."""
        if len(self.trainer_cpus) >= local_world > 1:
            return self.trainer_cpus[local_rank::local_world]
        return self.trainer_cpus

    def describe(self) -> str:
        return (
            f"servers on cores {_ranges(self.server_cpus)} (OMP_NUM_THREADS="
            f"{self.server_threads}), the trainer on cores {_ranges(self.trainer_cpus)} "
            f"({self.how})"
        )


def problem(setting: Any, available: Collection[int]) -> str | None:
    """Why ``RolloutConfig.server_cores = setting`` cannot be met on ``available`` cores
    (None when it can)."""
    counted = isinstance(setting, int) and not isinstance(setting, bool)
    if not counted or setting < len(available):
        return None
    return (
        f"RolloutConfig.server_cores = {setting} leaves the trainer no core: this process "
        f"may run on {len(available)} core(s) ({_ranges(available)}); give the servers "
        f"fewer, or 'off' to share every core"
    )


def plan(
    setting: Any,
    *,
    rollout_mode: str,
    servers_on_cpu: bool,
    available: Collection[int],
    num_servers: int = 1,
) -> tuple[CpuSplit | None, str]:
    """The split for a run, and why (a split's ``how``, or why there is none).

    Args:
        setting: ``RolloutConfig.server_cores`` (``"auto"``, ``"off"`` or a count).
        rollout_mode: ``TrainerConfig.rollout_mode``.
        servers_on_cpu: the engine starts servers, on this machine's CPU.
        available: the cores this process may run on.
        num_servers: servers the engine starts (they share the servers' cores).
    """
    cores = tuple(sorted(available))
    if setting == OFF:
        return None, "RolloutConfig.server_cores = 'off'"
    if not servers_on_cpu:
        return None, "the engine starts no server on this CPU"
    if setting == AUTO:
        if rollout_mode not in OVERLAPPED_MODES:
            return None, f"rollout_mode {rollout_mode!r}: the servers and trainer take turns"
        if len(cores) < 2:
            return None, f"one core ({cores[0]}) to share"
        count = (len(cores) + 1) // 2
        how = f"RolloutConfig.server_cores = 'auto' under rollout_mode {rollout_mode!r}"
    else:
        count = int(setting)
        how = f"RolloutConfig.server_cores = {count}"
    threads = max(1, count // max(1, num_servers))
    return CpuSplit(cores[-count:], cores[:-count], threads, how), how


def servers_on_cpu(engine_options: Mapping[str, Any], takes_run: bool, on_cpu: bool) -> bool:
    """Whether a server engine starts servers on this machine's CPU: registered as one
    (``takes_run``), with ``num_servers`` > 0 (default 1) and ``device`` ``"cpu"`` or
    unset on a CPU platform (``on_cpu``)."""
    device = engine_options.get("device") or ("cpu" if on_cpu else "cuda")
    return takes_run and int(engine_options.get("num_servers", 1)) > 0 and device == "cpu"


def available_cores() -> frozenset[int]:
    """The cores this process may run on (its affinity)."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class Placement:
    """Where :func:`place_trainer` put this process, and where it was before."""

    cores: tuple[int, ...]
    threads: int
    previous_cores: frozenset[int]
    previous_threads: int


def place_trainer(
    split: CpuSplit, threads: int | None, local_rank: int = 0, local_world: int = 1
) -> Placement:
    """Run this process on its trainer cores with one torch thread per core it owns (or
    ``threads``, ``TrainerConfig.num_threads``, when set)."""
    import torch

    placement = Placement(
        cores=split.trainer_cores(local_rank, local_world),
        threads=0,
        previous_cores=available_cores(),
        previous_threads=torch.get_num_threads(),
    )
    shared_by = local_world if placement.cores == split.trainer_cpus else 1
    count = threads or max(1, len(placement.cores) // shared_by)
    _pin_every_thread(placement.cores)
    torch.set_num_threads(count)
    return dataclasses.replace(placement, threads=count)


def restore(placement: Placement) -> None:
    """Give this process back the cores and threads it had before :func:`place_trainer`
    (a trainer run inside a notebook or under pytest leaves them as it found them)."""
    import torch

    _pin_every_thread(placement.previous_cores)
    torch.set_num_threads(placement.previous_threads)


def place_frontend(pid: int, compute_processes: Collection[str], env: Mapping[str, str]) -> int:
    """Move a healthy server's front-end to the trainer's cores; how many processes moved.

    The server's whole process tree starts on the servers' cores. Its model runs in one
    process per rank (``compute_processes``: command lines starting so, e.g.
    ``sglang::scheduler``); the others (HTTP server, tokenizer, detokenizer) take a
    slice of every request and would take it from the model's core. On the trainer's
    cores they run while the trainer waits for the next batch: on 2 cores the demo's
    ``one_step_off`` step went from 0.82 s to 0.72 s. Nothing moves without a split
    (``env`` lacks :data:`FRONTEND_CPUS_ENV`) or without named compute processes.
    """
    import psutil

    frontend = env.get(FRONTEND_CPUS_ENV)
    if not frontend or not compute_processes or not hasattr(os, "sched_setaffinity"):
        return 0
    cores = {int(c) for c in frontend.split(",")}
    moved = 0
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                command = " ".join(proc.cmdline())
                if any(command.startswith(name) for name in compute_processes):
                    continue
                for thread in proc.threads():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.sched_setaffinity(thread.id, cores)
                moved += 1
    return moved


def _pin_every_thread(cores: Collection[int]) -> None:
    """Set the affinity of every thread of this process (Linux sets it per thread: the
    OpenMP pool and the threads already started would keep the old one)."""
    if not hasattr(os, "sched_setaffinity"):
        return
    tasks = Path("/proc/self/task")
    ids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    for tid in ids:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # a thread that ended
            os.sched_setaffinity(tid, cores)


def _ranges(cores: Collection[int]) -> str:
    """``0-3,6``: sorted ids with runs collapsed."""
    ids = sorted(cores)
    parts: list[str] = []
    start = prev = None
    for c in ids + [None]:
        if start is not None and (c is None or c != prev + 1):
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if c is not None and start is None:
            start = c
        prev = c
    return ",".join(parts) or "none"
