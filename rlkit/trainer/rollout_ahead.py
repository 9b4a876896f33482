"""Rollouts ahead of the trainer: later steps' batches are generated while this one trains.

``TrainerConfig.rollout_mode = "one_step_off"`` and ``"async"`` wrap the
:class:`RolloutSource` of a synchronous run in a :class:`RolloutAhead` of some ``depth``
(1 for ``one_step_off``; ``max_staleness // u`` for ``async``, ``u`` the optimizer steps
of one step). The step asks it for a batch exactly as it asks the source; ``sync`` is the
source alone. The order of events, for depth ``d``::

    step k:  wait for batch k
             copy weights k (host memory) and close the weight gate; in a thread:
             wait for the generation calls running to finish, push the copy to the
             engine, open the gate
             draw the prompts of steps up to k+d; start generating each in a thread
             (its calls start once the gate is open: they sample from weights k)
             train on batch k                    # -> weights k+1, the copy untouched
    step k+1: ...

Generation never waits for the trainer except at the depth bound and during a sync.
Calls running when new weights arrive either finish under the weights they started with
while the sync waits for them (``partial_rollout = "finish"``), or are paused, synced and
continued under the new weights (``"continue"``; the engine reports each token's
version). Batch ``k+d``'s tokens come from weights ``k`` or newer and train at weights
``k+d``: at most ``d * u <= max_staleness`` versions old, which every step checks and
logs as ``async/staleness/{mean,max}``. In ``async`` each prompt is its own generation
call, so a sync waits for the calls running, not for whole batches. The recorded rollout
log-probs make the lag correctable with the rollout corrections
(``AlgorithmConfig.rollout_is_level``).

What a stop keeps: a checkpoint records the prompt sampler's position before the earliest
batch in flight was drawn, so a resumed run generates the batches in flight again (they
are regenerated, not restored), from the checkpoint's weights; no prompt is lost or
trained twice. Validation first syncs the newest weights, so it always scores the weights
it reports.

Only engines that sample from their own copy of the weights (servers) can run ahead of the
trainer: the registry entry says so with ``holds_own_weights=True``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future
from typing import Any

from rlkit.trainer.batch import TrainBatch
from rlkit.trainer.prompts import PromptSet
from rlkit.trainer.rollout_source import RolloutSource
from rlkit.trainer.scoring import ScoredRollout
from rlkit.trainer.timing import PhaseTimer

Rollout = tuple[TrainBatch | None, dict[str, float], dict[str, float]]
"""A step's batch, its rollout metrics, and the seconds of its rollout phases."""


