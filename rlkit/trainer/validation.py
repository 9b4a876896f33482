"""Validation: held-out prompts generated and scored at a step, from validation's own
random stream; mean@k and pass@k per data source."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlkit.metrics.intervals import mean_at_n_interval
from rlkit.metrics.pass_at_k import mean_and_pass_at_k
from rlkit.trainer.builders import seed_everything
from rlkit.trainer.checkpoint import capture_rng_state, restore_rng_state
from rlkit.trainer.prompts import PromptSet
from rlkit.trainer.scoring import ScoredRollout
from rlkit.trainer.timing import PhaseTimer


def validate(
    rollout: Any, prompts: PromptSet, platform: Any, seed: int, rank: int, step: int
) -> dict[str, float]:
    """Generate ``val_n`` responses to every prompt of ``prompts`` with ``rollout`` (a
    :class:`~rlkit.trainer.rollout_source.RolloutSource`); validation's metrics.

    Validation samples from its own random stream, seeded from (``TrainerConfig.seed``,
    rank, step), and the training streams (Python, NumPy, torch CPU and accelerator) are
    restored afterwards: ``test_freq``, ``val_n``, ``val_temperature`` and where a run was
    interrupted leave training bitwise unchanged, and validating at a step gives the same
    results in any run. (An SGLang server samples from its own generator, seeded once by
    ``--random-seed``; that stream is shared by training and validation requests, since
    per-request seeds are not sent.)
    """
    training_rng = capture_rng_state(platform)
    try:
        seed_everything(side_seed(seed, rank, step, "validation"))
        timer = PhaseTimer()
        with timer("testing"):
            params = rollout.sampling(validation=True)
            scored = rollout.generate(prompts, list(range(len(prompts))), params, timer)
        return {"timing_s/testing": timer.seconds["testing"]} | validation_metrics(scored, prompts)
    finally:
        restore_rng_state(training_rng, platform)


def side_seed(seed: int, rank: int, step: int, purpose: str) -> int:
    """A seed for a side computation at a step, independent of the training stream and
    of other purposes (a hash of seed, rank, step and ``purpose``)."""
    tag = int.from_bytes(purpose.encode(), "little")
    entropy = [seed % 2**63, rank, step, tag]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] >> 1)


def validation_metrics(scored: ScoredRollout, prompts: PromptSet) -> dict[str, float]:
    """``val/<source>/{mean@k, pass@k, score/mean}`` of ``scored`` (``val_n`` responses to
    each of ``prompts``), and ``tool_call_rate`` where a multi-turn loop ran."""
    correct: dict[str, dict[int, list[bool]]] = {}
    scores: dict[str, list[float]] = {}
    tool_use: dict[str, list[float]] = {}
    for i, (p_idx, traj) in enumerate(zip(scored.prompt_index, scored.trajectories)):
        source = prompts.data_sources[p_idx]
        correct.setdefault(source, {}).setdefault(p_idx, []).append(bool(scored.acc[i]))
        scores.setdefault(source, []).append(scored.scores[i])
        if traj.stats is not None:
            tool_use.setdefault(source, []).append(float(traj.stats["tool_calls"] > 0))
    out: dict[str, float] = {}
    for source, per_prompt in correct.items():
        stats = mean_and_pass_at_k(list(per_prompt.values()))
        out |= {f"val/{source}/{k}": v for k, v in stats.items()}
        mean_at_n = next(k for k in stats if k.startswith("mean@"))
        interval = mean_at_n_interval(list(per_prompt.values()))
        if interval.low is not None:  # the 95% interval over problems (Wilson / t)
            out[f"val/{source}/{mean_at_n}_ci_low"] = interval.low
            out[f"val/{source}/{mean_at_n}_ci_high"] = interval.high
        out[f"val/{source}/score/mean"] = float(np.mean(scores[source]))
        if source in tool_use:  # multi-turn loops: how often the policy called a tool
            out[f"val/{source}/tool_call_rate"] = float(np.mean(tool_use[source]))
    return out
