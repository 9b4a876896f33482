"""``rlkit train`` run under a supervisor, so that a trainer killed by a native crash
still ends with one message.

A reward scored in the trainer's process (``DataConfig.reward_workers = 0``, the default)
that segfaults in C code takes the trainer with it: the process vanishes with status 139
and nothing printed. So the ``rlkit train`` command (and ``python -m rlkit.train``) runs
the trainer as a child process and waits. Every reward call leaves a note of the reward
and row it is scoring (:mod:`rlkit.crash_note`); when the child dies from a signal the
supervisor reads the note and prints what crashed and how to contain it, exit status 2.
A death from a signal with no reward in flight is named too (exit 128 + signal).

The child is the whole run: the supervisor imports nothing heavy, forwards the signals a
user or a scheduler sends (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1/2, SIGABRT; Ctrl-Z
stops both and ``fg`` resumes both) and mirrors the child's exit status. The child is killed if the supervisor dies (Linux's
parent-death signal), so ``kill -9`` of the command leaves no trainer behind. Several
processes started by a launcher (``accelerate launch``, ``torchrun``: ``WORLD_SIZE`` set)
and other systems than Linux run unsupervised.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

SUPERVISED = "RLKIT_SUPERVISED"
_FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGABRT")
_PR_SET_PDEATHSIG = 1


def applies() -> bool:
    """Whether this command should run its work in a supervised child."""
    launched = os.environ.get("WORLD_SIZE", "1") != "1" or "LOCAL_RANK" in os.environ
    return sys.platform == "linux" and not os.environ.get(SUPERVISED) and not launched


def _prepare_child() -> None:  # runs in the child between fork and exec
    # Its own process group: a Ctrl-C reaches it once, forwarded, not twice.
    os.setpgid(0, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def supervise(module: str, argv: list[str], command: str = "rlkit train") -> int:
    """Run ``python -m module argv`` as a supervised child (module docstring); its exit
    status, or 2 after a reward crashed it."""
    from rlkit.crash_note import ENV, describe, read

    with tempfile.TemporaryDirectory(prefix="rlkit-supervisor-") as folder:
        note = Path(folder) / "crash_note.json"
        env = {**os.environ, SUPERVISED: "1", ENV: str(note)}
        child = subprocess.Popen(
            [sys.executable, "-m", module, *argv], env=env, preexec_fn=_prepare_child
        )
        forwarded = _forward_signals(child)
        while True:
            try:
                status = child.wait()
                break
            except KeyboardInterrupt:  # SIGINT's default handler, when not forwarded
                continue
        if status >= 0:
            return status
        number = -status
        if number in forwarded:  # the child ended on the signal it was sent: end the same way
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)
        name = signal.Signals(number).name
        crashed = read(note)
        if crashed is not None:
            print(
                f"{command}: the trainer's process died from {name} inside "
                f"{describe(crashed)}. Rewards run in the trainer's process with "
                f"DataConfig.reward_workers = 0; set DataConfig.reward_workers = 1 (or more) "
                f"to run them in worker processes, where such a crash costs only that row",
                file=sys.stderr,
                flush=True,
            )
            return 2
        print(
            f"{command}: the trainer's process died from {name} (no reward call was in "
            f"flight); the last checkpoint is intact, and the run resumes from it",
            file=sys.stderr,
            flush=True,
        )
        return 128 + number


def _forward_signals(child: subprocess.Popen) -> set[int]:
    """Pass the signals sent to this process on to ``child``; the ones forwarded."""
    forwarded = set()

    def forward(number: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(number)

    for name in _FORWARDED:
        number = getattr(signal, name)
        if signal.getsignal(number) == signal.SIG_IGN:  # nohup: stays ignored, as in the child
            continue
        signal.signal(number, forward)
        forwarded.add(number)

    def suspend(number: int, _frame: object) -> None:
        # Ctrl-Z: the child (in its own process group) stops too, then this process does.
        if child.poll() is None:
            child.send_signal(signal.SIGSTOP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)

    def resume(number: int, _frame: object) -> None:  # fg / bg: both go on
        signal.signal(signal.SIGTSTP, suspend)
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)

    if signal.getsignal(signal.SIGTSTP) != signal.SIG_IGN:
        signal.signal(signal.SIGTSTP, suspend)
        signal.signal(signal.SIGCONT, resume)
    return forwarded
