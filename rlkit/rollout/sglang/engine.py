"""The SGLang rollout engine: SGLang's native protocol and weight updates.

:class:`SGLangEngine` is a :class:`~rlkit.rollout.servers.engine.ServerRolloutEngine`
(requests, retries, restarts and sync checks shared with the vLLM engine) that speaks
SGLang's native ``/generate`` (token ids in and out, log-probs returned) and moves
weights in one of three ways (:mod:`rlkit.rollout.sglang.weight_sync`).

**Weight check.** After a sync the engine reads slices of a fixed sample of parameters
back by their Hugging Face names (``/get_weights_by_name``) and compares them with the
trainer's, besides the log-prob probe every server engine runs
(:mod:`rlkit.rollout.servers.weight_check`). Measured on SGLang 0.5.23 CPU servers:

* Llama-family classes (``LlamaForCausalLM`` and its subclasses: Mistral, Phi-3,
  InternLM3, ...; also OPT, Granite, Exaone4) answer every Hugging Face name, fused
  ``q_proj`` / ``k_proj`` / ``v_proj`` and ``gate_proj`` / ``up_proj`` included (SGLang
  cuts them out of ``qkv_proj`` / ``gate_up_proj``), norms, and ``lm_head.weight`` (the
  embeddings when tied). Right after a ``disk``, ``tensor`` or ``distributed`` sync
  the slices equal the trainer's exactly, and a ``bfloat16`` server answers its
  bfloat16 values (the trainer's rounded to bfloat16), not the trainer's float32 ones.
* Qwen2 / Qwen3 and most other classes have no ``get_weights_by_name``: every name
  answers HTTP 400 ("Get parameter by name failed"). Which names a server reads
  depends only on its model class, never on its weights, so when the first check reads
  none, the engine logs that once and relies on the log-prob probe alone
  (``weight_sync/params_checked`` stays 0) instead of failing every sync.
* SGLang turns the whole parameter into a Python list (~32 bytes per element) before
  cutting it, so a vocabulary-sized parameter is read only for vocabularies of at most
  :data:`MAX_READ_VOCAB` tokens (a 150k x 3584 embedding would take ~17 GB of the
  server's memory); the other sampled parameters cost their size in transient memory
  once per checked sync (``verify_every`` thins the checks).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rlkit.distributed import collectives as comm
from rlkit.rollout.base import PolicyWeights, SamplingParams
from rlkit.rollout.servers import snapshots
from rlkit.rollout.servers.engine import ServerRolloutEngine, read_vocab_size
from rlkit.rollout.servers.errors import BadRequestError, WeightSyncError
from rlkit.rollout.servers.options import ServerOptions
from rlkit.rollout.servers.pool import Endpoint
from rlkit.rollout.servers.process import find_free_port
from rlkit.rollout.servers.sample import Sample
from rlkit.rollout.sglang import weight_sync
from rlkit.rollout.sglang.client import (
    LOG_PROB_MODES,
    generate_body,
    parse_prompt_log_probs,
    parse_samples,
    parse_weight_rows,
    prompt_log_probs_body,
    sampling_payload,
    served_dtype,
    uses_filters,
    weights_by_name_body,
)
from rlkit.rollout.sglang.server import ServerConfig

logger = logging.getLogger(__name__)

MAX_READ_VOCAB = 4096
"""Largest vocabulary whose vocabulary-sized parameters (embeddings, output layer) are
read back: SGLang 0.5.23 converts a parameter whole into a Python list before cutting
the slice, which for any production vocabulary costs gigabytes of the server's memory.
Test models (259 tokens) stay below it."""

#: Name parts of the parameters with one row per vocabulary entry.
_VOCAB_PARAMETERS = ("embed_tokens.", "lm_head.", "wte.", "embed_out.", "word_embeddings.")

#: What each ``weight_sync`` mode does, for the weight-check message.
_SYNC_METHODS = {
    "disk": "SGLang's /update_weights_from_disk (each server reloads the checkpoint the "
    "trainer saved)",
    "tensor": "SGLang's /update_weights_from_tensor (tensor buckets in the request body, "
    "CUDA IPC handles for colocated GPU servers)",
    "distributed": "SGLang's /update_weights_from_distributed (a {backend} broadcast from "
    "the trainer into the servers' ranks)",
}


class _NoReadsByName(Exception):
    """A server answered no sampled parameter name: its model class cannot be read."""


class SGLangEngine(ServerRolloutEngine):
    """Rollouts on SGLang servers (started here, or attached by URL, or behind a router).

    Args:
        options: the settings every server engine shares
            (:class:`~rlkit.rollout.servers.options.ServerOptions`: ``urls``,
            ``router_url``, ``log_dir``, ``max_concurrency``, ``request_timeout_s``,
            ``max_retries``, ``retry_backoff_s``, ``restart_dead_servers``,
            ``max_restarts``, ``sync_dir``, ``keep_snapshots``, ``extra_stop_token_ids``,
            ``vocab_size``, ``verify_sync``, ``verify_every``, ``verify_tolerance``).
            ``vocab_size`` is needed for top-p without top-k in ``sampling`` mode and for
            the sync check (also to read back vocabulary-sized parameters); read from
            ``model_path/config.json`` if not given.
        server: launch settings for servers this engine starts (``None``: attach only).
        num_servers: how many servers to start with ``server`` (ports chosen freely;
            on GPUs, server ``i`` uses GPUs ``i * tp_size ...``).
        weight_sync: ``disk`` | ``tensor`` | ``distributed`` (see :mod:`weight_sync`).
        bucket_mb: tensor / distributed sync bucket size in MiB.
        dist_backend: process-group backend for ``distributed`` (default: ``gloo``
            on CPU servers, else ``nccl``).
        dist_master_address: this host's address as the servers see it.
        log_prob_mode: ``sampling`` (log-prob under the distribution actually
            sampled from: temperature, top-k and top-p applied, as the HF engine
            returns) or ``temperature`` (``log_softmax(logits / T)``, filters
            ignored). The same when top-k and top-p are off. Greedy
            (temperature 0) returns ``log_softmax(logits)``.
    """

    server_name = "SGLang"
    default_log_dir = "runs/sglang"
    weight_check = "slices"

    def __init__(
        self,
        options: ServerOptions,
        *,
        server: ServerConfig | None = None,
        num_servers: int = 1,
        weight_sync: str = "disk",
        bucket_mb: float = 256,
        dist_backend: str | None = None,
        dist_master_address: str = "127.0.0.1",
        log_prob_mode: str = "sampling",
    ) -> None:
        _check_options(
            server,
            num_servers,
            options.urls,
            options.router_url,
            weight_sync,
            log_prob_mode,
            bucket_mb,
        )
        self.server_config = server
        self.weight_sync_mode = weight_sync
        self.bucket_bytes = max(int(bucket_mb * 2**20), 1)
        self.dist_backend = dist_backend or (
            "gloo" if server and server.device == "cpu" else "nccl"
        )
        self.dist_master_address = dist_master_address
        self.log_prob_mode = log_prob_mode
        self.sync_method = _SYNC_METHODS[weight_sync].format(backend=self.dist_backend)
        # Whether the served model class answers /get_weights_by_name: learnt at the first
        # weight check (None until then), the same on every process.
        self._reads_by_name: bool | None = None
        vocab_size = options.vocab_size or read_vocab_size(server.model_path if server else None)
        self._group: weight_sync.TrainerProcessGroup | None = None
        self._group_members: tuple[int, ...] = ()
        self._group_count = 0
        servers: list[ServerConfig] = []
        if server is not None and num_servers > 0:
            if server.model_path and self.log_prob_mode == "sampling" and vocab_size:
                # top-p alone is sent as top_k = vocab, which the sampling-mask path must allow.
                flag = "--sampling-mask-max-tokens"
                if flag not in server.extra_args and vocab_size > 4096:
                    server = replace(server, extra_args=(*server.extra_args, flag, str(vocab_size)))
            servers = [_for_index(server, i) for i in range(num_servers)]
        super().__init__(
            replace(options, vocab_size=vocab_size),
            servers=servers,
            server_dtype=server.dtype if server else "auto",
            initial_version=server.weight_version if server else None,
        )

    # ------------------------------------------------------------------ protocol
    def _checked(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[int]]:
        prompts = super()._checked(prompt_ids, params)
        if (
            self.log_prob_mode == "sampling"
            and uses_filters(params)
            and params.top_k <= 0
            and not self.vocab_size
        ):
            raise ValueError(
                "top_p < 1 without top_k needs vocab_size (SGLang returns the renormalised "
                "log-probs only for a finite top_k): pass vocab_size=... to the sglang engine "
                "or use log_prob_mode='temperature'"
            )
        return prompts

    def _samples_per_request(self, params: SamplingParams) -> int:
        # SGLang 0.5.23 aborts n > 1 requests that return the sampling mask ("did not
        # return captured sampling support"): those go as n requests of one sample.
        return 1 if self._wants_filtered(params) else params.n

    def _wants_filtered(self, params: SamplingParams) -> bool:
        return self.log_prob_mode == "sampling" and uses_filters(params)

    async def _send(
        self, endpoint: Endpoint, prompt: list[int], params: SamplingParams
    ) -> list[Sample]:
        payload = sampling_payload(params, self.extra_stop_token_ids, self.vocab_size)
        body = generate_body(prompt, params, payload, self.log_prob_mode)
        response = await self.client.post(endpoint.url, "/generate", body)
        return parse_samples(response, params.n, self._wants_filtered(params), params.top_logprobs)

    async def _served_log_probs(self, endpoint: Endpoint, token_ids: list[int]) -> list[float]:
        response = await self.client.post(
            endpoint.url, "/generate", prompt_log_probs_body(token_ids)
        )
        return parse_prompt_log_probs(response)

    # -------------------------------------------------------------- weight check
    def _check_weights(
        self, weights: PolicyWeights, targets: list[Endpoint], when: str | None = None
    ) -> int:
        """The slice comparison, unless the served model class cannot be read by name.

        The first check finds out (on the main process, told to the others): a server
        that answers none of the sampled names serves a class without
        ``get_weights_by_name`` (Qwen2 in SGLang 0.5.23), which no later sync changes,
        so the check is left to the log-prob probe from then on. A later check that reads
        nothing fails as the base engine says: the names did read before.
        """
        if self._reads_by_name is False:
            return 0
        if self._reads_by_name is None and not self._know_served_dtype(targets):
            self._reads_by_name = False
            return 0
        unreadable = False
        try:
            compared = super()._check_weights(weights, targets, when)
        except _NoReadsByName as exc:
            unreadable, compared = True, 0
            logger.warning(
                "%s; the weight check after each sync is the log-prob probe alone "
                "(weight_sync/params_checked = 0)",
                exc,
            )
        if self._reads_by_name is None:  # unsettled while a held failure skipped the check
            self._reads_by_name = comm.broadcast_object(
                None if self._held is not None else not unreadable
            )
        return compared

    def _know_served_dtype(self, targets: list[Endpoint]) -> bool:
        """Settle ``server_dtype`` (what the trainer's slices are rounded to) before the
        first check: an attached server, or one started with ``dtype="auto"``, is asked
        (``/server_info``). False, with a warning, when it cannot be known: slices
        compared unrounded with a bfloat16 server would report every sync as failed."""
        if served_dtype(self.server_dtype, None) is not None:
            self.server_dtype = served_dtype(self.server_dtype, None)
            return True
        found = None
        if self.rank == 0 and targets:
            found = self._on_servers(self._run, self._served_dtype(targets[0]))
        found = comm.broadcast_object(found)
        if found is None:
            logger.warning(
                "the dtype of the SGLang server %s is 'auto' and its config.json is not "
                "readable here; the weight check after each sync is the log-prob probe alone "
                "(launch the server with an explicit --dtype to compare weights too)",
                targets[0].url if targets else "?",
            )
            return False
        self.server_dtype = found
        return True

    async def _served_dtype(self, endpoint: Endpoint) -> str | None:
        try:
            info = await self.client.get(endpoint.url, "/server_info")
        except BadRequestError:  # no such route (not an SGLang server): dtype unknown
            return None
        info = info if isinstance(info, dict) else {}
        launched = info.get("dtype")
        if served_dtype(launched, None) is not None:
            return served_dtype(launched, None)
        path = self.server_config.model_path if self.server_config else info.get("model_path")
        config = Path(str(path)) / "config.json"
        return served_dtype(launched, json.loads(config.read_text()) if config.is_file() else None)

    async def _served_slices(
        self, endpoint: Endpoint, names: Sequence[str], length: int
    ) -> dict[str, list[float] | None]:
        """The first ``length`` elements of each of ``names`` on ``endpoint``, read one
        name at a time (each read copies a whole parameter on the server); ``None`` for a
        name the server does not answer (HTTP 400) or a vocabulary-sized one above
        :data:`MAX_READ_VOCAB`.

        Raises:
            _NoReadsByName: at the first check, the server answered none of ``names``.
            RequestError: the server is unreachable or failed (not a missing name).
        """
        out: dict[str, list[float] | None] = {}
        asked = 0
        for name in names:
            if any(part in name for part in _VOCAB_PARAMETERS) and not (
                self.vocab_size and self.vocab_size <= MAX_READ_VOCAB
            ):
                out[name] = None
                continue
            asked += 1
            out[name] = await self._read_slice(endpoint, name, length)
        if self._reads_by_name is None and asked and all(v is None for v in out.values()):
            raise _NoReadsByName(
                f"the SGLang server {endpoint.url} answered none of {asked} parameter names "
                f"on /get_weights_by_name (its model class cannot read weights by name, "
                f"e.g. Qwen2 in SGLang 0.5.23)"
            )
        return out

    async def _read_slice(self, endpoint: Endpoint, name: str, length: int) -> list[float] | None:
        """``name``'s first ``length`` elements (flattened): one entry of the first
        dimension first, which tells how many entries ``length`` elements span, then
        those if more are needed."""
        rows = 1
        while True:
            try:
                response = await self.client.post(
                    endpoint.url, "/get_weights_by_name", weights_by_name_body(name, rows)
                )
            except BadRequestError:
                return None
            values, per_row = parse_weight_rows(response)
            needed = math.ceil(length / per_row)
            if len(values) >= length or rows >= needed or len(response) < rows:
                return values[:length]
            rows = needed

    # --------------------------------------------------------------- weight sync
    @property
    def reloads_from_disk(self) -> bool:
        return self.weight_sync_mode == "disk"

    def sync_weights_in_flight(self, weights: PolicyWeights) -> dict[str, float]:
        """:meth:`sync_weights` without waiting for the requests running: every server
        pauses them (``/pause_generation``, mode ``retract``: their KV cache is freed),
        takes the weights, and continues them (``/continue_generation``), recomputing
        their context under the new weights. Each response then reports the version of
        every token (SGLang's ``weight_versions`` spans), which its samples keep.
        """
        paused: list[Endpoint] = []
        if self.rank == 0:
            self.pool.wait_restarts()
            paused = [e for e in self.sync_endpoints if e.healthy or e.stale]
            self._run(self._all(paused, "/pause_generation", {"mode": "retract"}))
        try:
            targets, metrics = self._push(weights)
        finally:
            if paused:
                self._run(self._all(paused, "/continue_generation", {}))
        return metrics | self._verified(weights, targets)

    def _load(self, weights: PolicyWeights, version: str, targets: list[Endpoint]) -> None:
        sync = {
            "disk": self._sync_disk,
            "tensor": self._sync_tensor,
            "distributed": self._sync_distributed,
        }[self.weight_sync_mode]
        sync(weights, version, targets)
        if self.rank == 0 and self.weight_sync_mode != "disk":
            # disk updates flush as part of the request
            self._on_servers(self._run, self._all(targets, "/flush_cache", {}))

    def _sync_disk(self, weights: PolicyWeights, version: str, targets: list[Endpoint]) -> None:
        tmp = comm.broadcast_object(
            str(snapshots.new_tmp_dir(self.sync_dir)) if self.rank == 0 else None
        )
        weights.save_pretrained(tmp)  # a collective under FSDP: every process calls it
        comm.barrier()
        if self.rank != 0:
            return
        final = snapshots.publish_snapshot(
            Path(tmp), self.sync_dir, int(version), self.keep_snapshots
        )
        self.latest_snapshot = final
        body = {"model_path": str(final), "weight_version": version, "flush_cache": True}
        self._post(targets, "/update_weights_from_disk", body, tolerate=True)

    def _sync_tensor(self, weights: PolicyWeights, version: str, targets: list[Endpoint]) -> None:
        tp = self.server_config.tp_size if self.server_config else 1
        on_gpu = bool(self.server_config and self.server_config.device == "cuda")
        on_gpu = on_gpu and torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else None
        if self.rank == 0:
            self._post(targets, "/begin_weight_update", {}, tolerate=True)
        try:
            for bucket in weight_sync.buckets(weights.named_tensors(), self.bucket_bytes):
                if self.rank != 0 or self._held is not None:
                    continue  # only take part in the collective export
                if on_gpu:  # colocated GPU servers map the tensors (CUDA IPC), no HTTP copy
                    bucket = [(n, t.to(device, non_blocking=True)) for n, t in bucket]
                    torch.cuda.synchronize()
                payload = weight_sync.serialize_bucket(bucket)
                body = {
                    "serialized_named_tensors": [payload] * tp,
                    "flush_cache": False,
                    "weight_version": version,
                }
                self._post(targets, "/update_weights_from_tensor", body, tolerate=True)
        finally:
            if self.rank == 0:
                self._post(targets, "/end_weight_update", {}, tolerate=True)

    def _sync_distributed(
        self, weights: PolicyWeights, version: str, targets: list[Endpoint]
    ) -> None:
        if self.rank == 0:
            self._on_servers(self._ensure_group, targets)
            self._post(targets, "/begin_weight_update", {})
        device = comm.transport_device(self.dist_backend)
        try:
            for bucket in weight_sync.buckets(weights.named_tensors(), self.bucket_bytes):
                if self.rank != 0 or self._held is not None:
                    continue
                body = {
                    "names": [n for n, _ in bucket],
                    "dtypes": [weight_sync.dtype_name(t.dtype) for _, t in bucket],
                    "shapes": [list(t.shape) for _, t in bucket],
                    "group_name": self._group.group_name,  # type: ignore[union-attr]
                    "flush_cache": False,
                    "weight_version": version,
                }
                tensors = [t.detach().to(device).contiguous() for _, t in bucket]
                self._on_servers(self._broadcast_bucket, targets, body, tensors)
        finally:
            if self.rank == 0:
                self._post(targets, "/end_weight_update", {})

    def _post(self, targets: list[Endpoint], path: str, body: Any, tolerate: bool = False) -> None:
        """``POST path`` to every target from the main process, within a sync."""
        self._on_servers(self._run, self._all(targets, path, body, tolerate=tolerate))

    def _broadcast_bucket(
        self, targets: list[Endpoint], body: dict[str, Any], tensors: list[torch.Tensor]
    ) -> None:
        pending = self._submit(self._all(targets, "/update_weights_from_distributed", body))
        self._group.broadcast(tensors)  # type: ignore[union-attr]
        pending.result()

    def _ensure_group(self, targets: list[Endpoint]) -> None:
        members = tuple(id(e) for e in targets)
        restarted = any(e.stale for e in targets)
        if self._group is not None and members == self._group_members and not restarted:
            return
        self._close_group(targets)
        tp = self.server_config.tp_size if self.server_config else 1
        world = 1 + tp * len(targets)
        port = find_free_port(self.dist_master_address)
        self._group_count += 1
        name = f"rlkit_weight_sync_{self._group_count}"
        joins = self._submit(
            self._gather(
                [
                    self.client.post(
                        e.url,
                        "/init_weights_update_group",
                        {
                            "master_address": self.dist_master_address,
                            "master_port": port,
                            "rank_offset": 1 + tp * i,
                            "world_size": world,
                            "group_name": name,
                            "backend": self.dist_backend,
                        },
                    )
                    for i, e in enumerate(targets)
                ]
            )
        )
        self._group = weight_sync.TrainerProcessGroup(
            self.dist_master_address, port, world, name, self.dist_backend
        )
        _raise_unless_all_ok(joins.result(), "init_weights_update_group", targets)
        self._group_members = members

    def _close_group(self, targets: list[Endpoint]) -> None:
        if self._group is None:
            return
        name = self._group.group_name
        alive = [e for e in targets if e.healthy and not e.stale]
        with contextlib.suppress(Exception):
            self._run(self._all(alive, "/destroy_weights_update_group", {"group_name": name}))
        self._group.close()
        self._group = None

    def _close_transfer(self) -> None:
        if self._group is not None:
            self._group.close()


def _raise_unless_all_ok(results: list[Any], path: str, targets: list[Endpoint]) -> None:
    for e, r in zip(targets, results):
        if isinstance(r, dict) and r.get("success") is False:
            raise WeightSyncError(f"{e.url}{path} failed: {r.get('message')}")


def _for_index(config: ServerConfig, index: int) -> ServerConfig:
    """Server ``index``'s config: its own GPUs when on an accelerator."""
    if config.device == "cpu":
        return config
    return replace(config, base_gpu_id=config.base_gpu_id + index * config.tp_size)


def _check_options(
    server: ServerConfig | None,
    num_servers: int,
    urls: Sequence[str],
    router_url: str | None,
    weight_sync_mode: str,
    log_prob_mode: str,
    bucket_mb: float,
) -> None:
    if server is None and not urls and not router_url:
        raise ValueError(
            "the sglang engine needs servers: give model_path (servers are started), urls=[...] "
            "(servers you started) or router_url=... (an sglang-router)"
        )
    if num_servers < 0:
        raise ValueError(f"num_servers must be >= 0, got {num_servers}")
    if bucket_mb <= 0:
        raise ValueError(f"need bucket_mb > 0, got {bucket_mb}")
    if weight_sync_mode not in weight_sync.WEIGHT_SYNC_MODES:
        raise ValueError(
            f"weight_sync must be one of {weight_sync.WEIGHT_SYNC_MODES}, got {weight_sync_mode!r}"
        )
    if log_prob_mode not in LOG_PROB_MODES:
        raise ValueError(f"log_prob_mode must be one of {LOG_PROB_MODES}, got {log_prob_mode!r}")
