"""The rollout side of a step: prompts drawn, responses generated, rewards scored.

:class:`RolloutSource` turns the next prompts of the epoch into a scored
:class:`~rlkit.trainer.batch.TrainBatch` for the trainer. It is the one seam between
generation and training: a step asks it for a batch (:meth:`RolloutSource.next_batch`)
and never sees the engine, the agent loop or the reward functions. Each process
generates for its share of the prompts; the scored rollouts are gathered, so every
process returns the same global batch.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlkit.distributed import collectives as comm
from rlkit.rollout.agent_loop import AgentRequest, loop_metrics
from rlkit.rollout.base import SamplingParams, split_engine_metrics
from rlkit.trainer.batch import TrainBatch
from rlkit.trainer.metrics import unfiltered_metrics
from rlkit.trainer.prompts import PromptSampler, PromptSet
from rlkit.trainer.scoring import ScoredRollout, score_rollout
from rlkit.trainer.timing import PhaseTimer
from rlkit.trainer.weight_gate import WeightGate

EngineMetrics = tuple[tuple[str, ...], tuple[str, ...]]


class DrawnPrompts(list):
    """One round's prompt indices, and the epoch of the sampler when the round began."""

    def __init__(self, indices: list[int], epoch: int):
        super().__init__(indices)
        self.epoch = epoch


class NoUpdateError(RuntimeError):
    """Group filtering kept no group in any step of a run: nothing was trained."""


def no_update_error(config: Any) -> NoUpdateError:
    """Why a run whose every step was skipped (DAPO's group filter kept nothing) failed."""
    a = config.algorithm
    return NoUpdateError(
        f"no step of the run updated the model: every group had the same {a.filter_metric} "
        f"in each of AlgorithmConfig.max_num_gen_batches = {a.max_num_gen_batches} generation "
        f"rounds of every step (the prompts are too easy or too hard for the model); raise "
        f"max_num_gen_batches or DataConfig.gen_batch_size, or use other data"
    )


@dataclass(frozen=True)
class RolloutSettings:
    """What a :class:`RolloutSource` generates and scores with.

    Attributes:
        config: the :class:`~rlkit.trainer.config.ExperimentConfig`.
        engine: the rollout engine (``rlkit.registry.ROLLOUT_ENGINES``).
        agent_loop, agent: the agent loop and its configuration.
        tokenizer: the policy's tokenizer.
        weights: the policy weights the engine samples with (their version is recorded
            on every token).
        prompts, sampler: the training prompts and the epoch's draw of them.
        scorers: roles that score responses (a reward model).
        needs: the algorithm's :class:`~rlkit.trainer.algorithm.Needs`.
        report: prints a line on the main process.
        world: ``(rank, world_size)`` of the processes that generate different prompts.
        replicas: processes per rank of ``world`` (a tensor-parallel group's size): they
            generate that rank's prompts together (an engine that runs the trainer's split
            model) or the first of them alone (a server engine), and one copy is kept.
        concurrent_prompts: 0 (one agent-loop call for all of a round's prompts) or how
            many prompts' calls run at once, each as its own call (rollouts running ahead:
            a weight sync then waits for the calls running, not for whole rounds).
    """

    config: Any
    engine: Any
    agent_loop: Callable[..., Any]
    agent: Any
    tokenizer: Any
    weights: Any
    prompts: PromptSet
    sampler: PromptSampler
    scorers: list[Any]
    needs: Any
    report: Callable[[str], None]
    world: tuple[int, int]
    replicas: int = 1
    concurrent_prompts: int = 0


