"""How sandboxed code is isolated: bubblewrap where it works, plain processes otherwise.

Two modes, chosen once per process (:func:`isolation_mode`) and logged in one line:

* ``"bubblewrap"``: the interpreter runs under ``bwrap`` (Debian / Ubuntu package
  ``bubblewrap``) in new PID, network, IPC and UTS namespaces, with a read-only view
  of the file system, a fresh ``/proc`` (only the sandbox's own processes), an empty
  private ``/tmp``, ``/root`` and ``/home`` hidden (only the interpreter's own
  directories bound back, read-only), ``/etc/shadow`` masked by an empty file, and the
  run's scratch directory the one writable place that outlives the call. The
  namespace's first process dies with the caller (``--die-with-parent``) and with it
  every process of the call, ``setsid`` children included. As root, the code drops to
  ``nobody`` inside, so ``RLIMIT_NPROC`` bounds its processes.
* ``"process"``: no bubblewrap (not installed, or it cannot create namespaces here).
  The code runs as ``nobody`` when the caller is root and an interpreter ``nobody``
  can run is found; Unix permissions, resource limits and the clean-up of the call's
  session and marked processes are all that contain it. No network isolation.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence

logger = logging.getLogger(__name__)

#: The modes :func:`isolation_mode` reports.
MODES = ("bubblewrap", "process")
#: Directories hidden from the code in bubblewrap mode (secrets, other users' files).
HIDDEN_DIRS = ("/root", "/home", "/tmp")
#: Files masked by an empty file in bubblewrap mode.
MASKED_FILES = ("/etc/shadow", "/etc/gshadow")

_lock = threading.Lock()
_probed: dict[str, str] = {}

GUARANTEES = {
    "bubblewrap": (
        "no network, read-only file system except its scratch directory, own PID "
        "namespace (no view of or signals to the caller), secrets hidden, every "
        "process killed at the end of the call"
    ),
    "process": (
        "resource limits, separate user when root (no signals to the caller, Unix "
        "permissions), clean-up of the call's processes; network and world-writable "
        "paths reachable"
    ),
}


def _namespace_flags() -> list[str]:
    flags = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    flags.append("--unshare-cgroup-try")
    if os.geteuid() != 0:  # without root, namespaces come from a user namespace
        flags.append("--unshare-user")
    return flags


def _probe() -> str:
    """``""`` when bubblewrap starts a sandbox here, else why it does not."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap is not installed"
    true = shutil.which("true") or "/bin/true"
    work = tempfile.mkdtemp(prefix="rlkit-bwrap-probe-")
    # The very command line a sandbox uses, so that no option fails later.
    argv = bubblewrap_argv(true, work, {}, drop_privileges=os.geteuid() == 0)
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap failed to start: {exc}"
    finally:
        os.rmdir(work)
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap failed: {message[-1] if message else f'exit code {done.returncode}'}"
    return ""


def bubblewrap_problem() -> str:
    """Why bubblewrap cannot be used (``""`` when it can); probed once, then cached."""
    with _lock:
        if "problem" not in _probed:
            _probed["problem"] = _probe()
            mode = "process" if _probed["problem"] else "bubblewrap"
            why = f" ({_probed['problem']})" if _probed["problem"] else ""
            # A warning for the fallback: its guarantees are weaker than the default's.
            log = logger.warning if _probed["problem"] else logger.info
            log("sandbox mode: %s%s: %s", mode, why, GUARANTEES[mode])
        return _probed["problem"]


def isolation_mode() -> str:
    """``"bubblewrap"`` when it works on this machine, else ``"process"``."""
    return "process" if bubblewrap_problem() else "bubblewrap"


def describe_isolation() -> str:
    """One line: the mode, why (for the fallback), and what it guarantees."""
    problem = bubblewrap_problem()
    mode = "process" if problem else "bubblewrap"
    why = f" ({problem})" if problem else ""
    return f"{mode}{why}: {GUARANTEES[mode]}"


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _interpreter_dirs(exe: str) -> list[str]:
    """Directories the interpreter needs: its own prefix (and this one's, if it is this)."""
    real = os.path.realpath(exe)
    dirs = {os.path.dirname(os.path.dirname(real)), os.path.dirname(os.path.abspath(exe))}
    if real == os.path.realpath(sys.executable):
        dirs |= {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    return sorted(dirs)


def _bind_back(path: str, hidden: str, flag: str, made: set[str]) -> list[str]:
    """Arguments that recreate ``path``'s parents below ``hidden`` (0755) and bind it."""
    args: list[str] = []
    parts = os.path.relpath(path, hidden).split(os.sep)
    current = hidden
    for part in parts[:-1]:
        current = os.path.join(current, part)
        if current not in made:  # bwrap would create missing parents as 0700
            made.add(current)
            args += ["--perms", "0755", "--dir", current]
    return [*args, flag, path, path]


def bubblewrap_argv(
    exe: str, work: str, env: Mapping[str, str], *, drop_privileges: bool
) -> list[str]:
    """The ``bwrap`` command line that runs ``exe`` with ``work`` as the only writable dir.

    Args:
        exe: the interpreter (its directories are bound back if hidden).
        work: the scratch directory, bound read-write and made the working directory.
        env: the whole environment of the code (the caller's is cleared).
        drop_privileges: keep ``CAP_SETUID`` / ``CAP_SETGID`` so that the code, started
            as root, can switch to its own user (every other capability is dropped).
    """
    argv = [shutil.which("bwrap") or "bwrap", "--ro-bind", "/", "/", "--dev", "/dev"]
    argv += ["--proc", "/proc", *_namespace_flags(), "--die-with-parent"]
    hidden = [d for d in HIDDEN_DIRS if os.path.isdir(d)]
    for directory in hidden:
        argv += ["--perms", "0755", "--tmpfs", directory]
    argv += _binds(exe, work, hidden)
    for path in MASKED_FILES:
        if os.path.exists(path):
            argv += ["--ro-bind", "/dev/null", path]
    if drop_privileges:
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    argv += ["--chdir", work, "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    return [*argv, "--", exe]


def _binds(exe: str, work: str, hidden: Sequence[str]) -> list[str]:
    made: set[str] = set()
    args: list[str] = []
    for path, flag in [*((d, "--ro-bind") for d in _interpreter_dirs(exe)), (work, "--bind")]:
        inside = [h for h in hidden if _under(path, h) and path != h]
        if inside:
            args += _bind_back(path, inside[0], flag, made)
        elif flag == "--bind":
            args += [flag, path, path]
    return args


def exit_status(returncode: int | None, mode: str) -> int | None:
    """The code's exit status as ``Popen.returncode`` would give it (``-N``: signal N).

    Under bubblewrap the code is not our child: ``bwrap`` exits with ``128 + N`` when
    the code is killed by signal N.
    """
    if mode == "bubblewrap" and returncode is not None and 128 < returncode < 128 + 65:
        return -(returncode - 128)
    return returncode
