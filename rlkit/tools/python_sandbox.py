"""The ``python`` tool: run model-written code in a separate, limited process.

Each call starts a fresh interpreter (the caller's own ``sys.executable``) with
``-I -S -B -u -X utf8``: isolated mode (no ``PYTHON*`` variables, no user site, no
current directory on ``sys.path``), no ``site`` (so only the standard library imports,
not the caller's site-packages), no ``.pyc`` writes, unbuffered output. A short
bootstrap sets the resource limits, then runs the code read from the head of stdin
(exactly its length in bytes, so that the rest of stdin, ``run(stdin=...)``, is the
code's own input); if the code ends with an expression its ``repr`` is printed, as in
a notebook cell. ``exit()`` and ``quit()`` work although ``site`` is not imported.

What contains it (see :class:`PythonSandbox` for the numbers):

* ``RLIMIT_CPU`` (CPU seconds, rounded up from the time limit), ``RLIMIT_AS``
  (address space: an allocation past it raises ``MemoryError`` inside the sandbox),
  ``RLIMIT_FSIZE`` (largest file written, the captured output included),
  ``RLIMIT_NOFILE`` and ``RLIMIT_CORE = 0``.
* A wall-clock limit: the process runs in a session and process group of its own
  (``start_new_session=True``) and the whole group is killed with ``SIGKILL`` at the
  deadline. When the call ends, for any reason, every process left in that session
  or group, or carrying the call's ``RLKIT_SANDBOX_ID`` environment marker (which
  catches a child that left the session with ``setsid``), is killed too. Should the
  caller itself die first, an ``alarm`` set by the bootstrap ends the code's own
  process two seconds after the time limit, rounded up (its children are not covered).
* Processes: ``RLIMIT_NPROC`` bounds the processes and threads of the sandbox's user
  when that user is not root (the kernel does not enforce it for root). When the
  caller is root and the interpreter is reachable by others, the sandbox runs as
  a user id of its own for each call (:data:`CALL_UIDS`; ``nobody`` inside bubblewrap) so
  that the limit holds and the code cannot signal or read
  root's processes and files; otherwise (root, interpreter under ``/root``) a
  watchdog counts the session's processes (at most 50 ms apart) and kills the
  group past ``max_processes``.
* A fresh scratch directory (``tempfile``) is the working directory, ``HOME`` and
  ``TMPDIR``; it is removed afterwards. The environment holds none of the caller's
  variables: only ``PATH``, ``LANG``, ``HOME``, ``TMPDIR`` and the marker.
* stdout and stderr go, interleaved, to one file (or to two, ``separate_stderr``);
  the first ``max_output_bytes`` of each are read back. An uncaught ``MemoryError``
  (an allocation past ``RLIMIT_AS``) is reported as its own reason, ``"memory"``.

Isolation (:mod:`rlkit.tools.isolation`, :attr:`PythonSandbox.isolation`): where
bubblewrap works, the interpreter runs inside it, which makes the sandbox a boundary
(no network, read-only file system but for the scratch directory, its own PID
namespace, secrets hidden, every process gone with the call). Without it the above is
a guard against accidents and runaway code: no network or file-system isolation
beyond Unix permissions, and a process that leaves the session *and* replaces its
environment escapes the clean-up.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rlkit.registry import TOOLS
from rlkit.tools.base import Tool, ToolError, ToolTimeout
from rlkit.tools.isolation import bubblewrap_argv, bubblewrap_problem, exit_status

logger = logging.getLogger(__name__)

#: The uid / gid the sandbox runs as inside bubblewrap when the caller is root (``nobody``).
NOBODY = 65534
#: Without bubblewrap, as root: each call runs as a user id of its own, taken from this
#: range (``first``, ``count``), and nobody else's. A user may signal every process of its
#: own uid: code that runs ``os.kill(-1, 9)`` as ``nobody`` would kill every other call
#: running as ``nobody`` at the same time. The ids have no passwd entry and own nothing
#: but the call's scratch directory.
CALL_UIDS = (1_900_000_000, 1_000_000)
_call_numbers = itertools.count()
_call_numbers_lock = threading.Lock()
#: Name of the environment variable that marks a call's processes.
MARKER_VARIABLE = "RLKIT_SANDBOX_ID"
#: Exit code of the bootstrap when the code ended with an uncaught ``MemoryError``.
MEMORY_EXIT_CODE = 86
_MAX_POLL_S = 0.05

# Kept to modules that start fast (no json, re or ast on the plain path): it runs before
# every call. argv: limits "NAME=soft:hard,...", then "code_bytes alarm_s echo uid gid"
# (uid -1: keep the user it started as).
_BOOTSTRAP = r"""
import sys
def _limit():
    import resource
    for item in sys.argv[1].split(","):
        name, _, values = item.partition("=")
        which = getattr(resource, name, None)
        if which is not None:
            try:
                resource.setrlimit(which, tuple(int(v) for v in values.split(":")))
            except (ValueError, OSError):
                pass
