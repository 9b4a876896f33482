"""The SGLang rollout engine: prompts spread over SGLang servers, weights synced after updates.

:class:`SGLangEngine` implements :class:`rlkit.rollout.base.RolloutEngine`. It
sends one native ``/generate`` request per prompt (``n`` samples each, token ids
in and out, log-probs returned) with at most ``max_concurrency`` requests in
flight, to the least-loaded healthy server. A request that times out or hits a
dead server is re-sent elsewhere with exponential backoff; each prompt ends up
with exactly ``n`` responses, in prompt order, or the call raises
:class:`RolloutError` after ``max_retries`` retries of one prompt. Responses are
keyed by prompt, so a late duplicate can never be counted twice.

In a multi-process trainer (``accelerate launch``) the main process starts the
servers and every process sends its own prompts to them; ``sync_weights`` is
called by every process (the weight export is a collective) and only the main
process talks to the servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rlkit.distributed import collectives as comm
from rlkit.rollout.base import PolicyWeights, RolloutBatch, RolloutEngine, SamplingParams
from rlkit.rollout.sglang import logprob_check, weight_sync
from rlkit.rollout.sglang.client import (
    LOG_PROB_MODES,
    BadRequestError,
    RequestError,
    Sample,
    SGLangClient,
    generate_body,
    parse_samples,
    sampling_payload,
    uses_filters,
)
from rlkit.rollout.sglang.pool import Endpoint, NoHealthyServerError, RolloutError, ServerPool
from rlkit.rollout.sglang.server import ServerConfig, find_free_port, start_servers
from rlkit.rollout.turns import TurnGenerator, TurnResult


def read_vocab_size(model_path: str | None) -> int | None:
    """``vocab_size`` from ``model_path/config.json`` (or its ``text_config``), else ``None``."""
    if not model_path:
        return None
    path = Path(model_path) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    return config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")


class SGLangEngine(RolloutEngine):
    """Rollouts on SGLang servers (started here, or attached by URL, or behind a router).

    Args:
        server: launch settings for servers this engine starts (``None``: attach only).
        num_servers: how many servers to start with ``server`` (ports chosen freely;
            on GPUs, server ``i`` uses GPUs ``i * tp_size ...``).
        urls: servers started by someone else (``http://host:port``), used besides
            the started ones. With ``router_url`` they are the workers behind the
            router, used only for weight sync.
        router_url: an ``sglang-router`` in front of the workers: all generation
            goes through it (it balances load itself).
        log_dir: where server logs (and, by default, disk snapshots) go.
        max_concurrency: requests (prompts) in flight at once, over all servers.
        request_timeout_s: time allowed for one request (all ``n`` samples of a prompt).
        max_retries: re-sends of one prompt before :class:`RolloutError`.
        retry_backoff_s: wait before retry ``k`` is ``retry_backoff_s * 2**k``.
        restart_dead_servers: restart a started server whose process died.
        max_restarts: restarts allowed per started server.
        weight_sync: ``disk`` | ``tensor`` | ``distributed`` (see :mod:`weight_sync`).
        sync_dir: folder for disk snapshots (default ``log_dir/weights``); must be
            readable by the servers.
        keep_snapshots: disk snapshots kept (older ones are deleted).
        bucket_mb: tensor / distributed sync bucket size in MiB.
        dist_backend: process-group backend for ``distributed`` (default: ``gloo``
            on CPU servers, else ``nccl``).
        dist_master_address: this host's address as the servers see it.
        log_prob_mode: ``sampling`` (log-prob under the distribution actually
            sampled from: temperature, top-k and top-p applied, as the HF engine
            returns) or ``temperature`` (``log_softmax(logits / T)``, filters
            ignored). The same when top-k and top-p are off. Greedy
            (temperature 0) returns ``log_softmax(logits)``.
        extra_stop_token_ids: ids that always end a response (e.g. the tokenizer's EOS
            when the model config names another one).
        vocab_size: needed for top-p without top-k in ``sampling`` mode and for the
            sync check; read from ``model_path/config.json`` if not given.
        verify_sync: after each sync, score a fixed sequence on every server and on
            the trainer's model and report ``weight_sync/logprob_max_abs_diff``.
        verify_tolerance: raise :class:`weight_sync.WeightSyncError` above this
            difference (default: 1e-3 for float32 servers, 0.1 otherwise); ``inf``
            only reports.
    """

    # The counts of generate and SGLangTurns; the server states of ServerPool.stats(),
    # which generate adds to its batch's metrics.
    counters: tuple[str, ...] = (
        "rollout/num_requests",
        "rollout/num_retries",
        "rollout/duplicates_dropped",
    )
    gauges: tuple[str, ...] = ("rollout/servers_usable", "rollout/server_restarts")

    def __init__(
        self,
        *,
        server: ServerConfig | None = None,
        num_servers: int = 1,
        urls: Sequence[str] = (),
        router_url: str | None = None,
        log_dir: str | Path = "runs/sglang",
        max_concurrency: int = 64,
        request_timeout_s: float = 600.0,
        max_retries: int = 3,
        retry_backoff_s: float = 1.0,
        restart_dead_servers: bool = True,
        max_restarts: int = 2,
        weight_sync: str = "disk",
        sync_dir: str | Path | None = None,
        keep_snapshots: int = 2,
        bucket_mb: float = 256,
        dist_backend: str | None = None,
        dist_master_address: str = "127.0.0.1",
        log_prob_mode: str = "sampling",
        extra_stop_token_ids: Sequence[int] = (),
        vocab_size: int | None = None,
        verify_sync: bool = True,
        verify_tolerance: float | None = None,
    ) -> None:
        _check_options(
            server, num_servers, urls, router_url, max_concurrency, max_retries, weight_sync,
            log_prob_mode, bucket_mb, keep_snapshots,
        )  # fmt: skip
        self.rank, self.world = comm.world()
        self.server_config = server
        self.log_dir = Path(log_dir)
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.weight_sync_mode = weight_sync
        self.sync_dir = Path(sync_dir) if sync_dir else self.log_dir / "weights"
        self.keep_snapshots = keep_snapshots
        self.bucket_bytes = max(int(bucket_mb * 2**20), 1)
        self.dist_backend = dist_backend or (
            "gloo" if server and server.device == "cpu" else "nccl"
        )
        self.dist_master_address = dist_master_address
        self.log_prob_mode = log_prob_mode
        self.extra_stop_token_ids = tuple(int(t) for t in extra_stop_token_ids)
        self.vocab_size = vocab_size or read_vocab_size(server.model_path if server else None)
        self.verify_sync = verify_sync
        self.verify_tolerance = verify_tolerance
        self.router_url = router_url
        # The policy version the servers hold: "init" for started servers until the first sync.
        self.expected_version: str | None = server.weight_version if server else None
        self.latest_snapshot: Path | None = None
        self._group: weight_sync.TrainerProcessGroup | None = None
        self._group_members: tuple[int, ...] = ()
        self._group_count = 0
        self._closed = False
        self._turn_slots: asyncio.Semaphore | None = None

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sglang-engine", daemon=True
        )
        self._thread.start()
        self.client = SGLangClient(request_timeout_s)

        servers = []
        if self.rank == 0 and server is not None and num_servers > 0:
            if server.model_path and self.log_prob_mode == "sampling" and self.vocab_size:
                # top-p alone is sent as top_k = vocab, which the sampling-mask path must allow.
                flag = "--sampling-mask-max-tokens"
                if flag not in server.extra_args and self.vocab_size > 4096:
                    server = replace(
                        server, extra_args=(*server.extra_args, flag, str(self.vocab_size))
                    )
            configs = [_for_index(server, i) for i in range(num_servers)]
            try:
                servers = start_servers(configs, self.log_dir)
            except BaseException:
                self._loop.call_soon_threadsafe(self._loop.stop)
                raise
        owned_urls = comm.broadcast_object([s.url for s in servers])
        endpoints = [Endpoint(s.url, s) for s in servers] if self.rank == 0 else []
        endpoints += [Endpoint(u) for u in owned_urls] if self.rank != 0 else []
        attached = [Endpoint(u.rstrip("/")) for u in urls]
        self.sync_endpoints = endpoints + attached  # every worker that must receive weights
        gen_endpoints = [Endpoint(router_url.rstrip("/"))] if router_url else self.sync_endpoints
        self.pool = ServerPool(
            gen_endpoints,
            restart_dead_servers=restart_dead_servers,
            max_restarts=max_restarts,
            restart_args=self._restart_args,
        )

    # ------------------------------------------------------------------ generate
    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutBatch:
        """Sample ``params.n`` responses per prompt; rows grouped by prompt, in prompt order.

        Raises:
            ValueError: bad prompts or sampling parameters.
            RolloutError: a prompt failed ``max_retries + 1`` times, or the server
                rejected a request (the server's message is included).
        """
        prompts = self._checked(prompt_ids, params)
        start = time.perf_counter()
        per_prompt, stats = self._run(self._generate_all(prompts, params))
        batch = RolloutBatch(
            prompt_ids=[p for p in prompts for _ in range(params.n)],
            response_ids=[s.response_ids for samples in per_prompt for s in samples],
            rollout_log_probs=[s.log_probs for samples in per_prompt for s in samples],
            finish_reasons=[s.finish_reason for samples in per_prompt for s in samples],
            prompt_index=[i for i in range(len(prompts)) for _ in range(params.n)],
        )
        if any(s.token_versions for samples in per_prompt for s in samples):
            batch.token_versions = [
                s.token_versions or [None] * len(s.response_ids)
                for samples in per_prompt
                for s in samples
            ]
        batch.validate()
        elapsed = time.perf_counter() - start
        tokens = sum(len(r) for r in batch.response_ids)
        batch.metrics = {
            "rollout/num_retries": float(stats["retries"]),
            "rollout/num_requests": float(stats["requests"]),
            "rollout/duplicates_dropped": float(stats["duplicates"]),
            "rollout/response_tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
            **self.pool.stats(),
        }
        return batch

    def _checked(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[int]]:
        self._check_open()
        prompts = _check_prompts(prompt_ids, params)
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

    # -------------------------------------------------------------------- turns
    def turns(self, params: SamplingParams) -> TurnGenerator:
        """Multi-turn generation: every turn is its own ``/generate`` request, sent as soon
        as its trajectory asks (the server's prefix cache reuses the context)."""
        self._checked([[0]], params)
        return SGLangTurns(self, params)

    def submit_turn(
        self, context_ids: Sequence[int], params: SamplingParams
    ) -> Future[tuple[Sample, Counter[str]]]:
        """Send one turn (one sample after ``context_ids``) on the engine's event loop."""
        (prompt,) = self._checked([context_ids], replace(params, n=1))
        return self._submit(self._one_turn(prompt, replace(params, n=1)))

    async def _one_turn(
        self, prompt: list[int], params: SamplingParams
    ) -> tuple[Sample, Counter[str]]:
        if self._turn_slots is None:  # made here, on the engine's loop
            self._turn_slots = asyncio.Semaphore(self.max_concurrency)
        want_filtered = self.log_prob_mode == "sampling" and uses_filters(params)
        payload = sampling_payload(params, self.extra_stop_token_ids, self.vocab_size)
        stats: Counter[str] = Counter()
        async with self._turn_slots:
            body = generate_body(prompt, params, payload, self.log_prob_mode)
            (sample,) = await self._request_with_retries(0, body, 1, want_filtered, stats)
        return sample, stats

    async def _generate_all(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> tuple[list[list[Sample]], Counter[str]]:
        want_filtered = self.log_prob_mode == "sampling" and uses_filters(params)
        # SGLang 0.5.23 aborts n > 1 requests that return the sampling mask ("did not
        # return captured sampling support"): send those as n requests of one sample.
        per_request = 1 if want_filtered else params.n
        payload = sampling_payload(
            replace(params, n=per_request), self.extra_stop_token_ids, self.vocab_size
        )
        units = [(i, j) for i in range(len(prompts)) for j in range(params.n // per_request)]
        results: dict[tuple[int, int], list[Sample]] = {}
        stats: Counter[str] = Counter()
        semaphore = asyncio.Semaphore(self.max_concurrency)

        async def one(unit: tuple[int, int]) -> None:
            async with semaphore:
                body = generate_body(prompts[unit[0]], params, payload, self.log_prob_mode)
                samples = await self._request_with_retries(
                    unit[0], body, per_request, want_filtered, stats
                )
            if unit in results:  # never expected: one task per unit; kept as the guarantee
                stats["duplicates"] += 1
            else:
                results[unit] = samples

        tasks = [asyncio.ensure_future(one(u)) for u in units]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        missing = [u for u in units if u not in results]
        if missing:  # gather returned without error, so this would be a bug here
            raise RolloutError(f"internal error: no responses for (prompt, request) {missing[:10]}")
        per_prompt: list[list[Sample]] = [[] for _ in prompts]
        for i, j in units:
            per_prompt[i].extend(results[(i, j)])
        return per_prompt, stats

    async def _request_with_retries(
        self, index: int, body: dict[str, Any], n: int, want_filtered: bool, stats: Counter[str]
    ) -> list[Sample]:
        errors: list[str] = []
        loop = asyncio.get_running_loop()
        for attempt in range(self.max_retries + 1):
            endpoint = await self._acquire(errors)
            ok = False
            try:
                stats["requests"] += 1
                sent = self.expected_version
                response = await self.client.post(endpoint.url, "/generate", body)
                samples = self._check_versions(
                    endpoint, parse_samples(response, n, want_filtered), sent
                )
                ok = True
                return samples
            except BadRequestError as exc:
                raise RolloutError(
                    f"prompt {index}: the server rejected the request: {exc}"
                ) from exc
            except RequestError as exc:
                errors.append(f"attempt {attempt + 1} on {endpoint.url}: {exc}")
                stats["retries"] += 1
                await loop.run_in_executor(None, self.pool.report_failure, endpoint, str(exc))
                if attempt < self.max_retries:
                    await asyncio.sleep(self.retry_backoff_s * 2**attempt)
            finally:
                self.pool.release(endpoint, ok=ok)
        raise RolloutError(
            f"prompt {index} failed {self.max_retries + 1} times (max_retries={self.max_retries}); "
            f"errors:\n  " + "\n  ".join(errors)
        )

    async def _acquire(self, errors: list[str]) -> Endpoint:
        """A usable endpoint; waits while a server restarts, raises when none can recover."""
        loop = asyncio.get_running_loop()
        while True:
            endpoint = self.pool.acquire()
            if endpoint is not None:
                return endpoint
            await loop.run_in_executor(None, self.pool.recheck)
            if not self.pool.recoverable():
                details = "; ".join(
                    f"{e.url}: {e.last_error or 'down'}" for e in self.pool.endpoints
                )
                stale = [e.url for e in self.pool.endpoints if e.stale]
                hint = (
                    f" Servers {stale} were restarted and still hold old weights: call "
                    f"sync_weights() (weight_sync='{self.weight_sync_mode}' cannot reload "
                    f"them from disk)."
                    if stale
                    else ""
                )
                raise NoHealthyServerError(
                    f"no SGLang server left to send requests to ({details}).{hint} "
                    f"Earlier errors: {errors[-3:]}"
                )
            await asyncio.sleep(0.5)

    def _check_versions(
        self, endpoint: Endpoint, samples: list[Sample], sent: str | None
    ) -> list[Sample]:
        """``samples``, checked: a response from weights other than the ones synced when
        the request was sent or now (a sync may have updated the server under it) comes
        from a stale server. A response whose single version is not the one it was sent
        under was sampled wholly by the newer weights: its tokens say so."""
        expected = self.expected_version
        if expected is None or self.router_url:
            return samples
        wrong = {s.weight_version for s in samples} - {expected, sent}
        if wrong:
            endpoint.stale = True
            raise RequestError(
                f"server holds weight version {sorted(wrong)}, expected {expected!r} "
                f"(taken out of rotation until the next sync)"
            )
        return [
            replace(s, token_versions=[int(s.weight_version)] * len(s.response_ids))
            if s.token_versions is None and s.weight_version != sent and s.weight_version.isdigit()
            else s
            for s in samples
        ]

    def _restart_args(self) -> tuple[str | None, str | None, bool]:
        if self.weight_sync_mode == "disk" and self.latest_snapshot is not None:
            return str(self.latest_snapshot), self.expected_version, False
        synced = self.latest_snapshot is not None or self.expected_version not in (None, "init")
        return None, None, synced

    # --------------------------------------------------------------- weight sync
    def sync_weights(self, weights: PolicyWeights) -> dict[str, float]:
        """Load ``weights`` into every server, flush their caches, check log-probs.

        Called by every process of a multi-process trainer. Returns
        ``timing_s/weight_sync``, ``timing_s/weight_sync_verify`` and
        ``weight_sync/logprob_max_abs_diff`` (``nan`` if not verified).

        Raises:
            WeightSyncError: a server refused the update, or the log-probs differ
                by more than ``verify_tolerance``.
        """
        targets, metrics = self._push(weights)
        return metrics | self._verified(weights, targets)

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

    def _push(self, weights: PolicyWeights) -> tuple[list[Endpoint], dict[str, float]]:
        self._check_open()
        version = str(weights.version)
        start = time.perf_counter()
        targets: list[Endpoint] = []
        if self.rank == 0:
            self.pool.wait_restarts()
            targets = [e for e in self.sync_endpoints if e.healthy or e.stale]
            if not targets:
                raise weight_sync.WeightSyncError("no healthy SGLang server to sync weights to")
        sync = {
            "disk": self._sync_disk,
            "tensor": self._sync_tensor,
            "distributed": self._sync_distributed,
        }[self.weight_sync_mode]
        sync(weights, version, targets)
        if self.rank == 0:
            if self.weight_sync_mode != "disk":  # disk updates flush as part of the request
                self._run(self._all(targets, "/flush_cache", {}))
            self.pool.mark_synced(targets)
        else:  # process 0 synced every server: whatever this process saw as stale is current
            self.pool.mark_synced(self.pool.endpoints)
        self.expected_version = version
        return targets, {"timing_s/weight_sync": time.perf_counter() - start}

    def _verified(self, weights: PolicyWeights, targets: list[Endpoint]) -> dict[str, float]:
        start = time.perf_counter()
        metrics = {
            "weight_sync/logprob_max_abs_diff": (
                self._verify(weights, targets) if self.verify_sync else float("nan")
            )
        }
        metrics["timing_s/weight_sync_verify"] = time.perf_counter() - start
        comm.barrier()
        return metrics

    def _sync_disk(self, weights: PolicyWeights, version: str, targets: list[Endpoint]) -> None:
        tmp = comm.broadcast_object(
            str(weight_sync.new_tmp_dir(self.sync_dir)) if self.rank == 0 else None
        )
        weights.save_pretrained(tmp)  # a collective under FSDP: every process calls it
        comm.barrier()
        if self.rank != 0:
            return
        final = weight_sync.publish_snapshot(
            Path(tmp), self.sync_dir, int(version), self.keep_snapshots
        )
        self.latest_snapshot = final
        body = {"model_path": str(final), "weight_version": version, "flush_cache": True}
        self._run(self._all(targets, "/update_weights_from_disk", body, tolerate=True))

    def _sync_tensor(self, weights: PolicyWeights, version: str, targets: list[Endpoint]) -> None:
        tp = self.server_config.tp_size if self.server_config else 1
        on_gpu = bool(self.server_config and self.server_config.device == "cuda")
        on_gpu = on_gpu and torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else None
        if self.rank == 0:
            self._run(self._all(targets, "/begin_weight_update", {}, tolerate=True))
        try:
            for bucket in weight_sync.buckets(weights.named_tensors(), self.bucket_bytes):
                if self.rank != 0:
                    continue  # other processes only take part in the collective export
                if on_gpu:  # colocated GPU servers map the tensors (CUDA IPC), no HTTP copy
                    bucket = [(n, t.to(device, non_blocking=True)) for n, t in bucket]
                    torch.cuda.synchronize()
                payload = weight_sync.serialize_bucket(bucket)
                body = {
                    "serialized_named_tensors": [payload] * tp,
                    "flush_cache": False,
                    "weight_version": version,
                }
                self._run(self._all(targets, "/update_weights_from_tensor", body, tolerate=True))
        finally:
            if self.rank == 0:
                self._run(self._all(targets, "/end_weight_update", {}, tolerate=True))

    def _sync_distributed(
        self, weights: PolicyWeights, version: str, targets: list[Endpoint]
    ) -> None:
        if self.rank == 0:
            self._ensure_group(targets)
            self._run(self._all(targets, "/begin_weight_update", {}))
        device = comm.transport_device(self.dist_backend)
        try:
            for bucket in weight_sync.buckets(weights.named_tensors(), self.bucket_bytes):
                if self.rank != 0:
                    continue
                body = {
                    "names": [n for n, _ in bucket],
                    "dtypes": [weight_sync.dtype_name(t.dtype) for _, t in bucket],
                    "shapes": [list(t.shape) for _, t in bucket],
                    "group_name": self._group.group_name,  # type: ignore[union-attr]
                    "flush_cache": False,
                    "weight_version": version,
                }
                pending = self._submit(self._all(targets, "/update_weights_from_distributed", body))
                tensors = [t.detach().to(device).contiguous() for _, t in bucket]
                self._group.broadcast(tensors)  # type: ignore[union-attr]
                pending.result()
        finally:
            if self.rank == 0:
                self._run(self._all(targets, "/end_weight_update", {}))

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

    def _verify(self, weights: PolicyWeights, targets: list[Endpoint]) -> float:
        vocab = self.vocab_size
        with weights.generation_context() as (model, _):  # a collective under FSDP
            vocab = vocab or int(model.config.vocab_size)
            probe = logprob_check.probe_token_ids(vocab)
            reference = logprob_check.trainer_log_probs(model, probe)
        if self.rank != 0:
            return float("nan")
        served = self._run(
            self._gather([self.client.prompt_log_probs(e.url, probe) for e in targets])
        )
        worst = max(logprob_check.max_abs_diff(s, reference) for s in served)
        tolerance = self.verify_tolerance
        if tolerance is None:
            dtype = self.server_config.dtype if self.server_config else "auto"
            tolerance = 1e-3 if dtype == "float32" else 0.1
        if not worst <= tolerance:
            raise weight_sync.WeightSyncError(
                f"after syncing weight version {self.expected_version}, the servers' log-probs of a "
                f"fixed sequence differ from the trainer's by up to {worst:.3g} (tolerance "
                f"{tolerance:g}): the sync did not take effect, or the server computes in another "
                f"dtype. Pass verify_tolerance=... to accept this, or check the parameter names."
            )
        return worst

    # ------------------------------------------------------------------ plumbing
    async def _all(
        self,
        targets: list[Endpoint],
        path: str,
        body: dict[str, Any],
        *,
        tolerate: bool = False,
    ) -> list[Any]:
        """``POST path`` to every target at once.

        With ``tolerate``, a target that fails is dropped from ``targets`` (in place, so
        the rest of this sync skips it and it is not marked synced), taken out of
        rotation as stale and, if owned, restarted; only if all fail does this raise.

        Raises:
            WeightSyncError: a target failed (any, or all with ``tolerate``).
        """
        calls = [self.client.post(e.url, path, body) for e in targets]
        results = await asyncio.gather(*calls, return_exceptions=True)
        failed = [
            (e, r)
            for e, r in zip(targets, results)
            if isinstance(r, BaseException) or (isinstance(r, dict) and r.get("success") is False)
        ]
        if failed and (not tolerate or len(failed) == len(targets)):
            e, r = failed[0]
            message = r if isinstance(r, BaseException) else r.get("message")
            raise weight_sync.WeightSyncError(f"{e.url}{path} failed: {message}")
        loop = asyncio.get_running_loop()
        for e, r in failed:
            targets.remove(e)
            e.stale = True
            await loop.run_in_executor(None, self.pool.report_failure, e, f"{path}: {r}")
        return results

    @staticmethod
    async def _gather(calls: list[Any]) -> list[Any]:
        return list(await asyncio.gather(*calls))

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _submit(self, coro: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this SGLangEngine is closed; create a new one")

    def restarted_servers(self) -> list[str]:
        return self.pool.restart_lines()

    def close(self) -> None:
        """Stop started servers, the process group and the event loop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            if self._group is not None:
                self._group.close()
        with contextlib.suppress(Exception):
            self._run(self.client.close())
        self.pool.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class SGLangTurns(TurnGenerator):
    """Turns on SGLang servers: each trajectory's turn is a request of its own, so a
    trajectory waiting for its tool never holds up another's request."""

    def __init__(self, engine: SGLangEngine, params: SamplingParams) -> None:
        super().__init__(params)
        self.engine = engine

    async def generate(self, key: int, context_ids: list[int], max_new_tokens: int) -> TurnResult:
        params = replace(self.params, max_new_tokens=max_new_tokens)
        sample, stats = await asyncio.wrap_future(self.engine.submit_turn(context_ids, params))
        self.add_metrics(
            {
                "rollout/num_retries": float(stats["retries"]),
                "rollout/num_requests": float(stats["requests"]),
            }
        )
        return TurnResult(
            sample.response_ids, sample.log_probs, sample.finish_reason, sample.token_versions
        )


def _raise_unless_all_ok(results: list[Any], path: str, targets: list[Endpoint]) -> None:
    for e, r in zip(targets, results):
        if isinstance(r, dict) and r.get("success") is False:
            raise weight_sync.WeightSyncError(f"{e.url}{path} failed: {r.get('message')}")


def _for_index(config: ServerConfig, index: int) -> ServerConfig:
    """Server ``index``'s config: its own GPUs when on an accelerator."""
    if config.device == "cpu":
        return config
    return replace(config, base_gpu_id=config.base_gpu_id + index * config.tp_size)


def _check_prompts(prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> list[list[int]]:
    if params.n < 1:
        raise ValueError(f"SamplingParams.n must be >= 1, got {params.n}")
    if params.max_new_tokens < 0:
        raise ValueError(f"SamplingParams.max_new_tokens must be >= 0, got {params.max_new_tokens}")
    if params.temperature < 0:
        raise ValueError(f"SamplingParams.temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {params.top_p}")
    prompts = []
    for i, p in enumerate(prompt_ids):
        ids = [int(t) for t in p]
        if not ids:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token id")
        prompts.append(ids)
    return prompts


def _check_options(
    server: ServerConfig | None,
    num_servers: int,
    urls: Sequence[str],
    router_url: str | None,
    max_concurrency: int,
    max_retries: int,
    weight_sync_mode: str,
    log_prob_mode: str,
    bucket_mb: float,
    keep_snapshots: int,
) -> None:
    if server is None and not urls and not router_url:
        raise ValueError(
            "the sglang engine needs servers: give model_path (servers are started), urls=[...] "
            "(servers you started) or router_url=... (an sglang-router)"
        )
    if num_servers < 0:
        raise ValueError(f"num_servers must be >= 0, got {num_servers}")
    if router_url and not urls and (server is None or num_servers == 0):
        raise ValueError(
            "with router_url, also give urls=[...] of the workers behind it: weights are synced "
            "to each worker directly"
        )
    if max_concurrency < 1 or max_retries < 0 or bucket_mb <= 0 or keep_snapshots < 1:
        raise ValueError(
            f"need max_concurrency >= 1, max_retries >= 0, bucket_mb > 0, keep_snapshots >= 1; got "
            f"{max_concurrency}, {max_retries}, {bucket_mb}, {keep_snapshots}"
        )
    if weight_sync_mode not in weight_sync.WEIGHT_SYNC_MODES:
        raise ValueError(
            f"weight_sync must be one of {weight_sync.WEIGHT_SYNC_MODES}, got {weight_sync_mode!r}"
        )
    if log_prob_mode not in LOG_PROB_MODES:
        raise ValueError(f"log_prob_mode must be one of {LOG_PROB_MODES}, got {log_prob_mode!r}")
