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

Then each server's weights are compared with the trainer's (``weight_check =
"checksums"``, :mod:`rlkit.rollout.servers.weight_check`): ``POST /collective_rpc`` with
``rlkit_weight_checksums`` runs rlkit's worker extension
(:mod:`rlkit.rollout.vllm.worker_extension.rlkit_vllm_worker`, loaded by every server
rlkit starts) on the server's worker, which sums each group of the weights its forward
pass reads, packed CPU kernels included. A server that cannot answer exactly is left to
the log-prob probe below, with one warning: an attached server started without the
extension, or one that runs several workers (tensor or pipeline parallel: each worker
holds a shard, and shards of the fused projections overlap when key/value heads are
replicated, so their sums do not add up to the model's). Then, as for SGLang, a fixed
sequence is scored on every server and on the trainer's model
(``weight_sync/logprob_max_abs_diff``). A server restarted after a crash starts
from the newest snapshot. Responses carry no weight version, so each sample is labelled
with the version the engine last synced, which step 1 makes exact.

With ``SamplingParams.top_logprobs = k`` each request asks for the ``k`` most likely
tokens per position (:mod:`rlkit.rollout.vllm.client`); started servers answer up to
``max_logprobs`` (64), a larger ``k`` is refused before anything is sent.
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from rlkit.distributed import collectives as comm
from rlkit.rollout.base import PolicyWeights, SamplingParams
from rlkit.rollout.servers import snapshots, weight_check
from rlkit.rollout.servers.engine import ServerRolloutEngine
from rlkit.rollout.servers.errors import (
    BadRequestError,
    RequestError,
    ServerStartError,
    WeightSyncError,
)
from rlkit.rollout.servers.http_client import HttpClient
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
from rlkit.rollout.vllm.server import EXTENSION_DIR, WORKER_EXTENSION, VLLMServerConfig
from rlkit.rollout.vllm.worker_extension.rlkit_vllm_worker import VERSION as EXTENSION_VERSION

logger = logging.getLogger(__name__)

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
    weight_check = "checksums"
    sync_method = (
        "a disk snapshot that each server reloaded in place (POST /collective_rpc reload_weights)"
    )
    #: The worker-extension methods (``POST /collective_rpc``) the weight check calls.
    extension_info_method = "rlkit_extension_info"
    checksums_method = "rlkit_weight_checksums"

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
        #: The largest ``top_logprobs`` every started server answers (``None``: unknown
        #: for attached servers, or no limit below the vocabulary).
        limits = [s.served_max_logprobs for s in servers]
        self.max_logprobs = min((m for m in limits if m is not None), default=None)
        #: Per server URL, the dtype its extension reports, or ``None`` when its
        #: checksums are not read (no extension, several workers; warned once).
        self._checksum_dtype: dict[str, str | None] = {}
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
        try:
            response = await self.client.post(endpoint.url, "/v1/completions", body)
        except BadRequestError as exc:
            if params.top_logprobs > 0 and "logprobs" in str(exc):
                raise BadRequestError(
                    f"{exc}. SamplingParams.top_logprobs={params.top_logprobs} is more than "
                    f"the server {endpoint.url} answers: restart it with --max-logprobs "
                    f"{params.top_logprobs} or more, or ask for fewer"
                ) from exc
            raise
        samples = parse_choices(response, draws, version, params.top_logprobs)
        return (
            samples if draws == params.n else [copy.deepcopy(samples[0]) for _ in range(params.n)]
        )

    def _checked(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[int]]:
        prompts = super()._checked(prompt_ids, params)
        k = params.top_logprobs
        if k < 0:
            raise ValueError(f"SamplingParams.top_logprobs must be >= 0, got {k}")
        if self.max_logprobs is not None and k > self.max_logprobs:
            raise ValueError(
                f"SamplingParams.top_logprobs={k} is more than the vLLM servers answer "
                f"(--max-logprobs {self.max_logprobs}): start them with the engine option "
                f"max_logprobs={k} or more, or ask for fewer"
            )
        return prompts

    async def _served_log_probs(self, endpoint: Endpoint, token_ids: list[int]) -> list[float]:
        body = prompt_log_probs_body(token_ids)
        response = await self.client.post(endpoint.url, "/v1/completions", body)
        return parse_prompt_log_probs(response, token_ids)

    @property
    def reloads_from_disk(self) -> bool:
        return True

    # -------------------------------------------------------------- weight check
    def _check_weights(
        self, weights: PolicyWeights, targets: list[Endpoint], when: str | None = None
    ) -> int:
        """The checksum comparison, on the servers that can answer it exactly (see the
        module docstring); ``0`` compared when none can. The trainer's tensors are
        rounded to the dtype the servers report holding."""
        checkable = []
        if self.rank == 0:
            checkable = self._on_servers(self._checksum_targets, targets, default=[])
        if not checkable and self.world == 1:
            return 0  # nothing to compare with, and no other process to stay in step with
        compared = super()._check_weights(weights, checkable, when)  # a collective under FSDP
        return compared if checkable else 0

    def _checksum_targets(self, targets: list[Endpoint]) -> list[Endpoint]:
        """``targets`` whose checksums are read: each is asked once which extension it
        runs, in which dtype; the engine adopts the first dtype when its own setting
        does not name one (``auto``), and leaves out a server that holds another."""
        unknown = [e for e in targets if e.url not in self._checksum_dtype]
        if unknown:
            found = self._run(self._gather([self._extension_dtype(e) for e in unknown]))
            self._checksum_dtype.update({e.url: d for e, d in zip(unknown, found)})
        checkable = []
        for e in targets:
            dtype = self._checksum_dtype[e.url]
            if dtype is None:
                continue
            if weight_check.server_dtype(self.server_dtype) is None:
                self.server_dtype = dtype
            if weight_check.server_dtype(dtype) != weight_check.server_dtype(self.server_dtype):
                logger.warning(
                    "the vLLM server %s holds its weights in %s, the engine compares them in "
                    "%s (the other servers' dtype or the engine's dtype setting): its weights "
                    "are not compared with the trainer's after syncs (the log-prob probe "
                    "still runs)",
                    e.url,
                    dtype,
                    self.server_dtype,
                )
                self._checksum_dtype[e.url] = None
                continue
            checkable.append(e)
        return checkable

    async def _extension_dtype(self, endpoint: Endpoint) -> str | None:
        """The dtype of ``endpoint``'s weights as rlkit's worker extension reports it;
        ``None``, with a warning, when the server cannot give exact checksums.

        Asked on a connection of its own: a server without the extension raises in the
        route, and the server then closes the connection after its 500 answer, which a
        pooled connection would only notice on the next request (reset by peer)."""
        body = {"method": self.extension_info_method}
        probe = HttpClient(self.client.request_timeout_s)
        try:
            answer = await probe.post(endpoint.url, "/collective_rpc", body)
        except (RequestError, BadRequestError) as exc:
            if self.extension_info_method not in str(exc):
                raise WeightSyncError(
                    f"could not ask the vLLM server {endpoint.url} for its weight checksums: {exc}"
                ) from exc
            logger.warning(
                "the vLLM server %s runs without rlkit's worker extension (started with "
                "--worker-extension-cls %s and %s on PYTHONPATH, as rlkit starts its "
                "servers): its weights are not compared with the trainer's after syncs, "
                "only the log-prob probe checks them",
                endpoint.url,
                WORKER_EXTENSION,
                EXTENSION_DIR,
            )
            return None
        finally:
            await probe.close()
        infos = _rpc_results(answer, endpoint, self.extension_info_method)
        info = infos[0] if isinstance(infos[0], dict) else {}
        parallel = [int(info.get(k, 1)) for k in ("tensor_parallel_size", "pipeline_parallel_size")]
        if len(infos) != 1 or parallel != [1, 1]:
            logger.warning(
                "the vLLM server %s runs %d workers (tensor parallel %d, pipeline parallel "
                "%d): each holds part of the model, so its weight checksums are not "
                "compared with the trainer's after syncs (the log-prob probe still runs)",
                endpoint.url,
                len(infos),
                *parallel,
            )
            return None
        if info.get("version") != EXTENSION_VERSION:
            logger.warning(
                "the vLLM server %s runs version %s of rlkit's worker extension, this rlkit "
                "reads version %s: its weights are not compared with the trainer's after "
                "syncs (restart it with this checkout's %s on PYTHONPATH)",
                endpoint.url,
                info.get("version"),
                EXTENSION_VERSION,
                EXTENSION_DIR,
            )
            return None
        return str(info.get("dtype", "")).removeprefix("torch.")

    async def _served_checksums(self, endpoint: Endpoint) -> dict[str, weight_check.Checksum]:
        body = {"method": self.checksums_method}
        answer = await self.client.post(endpoint.url, "/collective_rpc", body)
        results = _rpc_results(answer, endpoint, self.checksums_method)
        try:
            (sums,) = results  # one worker: servers with several are not asked
            return {group: (float(s), float(a), float(q)) for group, (s, a, q) in sums.items()}
        except (AttributeError, TypeError, ValueError) as exc:
            raise WeightSyncError(
                f"malformed {self.checksums_method} answer from {endpoint.url}: {str(results)[:300]}"
            ) from exc

    # --------------------------------------------------------------- weight sync
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
        self._on_servers(self._reload, final, version, targets)

    def _reload(self, final: Path, version: str, targets: list[Endpoint]) -> None:
        """Pause the targets, reload them from the snapshot ``final``, reset their prefix
        caches, name the version, resume."""
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


def _rpc_results(answer: object, endpoint: Endpoint, method: str) -> list[object]:
    """The per-worker ``results`` of a ``/collective_rpc`` answer.

    Raises:
        WeightSyncError: the answer has no results.
    """
    results = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list) or not results:
        raise WeightSyncError(
            f"malformed /collective_rpc {method} answer from {endpoint.url}: {str(answer)[:300]}"
        )
    return results


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
