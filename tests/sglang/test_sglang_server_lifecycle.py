"""No orphans: servers die with the trainer on SIGTERM, SIGKILL, Ctrl-C and normal exit.

A child "trainer" process starts a :class:`ManagedServer` running a stand-in
process tree (HTTP ``/health`` + a child, like SGLang's server + scheduler); the
test ends the trainer in each way and checks that the whole tree is gone. The real
SGLang tree is killed and checked in ``test_sglang_faults.py``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

FAKE = Path(__file__).with_name("fake_server_tree.py")
REPO = Path(__file__).resolve().parents[2]

TRAINER = """
import json, signal, sys, time
import psutil
# A process started in the background by a non-interactive shell inherits SIGINT ignored,
# and Python then keeps ignoring it; a trainer at a terminal gets Ctrl-C as
# KeyboardInterrupt, which is what the "sigint" case is about.
signal.signal(signal.SIGINT, signal.default_int_handler)
from rlkit.rollout.servers.process import ManagedServer
from rlkit.rollout.sglang.server import ServerConfig

server = ManagedServer(
    ServerConfig(model_path="unused", device="cpu", startup_timeout_s=60),
    log_path=sys.argv[1],
    command=[sys.executable, sys.argv[2], "{port}"],
)
server.start()
time.sleep(0.5)  # let the tree's child start
tree = [server.process.pid] + [c.pid for c in psutil.Process(server.process.pid).children(recursive=True)]
print(json.dumps(tree), flush=True)
if sys.argv[3] == "exit":
    sys.stdin.readline()  # the test checks the tree is up before the trainer leaves
    sys.exit(0)  # no stop(): atexit must do it
time.sleep(3600)
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("ending", ["sigterm", "sigint", "sigkill", "exit"])
def test_server_tree_dies_with_its_trainer(tmp_path, ending):
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(tmp_path / "server.log"), str(FAKE), ending],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        tree = json.loads(trainer.stdout.readline())
        assert len(tree) == 2  # the exec wrapper became the server: server + its child
        assert all(alive(p) for p in tree)
        signals = {"sigterm": signal.SIGTERM, "sigint": signal.SIGINT, "sigkill": signal.SIGKILL}
        if ending in signals:
            trainer.send_signal(signals[ending])
        else:
            trainer.stdin.write("exit now\n")
            trainer.stdin.flush()
        trainer.wait(timeout=30)
        deadline = time.monotonic() + 15
        while any(alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in tree if alive(p)], f"orphans after {ending}"
    finally:
        if trainer.poll() is None:
            trainer.kill()
