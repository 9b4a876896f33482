"""The vLLM rollout engine: vLLM's completions protocol and its reinforcement-learning routes.

:class:`VLLMEngine` is a :class:`~rlkit.rollout.servers.engine.ServerRolloutEngine`
(requests, retries, restarts and sync checks shared with the SGLang engine) that sends
token ids to ``/v1/completions`` and moves weights through the routes vLLM's
development mode exposes for reinforcement learning:

1. ``POST /pause?mode=wait``: new requests wait; the running ones finish first, so every
   response is sampled by one version of the weights.
2. the trainer writes a snapshot (:mod:`rlkit.rollout.servers.snapshots`, with the
   output layer untied: :mod:`rlkit.rollout.vllm.untied`) and each server
   reloads it in place: ``POST /collective_rpc`` with ``reload_weights(weights_path=...)``
   on every worker. (vLLM's weight-transfer engine, ``/init_weight_transfer_engine`` ...
   ``/finish_weight_update``, moves tensors over NCCL or CUDA IPC, which a CPU server
   cannot take; the reload from disk works on every device.)
3. ``POST /reset_prefix_cache`` (cached prefixes were computed by the old weights) and
   ``POST /update_weight_version``.
4. ``POST /resume``.

Then, as for SGLang, a fixed sequence is scored on every server and on the trainer's
model (``weight_sync/logprob_max_abs_diff``). A server restarted after a crash starts
from the newest snapshot. Responses carry no weight version, so each sample is labelled
with the version the engine last synced, which step 1 makes exact.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from rlkit.distributed import collectives as comm
from rlkit.rollout.base import PolicyWeights, SamplingParams
from rlkit.rollout.servers import snapshots
from rlkit.rollout.servers.engine import ServerRolloutEngine
from rlkit.rollout.servers.errors import ServerStartError
from rlkit.rollout.servers.options import ServerOptions
from rlkit.rollout.servers.pool import Endpoint
from rlkit.rollout.servers.process import http_ok
from rlkit.rollout.servers.sample import Sample
from rlkit.rollout.vllm import untied
from rlkit.rollout.vllm.client import (
    completion_body,
    parse_choices,
    parse_prompt_log_probs,
    prompt_log_probs_body,
)
from rlkit.rollout.vllm.server import VLLMServerConfig

#: The version started servers report until the first sync.
INITIAL_VERSION = "init"


class VLLMEngine(ServerRolloutEngine):
    """Rollouts on vLLM servers (started here, attached by URL, or behind a router).

    Args:
        options: the settings every server engine shares
            (:class:`~rlkit.rollout.servers.options.ServerOptions`: ``urls``,
            ``router_url``, ``log_dir``, ``max_concurrency``, ``request_timeout_s``,
            ``max_retries``, ``retry_backoff_s``, ``restart_dead_servers``,
            ``max_restarts``, ``sync_dir``, ``keep_snapshots``, ``extra_stop_token_ids``,
            ``vocab_size``, ``verify_sync``, ``verify_tolerance``).
        servers: launch settings of the servers to start, one per server.
        seed: draws one seed per request, so a run's samples repeat where the server
            honours seeds (``None``: unseeded).
    """

    server_name = "vLLM"
    default_log_dir = "runs/vllm"
    sync_mismatch_hint = (
        " A vLLM server on CPU started from a checkpoint with tied embeddings keeps its old "
        "output layer on reload: start it from an untied copy (rlkit.rollout.vllm.untied."
        "untied_copy; the servers rlkit starts are started that way)."
    )

    def __init__(
        self,
        options: ServerOptions,
        *,
        servers: Sequence[VLLMServerConfig] = (),
        seed: int | None = None,
    ) -> None:
        _check_attached(options.urls, options.router_url)
        if servers and comm.world()[0] == 0:
            sync_dir = options.sync_dir or self.resolved_log_dir(options) / "weights"
            served = _served_copy(servers[0].model_path, sync_dir)
            servers = [s.with_weights(str(served), None) for s in servers]
        self._seeds = random.Random(seed) if seed is not None else None
        super().__init__(
            options,
            servers=servers,
            server_dtype=servers[0].dtype if servers else "auto",
            initial_version=INITIAL_VERSION if servers else None,
        )
        if self.rank == 0 and servers:
            self._run(
                self._all(self.sync_endpoints, "/update_weight_version", _version(INITIAL_VERSION))
            )

    # ------------------------------------------------------------------ protocol
    async def _send(
        self, endpoint: Endpoint, prompt: list[int], params: SamplingParams
    ) -> list[Sample]:
        seed = self._seeds.randrange(2**31) if self._seeds is not None else None
        # vLLM refuses n > 1 when greedy; every greedy sample is the one argmax path anyway.
        draws = 1 if params.temperature <= 0 else params.n
        body = completion_body(prompt, replace(params, n=draws), self.extra_stop_token_ids, seed)
        version = self.expected_version or ""
        response = await self.client.post(endpoint.url, "/v1/completions", body)
        samples = parse_choices(response, draws, version)
        return (
            samples if draws == params.n else [copy.deepcopy(samples[0]) for _ in range(params.n)]
        )

    async def _served_log_probs(self, endpoint: Endpoint, token_ids: list[int]) -> list[float]:
        body = prompt_log_probs_body(token_ids)
        response = await self.client.post(endpoint.url, "/v1/completions", body)
        return parse_prompt_log_probs(response, token_ids)

    # --------------------------------------------------------------- weight sync
    @property
    def reloads_from_disk(self) -> bool:
        return True

    def _load(self, weights: PolicyWeights, version: str, targets: list[Endpoint]) -> None:
        tmp = comm.broadcast_object(
            str(snapshots.new_tmp_dir(self.sync_dir)) if self.rank == 0 else None
        )
        weights.save_pretrained(tmp)  # a collective under FSDP: every process calls it
        comm.barrier()
        if self.rank != 0:
            return
        untied.untie_in_place(tmp)
        final = snapshots.publish_snapshot(
            Path(tmp), self.sync_dir, int(version), self.keep_snapshots
        )
        self.latest_snapshot = final
        self._run(self._all(targets, "/pause?mode=wait", None, tolerate=True))
        try:
            reload = {"method": "reload_weights", "kwargs": {"weights_path": str(final)}}
            self._run(self._all(targets, "/collective_rpc", reload, tolerate=True))
            self._run(self._all(targets, "/reset_prefix_cache", None, tolerate=True))
            self._run(
                self._all(targets, "/update_weight_version", _version(version), tolerate=True)
            )
        finally:
            self._run(self._all(targets, "/resume", None, tolerate=True))


def _served_copy(model_path: str, sync_dir: str | Path) -> Path:
    """What started servers load: ``model_path``, or its untied copy (see
    :mod:`rlkit.rollout.vllm.untied`) when it ties its embeddings."""
    return untied.untied_copy(model_path, Path(sync_dir) / "served_untied")


def _version(version: str) -> dict[str, str]:
    return {"new_version": version}


def _check_attached(urls: Sequence[str], router_url: str | None) -> None:
    """Attached servers answer ``/health`` now, or the engine is not built."""
    for url in [*urls, *([router_url] if router_url else [])]:
        if not http_ok(url.rstrip("/") + "/health", timeout_s=10.0):
            raise ServerStartError(
                f"the vLLM server {url} does not answer GET /health: start it (with "
                f"VLLM_SERVER_DEV_MODE=1 and --logprobs-mode processed_logprobs) or fix "
                f"the address in urls / router_url"
            )
