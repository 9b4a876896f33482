"""How the tests start several CPU processes: ``accelerate launch`` with a clean environment."""

from __future__ import annotations

import os
import socket
import sys


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accelerate_launch(num_processes: int = 2) -> list[str]:
    """The ``accelerate launch`` prefix for ``num_processes`` CPU processes on this machine.

    ``--multi_gpu`` because on a machine without GPUs accelerate's plain launcher starts
    ONE process whatever ``--num_processes`` says.
    """
    return [
        *(sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu"),
        *("--num_processes", str(num_processes), "--num_machines", "1"),
        *("--mixed_precision", "no", "--dynamo_backend", "no"),
        *("--main_process_port", str(free_port())),
    ]


def launch_env() -> dict[str, str]:
    """This environment, offline, with no inherited launcher identity, and one thread per
    process (``RLKIT_TEST_NUM_THREADS`` threads when set: tests/conftest.py)."""
    threads = os.environ.get("RLKIT_TEST_NUM_THREADS", "").strip() or "1"
    env = os.environ | {
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # never inherit a launcher's identity from the test runner
    return env
