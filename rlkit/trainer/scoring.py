"""Rollouts with their rewards, grouped by prompt draw; DAPO's group filter.

A *group* is the ``n`` responses drawn for one prompt in one generation batch
(the same prompt drawn again later is a new group). Group ids are what the
estimators receive as ``index``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlkit.rollout.base import RolloutBatch
from rlkit.trainer.batch import Batch

REWARD_COUNTERS = ("reward/num_errors", "reward/num_timeouts")


@dataclass
class ScoredRollout:
    """A rollout with one reward per row.

    Attributes:
        rollout: the engine's rows; ``prompt_index`` holds indices into the PromptSet.
        groups: group id per row (rows of a group are contiguous).
        scores: the reward per row (shaping included).
        acc: correctness per row: the reward's ``acc`` field if it returns one,
            else ``score > 0``.
        baselines: per-row baseline reward (ReMax's greedy rollout), if any.
        metrics: reward-side counters (errors, timeouts), summed on concatenation.
    """

    rollout: RolloutBatch
    groups: list[int]
    scores: list[float]
    acc: list[float]
    data_sources: list[str]
    baselines: list[float] | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.scores)

    def num_groups(self) -> int:
        return len(set(self.groups))

    @staticmethod
    def concat(parts: list[ScoredRollout]) -> ScoredRollout:
        """Rows of all parts in order; group ids renumbered 0.. by first appearance."""
        rows: dict[str, list] = {
            k: []
            for k in (
                "prompt_ids",
                "response_ids",
                "rollout_log_probs",
                "finish_reasons",
                "prompt_index",
            )
        }
        groups, scores, acc, sources, baselines, metrics = [], [], [], [], [], {}
        offset = 0
        for part in parts:
            for k in rows:
                rows[k] += getattr(part.rollout, k)
            groups += [g + offset for g in part.groups]
            offset += max(part.groups, default=-1) + 1
            scores += part.scores
            acc += part.acc
            sources += part.data_sources
            if part.baselines is not None:
                baselines += part.baselines
            for k, v in part.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v
        renumber: dict[int, int] = {}
        groups = [renumber.setdefault(g, len(renumber)) for g in groups]
        has_baselines = bool(parts) and all(p.baselines is not None for p in parts)
        return ScoredRollout(
            RolloutBatch(**rows),
            groups,
            scores,
            acc,
            sources,
            baselines if has_baselines else None,
            metrics,
        )

    def select(self, keep: list[int]) -> ScoredRollout:
        r = self.rollout
        pick = lambda xs: [xs[i] for i in keep]  # noqa: E731
        rollout = RolloutBatch(
            pick(r.prompt_ids),
            pick(r.response_ids),
            pick(r.rollout_log_probs),
            pick(r.finish_reasons),
            pick(r.prompt_index),
        )
        return ScoredRollout(
            rollout,
            pick(self.groups),
            pick(self.scores),
            pick(self.acc),
            pick(self.data_sources),
            None if self.baselines is None else pick(self.baselines),
            dict(self.metrics),
        )

    def keep_varied_groups(self, metric: str) -> ScoredRollout:
        """DAPO dynamic sampling: drop groups whose ``metric`` (acc | score) is constant.

        A group of one response is kept (there is nothing to compare), as in DAPO.
        """
        values = np.asarray(self.acc if metric == "acc" else self.scores, dtype=np.float64)
        groups = np.asarray(self.groups)
        keep_group = {
            g for g in set(self.groups) if (groups == g).sum() == 1 or values[groups == g].std() > 0
        }
        return self.select([i for i, g in enumerate(self.groups) if g in keep_group])

    def first_groups(self, count: int) -> ScoredRollout:
        """Rows of the first ``count`` groups."""
        order = list(dict.fromkeys(self.groups))[:count]
        chosen = set(order)
        return self.select([i for i, g in enumerate(self.groups) if g in chosen])

    def attach_baselines(self, base: ScoredRollout) -> None:
        """Use ``base`` (one greedy response per group, same draw order) as reward baselines."""
        per_group = dict(zip(base.groups, base.scores))
        if set(per_group) != set(self.groups):
            raise ValueError("baseline rollout does not cover the same prompt draws")
        self.baselines = [per_group[g] for g in self.groups]
        self.metrics["critic/baseline_score_sum"] = float(sum(base.scores))

    def fill(self, batch: Batch) -> None:
        """Add ``scores``, ``acc``, ``token_level_scores`` (score on the last response
        token), ``index`` (group ids) and ``reward_baselines`` to ``batch``."""
        scores = torch.tensor(self.scores, dtype=torch.float32)
        batch["scores"] = scores
        batch["acc"] = torch.tensor(self.acc, dtype=torch.float32)
        batch["index"] = torch.tensor(self.groups, dtype=torch.long)
        lengths = batch["response_lengths"]
        token_scores = torch.zeros_like(batch["response_mask"])
        rows = torch.nonzero(lengths > 0).squeeze(-1)
        token_scores[rows, lengths[rows] - 1] = scores[rows]
        batch["token_level_scores"] = token_scores
        if self.baselines is not None:
            batch["reward_baselines"] = torch.tensor(self.baselines, dtype=torch.float32)
        batch.meta["data_source"] = list(self.data_sources)


def score_rollout(
    rollout: RolloutBatch, prompts: Any, tokenizer: Any, cfg: Any, groups: list[int]
) -> ScoredRollout:
    """Decode responses and score them with the configured reward (+ overlong shaping).

    Reward exceptions and time-outs score 0 and are counted in the metrics
    (``reward/num_errors``, ``reward/num_timeouts``); the run continues.
    """
    import rewards

    d, a = cfg.data, cfg.algorithm
    texts = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
    truths = [prompts.ground_truths[i] for i in rollout.prompt_index]
    sources = [prompts.data_sources[i] for i in rollout.prompt_index]
    # response_length (tokens, EOS included) is what the length-shaping rewards read.
    extras = [
        {**d.reward_options, "data_source": s, "response_length": len(ids)}
        for s, ids in zip(sources, rollout.response_ids)
    ]
    result = rewards.score_batch(
        d.reward, texts, truths, extras, timeout_s=d.reward_timeout_s, num_workers=d.reward_workers
    )
    scores = [float(s) for s in result.scores]
    acc = [float(info.get("acc", s > 0)) for s, info in zip(scores, result.infos)]
    # Only counters: they add up over processes and generation batches (means would not).
    metrics = {k: float(v) for k, v in result.metrics().items() if k in REWARD_COUNTERS}
    if a.overlong_buffer_len > 0:
        penalties = [
            rewards.overlong_penalty(
                len(ids),
                max_length=cfg.rollout.max_response_length,
                buffer_length=a.overlong_buffer_len,
                penalty_factor=a.overlong_penalty_factor,
            )
            for ids in rollout.response_ids
        ]
        scores = [s + p for s, p in zip(scores, penalties)]
        metrics["reward/overlong_penalty_sum"] = float(sum(penalties))
    return ScoredRollout(rollout, list(groups), scores, acc, sources, None, metrics)
