"""SGLang server processes: launch, wait for ``/health``, log to a file, stop with no orphans.

A :class:`SGLangServer` runs ``python -m sglang.launch_server`` as a subprocess in
its own process group, so stopping it kills the HTTP server, its scheduler and
detokenizer children together. Every live server is also stopped at interpreter
exit (``atexit``), on SIGTERM and on Ctrl-C, and on Linux a server dies with the
thread that started it (``PR_SET_PDEATHSIG``) even if the process is SIGKILLed: start
servers from the main thread or from a thread that lives as long as they should.

On a CPU-only machine the server needs ``SGLANG_USE_CPU_ENGINE=1`` and the
import-only stand-ins for ``sgl_kernel`` and ``torchvision`` (see
``tools/sglang_cpu_standins/README.md``); :func:`server_env` adds both, the
stand-ins only when the real package is not importable.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Environment variable naming the stand-ins folder explicitly (overrides the search).
STANDINS_ENV = "RLKIT_SGLANG_CPU_STANDINS"
_STANDINS_IN_REPO = Path(__file__).resolve().parents[3] / "tools" / "sglang_cpu_standins" / "python"


class ServerStartError(RuntimeError):
    """An SGLang server exited or did not become healthy in time."""


@dataclass(frozen=True)
class ServerConfig:
    """How to launch one SGLang server (``sglang.launch_server`` flags).

    Attributes:
        model_path: Hugging Face model directory to serve.
        tokenizer_path: tokenizer directory (default ``model_path``); kept when a
            restart loads a weights-only snapshot.
        device: ``cuda`` | ``cpu`` | ``npu`` | ... (``--device``).
        dtype: ``auto`` | ``float32`` | ``bfloat16`` | ``float16``. On CPU pass
            ``float32`` for a float32 checkpoint (``auto`` serves it in float16).
        tp_size: tensor-parallel size (GPUs per server).
        base_gpu_id: first GPU of this server (``--base-gpu-id``).
        mem_fraction_static: fraction of device memory for weights + KV cache.
        max_total_tokens: KV-cache size in tokens; on CPU set it, or SGLang
            reserves ~70% of the RAM.
        attention_backend: e.g. ``torch_native`` on CPU, ``None`` for SGLang's choice.
        host: interface to listen on.
        weight_version: label the server reports in ``meta_info.weight_version``.
        random_seed: ``--random-seed``.
        sleep_on_idle: ``--sleep-on-idle``: an idle scheduler waits on its sockets
            instead of busy-polling a CPU core. Needed wherever the server shares CPU
            cores with the trainer (on a 2-core machine two idle servers otherwise
            take both cores from the trainer's forward and backward passes).
        extra_args: further command-line flags, passed as is.
        env: extra environment variables for the server process.
        startup_timeout_s: seconds to wait for ``/health``.
    """

    model_path: str
    tokenizer_path: str | None = None
    device: str = "cuda"
    dtype: str = "auto"
    tp_size: int = 1
    base_gpu_id: int = 0
    mem_fraction_static: float | None = None
    max_total_tokens: int | None = None
    attention_backend: str | None = None
    host: str = "127.0.0.1"
    weight_version: str = "init"
    random_seed: int | None = None
    sleep_on_idle: bool = False
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 600.0


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def launch_command(config: ServerConfig, port: int) -> list[str]:
    """The ``sglang.launch_server`` command line for ``config`` on ``port``."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(config.model_path)]
    cmd += ["--tokenizer-path", str(config.tokenizer_path or config.model_path)]
    cmd += ["--host", config.host, "--port", str(port), "--device", config.device]
    cmd += ["--dtype", config.dtype, "--tp-size", str(config.tp_size)]
    cmd += ["--weight-version", config.weight_version]
    optional = {
        "--base-gpu-id": config.base_gpu_id if config.base_gpu_id else None,
        "--mem-fraction-static": config.mem_fraction_static,
        "--max-total-tokens": config.max_total_tokens,
        "--attention-backend": config.attention_backend,
        "--random-seed": config.random_seed,
    }
    for flag, value in optional.items():
        if value is not None:
            cmd += [flag, str(value)]
    if config.sleep_on_idle:
        cmd.append("--sleep-on-idle")
    return cmd + list(config.extra_args)


def cpu_standins_path() -> Path | None:
    """The folder of import-only stand-ins, if a CPU server needs and can find it.

    Returns ``None`` when both ``sgl_kernel`` and ``torchvision`` import for real
    (then nothing is shadowed). Otherwise ``$RLKIT_SGLANG_CPU_STANDINS`` or the
    repository's ``tools/sglang_cpu_standins/python``.

    Raises:
        ServerStartError: a stand-in is needed but the folder is not found.
    """
    needed = [m for m in ("sgl_kernel", "torchvision") if importlib.util.find_spec(m) is None]
    if not needed:
        return None
    path = Path(os.environ.get(STANDINS_ENV, _STANDINS_IN_REPO))
    if not (path / "sglang_cpu_standin.py").is_file():
        raise ServerStartError(
            f"SGLang on CPU imports {needed}, which are not installed, and the import-only "
            f"stand-ins were not found at {path}. Set {STANDINS_ENV} to the folder "
            f"tools/sglang_cpu_standins/python of an rlkit checkout, or install the packages."
        )
    return path


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


def server_env(config: ServerConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a server process.

    ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is forced off so that ``output_token_logprobs``
    are ``log_softmax(logits / temperature)`` (the trainer's convention), whatever the
    caller's environment says. The launcher's process-group variables (``RANK``,
    ``WORLD_SIZE``, ``MASTER_PORT``, ``TORCHELASTIC_*`` ...) are left out: a server started
    by a rank of ``accelerate launch`` would otherwise try to join the trainer's group
    while setting up its own and hang at "Init parallel begin".
    """
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if k not in _LAUNCHER_VARIABLES and not k.startswith("TORCHELASTIC_")
    }
    env["SGLANG_RETURN_ORIGINAL_LOGPROB"] = "0"
    if config.device == "cpu":
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        standins = cpu_standins_path()
        if standins is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(standins), env.get("PYTHONPATH", "")) if p
            )
    env.update(config.env)
    return env


# Exec'd in front of the server: ask Linux to SIGKILL it when the thread that started it
# exits (PR_SET_PDEATHSIG survives execve), then become the server. No preexec_fn, which is
# unsafe in a process with threads.
_EXEC_WITH_PDEATHSIG = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
    "except Exception:\n"
    "    pass\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


class SGLangServer:
    """One SGLang server subprocess.

    Args:
        config: launch settings.
        log_path: file receiving the server's stdout and stderr (appended, so a
            restart keeps the earlier log).
        port: TCP port; a free one if ``None``.
        command: the command line to run instead of :func:`launch_command`, with
            ``{port}`` replaced by the port (e.g. to wrap it in ``numactl`` or a
            container runtime; the tests run a stand-in process tree this way).
    """

    def __init__(
        self,
        config: ServerConfig,
        log_path: str | Path,
        port: int | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        self.config = config
        self.command = list(command) if command is not None else None
        self.log_path = Path(log_path)
        self.port = port or find_free_port(config.host)
        self.process: subprocess.Popen[bytes] | None = None
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
                    "not starting the SGLang server: it was closed, or the process is terminating"
                )
            config = self.config
            if model_path is not None or weight_version is not None:
                config = _replace(config, model_path=model_path, weight_version=weight_version)
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it open
            self.process = subprocess.Popen(
                [sys.executable, "-c", _EXEC_WITH_PDEATHSIG, *self._command(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=server_env(config),
                start_new_session=True,
            )
            log.close()
            _LIVE.add(self)
            _install_exit_handlers()
        if wait:
            self.wait_healthy()

    def _command(self, config: ServerConfig) -> list[str]:
        if self.command is None:
            return launch_command(config, self.port)
        return [part.replace("{port}", str(self.port)) for part in self.command]

    def wait_healthy(self, timeout_s: float | None = None) -> None:
        """Block until ``GET /health`` answers 200.

        Raises:
            ServerStartError: the process exited, or ``timeout_s`` passed (the
                server is stopped then); the message holds the log's last lines.
        """
        deadline = time.monotonic() + (timeout_s or self.config.startup_timeout_s)
        while time.monotonic() < deadline:
            if not self.alive:
                raise ServerStartError(
                    f"SGLang server on port {self.port} exited with code "
                    f"{self.process.returncode if self.process else None} during startup; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if http_ok(self.url + "/health", timeout_s=2.0):
                return
            time.sleep(0.5)
        self.stop()
        raise ServerStartError(
            f"SGLang server on port {self.port} was not healthy after "
            f"{timeout_s or self.config.startup_timeout_s:.0f} s (raise startup_timeout_s if the "
            f"model is large); log {self.log_path}:\n{self.log_tail()}"
        )

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


def _replace(config: ServerConfig, **changes: str | None) -> ServerConfig:
    from dataclasses import replace

    return replace(config, **{k: v for k, v in changes.items() if v is not None})


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
_LIVE: set[SGLangServer] = set()
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
    configs: Sequence[ServerConfig], log_dir: str | Path, ports: Sequence[int | None] | None = None
) -> list[SGLangServer]:
    """Launch several servers at once and wait until all are healthy.

    Raises:
        ServerStartError: any server failed; all of them are stopped then.
    """
    ports = list(ports) if ports is not None else [None] * len(configs)
    servers = [
        SGLangServer(c, Path(log_dir) / f"sglang_server_{i}.log", p)
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
