"""The options every server engine (SGLang's, vLLM's) takes: which servers it uses, how
it sends and retries requests, where weight snapshots go and how a sync is checked.

Users give them as keywords in ``RolloutConfig.engine_options``, mixed with an engine's
own options; :func:`split_server_options` sorts the two apart. This module imports
nothing heavy: the registry factories use it without loading aiohttp or a server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ServerOptions:
    """What :class:`~rlkit.rollout.servers.engine.ServerRolloutEngine` needs besides the
    servers it starts; the values are checked when the engine is built."""

    urls: Sequence[str] = ()
    """Servers started by someone else (``http://host:port``), used besides the started
    ones. With ``router_url`` they are the workers behind the router, used only for
    weight sync."""
    router_url: str | None = None
    """A router in front of the workers: all generation goes through it (it balances
    load itself)."""
    log_dir: str | Path | None = None
    """Where server logs (and, by default, disk snapshots) go; ``None``: the engine's
    ``default_log_dir`` (``runs/sglang``, ``runs/vllm``)."""
    max_concurrency: int = 64
    """Requests (prompts) in flight at once, over all servers."""
    request_timeout_s: float = 600.0
    """Time allowed for one request (all ``n`` samples of a prompt)."""
    max_retries: int = 3
    """Re-sends of one prompt before :class:`~rlkit.rollout.servers.errors.RolloutError`."""
    retry_backoff_s: float = 1.0
    """The wait before retry ``k`` is ``retry_backoff_s * 2**k``."""
    restart_dead_servers: bool = True
    """Restart a started server whose process died."""
    max_restarts: int = 2
    """Restarts allowed per started server."""
    sync_dir: str | Path | None = None
    """Folder for disk snapshots (default ``log_dir/weights``); must be readable by the
    servers."""
    keep_snapshots: int = 2
    """Disk snapshots kept (older ones are deleted)."""
    extra_stop_token_ids: Sequence[int] = ()
    """Ids that always end a response (e.g. the tokenizer's EOS when the model config
    names another one)."""
    vocab_size: int | None = None
    """For the sync check (the trainer model's if not given); the SGLang engine reads it
    from ``model_path/config.json`` when not given."""
    verify_sync: bool = True
    """After each sync, compare every server's weights with the trainer's (checksums, or
    slices read back: :mod:`rlkit.rollout.servers.weight_check`; a difference stops the
    run with :class:`~rlkit.rollout.servers.errors.WeightMismatchError`), then score a
    fixed sequence on every server and on the trainer's model and report
    ``weight_sync/logprob_max_abs_diff``."""
    verify_every: int = 1
    """Check every ``verify_every``-th sync (the first always): the weights themselves
    (checksums or read-back slices, where the server offers them) and the log-prob probe.
    A larger value makes the check sparse; ``0`` checks none (as ``verify_sync=False``)."""
    verify_tolerance: float | None = None
    """Raise :class:`~rlkit.rollout.servers.errors.WeightSyncError` above this difference
    (default: 1e-3 for float32 servers, 0.1 otherwise); ``inf`` only reports."""


def server_option_names() -> set[str]:
    """The keywords that are :class:`ServerOptions` fields."""
    return {f.name for f in fields(ServerOptions)}


def split_server_options(options: Mapping[str, Any]) -> tuple[ServerOptions, dict[str, Any]]:
    """``options`` as a :class:`ServerOptions` and the rest: the engine's own options, and
    any unknown keyword, which the engine then refuses by its own name."""
    names = server_option_names()
    shared = {k: v for k, v in options.items() if k in names}
    return ServerOptions(**shared), {k: v for k, v in options.items() if k not in names}
