"""``ROLLOUT_ENGINES["sglang"]``: the factory the trainer calls, kept free of heavy imports.

Importing this module (which ``import rlkit.rollout.sglang`` does) registers the
name without importing aiohttp or SGLang, so ``rlkit list rollout_engines`` works
where SGLang is not installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.servers.factory_options import forwarded_options, stop_token_ids
from rlkit.rollout.servers.options import split_server_options

#: KV-cache tokens of a CPU server when not given (SGLang would reserve ~70% of the RAM).
CPU_MAX_TOTAL_TOKENS = 16384


@ROLLOUT_ENGINES.register(
    "sglang",
    summary="SGLang servers (started, attached by URL, or behind sglang-router)",
    holds_own_weights=True,  # samples while the trainer updates (rollout_mode one_step_off)
    continues_in_flight=True,  # syncs under running requests (partial_rollout continue)
)
def make_sglang_engine(
    *,
    model_path: str | None = None,
    tokenizer: Any = None,
    weights: Any = None,
    seed: int | None = None,
    num_servers: int = 1,
    urls: Sequence[str] = (),
    router_url: str | None = None,
    device: str = "cuda",
    dtype: str = "auto",
    tp_size: int = 1,
    base_gpu_id: int = 0,
    mem_fraction_static: float | None = None,
    max_total_tokens: int | None = None,
    attention_backend: str | None = None,
    sleep_on_idle: bool | None = None,
    server_args: Sequence[str] = (),
    server_env: dict[str, str] | None = None,
    startup_timeout_s: float = 600.0,
    **engine_options: Any,
) -> Any:
    """Build an :class:`~rlkit.rollout.sglang.engine.SGLangEngine`.

    Called by the trainer as ``factory(model_path=..., tokenizer=..., weights=...,
    seed=..., **engine_options)``; usable directly as
    ``ROLLOUT_ENGINES.get("sglang")(model_path=DIR, num_servers=2, device="cpu", ...)``.

    Args:
        model_path: model directory; servers are started from it when ``num_servers > 0``.
        tokenizer: its EOS id (and pad id, if different from EOS) always ends a response,
            as in the HF engine.
        weights: unused at construction (servers load ``model_path``).
        seed: ``--random-seed`` of started servers (per-request seeds are not sent:
            SGLang ignores them on CPU and rejects them with flashinfer sampling).
        num_servers: servers to start (0 with ``urls`` / ``router_url``: attach only).
        urls: servers started by someone else; with ``router_url``, the workers behind it.
        router_url: an ``sglang-router`` address that all generation goes through.
        device, dtype, tp_size, base_gpu_id, mem_fraction_static, max_total_tokens,
            attention_backend: ``sglang.launch_server`` flags (see
            :class:`~rlkit.rollout.sglang.server.ServerConfig`). With ``device="cpu"``,
            ``dtype="auto"`` becomes ``float32`` (SGLang would serve a float32 checkpoint in
            float16), and unset ``attention_backend`` / ``max_total_tokens`` become
            ``torch_native`` / ``CPU_MAX_TOTAL_TOKENS``.
        sleep_on_idle: ``--sleep-on-idle`` (idle schedulers stop busy-polling a core);
            ``None`` means on for ``device="cpu"``, where servers share cores with the
            trainer, and off elsewhere (SGLang's default, lowest first-token latency).
        server_args: further ``launch_server`` flags, as strings.
        server_env: extra environment variables for started servers.
        startup_timeout_s: seconds a server may take to become healthy.
        **engine_options: :class:`~rlkit.rollout.servers.options.ServerOptions` fields
            (``max_concurrency``, ``request_timeout_s``, ``max_retries``,
            ``retry_backoff_s``, ``restart_dead_servers``, ``max_restarts``, ``sync_dir``,
            ``keep_snapshots``, ``extra_stop_token_ids`` (alias ``extra_eos_token_ids``),
            ``vocab_size``, ``verify_sync``, ``verify_every``, ``verify_tolerance``,
            ``log_dir``) and
            :class:`~rlkit.rollout.sglang.engine.SGLangEngine` arguments (``weight_sync``,
            ``bucket_mb``, ``dist_backend``, ``dist_master_address``, ``log_prob_mode``).
    """
    from rlkit.rollout.sglang.engine import SGLangEngine
    from rlkit.rollout.sglang.server import ServerConfig

    if device == "cpu":  # SGLang's own CPU defaults are traps (see docs/sglang.md)
        dtype = "float32" if dtype == "auto" else dtype
        attention_backend = attention_backend or "torch_native"
        max_total_tokens = max_total_tokens or CPU_MAX_TOTAL_TOKENS
    if sleep_on_idle is None:
        sleep_on_idle = device == "cpu"
    server = None
    if model_path and num_servers > 0:
        server = ServerConfig(
            model_path=str(model_path),
            tokenizer_path=str(model_path),
            device=device,
            dtype=dtype,
            tp_size=tp_size,
            base_gpu_id=base_gpu_id,
            mem_fraction_static=mem_fraction_static,
            max_total_tokens=max_total_tokens,
            attention_backend=attention_backend,
            random_seed=seed,
            sleep_on_idle=sleep_on_idle,
            extra_args=tuple(str(a) for a in server_args),
            env=dict(server_env or {}),
            startup_timeout_s=startup_timeout_s,
        )
    stops = stop_token_ids(tokenizer, engine_options)
    shared = {"urls": tuple(urls), "router_url": router_url, "extra_stop_token_ids": stops}
    options, own = split_server_options(engine_options | shared)
    return SGLangEngine(options, server=server, num_servers=num_servers if server else 0, **own)


def _forwarded_options() -> set[str]:
    from rlkit.rollout.sglang.engine import SGLangEngine

    set_by_factory = {"server", "num_servers", "urls", "router_url"}
    return forwarded_options(SGLangEngine, set_by_factory)


make_sglang_engine.forwarded_options = _forwarded_options  # type: ignore[attr-defined]
