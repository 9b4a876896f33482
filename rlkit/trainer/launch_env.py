"""What the launcher set up: the process count a run was started with, and the variables
that make one process look like a one-process torchrun launch (FSDP2 needs a process
group even alone)."""

from __future__ import annotations

import os
import socket
import warnings

import torch.distributed as dist
from accelerate.utils import get_int_from_env

#: Environment of a one-process torchrun launch; see `_single_process_launch_env`.
LAUNCH_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
)


def launched() -> bool:
    # torchrun / `accelerate launch --multi_gpu` set LOCAL_RANK; mpirun sets PMI_SIZE etc.
    names = ("LOCAL_RANK", "WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
    return any(name in os.environ for name in names)


def launched_world_size() -> int:
    """The processes of this run: the process group's, else the launcher's variables."""
    if dist.is_initialized():
        return dist.get_world_size()
    names = ["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"]
    return get_int_from_env(names, 1)


def choose_sharding(strategy: str, world_size: int, launched_with_fsdp: bool) -> bool:
    """Whether to shard with FSDP2; raises for ``"none"`` with several processes."""
    if strategy == "none" and (world_size > 1 or launched_with_fsdp):
        raise ValueError(
            f"strategy='none' runs one unsharded process, but {world_size} processes were "
            "launched (or --use_fsdp was given); use strategy='auto' or 'fsdp2', or launch "
            "one process without --use_fsdp."
        )
    return strategy == "fsdp2" or (strategy == "auto" and (world_size > 1 or launched_with_fsdp))


def warn_if_single_process_launch() -> None:
    # `accelerate launch --num_processes N` without --multi_gpu on a machine without GPUs
    # starts ONE process; it still exports MASTER_ADDR (and its ACCELERATE_* settings).
    simple_launcher = "ACCELERATE_DYNAMO_BACKEND" in os.environ and "MASTER_ADDR" in os.environ
    if simple_launcher and not launched():
        warnings.warn(
            "accelerate launch started a single process although --num_processes > 1 was "
            "requested: without GPUs add --multi_gpu (it starts the processes with torchrun; "
            "rlkit then runs them on CPU with gloo). See docs/distributed.md.",
            stacklevel=3,
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def single_process_launch_env() -> dict[str, str | None]:
    """Make this process look like a one-process torchrun launch; return the previous values.

    FSDP2 needs a process group even with one process. Accelerate creates one only for a
    launched process, so the variables torchrun would set are set here; on CUDA/NPU this
    yields accelerate's ordinary one-process FSDP state.
    """
    previous = {name: os.environ.get(name) for name in LAUNCH_VARS}
    values = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0"}
    values |= {"LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    os.environ.update(values)
    return previous


def restore_env(previous: dict[str, str | None]) -> None:
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