_limit()
del _limit
def _drop():
    import os
    uid, gid = (int(v) for v in sys.argv[2].split()[3:5])
    if uid >= 0:  # inside bubblewrap, started as root: become the sandbox user
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
_drop()
del _drop
def _run():
    import builtins, os
    code_bytes, alarm_s, echo = (int(v) for v in sys.argv[2].split()[:3])
    try:  # ends this process should the caller die before it can kill it
        import _signal
        _signal.alarm(alarm_s)
    except (ImportError, AttributeError):
        pass
    # Exactly the code's bytes, unbuffered: the rest of stdin is the code's own input.
    chunks, left = [], code_bytes
    while left > 0:
        chunk = os.read(0, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    source = b"".join(chunks).decode("utf-8", "replace")
    if not hasattr(builtins, "exit"):  # site (not imported) defines them
        builtins.exit = builtins.quit = sys.exit
    sys.argv = ["<code>"]
    def remember_source():
        import linecache
        lines = source.splitlines(True)
        linecache.cache["<code>"] = (len(source), None, lines, "<code>")
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        if echo:
            import ast
            remember_source()
            tree = ast.parse(source, "<code>")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, "<code>", "exec"), namespace)
            if last is not None:
                value = eval(compile(last, "<code>", "eval"), namespace)
                if value is not None:
                    print(repr(value))
        else:
            exec(compile(source, "<code>", "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "<code>":
            tb = tb.tb_next
        try:
            import traceback
            remember_source()
            traceback.print_exception(type(exc), exc, tb)
        except BaseException:
            pass
        sys.exit(MEMORY_EXIT_CODE if isinstance(exc, MemoryError) else 1)
_run()
""".replace("MEMORY_EXIT_CODE", str(MEMORY_EXIT_CODE))


# -- /proc ----------------------------------------------------------------------
def _proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, process group, session) of a process; None if it is gone."""
    # os.open / os.read: a scan reads every process's stat, file objects cost a third more.
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3])
    except (IndexError, ValueError):
        return None


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def is_alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process."""
    info = _proc_stat(pid)
    return info is not None and info[0] not in ("Z", "X", "x")


def session_members(sid: int, *, zombies: bool = True) -> list[int]:
    """Processes in session or process group ``sid``."""
    out = []
    for pid in _pids():
        info = _proc_stat(pid)
        if info is None or (not zombies and info[0] in ("Z", "X", "x")):
            continue
        if sid in (info[2], info[3]):
            out.append(pid)
    return out


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def _leftovers(sid: int, marker: bytes) -> list[int]:
    me = os.getpid()
    out = []
    for pid in _pids():
        info = _proc_stat(pid)
        if pid == me or info is None or info[0] in ("Z", "X", "x"):
            continue
        if sid in (info[2], info[3]) or _has_marker(pid, marker):
            out.append(pid)
    return out


def _kill_all(sid: int, marker: bytes) -> None:
    """Kill the process group, the session and every process with the marker."""
    for _ in range(100):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sid, signal.SIGKILL)
        left = _leftovers(sid, marker)
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)
    logger.warning("python sandbox: processes of session %d survived SIGKILL", sid)


def _call_uid() -> int:
    """A user id for one call (:data:`CALL_UIDS`): this process's calls take ids in turn, and
    processes start at ids apart by their pid, so calls running at once, in this process
    or another trainer's, do not share one."""
    with _call_numbers_lock:
        number = next(_call_numbers)
    first, count = CALL_UIDS
    return first + (os.getpid() * 1009 + number) % count


