"""One message when a reward call hangs inside a single C call and the watchdog ends the run.

Scored in the trainer's process (``DataConfig.reward_workers = 0``), a reward stuck in one
C call (a regex backtracking for minutes, a huge integer power) holds the interpreter:
no signal handler or Python thread can run until it returns, so only ``faulthandler``'s C
watchdog can stop it, and it ends the process with every thread's stack. Here that dump
goes to a small watcher process instead of the terminal: when the process dies with a
dump in the pipe, the watcher saves the stacks to a file and prints one line naming the
call that hung (its function, file and line), the watchdog's limit and the fix
(``DataConfig.reward_workers >= 1``: a hung call then costs only its worker). A process
that ends normally closes the pipe empty, and the watcher exits without a word.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO

_WATCHER_SCRIPT = r"""
import re, sys
dump = sys.stdin.buffer.read().decode("utf-8", "replace")
if dump.strip():
    path, thread = sys.argv[1], sys.argv[2]
    with open(path, "w", encoding="utf-8") as out:
        out.write(dump)
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump)
    block = next((b for b in blocks if thread in b.split("\n", 1)[0].lower()), dump)
    frame = re.search(r'File "([^"]+)", line (\d+) in (\S+)', block)
    where = f"{frame.group(3)} ({frame.group(1)}, line {frame.group(2)})" if frame else "?"
    limit = dump.strip().splitlines()[0]
    sys.stderr.write(
        f"rlkit: a reward call hung inside one C call and the watchdog stopped the run "
        f"({limit}): stuck in {where}. Score this reward in worker processes "
        f"(DataConfig.reward_workers >= 1), where a hung call costs only its worker; "
        f"every thread's stack: {path}\n"
    )
"""

_watcher: subprocess.Popen | None = None
_lock = threading.Lock()


def watchdog_file() -> IO[bytes]:
    """The pipe ``faulthandler`` writes its dump to: the stdin of this process's
    watcher, started on first use."""
    global _watcher
    with _lock:
        if _watcher is None or _watcher.poll() is not None:
            path = Path(tempfile.gettempdir()) / f"rlkit_reward_hang_{os.getpid()}.txt"
            thread = f"0x{threading.main_thread().ident:016x}"
            _watcher = subprocess.Popen(
                [sys.executable, "-I", "-c", _WATCHER_SCRIPT, str(path), thread],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
            )
            atexit.register(_close, _watcher)
        return _watcher.stdin


def _close(watcher: subprocess.Popen) -> None:
    """At a normal exit: an empty pipe tells the watcher to leave without a word."""
    watcher.stdin.close()
    try:
        watcher.wait(timeout=5)
    except subprocess.TimeoutExpired:
        watcher.kill()


def arm(seconds: float) -> None:
    """End the process after ``seconds`` unless disarmed
    (``faulthandler.cancel_dump_traceback_later()``), reported by the watcher."""
    faulthandler.dump_traceback_later(seconds, exit=True, file=watchdog_file())
