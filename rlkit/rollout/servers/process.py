"""Rollout server processes: launch, wait for ``/health``, log to a file, stop with no orphans.

A :class:`ManagedServer` runs an inference server (SGLang, vLLM) as a subprocess in its
own process group, so stopping it kills the HTTP server and every worker it forked
together. Every live server is also stopped at interpreter exit (``atexit``), on SIGTERM
and on Ctrl-C, and on Linux a server dies with the thread that started it
(``PR_SET_PDEATHSIG``) even if the process is SIGKILLed: start servers from the main
thread or from a thread that lives as long as they should.

What to launch comes from a :class:`ServerLaunch`, which each engine implements for its
server (command line, environment); everything else here is shared.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from rlkit.rollout.servers.cpu_split import SERVER_CPUS_ENV, place_frontend
from rlkit.rollout.servers.errors import ServerStartError
from rlkit.rollout.servers.startup_log import START_MARKER, root_cause, this_start

logger = logging.getLogger(__name__)


class ServerLaunch(Protocol):
    """What an engine's server configuration tells :class:`ManagedServer`."""

    server_name: str  # "SGLang", "vLLM": how messages and log files name the server
    host: str
    startup_timeout_s: float
    # Command-line prefixes of the processes that run the model; the rest of the tree is
    # the front-end, which a CPU split moves to the trainer's cores once healthy.
    compute_processes: tuple[str, ...]

    def command(self, port: int) -> list[str]:
        """The command line that serves on ``port``."""

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The server process's environment, made from ``base`` (this process's)."""

    def with_weights(self, model_path: str | None, weight_version: str | None) -> ServerLaunch:
        """This launch, loading ``model_path`` and reporting ``weight_version`` (each
        ``None``: unchanged), for a restart after weights were synced."""


#: Variables torchrun / accelerate launch set for the trainer's ranks, never for a server.
_LAUNCHER_VARIABLES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)


def without_launcher_variables(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less the launcher's process-group variables (``RANK``, ``WORLD_SIZE``,
    ``MASTER_PORT``, ``TORCHELASTIC_*`` ...): a server started by a rank of ``accelerate
    launch`` would otherwise try to join the trainer's group while setting up its own."""
    return {
        k: v
        for k, v in env.items()
        if k not in _LAUNCHER_VARIABLES and not k.startswith("TORCHELASTIC_")
    }


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# Exec'd in front of the server: ask Linux to SIGKILL it when the thread that started it
# exits (PR_SET_PDEATHSIG survives execve), take the cores a CPU split gives it
# (rlkit.rollout.servers.cpu_split), then become the server. No preexec_fn, which is
# unsafe in a process with threads.
_EXEC_WITH_PDEATHSIG = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
    "except Exception:\n"
    "    pass\n"
    f"cpus = os.environ.get({SERVER_CPUS_ENV!r})\n"
    "if cpus:\n"
    "    os.sched_setaffinity(0, {int(c) for c in cpus.split(',')})\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