class RolloutSource:
    """Scored rollouts of the training prompts, with DAPO's dynamic sampling and ReMax's
    greedy baselines where the algorithm asks for them (:class:`RolloutSettings`)."""

    def __init__(self, settings: RolloutSettings) -> None:
        s = settings
        self.cfg, self.engine, self.agent_loop, self.agent = (
            s.config,
            s.engine,
            s.agent_loop,
            s.agent,
        )
        self.tokenizer, self.weights, self.prompts, self.sampler = (
            s.tokenizer,
            s.weights,
            s.prompts,
            s.sampler,
        )
        self.scorers, self.needs, self.report = s.scorers, s.needs, s.report
        self.rank, self.world = s.world
        self.replicas = s.replicas
        weights, concurrent_prompts = s.weights, s.concurrent_prompts
        self.step = 0  # the step being generated for (messages)
        self.gauges: dict[str, float] = {}
        """The engine's server states after the main process's latest rollout."""
        self.num_skipped_rows = 0  # malformed training rows dropped at load (on_error)
        self.gate = WeightGate(weights.version)
        """Orders generation calls and weight syncs; holds the engine's weights version."""
        self.finished_samples: Counter[int] = Counter()
        """Responses generated per step, for steps whose batch is still being generated."""
        self._count_lock = threading.Lock()
        self.concurrent_prompts = concurrent_prompts
        self._call_slots = threading.BoundedSemaphore(max(1, concurrent_prompts))
        self._undeclared: set[str] = set()

    @property
    def engine_version(self) -> int:
        """The weights version the engine samples from (recorded on every token)."""
        return self.gate.version

    def sync_weights(self) -> dict[str, float]:
        """Give the engine the trainer's current weights (once no generation call runs);
        the engine's metrics, less its own ``timing_s/*`` (the caller times the sync)."""
        with self.gate.syncing(self.weights.version):
            return self.push_weights()

    def push_weights(self, weights: Any = None, *, in_flight: bool = False) -> dict[str, float]:
        """The engine's part of :meth:`sync_weights`, for a caller that holds the gate;
        ``weights``: a snapshot of the trainer's (default: the live ones); ``in_flight``:
        under the generation calls running, which go on with the new weights."""
        weights = self.weights if weights is None else weights
        push = self.engine.sync_weights_in_flight if in_flight else self.engine.sync_weights
        synced = push(weights)
        return {k: v for k, v in synced.items() if not k.startswith("timing_s/")}

    def finished_for(self, steps: set[int], *, forget: int | None = None) -> int:
        """Responses generated so far for ``steps`` (after dropping the count of step
        ``forget``, whose batch was taken)."""
        with self._count_lock:
            self.finished_samples.pop(forget, None)
            return sum(n for s, n in self.finished_samples.items() if s in steps)

    def sampler_state(self) -> dict[str, Any]:
        """The prompt sampler's position, as a checkpoint keeps it."""
        return self.sampler.state_dict()

    def close(self) -> None:
        """Nothing to stop: per-prompt calls run in daemon threads, which end with their
        engine."""

    def sampling(self, *, validation: bool = False, greedy: bool = False) -> SamplingParams:
        """Training sampling, validation's (``val_n``, ``val_temperature``, ``val_top_p``,
        ``val_top_k``; greedy when ``val_do_sample`` is off), or one greedy response per
        prompt (a baseline)."""
        r = self.cfg.rollout
        if greedy or (validation and not r.val_do_sample):
            return SamplingParams(max_new_tokens=r.max_response_length, temperature=0.0, n=1)
        if validation:
            return SamplingParams(
                max_new_tokens=r.max_response_length,
                temperature=r.val_temperature,
                top_p=r.top_p if r.val_top_p is None else r.val_top_p,
                top_k=r.top_k if r.val_top_k is None else r.val_top_k,
                n=r.val_n,
            )
        return SamplingParams(
            max_new_tokens=r.max_response_length,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            n=r.n,
        )

    def draw(self) -> list[int]:
        """The next round's prompt indices: ``train_batch_size``, or DAPO's
        ``gen_batch_size``, which trains on the first ``train_batch_size`` groups kept."""
        size = self.cfg.data.train_batch_size
        if self.cfg.algorithm.filter_groups:
            size = self.cfg.data.gen_batch_size or size
        epoch = self.sampler.epoch  # the epoch the round starts in (verl's training/epoch)
        return DrawnPrompts(self.sampler.next(size), epoch)

    def next_batch(
        self, step: int, timer: PhaseTimer, drawn: list[int] | None = None
    ) -> tuple[TrainBatch | None, dict]:
        """The step's global batch of ``train_batch_size`` prompt groups and its rollout
        metrics; ``None`` when group filtering kept no group (the update is skipped).
        ``drawn``: the first round's prompts, when the caller drew them (:meth:`draw`)."""
        a, size = self.cfg.algorithm, self.cfg.data.train_batch_size
        self.step = step
        kept: list[ScoredRollout] = []
        generated: list[ScoredRollout] = []  # before the group filter
        num_groups = num_gen = 0
        epoch = None
        while True:  # DAPO: draw again until enough groups with varied outcomes
            num_gen += 1
            indices, drawn = drawn if drawn is not None else self.draw(), None
            epoch = getattr(indices, "epoch", self.sampler.epoch) if epoch is None else epoch
            scored = self.generate(self.prompts, indices, self.sampling(), timer, step=step)
            if self.needs.greedy_baseline:  # ReMax
                greedy = self.generate(
                    self.prompts, indices, self.sampling(greedy=True), timer, step=step
                )
                scored.attach_baselines(greedy)
            generated.append(scored)
            if a.filter_groups:
                scored = scored.keep_varied_groups(a.filter_metric)
            kept.append(scored)
            num_groups += scored.num_groups()
            if not a.filter_groups or num_groups >= size or num_gen >= a.max_num_gen_batches:
                break
        rollout = ScoredRollout.concat(kept).first_groups(size)
        metrics = {
            "training/global_step": float(step + 1),
            "training/epoch": float(epoch),
            "train/num_gen_batches": float(num_gen),
            "train/num_truncated_prompts": float(self.prompts.num_truncated),
            "train/num_filtered_prompts": float(self.prompts.num_filtered),
            "train/num_skipped_rows": float(self.num_skipped_rows),
            **rollout.metrics,
            **loop_metrics(rollout.trajectories),
            **self.gauges,
        }
        if a.filter_groups:
            metrics["train/num_kept_groups"] = float(rollout.num_groups())
        if len(rollout) == 0:
            self.report(
                f"step {step + 1}: no group with varied {a.filter_metric} after {num_gen} "
                f"generation batches; update skipped"
            )
            seen = ScoredRollout.concat(generated)
            metrics |= unfiltered_metrics(
                seen.scores,
                seen.acc,
                [len(t.response_ids) for t in seen.trajectories],
                max_response_length=self.cfg.rollout.max_response_length,
            )
            return None, metrics | {"train/skipped_step": 1.0}
        return rollout.to_batch(pad_token_id=self.tokenizer.pad_token_id), metrics

    def generate(
        self,
        prompts: PromptSet,
        indices: list[int],
        params: SamplingParams,
        timer: PhaseTimer,
        *,
        step: int | None = None,
    ) -> ScoredRollout:
        """Generate for this process's share of ``indices``; the global scored rollout.
        ``step``: the training step it is for (counted in :attr:`finished_samples`)."""
        if not self._generates():
            return self._gathered(ScoredRollout([], [], [], [], []))
        with timer("gen"):
            per = -(-len(indices) // self.world)
            mine = indices[self.rank * per : (self.rank + 1) * per]
            requests = [
                AgentRequest(
                    prompts.token_ids[i],
                    prompts.messages[i],
                    ground_truth=prompts.ground_truths[i],
                    data_source=prompts.data_sources[i],
                    extra_info=prompts.extra_infos[i],
                    multimodal_inputs=prompts.multimodal[i] if prompts.multimodal else None,
                )
                for i in mine
            ]
            with timer("generate_sequences"):  # the agent loop and engine alone
                trajectories, engine_metrics = self._run_agent_loop(requests, params, step)
            # Group id = the prompt's position in this draw; prompt_index -> the PromptSet.
            groups = [self.rank * per + t.prompt_index for t in trajectories]
            for traj in trajectories:
                traj.prompt_index = mine[traj.prompt_index]
        model_scores = None
        if self.scorers:
            with timer("reward_model"):
                responses = self.tokenizer.batch_decode(
                    [t.response_ids for t in trajectories], skip_special_tokens=True
                )
                for scorer in self.scorers:
                    model_scores = scorer.score(trajectories, responses, prompts)
        with timer("reward"):
            scored = score_rollout(
                trajectories, prompts, self.tokenizer, self.cfg, groups, model_scores
            )
        counters, gauges = self._engine_metrics(engine_metrics)
        scored.metrics |= counters  # they add up over processes and rounds, as rewards do
        self._note_gauges(gauges)
        return self._gathered(scored)

    def _gathered(self, scored: ScoredRollout) -> ScoredRollout:
        """Every process's rollout, one copy per tensor-parallel group, in rank order."""
        return ScoredRollout.concat(one_copy_each(comm.gather_objects(scored), self.replicas))

    def _generates(self) -> bool:
        """Whether this process generates its rank's prompts: every process of a
        tensor-parallel group with an engine on the trainer's model (in step), only the
        group's first with a server engine (the others' copies would be other samples)."""
        tp_rank = comm.world()[0] % self.replicas
        return tp_rank == 0 or getattr(self.engine, "runs_trainer_model", False)

    def _run_agent_loop(
        self, requests: list[AgentRequest], params: SamplingParams, step: int | None
    ) -> tuple[list[Any], dict[str, float]]:
        """The agent loop over ``requests``: one call, or one call per prompt with
        ``concurrent_prompts`` running at once. Each call samples from one weights version,
        which its trajectories record."""

        def call(part: list[AgentRequest]) -> tuple[list[Any], dict[str, float]]:
            with self.gate.generating() as version:
                out = self.agent_loop(
                    self.engine,
                    part,
                    params,
                    tokenizer=self.tokenizer,
                    config=self.agent,
                    policy_version=version,
                )
            if step is not None:
                with self._count_lock:
                    self.finished_samples[step] += len(out[0])
            return out

        if not self.concurrent_prompts or len(requests) <= 1:
            return call(requests)
        results = self._per_prompt(call, requests)
        trajectories, metrics = [], {}
        for position, (part, part_metrics) in enumerate(results):
            for traj in part:
                traj.prompt_index = position  # the prompt's place among `requests`
            trajectories += part
            for name, value in part_metrics.items():  # counters add up; gauges: the last
                add = name in self.engine.counters
                metrics[name] = metrics.get(name, 0.0) + value if add else value
        return trajectories, metrics

    def _per_prompt(self, call: Callable[[list[AgentRequest]], Any], requests: list) -> list:
        """``call([r])`` for every request, ``concurrent_prompts`` at once, in daemon
        threads (a run stopped mid-generation exits without waiting for its server)."""
        results: list[Any] = [None] * len(requests)
        errors: list[BaseException] = []

        def one(i: int) -> None:
            with self._call_slots:
                try:
                    results[i] = call([requests[i]])
                except BaseException as exc:  # re-raised in the caller's thread
                    errors.append(exc)

        threads = [
            threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(requests))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results

    def _engine_metrics(self, metrics: dict[str, float]) -> tuple[dict, dict]:
        """The engine's counters and gauges, as it declares them; a name it reports
        without declaring is warned about once, not logged."""
        counters, gauges, undeclared = split_engine_metrics(self.engine, metrics)
        for name in sorted(set(undeclared) - self._undeclared):
            self._undeclared.add(name)
            self.report(
                f"warning: the rollout engine reports {name!r} without declaring it in its "
                f"`counters` or `gauges`: not logged"
            )
        return counters, gauges

    def _note_gauges(self, gauges: dict[str, float]) -> None:
        """Keep the engine's server states for the step's metrics; warn when a server was
        restarted since the last rollout (a step slowed by a restart is otherwise silent)."""
        before = self.gauges.get("rollout/server_restarts")
        after = gauges.get("rollout/server_restarts")
        if before is not None and after is not None and after > before:
            servers = "; ".join(self.engine.restarted_servers()) or "see the engine's log"
            self.report(
                f"warning: step {self.step + 1}: {int(after - before)} rollout server restart(s) "
                f"during this "
                f"rollout, which slows the step "
                f"({gauges.get('rollout/servers_usable', float('nan')):g} usable now): {servers}"
            )
        self.gauges = gauges


def one_copy_each(rollouts: list[ScoredRollout], replicas: int) -> list[ScoredRollout]:
    """The first of each group of ``replicas`` consecutive processes' rollouts.

    Raises:
        RuntimeError: two processes of a group that both generated (in step, from the same
            seed) sampled different tokens.
    """
    if replicas == 1:
        return rollouts
    kept = rollouts[::replicas]
    for g, first in enumerate(kept):
        ids = [t.response_ids for t in first.trajectories]
        for other in rollouts[g * replicas + 1 : (g + 1) * replicas]:
            theirs = [t.response_ids for t in other.trajectories]
            if theirs and theirs != ids:
                raise RuntimeError(
                    "the processes of a tensor-parallel group sampled different responses "
                    "from the same model and seed; their forward passes differ (a kernel "
                    "that is not deterministic across processes). Please report this with "
                    "the model and ModelConfig.kernel_overrides"
                )
    return kept
