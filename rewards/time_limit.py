"""Run a call in this process under a wall-clock limit (``SIGALRM``).

Used by :func:`rewards.score_batch` when ``num_workers == 0``. A signal
interrupts Python code (loops, ``time.sleep``, SymPy's pure-Python algorithms)
but not a single long C call that holds the GIL, such as ``10 ** (10 ** 9)``;
only a worker process (``num_workers >= 1``) bounds those. Signals reach the
main thread only, so elsewhere the call runs without a limit and a
:class:`RuntimeWarning` says so once. A caller's own pending ``ITIMER_REAL``
alarm is put back afterwards.
"""

from __future__ import annotations

import faulthandler
import signal
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from rewards import hang_report

T = TypeVar("T")
_warned_off_main_thread = False


class RewardTimeout(BaseException):
    """A reward call ran past its limit.

    A ``BaseException`` so that a reward's own ``except Exception`` cannot
    swallow it (math-verify, for one, catches ``Exception`` around parsing).
    """


def _raise_timeout(signum: int, frame: Any) -> None:
    raise RewardTimeout()


def can_limit_here() -> bool:
    """Whether :func:`call_with_time_limit` can enforce a limit in this thread."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def call_with_time_limit(
    fn: Callable[..., T],
    timeout_s: float | None,
    /,
    *args: Any,
    _hard_limit_s: float | None = None,
    **kwargs: Any,
) -> T:
    """Return ``fn(*args, **kwargs)``, interrupted after ``timeout_s`` seconds.

    Args:
        fn: the function to call (positional-only, as is ``timeout_s``, so ``fn`` may
            take keywords of those names).
        timeout_s: the limit in seconds; ``None`` for none.
        *args: positional arguments of ``fn``.
        _hard_limit_s: if set (with a limit), a watchdog ends the process (status 1,
            every thread's traceback on stderr) when the call is still running this many
            seconds after ``timeout_s``: the signal did not interrupt it (a long C
            call), and nothing else in the process can.
        **kwargs: keyword arguments of ``fn``.

    Returns:
        What ``fn`` returns.

    Raises:
        RewardTimeout: the call ran longer than ``timeout_s``.
    """
    global _warned_off_main_thread
    if timeout_s is None:
        return fn(*args, **kwargs)
    if not can_limit_here():
        if not _warned_off_main_thread:
            _warned_off_main_thread = True
            warnings.warn(
                "reward time limits need the main thread when num_workers=0; this call runs "
                "without one. Use num_workers >= 1 to score off the main thread with limits.",
                RuntimeWarning,
                stacklevel=3,
            )
        return fn(*args, **kwargs)
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    start = time.monotonic()
    outer_delay = 0.0
    watchdog = _watchdog(timeout_s, _hard_limit_s)
    try:
        outer_delay, _ = signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if watchdog:
                faulthandler.cancel_dump_traceback_later()
    finally:
        # Outer block: an alarm landing just before the disarm still restores the handler.
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        if outer_delay > 0:  # a caller's own alarm was pending: put it back
            signal.setitimer(
                signal.ITIMER_REAL, max(outer_delay - (time.monotonic() - start), 1e-3)
            )


def _watchdog(timeout_s: float, hard_limit_s: float | None) -> bool:
    """Arm a watchdog that ends the process if the call outlives its limit by
    ``hard_limit_s``; return whether one was armed.

    It is ``faulthandler``'s, a C thread: a Python thread cannot run while a C call
    holds the GIL, which is exactly the case it is for. It exits with status 1, and
    :mod:`rewards.hang_report` prints one line naming the stuck call and the fix.
    """
    if hard_limit_s is None:
        return False
    hang_report.arm(timeout_s + hard_limit_s)
    return True