class ManagedServer:
    """One server subprocess.

    Args:
        config: what to launch (an engine's server configuration).
        log_path: file receiving the server's stdout and stderr (appended, so a
            restart keeps the earlier log).
        port: TCP port; a free one if ``None``.
        command: the command line to run instead of ``config.command(port)``, with
            ``{port}`` replaced by the port (e.g. to wrap it in ``numactl`` or a
            container runtime; the tests run a stand-in process tree this way).
    """

    def __init__(
        self,
        config: ServerLaunch,
        log_path: str | Path,
        port: int | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        self.config = config
        self.command = list(command) if command is not None else None
        self.log_path = Path(log_path)
        self.port = port or find_free_port(config.host)
        self.process: subprocess.Popen[bytes] | None = None
        self.launched: list[str] = []  # the last command run, for error messages
        self._lock = threading.Lock()
        self._closed = False

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(
        self, *, wait: bool = True, model_path: str | None = None, weight_version: str | None = None
    ) -> None:
        """Launch the process (``model_path``/``weight_version`` override the config).

        Raises:
            ServerStartError: the process exited or ``/health`` did not answer in time.
        """
        with self._lock:
            if self.alive:
                return
            if _SHUTTING_DOWN or self._closed:
                raise ServerStartError(
                    f"not starting the {self.config.server_name} server: it was closed, or the "
                    f"process is terminating"
                )
            config = self.config.with_weights(model_path, weight_version)
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it open
            self.launched = self._command(config)
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            command = shlex.join(self.launched).replace("\n", "\\n")  # the marker is one line
            marker = f"{START_MARKER}{config.server_name} server on port {self.port} at {stamp}"
            log.write(f"{marker}: {command}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [sys.executable, "-c", _EXEC_WITH_PDEATHSIG, *self.launched],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=config.environment(os.environ),
                start_new_session=True,
            )
            log.close()
            _LIVE.add(self)
            _install_exit_handlers()
        if wait:
            self.wait_healthy()

    def _command(self, config: ServerLaunch) -> list[str]:
        if self.command is None:
            return config.command(self.port)
        return [part.replace("{port}", str(self.port)) for part in self.command]

    def wait_healthy(self, timeout_s: float | None = None) -> None:
        """Block until ``GET /health`` answers 200.

        Raises:
            ServerStartError: the process exited, or ``timeout_s`` passed (the server
                is stopped then). The message is the line of the log that says why
                (:func:`~rlkit.rollout.servers.startup_log.root_cause`; the log's last
                lines when none does), the log's path and the command that was run.
        """
        timeout_s = timeout_s or self.config.startup_timeout_s
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive:
                code = self.process.returncode if self.process else None
                raise ServerStartError(
                    self.startup_failure(f"exited with code {code} during startup")
                )
            if http_ok(self.url + "/health", timeout_s=2.0):
                self._place_frontend()
                return
            time.sleep(0.5)
        self.stop()
        raise ServerStartError(
            self.startup_failure(
                f"was not healthy after {timeout_s:.0f} s (raise startup_timeout_s if the "
                f"model is large)"
            )
        )

    def _place_frontend(self) -> None:
        """Under a CPU split, move the front-end processes to the trainer's cores."""
        if self.process is None:
            return
        env = self.config.environment(os.environ)
        names = getattr(self.config, "compute_processes", ())
        moved = place_frontend(self.process.pid, names, env)
        if moved:
            logger.info(
                "%s server: %d front-end process(es) moved to the trainer's cores",
                self.config.server_name,
                moved,
            )

    def startup_failure(self, what: str) -> str:
        """The message of a server that did not start: ``what`` happened, why (the log's
        telling line), and where the log and the command are."""
        head = f"{self.config.server_name} server on port {self.port} {what}"
        text = self.log_text()
        cause = root_cause(text)
        if cause is not None:
            hint = getattr(self.config, "failure_hint", None)
            extra = hint(cause) if callable(hint) else ""
            report = f"{head}: {cause}{extra}\nlog: {self.log_path}"
        else:
            tail = "\n".join(this_start(text).splitlines()[-15:]) or "(empty)"
            report = f"{head}; log {self.log_path} ends with:\n{tail}"
        return f"{report}\ncommand: {shlex.join(self.launched)}"

    def log_text(self) -> str:
        """The whole server log ('' when there is none)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL whatever is left after ``grace_s``. Idempotent."""
        with self._lock:
            proc, self.process = self.process, None
            _LIVE.discard(self)
        if proc is None:
            return
        kill_process_tree(proc, grace_s)

    def close(self) -> None:
        """Stop for good: a later :meth:`start` (e.g. a restart in progress) raises."""
        self._closed = True
        self.stop()

    def restart(self, *, model_path: str | None = None, weight_version: str | None = None) -> None:
        """Stop and start again on the same port (blocks until healthy)."""
        self.stop(grace_s=5.0)
        self.start(wait=True, model_path=model_path, weight_version=weight_version)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def http_ok(url: str, timeout_s: float) -> bool:
    """True if ``GET url`` answers 200 within ``timeout_s``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def kill_process_tree(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """Terminate ``proc``, its process group and any descendant that left the group."""
    descendants = _descendants(proc.pid)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        for pid in descendants:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        if not any(_pid_alive(p) for p in descendants):
            return


def _descendants(pid: int) -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:  # psutil missing or the process is gone
        return []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); psutil tells it apart.
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:
        return True


# -- stop every live server on exit ------------------------------------------
_LIVE: set[ManagedServer] = set()
_HANDLERS_INSTALLED = False


def stop_all_servers() -> None:
    """Stop every server this process started and has not stopped yet."""
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop(grace_s=5.0)


def _at_exit() -> None:
    global _SHUTTING_DOWN
    _SHUTTING_DOWN = True
    stop_all_servers()


def _on_sigterm(signum: int, frame: object) -> None:
    global _SHUTTING_DOWN
    _SHUTTING_DOWN = True  # no restart may start a server from now on
    stop_all_servers()
    previous = _PREVIOUS_SIGTERM
    if callable(previous):
        previous(signum, frame)
        return
    # Die of SIGTERM as if no handler were installed (an exception raised here could be
    # swallowed by whatever code the main thread happens to be running).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


_PREVIOUS_SIGTERM: object = None
_SHUTTING_DOWN = False


def _install_exit_handlers() -> None:
    global _HANDLERS_INSTALLED, _PREVIOUS_SIGTERM
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(_at_exit)
    # Ctrl-C raises KeyboardInterrupt, which unwinds to atexit; SIGTERM would not.
    if threading.current_thread() is threading.main_thread():
        _PREVIOUS_SIGTERM = signal.getsignal(signal.SIGTERM)
        if _PREVIOUS_SIGTERM in (signal.SIG_DFL, None):
            _PREVIOUS_SIGTERM = None
        if _PREVIOUS_SIGTERM is not signal.SIG_IGN:
            signal.signal(signal.SIGTERM, _on_sigterm)


def start_servers(
    configs: Sequence[ServerLaunch],
    log_dir: str | Path,
    ports: Sequence[int | None] | None = None,
) -> list[ManagedServer]:
    """Launch several servers at once and wait until all are healthy.

    Raises:
        ServerStartError: any server failed; all of them are stopped then.
    """
    ports = list(ports) if ports is not None else [None] * len(configs)
    servers = [
        ManagedServer(c, Path(log_dir) / f"{c.server_name.lower()}_server_{i}.log", p)
        for i, (c, p) in enumerate(zip(configs, ports))
    ]
    try:
        for s in servers:
            s.start(wait=False)
        for s in servers:
            s.wait_healthy()
    except BaseException:
        for s in servers:
            s.stop(grace_s=2.0)
        raise
    return servers
