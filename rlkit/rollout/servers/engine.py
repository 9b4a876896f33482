"""What every server-backed rollout engine shares: requests, retries, restarts, sync checks.

:class:`ServerRolloutEngine` implements :class:`rlkit.rollout.base.RolloutEngine` for
inference servers reached over HTTP (SGLang, vLLM). It sends one request per prompt
(``n`` samples each, token ids in and out, log-probs returned) with at most
``max_concurrency`` requests in flight, to the least-loaded usable server. A request
that times out or hits a dead server is re-sent elsewhere with exponential backoff;
each prompt ends up with exactly ``n`` responses, in prompt order, or the call raises
:class:`RolloutError` after ``max_retries`` retries of one prompt. Responses are keyed
by prompt, so a late duplicate can never be counted twice. Servers this engine started
are restarted when they die (:class:`ServerPool`), and stopped on close, exit, SIGTERM
and Ctrl-C (:mod:`rlkit.rollout.servers.process`).

A subclass says only what differs between servers: how one prompt's request is sent
and read (:meth:`_send`), how a fixed sequence is scored (:meth:`_served_log_probs`)
and how weights reach the servers (:meth:`_load`).

In a multi-process trainer (``accelerate launch``) the main process starts the servers
and every process sends its own prompts to them; ``sync_weights`` is called by every
process (the weight export is a collective) and only the main process talks to the
servers. A server failure there is held on the main process (:meth:`_on_servers`) while
the others finish the sync's collectives, and then settled by all together: a restarted
server is synced again on every process, or every process raises the same error.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlkit.distributed import collectives as comm
from rlkit.rollout.base import PolicyWeights, RolloutBatch, RolloutEngine, SamplingParams
from rlkit.rollout.sampling import TopLogProbs
from rlkit.rollout.servers import logprob_check, weight_check
from rlkit.rollout.servers.errors import (
    BadRequestError,
    NoHealthyServerError,
    ProbeMismatchError,
    RequestError,
    RolloutError,
    WeightMismatchError,
    WeightSyncError,
)
from rlkit.rollout.servers.http_client import HttpClient
from rlkit.rollout.servers.options import ServerOptions
from rlkit.rollout.servers.pool import Endpoint, ServerPool
from rlkit.rollout.servers.process import ServerLaunch, start_servers
from rlkit.rollout.servers.sample import Sample
from rlkit.rollout.turns import TurnGenerator, TurnResult

logger = logging.getLogger(__name__)


def read_vocab_size(model_path: str | None) -> int | None:
    """``vocab_size`` from ``model_path/config.json`` (or its ``text_config``), else ``None``."""
    if not model_path:
        return None
    path = Path(model_path) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    return config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")


class ServerRolloutEngine(RolloutEngine):
    """Rollouts on inference servers (started here, attached by URL, or behind a router).

    Args:
        options: the attached servers, request, retry, snapshot and sync-check settings
            (:class:`~rlkit.rollout.servers.options.ServerOptions`).
        servers: launch settings of the servers this engine starts, one per server.
        server_dtype: the dtype the servers compute in (for the default tolerance).
        initial_version: the weight version started servers report before the first
            sync (``None``: attached servers only, whose version is not checked).
    """

    #: How messages name the servers ("SGLang", "vLLM").
    server_name = "server"
    #: ``log_dir`` when ``ServerOptions.log_dir`` is ``None``.
    default_log_dir = "runs/servers"
    #: Appended to the sync-check error: what commonly causes a mismatch on this server.
    sync_mismatch_hint = ""
    #: How a sync's weights are compared with the trainer's, besides the log-prob probe
    #: (:mod:`rlkit.rollout.servers.weight_check`): ``"checksums"`` (the engine implements
    #: :meth:`_served_checksums`), ``"slices"`` (:meth:`_served_slices`) or ``"none"``.
    weight_check = "none"
    #: How this engine moves weights, for the mismatch message.
    sync_method = "a weight update"
    #: The counts of generate and the turn generator; the server states of
    #: ServerPool.stats(), which generate adds to its batch's metrics.
    counters: tuple[str, ...] = (
        "rollout/num_requests",
        "rollout/num_retries",
        "rollout/duplicates_dropped",
    )
    gauges: tuple[str, ...] = ("rollout/servers_usable", "rollout/server_restarts")

    def __init__(
        self,
        options: ServerOptions,
        *,
        servers: Sequence[ServerLaunch] = (),
        server_dtype: str = "auto",
        initial_version: str | None = None,
    ) -> None:
        urls, router_url = options.urls, options.router_url
        _check_pool_options(
            servers,
            urls,
            router_url,
            options.max_concurrency,
            options.max_retries,
            options.keep_snapshots,
        )
        self.options = options
        self.rank, self.world = comm.world()
        self.log_dir = self.resolved_log_dir(options)
        self.max_concurrency = options.max_concurrency
        self.max_retries = options.max_retries
        self.retry_backoff_s = options.retry_backoff_s
        self.sync_dir = Path(options.sync_dir) if options.sync_dir else self.log_dir / "weights"
        self.keep_snapshots = options.keep_snapshots
        self.extra_stop_token_ids = tuple(int(t) for t in options.extra_stop_token_ids)
        self.vocab_size = options.vocab_size
        self.verify_sync = options.verify_sync
        self.verify_tolerance = options.verify_tolerance
        self.verify_every = options.verify_every
        self._syncs = 0
        # The main process's first server failure in the sync running (several processes).
        self._held: Exception | None = None
        self.server_dtype = server_dtype
        self.router_url = router_url
        # The policy version the servers hold: "init" for started servers until the first sync.
        self.expected_version: str | None = initial_version
        self.latest_snapshot: Path | None = None
        self._closed = False
        self._turn_slots: asyncio.Semaphore | None = None

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"{self.server_name}-engine", daemon=True
        )
        self._thread.start()
        self.client = HttpClient(options.request_timeout_s)

        started = []
        if self.rank == 0 and servers:
            try:
                started = start_servers(list(servers), self.log_dir)
            except BaseException:
                self._closed = True  # nothing for close() (or __del__) to wait for
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=10)
                raise
        owned_urls = comm.broadcast_object([s.url for s in started])
        endpoints = [Endpoint(s.url, s) for s in started] if self.rank == 0 else []
        endpoints += [Endpoint(u) for u in owned_urls] if self.rank != 0 else []
        attached = [Endpoint(u.rstrip("/")) for u in urls]
        self.sync_endpoints = endpoints + attached  # every worker that must receive weights
        gen_endpoints = [Endpoint(router_url.rstrip("/"))] if router_url else self.sync_endpoints
        self.pool = ServerPool(
            gen_endpoints,
            restart_dead_servers=options.restart_dead_servers,
            max_restarts=options.max_restarts,
            restart_args=self._restart_args,
        )

    @classmethod
    def resolved_log_dir(cls, options: ServerOptions) -> Path:
        """``options.log_dir``, or this engine's ``default_log_dir`` when it is ``None``."""
        return Path(cls.default_log_dir if options.log_dir is None else options.log_dir)

    # ------------------------------------------------------- what a server differs in
    @abc.abstractmethod
    async def _send(
        self, endpoint: Endpoint, prompt: list[int], params: SamplingParams
    ) -> list[Sample]:
        """One request: ``params.n`` samples after ``prompt`` from ``endpoint``.

        Raises:
            RequestError: worth retrying elsewhere (includes a malformed answer).
            BadRequestError: the server rejected the request itself.
        """

    @abc.abstractmethod
    async def _served_log_probs(self, endpoint: Endpoint, token_ids: list[int]) -> list[float]:
        """The server's log-probs of ``token_ids[1:]`` given their prefixes (temperature 1)."""

    async def _served_checksums(self, endpoint: Endpoint) -> dict[str, weight_check.Checksum]:
        """The server's :func:`~rlkit.rollout.servers.weight_check.group_checksums` (by
        :func:`~rlkit.rollout.servers.weight_check.parameter_group`, in its own dtype);
        engines whose ``weight_check`` is ``"checksums"`` implement it."""
        raise NotImplementedError

    async def _served_slices(
        self, endpoint: Endpoint, names: Sequence[str], length: int
    ) -> dict[str, list[float] | None]:
        """The first ``length`` elements of each named (Hugging Face) parameter as the
        server holds it, ``None`` for one it cannot read; engines whose ``weight_check``
        is ``"slices"`` implement it."""
        raise NotImplementedError

    @abc.abstractmethod
    def _load(self, weights: PolicyWeights, version: str, targets: list[Endpoint]) -> None:
        """Put ``weights`` (labelled ``version``) into ``targets`` and clear their prefix
        caches. Called on every process (exporting weights is a collective under FSDP);
        ``targets`` is empty except on the main process. A target that fails may be
        removed from ``targets`` (it is then not marked synced)."""

    def _samples_per_request(self, params: SamplingParams) -> int:
        """How many of a prompt's ``n`` samples one request asks for."""
        return params.n

    @property
    def reloads_from_disk(self) -> bool:
        """Whether syncs write a snapshot that a restarted server can start from."""
        return False

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
        if params.top_logprobs > 0 and all(
            s.top_log_probs is not None for samples in per_prompt for s in samples
        ):
            batch.top_log_probs = [
                TopLogProbs.from_lists(s.top_log_probs, params.top_logprobs)
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
        return check_prompts(prompt_ids, params)

    # -------------------------------------------------------------------- turns
    def turns(self, params: SamplingParams) -> TurnGenerator:
        """Multi-turn generation: every turn is its own request, sent as soon as its
        trajectory asks (the server's prefix cache reuses the context)."""
        self._checked([[0]], params)
        return ServerTurns(self, params)

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
        stats: Counter[str] = Counter()
        async with self._turn_slots:
            (sample,) = await self._request_with_retries(0, prompt, params, stats)
        return sample, stats

    async def _generate_all(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> tuple[list[list[Sample]], Counter[str]]:
        per_request = self._samples_per_request(params)
        request_params = replace(params, n=per_request)
        units = [(i, j) for i in range(len(prompts)) for j in range(params.n // per_request)]
        results: dict[tuple[int, int], list[Sample]] = {}
        stats: Counter[str] = Counter()
        semaphore = asyncio.Semaphore(self.max_concurrency)

        async def one(unit: tuple[int, int]) -> None:
            async with semaphore:
                samples = await self._request_with_retries(
                    unit[0], prompts[unit[0]], request_params, stats
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
        self, index: int, prompt: list[int], params: SamplingParams, stats: Counter[str]
    ) -> list[Sample]:
        errors: list[str] = []
        loop = asyncio.get_running_loop()
        for attempt in range(self.max_retries + 1):
            endpoint = await self._acquire(errors)
            ok = False
            try:
                stats["requests"] += 1
                sent = self.expected_version
                samples = await self._send(endpoint, prompt, params)
                if len(samples) != params.n:
                    raise RequestError(f"got {len(samples)} samples, expected n={params.n}")
                samples = self._check_versions(endpoint, samples, sent)
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
                    f"sync_weights() (this weight sync cannot reload them from disk)."
                    if stale
                    else ""
                )
                raise NoHealthyServerError(
                    f"no {self.server_name} server left to send requests to ({details}).{hint} "
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
        if self.reloads_from_disk and self.latest_snapshot is not None:
            return str(self.latest_snapshot), self.expected_version, False
        synced = self.latest_snapshot is not None or self.expected_version not in (None, "init")
        return None, None, synced

    # --------------------------------------------------------------- weight sync
    def sync_weights(self, weights: PolicyWeights) -> dict[str, float]:
        """Load ``weights`` into every server, flush their caches, check log-probs.

        Called by every process of a multi-process trainer. Returns
        ``timing_s/weight_sync``, ``timing_s/weight_check`` (the weights compared, see
        ``weight_check``), ``weight_sync/params_checked`` (groups or slices compared),
        ``timing_s/weight_sync_verify`` and ``weight_sync/logprob_max_abs_diff`` (``nan``
        if not verified: ``verify_sync`` off, or a sync ``verify_every`` skips).

        Raises:
            WeightMismatchError: a server's weights are not the trainer's after the sync.
            ProbeMismatchError: the servers' log-probs of a fixed sequence differ from the
                trainer's by more than ``verify_tolerance``.
            WeightSyncError: a server refused the update, or the log-probs differ
                by more than ``verify_tolerance``.
        """
        self._syncs += 1
        restarts = sum(e.restarts for e in self.sync_endpoints)
        retries = 0
        while True:
            error: Exception | None = None
            self._held = None
            try:
                targets, metrics = self._push(weights)
                metrics |= self._verified(weights, targets)
                failure = "a server died during it"  # the sync went on without it
            except (WeightMismatchError, ProbeMismatchError):
                raise  # the servers answered: their weights or outputs are wrong
            except (WeightSyncError, RequestError) as exc:
                failure, error = str(exc), exc
            error = self._agreed(error)
            if error is not None:
                failure = str(error)
            again, restarts = self._restarted_for_resync(failure, restarts, retries)
            if again:
                retries += 1
                continue
            if error is not None:
                raise error
            metrics["weight_sync/retries"] = float(retries)
            return metrics

    def _on_servers(self, call: Any, *args: Any, default: Any = None) -> Any:
        """``call(*args)``: the main process's server I/O inside a sync.

        Alone, a failure raises at once. With several processes the others are inside
        the sync's collectives (the weight export, the checks' gathers, the closing
        barrier), which the main process must still join: its first failure is held
        (``self._held``), every later server call of the sync is skipped (``default``
        returned), and :meth:`_agreed` settles it on every process at the end.
        """
        if self._held is not None:
            return default
        try:
            return call(*args)
        except (WeightSyncError, RequestError, WeightMismatchError, ProbeMismatchError) as exc:
            if self.world == 1:
                raise
            self._held = exc
            return default

    def _agreed(self, error: Exception | None) -> Exception | None:
        """The sync's failure as every process sees it: ``error`` alone; with several
        processes the main process's held one, sent to all. A mismatch (the servers
        answered with wrong weights or outputs) is raised here on every process; a
        failed request is returned, for a restart to be tried."""
        if self.world == 1:
            return error
        held = self._held or error  # one raised past _on_servers counts the same
        self._held = None
        kind, message = comm.broadcast_object(
            (type(held).__name__, str(held)) if self.rank == 0 and held is not None else None
        ) or (None, None)
        if kind is None:
            return None
        if self.rank == 0 and held is not None:
            if isinstance(held, WeightMismatchError | ProbeMismatchError):
                raise held
            return held
        for mismatch in (WeightMismatchError, ProbeMismatchError):
            if kind == mismatch.__name__:
                raise mismatch(message)
        return WeightSyncError(message)

    def _restarted_for_resync(self, failure: str, restarts: int, retries: int) -> tuple[bool, int]:
        """After a sync (that failed with ``failure``, or went on without a server): whether
        a server died during it and has been restarted by the
        :class:`~rlkit.rollout.servers.pool.ServerPool`, so that the same weights are pushed
        to every server again and checked; and the restarts counted so far. The main
        process decides (it alone owns the servers) and tells the others."""
        again, now = False, restarts
        if self.rank == 0:
            again, now = self._restarted(failure, restarts, retries)
        if self.world > 1:
            again, now = comm.broadcast_object((again, now))
        return again, now

    def _restarted(self, failure: str, restarts: int, retries: int) -> tuple[bool, int]:
        for endpoint in self.sync_endpoints:  # restarts whichever died (live ones stay)
            if endpoint.server is not None and not endpoint.server.alive:
                self.pool.report_failure(endpoint, f"died during a weight sync: {failure}")
        now = sum(e.restarts for e in self.sync_endpoints)
        if now == restarts:
            return False, now
        self.pool.wait_restarts()
        if retries >= max(1, self.pool.max_restarts) or not any(
            e.healthy for e in self.sync_endpoints
        ):
            return False, now
        logger.warning(
            "weight sync to version %s: %s; a %s server was restarted: syncing the same "
            "weights to every server again",
            self.expected_version,
            failure.splitlines()[0][:300],
            self.server_name,
        )
        return True, now

    def _push(self, weights: PolicyWeights) -> tuple[list[Endpoint], dict[str, float]]:
        self._check_open()
        version = str(weights.version)
        start = time.perf_counter()
        targets: list[Endpoint] = []
        if self.rank == 0:
            targets = self._on_servers(self._sync_targets, default=[])
        self._load(weights, version, targets)
        if self.rank == 0 and self._held is None:
            self.pool.mark_synced(targets)
        else:  # process 0 synced every server: whatever this process saw as stale is current
            self.pool.mark_synced(self.pool.endpoints)
        self.expected_version = version
        return targets, {"timing_s/weight_sync": time.perf_counter() - start}

    def _sync_targets(self) -> list[Endpoint]:
        self.pool.wait_restarts()
        targets = [e for e in self.sync_endpoints if e.healthy or e.stale]
        if not targets:
            raise WeightSyncError(f"no healthy {self.server_name} server to sync weights to")
        return targets

    def _verified(self, weights: PolicyWeights, targets: list[Endpoint]) -> dict[str, float]:
        due = (
            self.verify_sync
            and self.verify_every > 0
            and (self._syncs == 1 or (self._syncs - 1) % self.verify_every == 0)
        )
        metrics = {"timing_s/weight_check": 0.0, "weight_sync/params_checked": 0.0}
        if due and self.weight_check != "none":
            start = time.perf_counter()
            metrics["weight_sync/params_checked"] = float(self._check_weights(weights, targets))
            metrics["timing_s/weight_check"] = time.perf_counter() - start
        start = time.perf_counter()
        metrics["weight_sync/logprob_max_abs_diff"] = (
            self._verify(weights, targets) if due else float("nan")
        )
        metrics["timing_s/weight_sync_verify"] = time.perf_counter() - start
        comm.barrier()
        return metrics

    def check_weights(self, weights: PolicyWeights) -> int:
        """Compare every server's weights with ``weights`` now, outside a sync (as
        ``rlkit diagnose`` does before the first sync); return how many groups or slices
        were compared (0 when this engine has no weight check).

        Raises:
            WeightMismatchError: a server holds other weights.
        """
        if self.weight_check == "none":
            return 0
        targets = list(self.sync_endpoints) if self.rank == 0 else []
        return self._check_weights(weights, targets, when="checked outside a sync")

    def _check_weights(
        self, weights: PolicyWeights, targets: list[Endpoint], when: str | None = None
    ) -> int:
        """Compare every target's weights with the trainer's (``weight_check``); return
        how many groups or slices were compared. A collective under FSDP (the trainer's
        tensors are gathered)."""
        dtype = weight_check.server_dtype(self.server_dtype)
        if self.weight_check == "checksums":
            expected: dict[str, Any] = weight_check.group_checksums(weights.named_tensors(), dtype)
        else:
            named = [(n, t) for n, t in weights.named_tensors() if t.is_floating_point()]
            names = set(weight_check.slice_names([n for n, _ in named]))
            expected = {n: weight_check.slice_of(t, dtype) for n, t in named if n in names}
        if self.rank != 0:
            return 0
        self._on_servers(self._compare_served, expected, targets, when)
        return len(expected)

    def _compare_served(
        self, expected: dict[str, Any], targets: list[Endpoint], when: str | None
    ) -> None:
        """Read the targets' checksums or slices and compare them with ``expected``.

        Raises:
            WeightMismatchError: a target differs.
        """
        if self.weight_check == "checksums":
            served = self._run(self._gather([self._served_checksums(e) for e in targets]))
            mismatches = weight_check.checksum_mismatches
        else:
            names, length = list(expected), weight_check.SLICE_LENGTH
            served = self._run(
                self._gather([self._served_slices(e, names, length) for e in targets])
            )
            mismatches = weight_check.slice_mismatches
        problems = [(e.url, mismatches(expected, got)) for e, got in zip(targets, served)]
        bad = [(url, lines) for url, lines in problems if lines]
        if not bad:
            return
        url, lines = bad[0]
        shown = "; ".join(lines[:4]) + (f"; and {len(lines) - 4} more" if len(lines) > 4 else "")
        when = when or f"after syncing weight version {self.expected_version} by {self.sync_method}"
        raise WeightMismatchError(
            f"{when}, the {self.server_name} server {url} does not hold the trainer's weights "
            f"({self.weight_check} compared, {len(lines)} of {len(expected)} differ: {shown}). "
            f"The sync did not reach the server (or reached part of it): check the "
            f"server's log and the parameter names it loads."
            + (f" {len(bad) - 1} more server(s) differ too." if len(bad) > 1 else "")
        )

    def _verify(self, weights: PolicyWeights, targets: list[Endpoint]) -> float:
        vocab = self.vocab_size
        with weights.generation_context() as (model, _):  # a collective under FSDP
            vocab = vocab or int(model.config.vocab_size)
            probe = logprob_check.probe_token_ids(vocab)
            reference = logprob_check.trainer_log_probs(model, probe)
        if self.rank != 0:
            return float("nan")
        return self._on_servers(self._probe_served, probe, reference, targets, default=math.nan)

    def _probe_served(
        self, probe: list[int], reference: list[float], targets: list[Endpoint]
    ) -> float:
        """The largest difference between the targets' log-probs of ``probe`` and the
        trainer's ``reference``.

        Raises:
            ProbeMismatchError: past ``verify_tolerance``.
        """
        served = self._run(self._gather([self._served_log_probs(e, probe) for e in targets]))
        worst = max(logprob_check.max_abs_diff(s, reference) for s in served)
        tolerance = self.verify_tolerance
        if tolerance is None:
            tolerance = 1e-3 if self.server_dtype == "float32" else 0.1
        if not worst <= tolerance:
            raise ProbeMismatchError(
                f"after syncing weight version {self.expected_version} by {self.sync_method}, "
                f"the servers' log-probs of a "
                f"fixed sequence differ from the trainer's by up to {worst:.3g} (tolerance "
                f"{tolerance:g}): the sync did not take effect, or the server computes in another "
                f"dtype. Pass verify_tolerance=... to accept this, or check the parameter names."
                + self.sync_mismatch_hint
            )
        return worst

    # ------------------------------------------------------------------ plumbing
    async def _all(
        self,
        targets: list[Endpoint],
        path: str,
        body: dict[str, Any] | None,
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
            raise WeightSyncError(f"{e.url}{path} failed: {message}")
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
        if not self._thread.is_alive():  # a stopped loop would never answer
            coro.close()
            raise RuntimeError(f"this {type(self).__name__}'s event loop has stopped")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _submit(self, coro: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"this {type(self).__name__} is closed; create a new one")

    def restarted_servers(self) -> list[str]:
        return self.pool.restart_lines()

    def _close_transfer(self) -> None:
        """Release what the weight transfer holds (a process group); called by close."""

    def close(self) -> None:
        """Stop started servers, the weight transfer and the event loop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._close_transfer()
        with contextlib.suppress(Exception):
            self._run(self.client.close())
        self.pool.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class ServerTurns(TurnGenerator):
    """Turns on servers: each trajectory's turn is a request of its own, so a trajectory
    waiting for its tool never holds up another's request."""

    def __init__(self, engine: ServerRolloutEngine, params: SamplingParams) -> None:
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


def check_prompts(prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> list[list[int]]:
    """``prompt_ids`` as lists of ints, after checking them and ``params``.

    Raises:
        ValueError: an empty prompt, or a sampling parameter out of range.
    """
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


def _check_pool_options(
    servers: Sequence[ServerLaunch],
    urls: Sequence[str],
    router_url: str | None,
    max_concurrency: int,
    max_retries: int,
    keep_snapshots: int,
) -> None:
    if not servers and not urls and not router_url:
        raise ValueError(
            "a server engine needs servers: give model_path (servers are started), urls=[...] "
            "(servers you started) or router_url=... (a router)"
        )
    if router_url and not urls and not servers:
        raise ValueError(
            "with router_url, also give urls=[...] of the workers behind it: weights are synced "
            "to each worker directly"
        )
    if max_concurrency < 1 or max_retries < 0 or keep_snapshots < 1:
        raise ValueError(
            f"need max_concurrency >= 1, max_retries >= 0, keep_snapshots >= 1; got "
            f"{max_concurrency}, {max_retries}, {keep_snapshots}"
        )
