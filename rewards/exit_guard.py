"""A reward scored in the trainer's process must not end the trainer.

With ``DataConfig.reward_workers = 0`` (the default) rewards run in the trainer's own
process. A reward that calls ``sys.exit`` raises ``SystemExit``, which is not an
``Exception`` and would escape any ``except Exception`` guard; one that calls
``os._exit`` ends the process on the spot, with whatever status it passes (0 looks like
success to a sweep or CI). :func:`exits_refused` turns both into that row's reward error,
as a worker process that dies does with ``reward_workers >= 1``: the row is named in the
reward errors, and a run where every row fails stops with exit 2.

A crash inside C code (a segfault) cannot be turned into an error in the process it
happens in: ``rlkit train``'s supervisor (:mod:`rlkit.supervisor`) names the reward and
row it happened in, and ``reward_workers >= 1`` contains it (docs/rewards.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


class ExitCalled(SystemExit):
    """``os._exit(status)`` called by a reward while :func:`exits_refused` is active."""


@contextmanager
def exits_refused() -> Iterator[None]:
    """While active, ``os._exit`` raises :class:`ExitCalled` instead of ending the process.
    Entered around in-process reward calls only (on the thread scoring them); the real
    ``os._exit`` is back when it exits, also after an error."""
    original = os._exit

    def refuse(status: int) -> None:
        raise ExitCalled(status)

    os._exit = refuse  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit = original


def exit_message(exc: SystemExit) -> str:
    """What a row's reward error says about a reward that tried to end the process."""
    call = "os._exit" if isinstance(exc, ExitCalled) else "sys.exit"
    return (
        f"the reward called {call}({exc.code!r}), which would end the trainer; a reward "
        f"must return a score (or raise an exception for an error)"
    )