class RolloutAhead:
    """A :class:`RolloutSource` whose next batches are generated during the current update.

    Args:
        source: the synchronous source it runs ahead with.
        total_steps: the run's last step (nothing is generated past it).
        depth: how many steps' batches are generated ahead of the one training (1:
            ``one_step_off``).
        max_staleness: the bound on ``async/staleness/max`` it guarantees (``None``: not
            checked).
        partial_rollout: ``finish`` (a sync waits for the generation calls running) or
            ``continue`` (they are paused, synced and continued under the new weights).
    """

    def __init__(
        self,
        source: RolloutSource,
        total_steps: int,
        depth: int = 1,
        max_staleness: int | None = None,
        partial_rollout: str = "finish",
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.source = source
        self.total_steps = total_steps
        self.depth = depth
        self.max_staleness = max_staleness
        self.in_flight_sync = partial_rollout == "continue"
        self._in_flight: dict[int, Future[Rollout]] = {}  # step -> its batch
        self._sampler_before: dict[int, dict[str, Any]] = {}  # step -> before its draw
        self._sync_due = False
        self._sync: Future[dict[str, float]] | None = None  # a sync in its thread
        self._sync_metrics: dict[str, float] = {}
        self._reported_across = 0

    # ------------------------------------------------ what the step calls
    def next_batch(self, step: int, timer: PhaseTimer) -> tuple[TrainBatch | None, dict]:
        """Step ``step``'s batch (waiting for it if it is still being generated); then the
        newest weights go to the engine, in a thread, as soon as the generation calls
        running have finished, and the batches of the next ``depth`` steps are started."""
        future = self._in_flight.pop(step, None)
        self._sampler_before.pop(step, None)
        if future is None and self._in_flight:
            raise RuntimeError(
                f"step {step + 1} asked for a batch, but the batches generated ahead are for "
                f"steps {sorted(s + 1 for s in self._in_flight)}"
            )
        queued = self.source.finished_for(set(self._in_flight), forget=step)
        if future is not None:
            with timer("wait_for_rollout"):
                batch, metrics, seconds = future.result()
            for phase, s in seconds.items():  # ran during earlier steps' updates
                timer.seconds[phase] = timer.seconds.get(phase, 0.0) + s
        timer.seconds.setdefault("wait_for_rollout", 0.0)
        with timer("weight_sync"):
            synced = self._collect_sync()
            if future is None:  # the first step of a run or of a resume generates in place
                synced |= self._sync_now()
                batch, metrics = self.source.next_batch(step, timer)
            else:
                self._start_sync()
        for ahead in range(step + 1, min(step + 1 + self.depth, self.total_steps)):
            if ahead not in self._in_flight:
                self._start(ahead)
        metrics = metrics | synced | self._async_metrics(queued)
        metrics |= staleness_metrics(batch, self.source.weights.version)
        self._check_staleness(step, metrics)
        return batch, metrics

    def sync_weights(self) -> dict[str, float]:
        """After an update: the engine is generating later batches, so the sync starts at
        the next :meth:`next_batch` (or validation)."""
        self._sync_due = True
        return {}

    def sampler_state(self) -> dict[str, Any]:
        """The sampler's position before the earliest batch in flight was drawn: a resumed
        run generates the batches in flight again."""
        if self._sampler_before:
            return self._sampler_before[min(self._sampler_before)]
        return self.source.sampler_state()

    def close(self) -> None:
        """Wait briefly for the work in flight (its engine is closed after this, which
        ends it); the batches in flight are dropped and generated again on resume."""
        pending = [*self._in_flight.values(), *([self._sync] if self._sync else [])]
        self._in_flight, self._sync = {}, None
        for future in pending:
            with contextlib.suppress(TimeoutError):
                future.exception(timeout=5.0)
        self.source.close()

    # ---------------------------------------- validation, as on RolloutSource
    def sampling(self, **kwargs: Any) -> Any:
        return self.source.sampling(**kwargs)

    def generate(
        self, prompts: PromptSet, indices: list[int], params: Any, timer: PhaseTimer
    ) -> ScoredRollout:
        """Generate with the newest weights; the batches in flight go on, their calls
        that start after the sync sampling from the same newest weights."""
        self._sync_metrics |= self._collect_sync() | self._sync_now()
        return self.source.generate(prompts, indices, params, timer)

    # ---------------------------------------------------------- internals
    def _start_sync(self) -> None:
        """Copy the weights and close the gate to new generation calls now; then, in a
        thread, wait for the calls running and push the copy (the trainer trains on)."""
        if not self._sync_due:
            return
        self._sync_due = False
        gate, source = self.source.gate, self.source
        snapshot = source.weights.snapshot()
        version = snapshot.version
        gate.begin_sync()
        future: Future[dict[str, float]] = Future()

        def run() -> None:
            try:
                start = time.perf_counter()
                if not self.in_flight_sync:
                    gate.wait_drained()
                drained = time.perf_counter()
                metrics = source.push_weights(snapshot, in_flight=self.in_flight_sync)
                metrics["async/sync_drain_s"] = drained - start
                metrics["async/sync_s"] = time.perf_counter() - drained
                future.set_result(metrics)
            except BaseException as exc:
                gate.end_sync(None)
                future.set_exception(exc)
            else:
                gate.end_sync(version)

        self._sync = future
        threading.Thread(target=run, name="rlkit-weight-sync", daemon=True).start()

    def _collect_sync(self) -> dict[str, float]:
        """The metrics of the sync started at the previous step (its failure, raised)."""
        metrics, self._sync_metrics = self._sync_metrics, {}
        future, self._sync = self._sync, None
        if future is not None:
            metrics |= future.result()
        return metrics

    def _sync_now(self) -> dict[str, float]:
        if not self._sync_due:
            return {}
        self._sync_due = False
        return self.source.sync_weights()

    def _start(self, step: int) -> None:
        """Draw step ``step``'s prompts (here, in step order) and generate its batch in a
        thread."""
        self._sampler_before[step] = self.source.sampler_state()
        drawn = self.source.draw()
        future: Future[Rollout] = Future()

        def run() -> None:
            timer = PhaseTimer()
            try:
                batch, metrics = self.source.next_batch(step, timer, drawn)
            except BaseException as exc:  # raised in the trainer's thread, at its step
                future.set_exception(exc)
            else:
                future.set_result((batch, metrics, timer.seconds))

        self._in_flight[step] = future
        # A daemon: a run stopped mid-generation exits without waiting for the server.
        threading.Thread(target=run, name=f"rlkit-rollout-step-{step + 1}", daemon=True).start()

    def _async_metrics(self, queued: int) -> dict[str, float]:
        """The queue's size (responses finished for later steps) and the generation calls
        running when a sync began (finished, or continued, across it) since the last step."""
        across = self.source.gate.finished_across_sync
        partial, self._reported_across = across - self._reported_across, across
        return {"async/queue_size": float(queued), "async/partial_rollouts": float(partial)}

    def _check_staleness(self, step: int, metrics: dict[str, float]) -> None:
        worst = metrics.get("async/staleness/max")
        if self.max_staleness is not None and worst is not None and worst > self.max_staleness:
            raise RuntimeError(
                f"internal error: step {step + 1}'s batch has tokens {worst:g} weight versions "
                f"old, above TrainerConfig.max_staleness = {self.max_staleness}"
            )


def staleness_metrics(batch: TrainBatch | None, version: int) -> dict[str, float]:
    """``async/staleness/{mean,max}``: how many optimizer steps the weights that sampled
    each generated token of ``batch`` are behind ``version``, the weights it trains from."""
    if batch is None:
        return {}
    generated = batch.loss_mask.bool() & (batch.policy_version >= 0)
    if not generated.any():
        return {}
    lag = (version - batch.policy_version[generated]).double()
    return {"async/staleness/mean": float(lag.mean()), "async/staleness/max": float(lag.max())}
