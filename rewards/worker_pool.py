"""Worker processes that score one reward, each call under a deadline.

A hung call (a pathological answer that sends SymPy into a C loop, a reward
that sleeps) cannot be interrupted inside a process, so each worker runs in its
own process: when a call overruns, its worker is killed and a fresh one takes
its place; the call is reported as a timeout and the other calls go on. A
worker that dies (segfault, out of memory) costs its call an error, never the
batch. Workers are bound to one reward, resolved while the worker starts, so
that importing the reward's module does not eat into the first call's limit.

Processes are started with ``spawn`` (safe next to CUDA and threads). As with
any ``spawn`` pool, a script that uses it must guard its entry point with
``if __name__ == "__main__":``, and a callable reward must be importable
(a module-level function or a ``functools.partial`` of one, not a lambda).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from rlkit.registry import REWARDS

RewardSpec = str | Callable[..., Any]
DEADLINE_MESSAGE = "the batch's deadline passed before this call finished"
Call = tuple[str, str, Mapping[str, Any]]


@dataclass(frozen=True)
class CallResult:
    """The outcome of one reward call.

    Attributes:
        status: ``"ok"``, ``"error"`` (the reward raised, or its worker died) or ``"timeout"``.
        value: what the reward returned (``status == "ok"`` only).
        message: why the call failed (``""`` when it did not).
    """

    status: str
    value: Any = None
    message: str = ""


def _serve(conn: Connection, payload: bytes) -> None:
    """Worker loop: resolve the reward, then answer calls until told to stop."""
    try:
        spec = pickle.loads(payload)
        reward = REWARDS.get(spec) if isinstance(spec, str) else spec
    except BaseException as exc:  # report anything, the parent raises it
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready",))
    try:
        while (task := conn.recv()) is not None:
            index, response, ground_truth, extra = task
            try:
                value = reward(response, ground_truth, **extra)
                conn.send((index, "ok", value))  # pickles first: a failure sends nothing
            except Exception as exc:
                conn.send((index, "error", f"{type(exc).__name__}: {exc}"))
    except (EOFError, OSError, KeyboardInterrupt):
        return  # the parent is gone or interrupted: nothing left to answer


@dataclass
class _Worker:
    process: Any
    conn: Connection
    started: float
    ready: bool = False
    task: int | None = None
    deadline: float = float("inf")
    batch_deadline_binds: bool = False  # the batch's deadline comes before the call's own


@dataclass
class RewardWorkerPool:
    """``num_workers`` processes scoring calls of one reward in parallel.

    Args:
        reward: a registered reward name, a ``"pkg.module:function"`` path, or a
            picklable callable with the reward contract.
        num_workers: number of worker processes (>= 1).
        start_timeout_s: how long a worker may take to start before the pool
            gives up with an error.
    """

    reward: RewardSpec
    num_workers: int
    start_timeout_s: float = 120.0
    _payload: bytes = field(init=False, repr=False)
    _workers: list[_Worker] = field(init=False, default_factory=list, repr=False)
    # Rollouts generated ahead score in several threads; the workers' pipes carry one
    # batch at a time.
    _lock: threading.Lock = field(
        init=False, default_factory=threading.Lock, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.num_workers, int) or self.num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, got {self.num_workers!r}")
        if isinstance(self.reward, str):
            REWARDS.get(self.reward)  # unknown names fail here, with the known names listed
        try:
            self._payload = pickle.dumps(self.reward)
        except Exception as exc:
            raise TypeError(
                f"reward {self.reward!r} cannot be sent to a worker process ({exc}). Use a "
                f"registered name, a module-level function or a functools.partial of one, "
                f"or score in-process with num_workers=0."
            ) from exc

    def __enter__(self) -> RewardWorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def map(
        self, calls: Sequence[Call], timeout_s: float | None, *, deadline_s: float | None = None
    ) -> list[CallResult]:
        """Run every call; return one :class:`CallResult` per call, in order.

        Args:
            calls: ``(response, ground_truth, extra)`` triples.
            timeout_s: limit per call in seconds, counted from when a worker
                receives it; ``None`` for none.
            deadline_s: seconds, from when the first worker is ready (starting
                processes is not the reward's time), by which every call must be done:
                calls still running then are timeouts (their workers replaced), calls
                not yet sent are timeouts without running.

        Returns:
            The results, ``len(calls)`` of them, in the order of ``calls``.

        Raises:
            RuntimeError: a worker could not load the reward or did not start in time.
        """
        with self._lock:
            return self._map(calls, timeout_s, deadline_s)

    def _map(
        self, calls: Sequence[Call], timeout_s: float | None, deadline_s: float | None
    ) -> list[CallResult]:
        results: list[CallResult | None] = [None] * len(calls)
        queue = deque(range(len(calls)))
        try:
            while len(self._workers) < self.num_workers:
                self._workers.append(self._start_worker())
            deadline = None
            while queue or any(w.task is not None for w in self._workers):
                if deadline is None and deadline_s is not None and self._any_ready():
                    deadline = time.monotonic() + deadline_s
                if deadline is not None and time.monotonic() >= deadline:
                    while queue:  # the batch's time is up: the rest are never sent
                        results[queue.popleft()] = CallResult("timeout", message=DEADLINE_MESSAGE)
                self._dispatch(queue, calls, timeout_s, results, deadline)
                self._collect(results)
                self._expire(results)
        except BaseException:
            # Interrupted (Ctrl-C, a fatal worker): calls may still be in flight, and
            # their late answers must not land in the next batch. Start afresh.
            self.close()
            raise
        return [r if r is not None else CallResult("error", message="lost") for r in results]

    def close(self) -> None:
        """Stop every worker (politely, then by force)."""
        for worker in self._workers:
            with contextlib.suppress(OSError):  # already dead: killed below
                worker.conn.send(None)
        for worker in self._workers:
            worker.process.join(timeout=2.0)
            self._stop(worker)
        self._workers.clear()

    # -- internals --------------------------------------------------------
    def _any_ready(self) -> bool:
        return any(w.ready for w in self._workers)

    def _start_worker(self) -> _Worker:
        ctx = multiprocessing.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe()
        process = ctx.Process(target=_serve, args=(child_conn, self._payload), daemon=True)
        process.start()
        child_conn.close()  # so that the parent sees EOF when the worker dies
        return _Worker(process, parent_conn, time.monotonic())

    def _stop(self, worker: _Worker) -> None:
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(timeout=5.0)
        worker.conn.close()

    def _replace(self, worker: _Worker) -> None:
        self._stop(worker)
        self._workers[self._workers.index(worker)] = self._start_worker()

    def _dispatch(
        self,
        queue: deque[int],
        calls: Sequence[Call],
        timeout_s: float | None,
        results: list[CallResult | None],
        deadline: float | None = None,
    ) -> None:
        for worker in list(self._workers):
            if not (worker.ready and worker.task is None and queue):
                continue
            index = queue.popleft()
            response, ground_truth, extra = calls[index]
            try:
                worker.conn.send((index, response, ground_truth, dict(extra)))
            except OSError:  # died while idle: not this call's fault
                queue.appendleft(index)
                self._replace(worker)
                continue
            except Exception as exc:  # unpicklable extras: nothing was sent
                message = f"cannot send the call to a worker: {type(exc).__name__}: {exc}"
                results[index] = CallResult("error", message=message)
                continue
            worker.task = index
            own = time.monotonic() + timeout_s if timeout_s else float("inf")
            batch = float("inf") if deadline is None else deadline
            worker.deadline = min(own, batch)
            worker.batch_deadline_binds = batch < own

    def _collect(self, results: list[CallResult | None]) -> None:
        now = time.monotonic()
        deadlines = [w.deadline for w in self._workers if w.task is not None]
        wake = min([*deadlines, now + 1.0]) - now  # poll at least each second for start-up
        by_conn = {w.conn: w for w in self._workers}
        for conn in wait(list(by_conn), timeout=max(wake, 0.0)):
            worker = by_conn[conn]
            try:
                message = conn.recv()
            except (EOFError, OSError):
                self._on_death(worker, results)
                continue
            self._on_message(worker, message, results)

    def _on_message(
        self, worker: _Worker, message: tuple, results: list[CallResult | None]
    ) -> None:
        if message[0] == "ready":
            worker.ready = True
        elif message[0] == "fatal":
            self.close()
            raise RuntimeError(f"reward worker could not load {self.reward!r}: {message[1]}")
        else:
            index, status, payload = message
            ok = status == "ok"
            results[index] = CallResult(status, payload if ok else None, "" if ok else payload)
            worker.task, worker.deadline = None, float("inf")

    def _on_death(self, worker: _Worker, results: list[CallResult | None]) -> None:
        worker.process.join(timeout=5.0)
        if worker.task is not None:
            code = worker.process.exitcode
            results[worker.task] = CallResult("error", message=f"worker died (exit code {code})")
        elif not worker.ready:
            self.close()
            raise RuntimeError(f"reward worker for {self.reward!r} died while starting")
        self._replace(worker)

    def _expire(self, results: list[CallResult | None]) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.task is not None and now >= worker.deadline:
                message = DEADLINE_MESSAGE if worker.batch_deadline_binds else "time limit exceeded"
                results[worker.task] = CallResult("timeout", message=message)
                self._replace(worker)
            elif not worker.ready and now - worker.started > self.start_timeout_s:
                self.close()
                raise RuntimeError(
                    f"reward worker for {self.reward!r} did not start within "
                    f"{self.start_timeout_s} s; is the machine overloaded?"
                )