def _tasks_of(uid: int) -> int:
    """Processes and threads whose real uid is ``uid`` (what RLIMIT_NPROC counts)."""
    total = 0
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
        except OSError:
            continue
        real_uid = threads = None
        for line in status.splitlines():
            if line.startswith("Uid:"):
                real_uid = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
        if real_uid == uid:
            total += threads or 1
    return total


# -- who runs it ------------------------------------------------------------------
def _reachable_by_others(*paths: str) -> bool:
    """Whether a user other than the owner can reach and use ``paths`` (exec / read)."""
    for path in paths:
        for candidate in {os.path.abspath(path), os.path.realpath(path)}:
            p = Path(candidate)
            try:
                if not all(os.stat(d).st_mode & stat.S_IXOTH for d in p.parents):
                    return False
                mode = os.stat(p).st_mode
            except OSError:
                return False
            need = stat.S_IXOTH if p.is_file() else stat.S_IXOTH | stat.S_IROTH
            if mode & need != need:
                return False
    return True


_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(key: str, message: str, *args: object) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message, *args)


@dataclass(frozen=True)
class SandboxResult:
    """What one run of code produced.

    Attributes:
        output: stdout and stderr, interleaved, decoded (cut at ``max_output_bytes``);
            stdout only when the sandbox has ``separate_stderr``.
        status: ``"ok"`` (exit code 0), ``"error"`` (non-zero exit, killed by a signal
            or past ``max_processes``) or ``"timeout"`` (wall-clock or CPU limit).
        exit_code: the process's exit code; negative: killed by that signal.
        reason: ``""``, ``"exit"``, ``"timeout"``, ``"cpu"``, ``"processes"``,
            ``"memory"`` (an uncaught ``MemoryError``: an allocation past
            ``memory_bytes``) or ``"signal"``.
        duration_s: wall-clock seconds from start to the end of the clean-up.
        uid: the user id the code ran as.
        stderr: stderr, decoded and cut like ``output``, when the sandbox has
            ``separate_stderr``; else ``""`` (it is in ``output``).
    """

    output: str
    status: str
    exit_code: int | None
    reason: str
    duration_s: float
    uid: int
    stderr: str = ""
    mode: str = "process"


#: Values of :attr:`PythonSandbox.isolation`.
ISOLATION_CHOICES = ("auto", "bubblewrap", "process")
#: Environment variable that decides for sandboxes left at ``isolation="auto"``.
ISOLATION_VARIABLE = "RLKIT_SANDBOX_ISOLATION"


