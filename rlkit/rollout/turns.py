"""Turn-level generation: each trajectory of a multi-turn loop asks for its own next turn.

A multi-turn agent loop runs one coroutine per trajectory. When a trajectory needs
the policy to speak, it awaits :meth:`TurnGenerator.generate` with its whole context
as token ids (prompt, earlier turns, tool and user messages) and its own token
budget; meanwhile other trajectories wait for their tools or decode. How turns are
batched is the engine's business:

* :class:`BatchedTurns` (any engine): the turns asked for while the engine was busy
  are sent together in one :meth:`RolloutEngine.generate` call, which runs in a
  worker thread so tools keep running. Each turn prefills its whole context again.
* The embedded engine continues each trajectory's KV cache across turns
  (:mod:`rlkit.rollout.embedded.continuous_decode`); SGLang sends each turn as its own
  request (:class:`rlkit.rollout.servers.engine.ServerTurns`), the server's prefix
  cache reusing the context.

Every engine's :meth:`RolloutEngine.turns` returns its generator; the default is
:class:`BatchedTurns`. Usage (what :func:`rlkit.rollout.agent_loop.tool_agent` does)::

    turns = engine.turns(params)
    result = run_turns(turns, main())  # main() awaits turns.generate(...) per row

This module imports nothing of :mod:`rlkit.rollout.base`, which imports it for that
default: an engine here is anything with ``generate`` (:class:`BatchGenerator`).
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import functools
from collections.abc import Awaitable, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from rlkit.rollout.sampling import RolloutBatch, SamplingParams

T = TypeVar("T")


class BatchGenerator(Protocol):
    """What :class:`BatchedTurns` needs of an engine: its ``generate``
    (:meth:`rlkit.rollout.base.RolloutEngine.generate`)."""

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams
    ) -> RolloutBatch: ...


@dataclass
class TurnResult:
    """One policy turn: the sampled ids, their log-probs, and why the turn ended.

    ``finish_reason`` is ``"stop"`` (a stop token, kept in ``response_ids``) or
    ``"length"`` (the turn's ``max_new_tokens`` ran out).
    """

    response_ids: list[int]
    log_probs: list[float]
    finish_reason: str
    versions: list[int | None] | None = None
    """The weights version of each token, from an engine that updates weights under a
    running turn (``None``: the version the trajectory samples with)."""


class TurnGenerator(abc.ABC):
    """Generates one turn at a time for many concurrent trajectories.

    ``key`` names a trajectory for the life of :func:`run_turns`: an engine may keep
    what it knows about the trajectory's context (its KV cache) under it until
    :meth:`release`. Turns are sampled with the ``SamplingParams`` the generator was
    made with, one sample per call.
    """

    def __init__(self, params: SamplingParams) -> None:
        self.params = replace(params, n=1)
        self.metrics: dict[str, float] = {}

    @abc.abstractmethod
    async def generate(
        self, key: int, context_ids: list[int], max_new_tokens: int, images: Any = None
    ) -> TurnResult:
        """The next policy turn after ``context_ids`` (the trajectory's whole context);
        ``images``: an image prompt's model inputs, for a generator that takes them
        (:class:`BatchedTurns` over an engine that does)."""

    def release(self, key: int) -> None:  # noqa: B027 - optional: most generators keep nothing
        """The trajectory ``key`` will ask for no more turns: free what is kept for it."""

    async def run(self, main: Awaitable[T]) -> T:
        """Run ``main`` (the trajectories) with whatever drives generation beside it."""
        return await main

    def add_metrics(self, metrics: dict[str, float]) -> None:
        """Sum engine-side numbers (e.g. ``rollout/num_retries``) over the turns."""
        for key, value in metrics.items():
            if key.startswith("rollout/") and key.endswith("_per_s"):
                continue  # a rate per call does not add up over calls
            self.metrics[key] = self.metrics.get(key, 0.0) + value


@dataclass
class _Pending:
    context_ids: list[int]
    max_new_tokens: int
    future: asyncio.Future[TurnResult]
    images: Any = None


class BatchedTurns(TurnGenerator):
    """Turns of any engine, batched through its ``generate``.

    The turns asked for since the last call go together, grouped by budget (one
    ``generate`` per distinct ``max_new_tokens``), in a worker thread. With ``synced``
    (an in-process engine under FSDP) every process calls ``generate`` equally often,
    with nothing to generate when it has no turn waiting, until all are done.
    """

    def __init__(
        self, engine: BatchGenerator, params: SamplingParams, synced: bool = False
    ) -> None:
        super().__init__(params)
        self.engine, self.synced = engine, synced
        self._pending: list[_Pending] = []
        self._wake = asyncio.Event()

    async def generate(
        self, key: int, context_ids: list[int], max_new_tokens: int, images: Any = None
    ) -> TurnResult:
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(list(context_ids), max_new_tokens, future, images))
        self._wake.set()
        return await future

    async def run(self, main: Awaitable[T]) -> T:
        task = asyncio.ensure_future(main)
        loop = asyncio.get_running_loop()
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="turns") as worker:
            while True:
                await asyncio.sleep(0)  # let every ready trajectory ask for its turn
                if not await self._anyone(not task.done()):
                    break
                if not self._pending and not self.synced:
                    self._wake.clear()
                    waiter = asyncio.ensure_future(self._wake.wait())
                    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    continue
                batch, self._pending = self._pending, []
                await self._flush(batch, worker, loop)
        return task.result()

    async def _anyone(self, flag: bool) -> bool:
        if not self.synced:
            return flag
        from rlkit.distributed.collectives import same_everywhere

        return same_everywhere(int(flag), "max") == 1

    async def _flush(self, batch: list[_Pending], worker: Any, loop: Any) -> None:
        calls = [
            (budget, [p for p in batch if p.max_new_tokens == budget])
            for budget in sorted({p.max_new_tokens for p in batch})
        ]
        if self.synced:  # every process makes as many generate calls as the busiest one
            from rlkit.distributed.collectives import same_everywhere

            calls += [(1, [])] * (same_everywhere(len(calls), "max") - len(calls))
            if not batch:
                await asyncio.sleep(0.005)  # only tools are running here: do not spin
        for budget, members in calls:
            params = replace(self.params, max_new_tokens=budget)
            prompts = [p.context_ids for p in members]
            images = [p.images for p in members]
            # Only turns of image prompts pass images: other engines are never asked to.
            call = (
                functools.partial(self.engine.generate, multimodal=images)
                if any(i is not None for i in images)
                else self.engine.generate
            )
            try:
                got = await loop.run_in_executor(worker, call, prompts, params)
            except BaseException as exc:
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                raise
            self.add_metrics(got.metrics)
            for j, p in enumerate(members):
                p.future.set_result(
                    TurnResult(got.response_ids[j], got.rollout_log_probs[j], got.finish_reasons[j])
                )


class WrappableEngine(BatchGenerator, Protocol):
    """What :class:`GenerateOnly` forwards to: a :class:`~rlkit.rollout.base.RolloutEngine`."""

    counters: tuple[str, ...]
    gauges: tuple[str, ...]

    def sync_weights(self, weights: Any) -> dict[str, float]: ...

    def close(self) -> None: ...


class GenerateOnly:
    """An engine seen through ``generate`` and ``sync_weights`` only, so its turns go
    through :class:`BatchedTurns` (every turn prefills its context again): the baseline
    that an engine's own turn generator is compared with.

    It stands in for a :class:`~rlkit.rollout.base.RolloutEngine` without being one (this
    module is below that interface), declaring the wrapped engine's metric names.
    """

    def __init__(self, engine: WrappableEngine) -> None:
        self.engine = engine
        self.counters: tuple[str, ...] = engine.counters
        self.gauges: tuple[str, ...] = engine.gauges

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutBatch:
        return self.engine.generate(prompt_ids, params)

    def turns(self, params: SamplingParams) -> TurnGenerator:
        return BatchedTurns(self, params)

    def sync_weights(self, weights: Any) -> dict[str, float]:
        return self.engine.sync_weights(weights)

    def close(self) -> None:
        self.engine.close()


def run_turns(turns: TurnGenerator, main: Coroutine[Any, Any, T]) -> T:
    """Run the coroutine ``main`` with ``turns`` to completion, from synchronous code.

    Works also where an event loop is already running (a Jupyter notebook): there the
    loop runs in a worker thread.
    """

    async def both() -> T:
        return await turns.run(main)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(both())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="turns-loop") as pool:
        return pool.submit(asyncio.run, both()).result()
