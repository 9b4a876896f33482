"""``ROLLOUT_ENGINES["vllm"]``: the factory the trainer calls, kept free of heavy imports.

Importing this module (which ``import rlkit.rollout.vllm`` does) registers the name
without importing aiohttp or vLLM (vLLM usually lives in an environment of its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.servers.factory_options import forwarded_options, stop_token_ids
from rlkit.rollout.servers.options import ServerOptions, split_server_options
from rlkit.rollout.servers.run import ServerRun, default_device, log_dir_option

GIB = 1 << 30


@ROLLOUT_ENGINES.register(
    "vllm",
    summary="vLLM servers (started from vLLM's own environment, attached by URL, or behind a router)",
    holds_own_weights=True,  # samples while the trainer updates (rollout_mode one_step_off)
    takes_run=True,  # the trainer passes run=ServerRun (rlkit.rollout.servers.run)
)
def make_vllm_engine(
    *,
    model_path: str | None = None,
    tokenizer: Any = None,
    weights: Any = None,
    seed: int | None = None,
    num_servers: int = 1,
    urls: Sequence[str] = (),
    router_url: str | None = None,
    python: str | None = None,
    device: str | None = None,
    dtype: str = "auto",
    tp_size: int = 1,
    gpu_memory_utilization: float | None = None,
    max_model_len: int | None = None,
    enable_chunked_prefill: bool | None = None,
    kv_cache_gib: float | None = None,
    max_logprobs: int | None = None,
    server_args: Sequence[str] = (),
    server_env: dict[str, str] | None = None,
    startup_timeout_s: float = 900.0,
    run: ServerRun | None = None,
    **engine_options: Any,
) -> Any:
    """Build a :class:`~rlkit.rollout.vllm.engine.VLLMEngine`.

    Called by the trainer as ``factory(model_path=..., tokenizer=..., weights=...,
    seed=..., **engine_options)``; usable directly as
    ``ROLLOUT_ENGINES.get("vllm")(model_path=DIR, device="cpu", ...)``.

    Args:
        model_path: model directory; servers are started from it when ``num_servers > 0``.
        tokenizer: its EOS id always ends a response, as in the HF engine.
        weights: unused at construction (servers load ``model_path``).
        seed: ``--seed`` of started servers; each request also carries a seed drawn
            from it, so a run's samples repeat where the server honours seeds.
        num_servers: servers to start (0 with ``urls`` / ``router_url``: attach only).
        urls: servers started by someone else (with ``VLLM_SERVER_DEV_MODE=1``); with
            ``router_url``, the workers behind it.
        router_url: a router address that all generation goes through.
        python: the interpreter of vLLM's environment (default: ``$RLKIT_VLLM_PYTHON``,
            this one if it has vLLM, else the checkout's ``.venv-vllm``).
        device: ``cpu`` or ``cuda``; ``None``: ``cpu`` where the trainer's platform is the
            CPU, else ``cuda``.
        dtype, tp_size, gpu_memory_utilization, max_model_len, enable_chunked_prefill:
            server settings (see :class:`~rlkit.rollout.vllm.server.VLLMServerConfig`).
            With ``device="cpu"``, ``dtype="auto"`` becomes ``float32``. Server ``i`` of
            ``num_servers`` on GPUs gets GPUs ``i * tp_size ...`` (``CUDA_VISIBLE_DEVICES``).
        kv_cache_gib: the KV cache in GiB (``--kv-cache-memory-bytes``). On CPU, when
            neither it, ``gpu_memory_utilization``, a ``--kv-cache-memory-bytes`` server
            argument nor ``VLLM_CPU_KVCACHE_SPACE`` is given, it is sized for the run's
            concurrent sequences (:func:`cpu_kv_defaults`) instead of vLLM's 92% of the
            machine's memory.
        max_logprobs: ``--max-logprobs`` of started servers, the largest
            ``SamplingParams.top_logprobs`` they answer (default
            :data:`~rlkit.rollout.vllm.server.MAX_LOGPROBS`, 64).
        server_args: further server flags, as strings.
        server_env: extra environment variables for started servers.
        startup_timeout_s: seconds a server may take to become healthy.
        run: what the trainer tells about its run
            (:class:`~rlkit.rollout.servers.run.ServerRun`): logs and snapshots go to
            ``output_dir/servers`` unless ``log_dir`` is given, and its lengths and batch
            size a CPU server's KV cache.
        **engine_options: :class:`~rlkit.rollout.servers.options.ServerOptions` fields
            (``max_concurrency``, ``request_timeout_s``, ``max_retries``,
            ``retry_backoff_s``, ``restart_dead_servers``, ``max_restarts``, ``sync_dir``,
            ``keep_snapshots``, ``extra_stop_token_ids`` (alias ``extra_eos_token_ids``),
            ``vocab_size``, ``verify_sync``, ``verify_tolerance``, ``log_dir``).
    """
    from rlkit.rollout.vllm.engine import VLLMEngine
    from rlkit.rollout.vllm.server import (
        MAX_LOGPROBS,
        VLLMServerConfig,
        check_servable,
        check_vllm_install,
        find_vllm_python,
    )

    device = device or default_device()
    if device == "cpu" and dtype == "auto":
        dtype = "float32"  # the trainer's float32 checkpoint, served as it is trained
    log_dir_option(engine_options, run)
    kv_cache_bytes = None if kv_cache_gib is None else int(kv_cache_gib * GIB)
    user_sized = kv_cache_bytes is not None or gpu_memory_utilization is not None
    if device == "cpu" and not user_sized and not _sized_by_user(server_args, server_env):
        max_concurrency = engine_options.get("max_concurrency", ServerOptions.max_concurrency)
        kv_cache_bytes, max_model_len = cpu_kv_defaults(
            model_path, dtype, max_model_len, run, max_concurrency
        )
    servers: list[VLLMServerConfig] = []
    if model_path and num_servers > 0:
        interpreter = find_vllm_python(python)
        check_vllm_install(interpreter)
        check_servable(str(model_path), device)
        base = VLLMServerConfig(
            model_path=str(model_path),
            python=interpreter,
            tokenizer_path=str(model_path),
            device=device,
            dtype=dtype,
            tp_size=tp_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enable_chunked_prefill=enable_chunked_prefill,
            kv_cache_bytes=kv_cache_bytes,
            max_logprobs=MAX_LOGPROBS if max_logprobs is None else max_logprobs,
            seed=seed,
            extra_args=tuple(str(a) for a in server_args),
            env=run.server_env(server_env) if run else dict(server_env or {}),
            startup_timeout_s=startup_timeout_s,
        )
        servers = [_for_index(base, i) for i in range(num_servers)]
    stops = stop_token_ids(tokenizer, engine_options)
    shared = {"urls": tuple(urls), "router_url": router_url, "extra_stop_token_ids": stops}
    options, own = split_server_options(engine_options | shared)
    return VLLMEngine(options, servers=servers, seed=seed, **own)


#: Smallest KV cache a CPU server gets by default (bytes).
FLOOR_BYTES = 64 << 20


def cpu_kv_defaults(
    model_path: str | None,
    dtype: str,
    max_model_len: int | None,
    run: ServerRun | None,
    max_concurrency: int,
) -> tuple[int, int | None]:
    """A CPU server's KV cache (bytes) and ``--max-model-len`` when the user sized
    neither: :func:`~rlkit.rollout.servers.run.kv_cache_tokens` tokens (the run's
    concurrent sequences times their length, at least the floor) at the model's bytes
    per token, at least :data:`FLOOR_BYTES`. vLLM refuses to start with a KV cache
    smaller than one ``max_model_len`` sequence, so a model whose context is longer than
    those tokens is served with ``--max-model-len`` = the tokens (still at least the
    run's prompt plus response). Logs the choice (one line)."""
    from rlkit.rollout.servers.run import (
        kv_bytes_per_token,
        kv_cache_tokens,
        log_defaults,
        model_config,
        round_up_mib,
    )

    config = model_config(model_path)
    tokens, how = kv_cache_tokens(run, max_concurrency)
    if max_model_len is not None and max_model_len > tokens:
        tokens, how = max_model_len, f"max_model_len {max_model_len}"
    per_token = kv_bytes_per_token(config, dtype)
    if per_token is None:
        per_token = 128 << 10  # unknown model: 128 KiB a token, a 7B model's in float32
    n_bytes = max(FLOOR_BYTES, round_up_mib(tokens * per_token))
    context = config.get("max_position_embeddings")
    served_len = max_model_len
    if served_len is None and isinstance(context, int) and context > tokens:
        served_len = tokens
    log_defaults(
        f"vLLM on CPU: KV cache {n_bytes / (1 << 20):.0f} MiB (--kv-cache-memory-bytes; "
        f"{tokens} tokens: {how}; {per_token} bytes a token)"
        + (f", --max-model-len {served_len}" if served_len != max_model_len else "")
        + "; engine option kv_cache_gib or gpu_memory_utilization overrides it"
    )
    return n_bytes, served_len


def _sized_by_user(server_args: Sequence[str], server_env: dict[str, str] | None) -> bool:
    """The KV cache is sized by a server flag or ``VLLM_CPU_KVCACHE_SPACE`` (server_env or
    this process's environment)."""
    import os

    from rlkit.rollout.vllm.server import KV_CACHE_ENV

    sizing = ("--kv-cache-memory-bytes", "--gpu-memory-utilization")
    if any(str(a).split("=", 1)[0] in sizing for a in server_args):
        return True
    return bool((server_env or {}).get(KV_CACHE_ENV) or os.environ.get(KV_CACHE_ENV))


def _for_index(config: Any, index: int) -> Any:
    """Server ``index``'s config: its own GPUs when on an accelerator."""
    from dataclasses import replace

    if config.device == "cpu":
        return config
    first = index * config.tp_size
    return replace(config, cuda_devices=",".join(str(first + k) for k in range(config.tp_size)))


def _forwarded_options() -> set[str]:
    from rlkit.rollout.vllm.engine import VLLMEngine

    set_by_factory = {"servers", "urls", "router_url", "seed"}
    return forwarded_options(VLLMEngine, set_by_factory)


make_vllm_engine.forwarded_options = _forwarded_options  # type: ignore[attr-defined]
