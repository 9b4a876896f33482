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
from rlkit.rollout.servers.options import ServerOptions, split_server_options
from rlkit.rollout.servers.run import (
    FLOOR_TOKENS,
    ServerRun,
    default_device,
    kv_cache_tokens,
    log_defaults,
    log_dir_option,
)

#: KV-cache tokens of a CPU server at least, when not given (SGLang would reserve ~70% of
#: the RAM); the run's concurrent sequences may ask for more.
CPU_MAX_TOTAL_TOKENS = FLOOR_TOKENS


@ROLLOUT_ENGINES.register(
    "sglang",
    summary="SGLang servers (started, attached by URL, or behind sglang-router)",
    holds_own_weights=True,  # samples while the trainer updates (rollout_mode one_step_off)
    continues_in_flight=True,  # syncs under running requests (partial_rollout continue)
    takes_run=True,  # the trainer passes run=ServerRun (rlkit.rollout.servers.run)
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
    device: str | None = None,
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
    run: ServerRun | None = None,
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
        device: ``--device``; ``None``: ``cpu`` where the trainer's platform is the CPU,
            else ``cuda``.
        dtype, tp_size, base_gpu_id, mem_fraction_static, max_total_tokens,
            attention_backend: ``sglang.launch_server`` flags (see
            :class:`~rlkit.rollout.sglang.server.ServerConfig`). With ``device="cpu"``,
            ``dtype="auto"`` becomes ``float32`` (SGLang would serve a float32 checkpoint in
            float16), an unset ``attention_backend`` becomes ``torch_native``, and unless
            ``max_total_tokens``, ``mem_fraction_static`` or one of their server flags is
            given the KV cache is sized for the run's concurrent sequences (at least
            ``CPU_MAX_TOTAL_TOKENS``: :func:`~rlkit.rollout.servers.run.kv_cache_tokens`).
        sleep_on_idle: ``--sleep-on-idle`` (idle schedulers stop busy-polling a core);
            ``None`` means on for ``device="cpu"``, where servers share cores with the
            trainer, and off elsewhere (SGLang's default, lowest first-token latency).
        server_args: further ``launch_server`` flags, as strings.
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
            ``vocab_size``, ``verify_sync``, ``verify_every``, ``verify_tolerance``,
            ``log_dir``) and
            :class:`~rlkit.rollout.sglang.engine.SGLangEngine` arguments (``weight_sync``,
            ``bucket_mb``, ``dist_backend``, ``dist_master_address``, ``log_prob_mode``).
    """
    from rlkit.rollout.sglang.engine import SGLangEngine
    from rlkit.rollout.sglang.server import ServerConfig

    device = device or default_device()
    log_dir_option(engine_options, run)
    if device == "cpu":  # SGLang's own CPU defaults are traps (see docs/sglang.md)
        dtype = "float32" if dtype == "auto" else dtype
        attention_backend = attention_backend or "torch_native"
        sized = {"--max-total-tokens", "--mem-fraction-static"}
        user_sized = any(str(a).split("=", 1)[0] in sized for a in server_args)
        if max_total_tokens is None and mem_fraction_static is None and not user_sized:
            max_concurrency = engine_options.get("max_concurrency", ServerOptions.max_concurrency)
            max_total_tokens, how = kv_cache_tokens(run, max_concurrency)
            log_defaults(
                f"SGLang on CPU: KV cache of {max_total_tokens} tokens (--max-total-tokens; "
                f"{how}); engine option max_total_tokens or mem_fraction_static overrides it"
            )
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
            env=run.server_env(server_env) if run else dict(server_env or {}),
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
