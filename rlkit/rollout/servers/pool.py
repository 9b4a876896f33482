"""The set of server endpoints a rollout is spread over: load balancing and health.

Each :class:`Endpoint` is a URL, optionally with the :class:`ManagedServer` this
process owns behind it. Requests go to the healthy endpoint with the fewest
requests in flight (ties: round robin). An endpoint that fails a request is taken
out of rotation; an owned server whose process died is restarted in the
background (at most ``max_restarts`` times) and rejoins once healthy and, for
weight-sync modes that cannot reload from disk, once re-synced; an attached
server (a URL) rejoins when ``/health`` answers again.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from rlkit.rollout.servers.process import ManagedServer, http_ok

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Endpoint:
    """One server URL and its state."""

    url: str
    server: ManagedServer | None = None
    healthy: bool = True
    stale: bool = False  # restarted with old weights: out of rotation until the next sync
    restarting: bool = False
    restarts: int = 0
    inflight: int = 0
    failures: int = 0
    served: int = 0
    last_error: str = ""
    _restart_future: Future[None] | None = field(default=None, repr=False)

    @property
    def usable(self) -> bool:
        """Healthy, holding the current weights and not restarting."""
        return self.healthy and not self.stale and not self.restarting


class ServerPool:
    """Endpoints plus the policy for picking, failing and restarting them.

    Args:
        endpoints: the servers (owned or attached).
        restart_dead_servers: restart an owned server whose process died.
        max_restarts: restarts allowed per owned server.
        restart_args: called at restart time; returns ``(model_path, weight_version)``
            for the new process (``None`` to keep the launch config's) and whether
            the restarted server is stale (must be re-synced before use).
    """

    def __init__(
        self,
        endpoints: list[Endpoint],
        *,
        restart_dead_servers: bool = True,
        max_restarts: int = 2,
        restart_args: Callable[[], tuple[str | None, str | None, bool]] | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("ServerPool needs at least one endpoint")
        self.endpoints = endpoints
        self.restart_dead_servers = restart_dead_servers
        self.max_restarts = max_restarts
        self.restart_args = restart_args or (lambda: (None, None, False))
        self._lock = threading.Lock()
        self._rr = itertools.count()
        # One long-lived thread: servers restarted here die with it (PR_SET_PDEATHSIG).
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="server-restart")
        self._closing = False

    # -- picking ---------------------------------------------------------------
    def acquire(self) -> Endpoint | None:
        """The usable endpoint with the fewest requests in flight (counted as one more)."""
        with self._lock:
            usable = [e for e in self.endpoints if e.usable]
            if not usable:
                return None
            start = next(self._rr) % len(usable)
            rotated = usable[start:] + usable[:start]
            best = min(rotated, key=lambda e: e.inflight)
            best.inflight += 1
            return best

    def release(self, endpoint: Endpoint, *, ok: bool) -> None:
        """One request to ``endpoint`` ended (``ok``: it returned a usable answer)."""
        with self._lock:
            endpoint.inflight -= 1
            if ok:
                endpoint.served += 1

    def usable(self) -> list[Endpoint]:
        """The endpoints in rotation now."""
        with self._lock:
            return [e for e in self.endpoints if e.usable]

    def recoverable(self) -> bool:
        """True if some endpoint is usable now or may become usable (restarting)."""
        with self._lock:
            return any(e.usable or e.restarting for e in self.endpoints)

    # -- failures ----------------------------------------------------------------
    def report_failure(self, endpoint: Endpoint, error: str) -> None:
        """Take ``endpoint`` out of rotation; restart it if it is an owned server that died
        or stopped answering ``/health`` (attached ones rejoin via :meth:`recheck`)."""
        with self._lock:
            endpoint.failures += 1
            endpoint.last_error = error
            if endpoint.restarting:
                return
        owned = endpoint.server is not None
        dead = owned and not endpoint.server.alive  # type: ignore[union-attr]
        # A timeout or 5xx from a live server: keep it only if it still answers /health.
        healthy = not dead and http_ok(endpoint.url + "/health", timeout_s=5.0)
        with self._lock:
            endpoint.healthy = healthy
            if healthy or not owned or endpoint.restarting or self._closing:
                return
            if self.restart_dead_servers and endpoint.restarts < self.max_restarts:
                endpoint.restarting = True
                endpoint.restarts += 1
                endpoint._restart_future = self._executor.submit(self._restart, endpoint)

    def _restart(self, endpoint: Endpoint) -> None:
        """Restart ``endpoint``'s server; a restart that fails (the new server dies while
        starting) is tried again while the endpoint has restarts left."""
        while not self._closing:
            logger.warning(
                "%s server %s is down (%s); restart %d of %d",
                endpoint.server.config.server_name if endpoint.server else "",
                endpoint.url,
                endpoint.last_error,
                endpoint.restarts,
                self.max_restarts,
            )
            model_path, version, stale = self.restart_args()
            try:
                assert endpoint.server is not None
                endpoint.server.restart(model_path=model_path, weight_version=version)
            except Exception as exc:
                with self._lock:
                    endpoint.last_error = f"restart failed: {exc}"
                    if endpoint.restarts < self.max_restarts and not self._closing:
                        endpoint.restarts += 1
                        continue
                    endpoint.restarting = False  # out of restarts: the pool is smaller
                    endpoint.healthy = False
                return
            with self._lock:
                endpoint.healthy = True
                endpoint.stale = stale
                endpoint.restarting = False
            return

    def recheck(self) -> None:
        """Put attached endpoints that answer ``/health`` again back into rotation."""
        for e in self.endpoints:
            if not e.healthy and not e.restarting and e.server is None:
                ok = http_ok(e.url + "/health", timeout_s=5.0)
                with self._lock:
                    e.healthy = ok

    def wait_restarts(self, timeout_s: float | None = None) -> None:
        """Block until every restart in progress has finished."""
        for e in self.endpoints:
            fut = e._restart_future
            if fut is not None:
                fut.result(timeout=timeout_s)

    def mark_synced(self, endpoints: list[Endpoint]) -> None:
        """``endpoints`` hold the current weights again (back into rotation if healthy)."""
        with self._lock:
            for e in endpoints:
                e.stale = False

    def stats(self) -> dict[str, float]:
        """Counts for the metrics log."""
        with self._lock:
            return {
                "rollout/servers_usable": float(sum(e.usable for e in self.endpoints)),
                "rollout/server_restarts": float(sum(e.restarts for e in self.endpoints)),
            }

    def restart_lines(self) -> list[str]:
        """``"URL (restarted k of n: last error)"`` for every endpoint restarted so far."""
        with self._lock:
            return [
                f"{e.url} (restarted {e.restarts} of {self.max_restarts}: {e.last_error})"
                for e in self.endpoints
                if e.restarts
            ]

    def close(self) -> None:
        """Stop owned servers for good (a restart in progress fails fast) and the restart thread."""
        self._closing = True
        for e in self.endpoints:
            if e.server is not None:
                e.server.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
