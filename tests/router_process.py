"""A real router process in front of a test's servers (sglang-router, vllm-router)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from rlkit.rollout.servers.process import find_free_port, http_ok, kill_process_tree


def running_router(command: list[str], workers: list[str], log_dir: Path) -> Iterator[str]:
    """Run ``command --host 127.0.0.1 --port P --policy round_robin --worker-urls ...``
    until the generator is closed; yields its URL once ``/health`` answers."""
    port = find_free_port()
    log = open(log_dir / "router.log", "wb")  # noqa: SIM115 - the router keeps it open
    proc = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin"]
        + ["--worker-urls", *workers],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not http_ok(url + "/health", timeout_s=2.0):
            assert proc.poll() is None, f"the router exited; see {log_dir / 'router.log'}"
            assert time.monotonic() < deadline, "the router did not become healthy in 60 s"
            time.sleep(0.5)
        yield url
    finally:
        kill_process_tree(proc, grace_s=5.0)
        log.close()
