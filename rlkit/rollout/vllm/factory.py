"""``ROLLOUT_ENGINES["vllm"]``: the factory the trainer calls, kept free of heavy imports.

Importing this module (which ``import rlkit.rollout.vllm`` does) registers the name
without importing aiohttp or vLLM (vLLM usually lives in an environment of its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.servers.factory_options import forwarded_options, stop_token_ids
from rlkit.rollout.servers.options import split_server_options


@ROLLOUT_ENGINES.register(
    "vllm",
    summary="vLLM servers (started from vLLM's own environment, attached by URL, or behind a router)",
    holds_own_weights=True,  # samples while the trainer updates (rollout_mode one_step_off)
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
    device: str = "cuda",
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
        device, dtype, tp_size, gpu_memory_utilization, max_model_len,
            enable_chunked_prefill, kv_cache_gib: server settings (see
            :class:`~rlkit.rollout.vllm.server.VLLMServerConfig`). With ``device="cpu"``,
            ``dtype="auto"`` becomes ``float32``. Server ``i`` of ``num_servers`` on GPUs
            gets GPUs ``i * tp_size ...`` (``CUDA_VISIBLE_DEVICES``).
        max_logprobs: ``--max-logprobs`` of started servers, the largest
            ``SamplingParams.top_logprobs`` they answer (default
            :data:`~rlkit.rollout.vllm.server.MAX_LOGPROBS`, 64).
        server_args: further server flags, as strings.
        server_env: extra environment variables for started servers.
        startup_timeout_s: seconds a server may take to become healthy.
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

    if device == "cpu" and dtype == "auto":
        dtype = "float32"  # the trainer's float32 checkpoint, served as it is trained
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
            kv_cache_gib=kv_cache_gib,
            max_logprobs=MAX_LOGPROBS if max_logprobs is None else max_logprobs,
            seed=seed,
            extra_args=tuple(str(a) for a in server_args),
            env=dict(server_env or {}),
            startup_timeout_s=startup_timeout_s,
        )
        servers = [_for_index(base, i) for i in range(num_servers)]
    stops = stop_token_ids(tokenizer, engine_options)
    shared = {"urls": tuple(urls), "router_url": router_url, "extra_stop_token_ids": stops}
    options, own = split_server_options(engine_options | shared)
    return VLLMEngine(options, servers=servers, seed=seed, **own)


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
