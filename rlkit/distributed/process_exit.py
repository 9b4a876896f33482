"""How a command launched as one of several processes ends: without interpreter shutdown.

After a finished multi-process run the process group is destroyed, yet gloo's worker and
transport threads live on: DTensor's sharding caches keep the device mesh, and with it the
process group, referenced until the interpreter tears itself down. That teardown then races
those threads, and now and then a run that finished, saved and logged everything dies with
SIGABRT (``terminate called without an active exception``), which the launcher reports as
a failed run and for which it kills the other processes.

:func:`exit_process` therefore ends a launched process the way the interpreter would up to
the point where the race begins (``atexit`` handlers, flushed output) and then leaves with
``os._exit``. A process that is not one of several (no launcher's ``WORLD_SIZE`` above 1)
exits normally.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn


def launched_world_size() -> int:
    """How many processes the launcher started (``WORLD_SIZE``; 1 when not launched)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def exit_process(status: int) -> NoReturn:
    """Leave the process with exit ``status``.

    One of several launched processes: run the ``atexit`` handlers (trackers, SGLang
    servers, worker pools), flush stdout and stderr, then ``os._exit(status)``, skipping
    the interpreter teardown that can abort after a finished run. Otherwise ``sys.exit``.
    """
    if launched_world_size() <= 1:
        sys.exit(status)
    # Handlers run while every thread can still take the GIL, exactly as at a normal exit.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        # A closed stream or a broken pipe has nothing more to deliver.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)