@dataclass(frozen=True)
class PythonSandbox:
    """Limits of the ``python`` tool's process.

    Attributes:
        timeout_s: wall-clock limit in seconds when the caller gives none (the tool
            runner passes its own ``timeout_s``); the CPU-time limit is its ceiling.
        memory_bytes: ``RLIMIT_AS``, address space of each process (1 GiB); ``None``: none.
        max_processes: processes and threads the code may start besides its own
            process (``RLIMIT_NPROC`` or, as root, the watchdog); ``None``: no limit.
        max_file_bytes: ``RLIMIT_FSIZE``, largest file written (16 MiB), output included.
        max_open_files: ``RLIMIT_NOFILE``.
        max_output_bytes: output bytes read back (1 MiB); the rest is counted, not read.
        user: ``"auto"`` (as root: ``nobody`` under bubblewrap, a user id of its own per
            call without it, when the interpreter is
            reachable by others, else the caller's user), ``None`` (always the
            caller's), a user name or a uid (the caller must be root).
        executable: the interpreter; default ``sys.executable``.
        site_packages: drop ``-S``, so that the caller's site-packages import too
            (numpy, sympy, ...; the sandbox user must be able to read them).
        separate_stderr: capture stderr apart from stdout (``SandboxResult.stderr``), for
            callers that compare what a program prints with an expected output.
        echo_last_expression: print the ``repr`` of a last bare expression, as in a
            notebook. ``False`` runs the code as a script would (``sys.stdout.write(s)``
            as the last line must not print its return value) and starts faster (no
            ``ast`` or ``linecache`` import; tracebacks the code prints itself then
            show no source lines, the one printed for an uncaught exception does).
        isolation: ``"auto"`` (the ``RLKIT_SANDBOX_ISOLATION`` environment variable
            when set, else bubblewrap where it works, else plain processes),
            ``"bubblewrap"`` (refuse to run without it) or ``"process"`` (never use
            it); see :mod:`rlkit.tools.isolation` for what each mode guarantees.
    """

    timeout_s: float = 10.0
    memory_bytes: int | None = 1 << 30
    max_processes: int | None = 16
    max_file_bytes: int | None = 16 << 20
    max_open_files: int | None = 256
    max_output_bytes: int = 1 << 20
    user: int | str | None = "auto"
    executable: str | None = None
    site_packages: bool = False
    separate_stderr: bool = False
    echo_last_expression: bool = True
    isolation: str = "auto"

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATION_CHOICES:
            raise ValueError(
                f"isolation must be one of {ISOLATION_CHOICES}, got {self.isolation!r}"
            )

    def mode(self) -> str:
        """The isolation this sandbox runs code under: ``"bubblewrap"`` or ``"process"``.

        Raises:
            ToolError: ``isolation="bubblewrap"`` and bubblewrap does not work here.
        """
        wanted = self.isolation
        if wanted == "auto":  # the operator's choice for every sandbox of the process
            wanted = os.environ.get(ISOLATION_VARIABLE, "auto").strip().lower() or "auto"
            if wanted not in ISOLATION_CHOICES:
                raise ToolError(
                    f"Error: {ISOLATION_VARIABLE}={wanted!r}; expected one of {ISOLATION_CHOICES}"
                )
        if wanted == "process":
            return "process"
        problem = bubblewrap_problem()
        if problem and wanted == "bubblewrap":
            raise ToolError(f"Error: the Python sandbox needs bubblewrap: {problem}")
        return "process" if problem else "bubblewrap"

    def _interpreter(self, mode: str) -> str:
        """The interpreter to run: as root without bubblewrap, one other users can reach.

        A same-version system interpreter replaces an unreachable one (a pyenv or uv
        install under ``/root``) when only the standard library is needed, so that the
        code still runs as a user of its own rather than as root.
        """
        exe = self.executable or sys.executable
        if mode == "bubblewrap" or self.executable or self.site_packages:
            return exe
        if self.user != "auto" or os.geteuid() != 0 or _reachable_by_others(exe):
            return exe
        return _system_twin(exe) or exe

    def _identity(self, exe: str, mode: str) -> tuple[int, int] | None:
        """(uid, gid) to switch to, or None to run as the caller."""
        if self.user is None:
            return None
        if self.user == "auto":
            if os.geteuid() != 0:
                return None
            if mode == "bubblewrap":  # the interpreter's directories are bound back
                return NOBODY, NOBODY
            if exe in _unreachable:
                return None
            same = os.path.realpath(exe) == os.path.realpath(sys.executable)
            needed = [exe, sysconfig.get_path("stdlib")] if same else [exe]
            if _reachable_by_others(*needed):
                uid = _call_uid()
                return uid, uid
            _unreachable.add(exe)
            _warn_once(
                exe,
                "python tool: running sandboxed code as root, because %s is not reachable "
                "by other users; processes are bounded by a watchdog, not RLIMIT_NPROC",
                exe,
            )
            return None
        import pwd

        if isinstance(self.user, str):
            entry = pwd.getpwnam(self.user)
            return entry.pw_uid, entry.pw_gid
        try:
            return int(self.user), pwd.getpwuid(int(self.user)).pw_gid
        except KeyError:
            return int(self.user), int(self.user)

    def _limits(self, timeout_s: float, uid: int) -> dict[str, tuple[int, int]]:
        cpu = max(1, math.ceil(timeout_s))
        limits = {"RLIMIT_CPU": (cpu, cpu + 1), "RLIMIT_CORE": (0, 0)}
        for name, value in (
            ("RLIMIT_AS", self.memory_bytes),
            ("RLIMIT_FSIZE", self.max_file_bytes),
            ("RLIMIT_NOFILE", self.max_open_files),
        ):
            if value is not None:
                limits[name] = (int(value), int(value))
        if self.max_processes is not None and uid != 0:
            nproc = _tasks_of(uid) + 1 + int(self.max_processes)
            limits["RLIMIT_NPROC"] = (nproc, nproc)
        return limits

    def run(
        self, code: str, *, timeout_s: float | None = None, stdin: str | bytes | None = None
    ) -> SandboxResult:
        """Run ``code`` under the limits; never raises for anything the code does.

        Args:
            code: Python source.
            timeout_s: wall-clock limit; default :attr:`timeout_s`.
            stdin: what the code reads from its standard input (``input()``,
                ``sys.stdin``, ``open(0)``); ``None``: nothing (end of file at once).

        Raises:
            ToolError: the interpreter could not be started at all.
        """
        limit = float(self.timeout_s if timeout_s is None else timeout_s)
        if not limit > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        mode = self.mode()
        exe = self._interpreter(mode)
        identity = self._identity(exe, mode)
        start = time.monotonic()
        top = tempfile.mkdtemp(prefix="rlkit-python-")
        try:
            work = os.path.join(top, "work")
            os.mkdir(work, 0o700)
            paths = _Paths(top, work)
            source = str(code).encode("utf-8", "replace")
            data = stdin.encode("utf-8", "replace") if isinstance(stdin, str) else stdin or b""
            with open(paths.code, "wb") as f:
                f.write(source + data)
            # The alarm: two seconds past the time limit, rounded up (module docstring).
            settings = (len(source), max(1, math.ceil(limit)) + 2, int(self.echo_last_expression))
            try:
                proc, uid, token = self._start(exe, identity, paths, limit, settings, mode)
            except OSError as exc:
                if self.user != "auto" or identity is None or mode == "bubblewrap":
                    raise ToolError(f"Error: the Python sandbox could not start: {exc}") from exc
                _unreachable.add(exe)  # the reachability check was wrong: run as the caller
                _warn_once(exe, "python tool: cannot start %s as a user of its own (%s)", exe, exc)
                proc, uid, token = self._start(exe, None, paths, limit, settings, mode)
            marker = f"{MARKER_VARIABLE}={token}".encode()
            try:
                watch = self.max_processes is not None and uid == 0
                reason = self._watch(proc, start + limit, watch)
            finally:
                _kill_all(proc.pid, marker)  # before reaping: the pid (= session id) stays ours
                proc.wait()
            output = self._read_output(paths.output)
            errors = self._read_output(paths.errors) if self.separate_stderr else ""
        finally:
            _remove_tree(top)
        duration = time.monotonic() - start
        code = exit_status(proc.returncode, mode)
        return self._result(output, code, reason, duration, uid, errors, mode)

    # -- internals ------------------------------------------------------------
    def _start(
        self,
        exe: str,
        identity: tuple[int, int] | None,
        paths: _Paths,
        limit: float,
        settings: tuple[int, int, int],
        mode: str,
    ) -> tuple[subprocess.Popen, int, str]:
        uid = os.geteuid() if identity is None else identity[0]
        kwargs: dict = {}
        drop = (-1, -1)
        if identity is not None:
            os.chown(paths.work, *identity)
            os.chmod(paths.top, 0o711)
            if mode == "bubblewrap":  # bwrap starts as root; the code drops inside
                drop = identity
            else:
                kwargs = {"user": identity[0], "group": identity[1], "extra_groups": []}
        token = secrets.token_hex(16)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": paths.work,
            "TMPDIR": paths.work,
            MARKER_VARIABLE: token,
        }
        flags = ["-I", "-B", "-u", "-X", "utf8"] + ([] if self.site_packages else ["-S"])
        limits = ",".join(f"{k}={s}:{h}" for k, (s, h) in self._limits(limit, uid).items())
        numbers = " ".join(map(str, (*settings, *drop)))
        argv = [exe, *flags, "-c", _BOOTSTRAP, limits, numbers]
        if mode == "bubblewrap":
            argv = [*bubblewrap_argv(exe, paths.work, env, drop_privileges=drop[0] >= 0), *argv[1:]]
        with contextlib.ExitStack() as files:
            stdin = files.enter_context(open(paths.code, "rb"))
            out = files.enter_context(open(paths.output, "wb"))
            err = files.enter_context(open(paths.errors, "wb")) if self.separate_stderr else None
            proc = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=out,
                stderr=err or subprocess.STDOUT,
                cwd=paths.work,
                env=env,
                start_new_session=True,
                close_fds=True,
                **kwargs,
            )
        return proc, uid, token

    def _watch(self, proc: subprocess.Popen, deadline: float, count_processes: bool) -> str:
        """Wait for the process to exit; the reason it was stopped, if any.

        Where ``os.waitid`` exists the exit is seen without reaping the process, so
        that its pid, the session id, cannot be reused before the clean-up. Where
        ``os.pidfd_open`` exists (Linux 5.3+) the wait wakes at the exit itself, not
        at the next poll, which matters for the many short runs of a code reward.
        """
        waiter = _ExitWaiter(proc.pid)
        try:
            # A count (a scan of /proc) within the first 10 ms finds nothing: the
            # interpreter is still starting.
            pause, pid = (0.01 if count_processes else 0.001), proc.pid
            while True:
                if _has_exited(proc):
                    return ""
                now = time.monotonic()
                if now >= deadline:
                    return "timeout"
                if count_processes and len(session_members(pid)) > 1 + self.max_processes:
                    return "processes"
                if waiter.can_wait and not count_processes:
                    waiter.wait(deadline - now)
                else:
                    waiter.wait(min(pause, deadline - now))
                pause = min(pause * 2, _MAX_POLL_S)
        finally:
            waiter.close()

    def _read_output(self, path: str) -> str:
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                data = f.read(self.max_output_bytes)
        except OSError:
            return ""
        text = data.decode("utf-8", "replace")
        if size > len(data):
            text += f"\n...[output cut at {len(data)} of {size} bytes]"
        return text

    def _result(
        self,
        output: str,
        code: int | None,
        reason: str,
        duration: float,
        uid: int,
        stderr: str = "",
        mode: str = "process",
    ) -> SandboxResult:
        if reason == "timeout":
            status = "timeout"
        elif reason == "processes":
            status = "error"
        elif code == 0:
            status, reason = "ok", ""
        elif code is not None and code == -signal.SIGXCPU:
            status, reason = "timeout", "cpu"
        elif code is not None and code == -signal.SIGALRM:  # the bootstrap's backstop
            status, reason = "timeout", "timeout"
        elif code == MEMORY_EXIT_CODE:
            status, reason = "error", "memory"
        elif code is not None and code < 0:
            status, reason = "error", "signal"
        else:
            status, reason = "error", "exit"
        return SandboxResult(output, status, code, reason, duration, uid, stderr, mode)


