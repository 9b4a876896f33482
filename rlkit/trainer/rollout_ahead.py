"""One-step-off-policy rollouts: the next step's batch is generated while this one trains.

``TrainerConfig.rollout_mode = "one_step_off"`` wraps the :class:`RolloutSource` of a
synchronous run in a :class:`RolloutAhead`. The step asks it for a batch exactly as it
asks the source, and the order of events is::

    step k:  wait for batch k (generated with weights k-1)
             sync weights k to the engine        # the engine is idle now
             start generating batch k+1 (weights k) in a background thread
             train on batch k                    # -> weights k+1
    step k+1: ...

Every token of a trained batch therefore comes from the weights one step's updates older
than the ones that train on it (the first batch: the same), which the step logs as
``async/staleness/{mean,max}`` in weight versions (one per optimizer step). The recorded
rollout log-probs make that lag correctable with the rollout corrections
(``AlgorithmConfig.rollout_is_level``).

What a stop keeps: a checkpoint records the prompt sampler's position *before* the batch
in flight was drawn, so a resumed run generates that batch again, from the checkpoint's
weights; no prompt is lost or trained twice. Validation first waits for the batch in
flight and syncs the newest weights, so it always scores the weights it reports.

Only engines that sample from their own copy of the weights (servers) can run ahead of the
trainer: the registry entry says so with ``holds_own_weights=True``.
"""

from __future__ import annotations

import contextlib
import threading
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
    """A :class:`RolloutSource` whose next batch is generated during the current update.

    Args:
        source: the synchronous source it runs ahead with.
        total_steps: the run's last step (nothing is generated past it).
    """

    def __init__(self, source: RolloutSource, total_steps: int) -> None:
        self.source = source
        self.total_steps = total_steps
        self._in_flight: Future[Rollout] | None = None
        self._in_flight_step = -1
        self._sampler_before: dict[str, Any] | None = None
        self._sync_due = False
        self._sync_metrics: dict[str, float] = {}

    # ------------------------------------------------ what the step calls
    def next_batch(self, step: int, timer: PhaseTimer) -> tuple[TrainBatch | None, dict]:
        """Step ``step``'s batch (waiting for it if it is still being generated), then the
        newest weights to the engine and the next batch's generation started."""
        ahead = self._in_flight is not None
        if ahead:
            if self._in_flight_step != step:
                raise RuntimeError(
                    f"the batch generated ahead was for step {self._in_flight_step + 1}, "
                    f"but step {step + 1} asked for one"
                )
            with timer("wait_for_rollout"):
                batch, metrics, seconds = self._take()
            for phase, s in seconds.items():  # ran during the previous step's update
                timer.seconds[phase] = timer.seconds.get(phase, 0.0) + s
        timer.seconds.setdefault("wait_for_rollout", 0.0)
        with timer("weight_sync"):  # the engine is idle: nothing generates now
            synced = self._sync()
        if not ahead:  # the first step of a run or of a resume generates in place
            batch, metrics = self.source.next_batch(step, timer)
        if step + 1 < self.total_steps:
            self._start(step + 1)
        return batch, metrics | synced | staleness_metrics(batch, self.source.weights.version)

    def sync_weights(self) -> dict[str, float]:
        """After an update: the engine is generating the next batch with the previous
        weights, so the sync waits for :meth:`next_batch` (or validation)."""
        self._sync_due = True
        return {}

    def sampler_state(self) -> dict[str, Any]:
        """The sampler's position before the batch in flight was drawn: a resumed run
        generates that batch again."""
        if self._in_flight is not None and self._sampler_before is not None:
            return self._sampler_before
        return self.source.sampler_state()

    def close(self) -> None:
        """Wait briefly for the generation in flight (its engine is closed after this, which
        ends it); its batch is dropped and generated again on resume."""
        future, self._in_flight = self._in_flight, None
        if future is not None:
            with contextlib.suppress(TimeoutError):
                future.exception(timeout=5.0)

    # ---------------------------------------- validation, as on RolloutSource
    def sampling(self, **kwargs: Any) -> Any:
        return self.source.sampling(**kwargs)

    def generate(
        self, prompts: PromptSet, indices: list[int], params: Any, timer: PhaseTimer
    ) -> ScoredRollout:
        """Generate with the newest weights: the batch in flight is finished first and
        kept for its step."""
        if self._in_flight is not None:
            self._in_flight.exception()  # wait; a failure is raised at its own step
        self._sync_metrics |= self._sync()
        return self.source.generate(prompts, indices, params, timer)

    # ---------------------------------------------------------- internals
    def _sync(self) -> dict[str, float]:
        metrics, self._sync_metrics = self._sync_metrics, {}
        if self._sync_due:
            self._sync_due = False
            metrics |= self.source.sync_weights()
        return metrics

    def _start(self, step: int) -> None:
        self._sampler_before = self.source.sampler_state()
        future: Future[Rollout] = Future()

        def run() -> None:
            timer = PhaseTimer()
            try:
                batch, metrics = self.source.next_batch(step, timer)
            except BaseException as exc:  # raised in the trainer's thread, at its step
                future.set_exception(exc)
            else:
                future.set_result((batch, metrics, timer.seconds))

        self._in_flight, self._in_flight_step = future, step
        # A daemon: a run stopped mid-generation exits without waiting for the server.
        threading.Thread(target=run, name=f"rlkit-rollout-step-{step + 1}", daemon=True).start()

    def _take(self) -> Rollout:
        future, self._in_flight = self._in_flight, None
        assert future is not None
        return future.result()


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
