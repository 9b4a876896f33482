"""How to launch an SGLang server: ``python -m sglang.launch_server`` and its environment.

:class:`ServerConfig` is the SGLang side of
:class:`rlkit.rollout.servers.process.ServerLaunch`; the process itself (health,
logs, restarts, clean shutdown) is a :class:`~rlkit.rollout.servers.process.ManagedServer`.

On a CPU-only machine the server needs ``SGLANG_USE_CPU_ENGINE=1`` and the
import-only stand-ins for ``sgl_kernel`` and ``torchvision`` (see
``tools/sglang_cpu_standins/README.md``); :func:`server_env` adds both, the
stand-ins only when the real package is not importable.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlkit.rollout.servers.errors import ServerStartError
from rlkit.rollout.servers.process import without_launcher_variables

#: Environment variable naming the stand-ins folder explicitly (overrides the search).
STANDINS_ENV = "RLKIT_SGLANG_CPU_STANDINS"
_STANDINS_IN_REPO = Path(__file__).resolve().parents[3] / "tools" / "sglang_cpu_standins" / "python"


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

    server_name = "SGLang"
    # The process that runs the model; the HTTP front-end and detokenizer are the others.
    compute_processes = ("sglang::scheduler",)

    def command(self, port: int) -> list[str]:
        return launch_command(self, port)

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        return server_env(self, base)

    def failure_hint(self, cause: str) -> str:
        """Appended to a failed start's cause: which engine option sizes the memory."""
        if "memory" not in cause.lower():
            return ""
        return " (the KV cache's size is the engine option max_total_tokens or mem_fraction_static)"

    def with_weights(self, model_path: str | None, weight_version: str | None) -> ServerConfig:
        changes = {"model_path": model_path, "weight_version": weight_version}
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


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


def server_env(config: ServerConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a server process.

    ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is forced off so that ``output_token_logprobs``
    are ``log_softmax(logits / temperature)`` (the trainer's convention), whatever the
    caller's environment says. The launcher's process-group variables (``RANK``,
    ``WORLD_SIZE``, ``MASTER_PORT``, ``TORCHELASTIC_*`` ...) are left out: a server started
    by a rank of ``accelerate launch`` would otherwise try to join the trainer's group
    while setting up its own and hang at "Init parallel begin".
    """
    env = without_launcher_variables(os.environ if base is None else base)
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
