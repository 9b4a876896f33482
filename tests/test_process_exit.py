"""``exit_process``: a launched process (``WORLD_SIZE`` > 1) ends after its ``atexit``
handlers and flushed output, without the interpreter teardown; any other process exits
normally."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.distributed.process_exit import launched_world_size

REPO = Path(__file__).resolve().parents[1]

# An atexit handler and a module-level object whose __del__ only runs in the interpreter's
# teardown (module globals cleared), then the last words left in stdout's buffer (a pipe is
# block-buffered, so they reach the parent only if stdout is flushed).
PROGRAM = """
import atexit, sys
from pathlib import Path
from rlkit.distributed.process_exit import exit_process

marks = Path(sys.argv[1])
atexit.register(lambda: (marks / "atexit").touch())

class TornDown:
    def __del__(self):
        (marks / "teardown").touch()

kept = TornDown()
print("last words", end="")
exit_process(3)
"""


def _run(tmp_path: Path, world_size: str | None) -> tuple[subprocess.CompletedProcess, set]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    if world_size is not None:
        env["WORLD_SIZE"] = world_size
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, {p.name for p in tmp_path.iterdir()}


def test_a_launched_process_runs_its_exit_handlers_and_skips_the_teardown(tmp_path):
    proc, marks = _run(tmp_path, "2")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "last words"  # flushed before os._exit
    assert marks == {"atexit"}  # handlers ran; the teardown (and its __del__) did not


@pytest.mark.parametrize("world_size", [None, "1", "not-a-number"])
def test_a_process_not_launched_as_one_of_several_exits_normally(tmp_path, world_size):
    proc, marks = _run(tmp_path, world_size)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "last words"
    assert marks == {"atexit", "teardown"}


def test_the_launched_world_size_comes_from_the_launcher(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert launched_world_size() == 4
    monkeypatch.delenv("WORLD_SIZE")
    assert launched_world_size() == 1