@dataclass(frozen=True)
class _Paths:
    """The files of one run: ``top`` (0o711 for another user), ``work`` (its cwd)."""

    top: str
    work: str

    @property
    def code(self) -> str:
        return os.path.join(self.top, "code.py")

    @property
    def output(self) -> str:
        return os.path.join(self.top, "output")

    @property
    def errors(self) -> str:
        return os.path.join(self.top, "errors")


def _has_exited(proc: subprocess.Popen) -> bool:
    """Whether ``proc`` has exited, without reaping it where ``os.waitid`` exists."""
    if not hasattr(os, "waitid"):
        return proc.poll() is not None
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class _ExitWaiter:
    """Sleeps until a child process exits or a timeout passes (a pidfd where there is one)."""

    def __init__(self, pid: int) -> None:
        self._fd: int | None = None
        self._poll = None
        if hasattr(os, "pidfd_open") and hasattr(select, "poll"):
            with contextlib.suppress(OSError):
                self._fd = os.pidfd_open(pid)
                self._poll = select.poll()
                self._poll.register(self._fd, select.POLLIN)

    @property
    def can_wait(self) -> bool:
        """Whether :meth:`wait` wakes at the exit (else it sleeps the whole timeout)."""
        return self._poll is not None

    def wait(self, timeout_s: float) -> None:
        if self._poll is None:
            time.sleep(max(timeout_s, 0.0))
        else:
            self._poll.poll(max(timeout_s, 0.0) * 1000.0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = self._poll = None


_unreachable: set[str] = set()


def _system_twin(exe: str) -> str | None:
    """A system interpreter of this one's version that other users can run, if any."""
    if os.path.realpath(exe) != os.path.realpath(sys.executable):
        return None
    name = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for folder in ("/usr/bin", "/usr/local/bin"):
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and _reachable_by_others(candidate):
            _warn_once(
                exe, "python tool: %s is not reachable by other users; using %s", exe, candidate
            )
            return candidate
    return None


def _remove_tree(path: str) -> None:
    def retry(function, failed, _exc_info) -> None:  # code may chmod its own files away
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            os.chmod(failed, 0o700)
            function(failed)

    shutil.rmtree(path, onerror=retry)
    if os.path.exists(path):
        shutil.rmtree(path, ignore_errors=True)


def result_text(result: SandboxResult, *, timeout_s: float, max_processes: int | None) -> str:
    """The tool's text for a run; raises :class:`ToolError` / :class:`ToolTimeout` on failure."""
    output = "\n".join(part for part in (result.output.rstrip(), result.stderr.rstrip()) if part)
    note = ""
    if result.reason == "timeout":
        note = f"[Timed out: the code ran longer than {timeout_s:g} s and was stopped]"
    elif result.reason == "cpu":
        note = f"[Timed out: CPU time limit of {math.ceil(timeout_s)} s exceeded]"
    elif result.reason == "processes":
        note = f"[Killed: the code started more than {max_processes} processes]"
    elif result.reason == "signal":
        name = signal.Signals(-result.exit_code).name if result.exit_code else "?"
        note = f"[Killed by signal {name} (out of memory or CPU time?)]"
    elif result.reason == "memory" and not output:
        note = "Error: MemoryError (the code went past its memory limit)"
    elif result.reason == "exit" and not output:
        note = f"Error: the code exited with code {result.exit_code}"
    text = "\n".join(part for part in (output, note) if part)
    if result.status == "timeout":
        raise ToolTimeout(text)
    if result.status == "error":
        raise ToolError(text)
    return text or "(no output)"


DEFAULT_SANDBOX = PythonSandbox()


@TOOLS.register("python")
def python(code: str, *, timeout_s: float | None = None) -> str:
    """Run Python code in a fresh interpreter and return what it prints.

    Only the standard library is available. Print the values you need; the value of a
    last bare expression is printed too. Nothing is kept between calls, and time,
    memory and processes are limited.

    Args:
        code: The Python source code to run.
    """
    return _run_tool(DEFAULT_SANDBOX, code, timeout_s)


def _run_tool(box: PythonSandbox, code: str, timeout_s: float | None) -> str:
    limit = box.timeout_s if timeout_s is None else timeout_s
    result = box.run(code, timeout_s=limit)
    return result_text(result, timeout_s=limit, max_processes=box.max_processes)


def make_python_tool(sandbox: PythonSandbox | None = None, *, name: str = "python") -> Tool:
    """A ``python`` tool with ``sandbox``'s limits (default: :class:`PythonSandbox`'s).

    Example: ``make_python_tool(PythonSandbox(memory_bytes=4 << 30, site_packages=True))``.
    """
    box = sandbox or PythonSandbox()

    def tool(code: str, *, timeout_s: float | None = None) -> str:
        return _run_tool(box, code, timeout_s)

    tool.__doc__ = python.__doc__
    if box.site_packages:
        tool.__doc__ = tool.__doc__.replace(
            "Only the standard library is available.", "Installed packages can be imported."
        )
    return Tool.from_function(tool, name=name)
