"""Trajectories with their rewards, grouped by prompt draw; DAPO's group filter.

A *group* is the ``n`` responses drawn for one prompt in one generation batch
(the same prompt drawn again later is a new group). Group ids are what the
estimators receive as ``index``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlkit.rollout.trajectory import Trajectory
from rlkit.trainer.batch import TrainBatch, build_batch
from rlkit.trainer.prompts import PromptSet

REWARD_COUNTERS = ("reward/num_errors", "reward/num_timeouts", "reward/num_past_deadline")


def numeric_fields(info: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric fields of one reward result's extras (``acc``, a term's score);
    strings (``pred``, ``error``) are left out."""
    return {
        k: float(v)
        for k, v in info.items()
        if isinstance(v, numbers.Real) and math.isfinite(v) and k != "score"
    }


def field_means(fields: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """``reward/<field>/mean``: each field's mean over the rows that have it."""
    values: dict[str, list[float]] = {}
    for row in fields:
        for k, v in row.items():
            values.setdefault(k, []).append(v)
    return {f"reward/{k}/mean": sum(v) / len(v) for k, v in values.items()}


def _is_field_mean(key: str) -> bool:
    return key.startswith("reward/") and key.endswith("/mean")


@dataclass
class ScoredRollout:
    """Trajectories with one reward per row.

    Attributes:
        trajectories: the rows; ``prompt_index`` holds indices into the PromptSet.
        groups: group id per row (rows of a group are contiguous).
        scores: the reward per row (shaping included).
        acc: correctness per row: the reward's ``acc`` field if it returns one,
            else ``score > 0``.
        data_sources: per row.
        baselines: per-row baseline reward (ReMax's greedy rollout), if any.
        metrics: reward-side counters (errors, timeouts), summed on concatenation, and
            ``reward/<field>/mean`` for every numeric extra field of the reward's
            results (``acc``, ``weighted/<term>``), the mean over the rows that have
            it: recomputed from ``reward_fields`` whenever rows are concatenated or
            selected, so it is over the rows of this rollout (all processes, the
            step's kept groups).
        reward_fields: per row, the numeric extra fields of its reward result.
    """

    trajectories: list[Trajectory]
    groups: list[int]
    scores: list[float]
    acc: list[float]
    data_sources: list[str]
    baselines: list[float] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    reward_fields: list[dict[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.reward_fields) != len(self.scores):  # built without them: none
            self.reward_fields = [{} for _ in self.scores]
        self._refresh_field_means()

    def _refresh_field_means(self) -> None:
        for key in [k for k in self.metrics if _is_field_mean(k)]:
            del self.metrics[key]
        self.metrics |= field_means(self.reward_fields)

    def __len__(self) -> int:
        return len(self.scores)

    def num_groups(self) -> int:
        return len(set(self.groups))

    @property
    def prompt_index(self) -> list[int]:
        return [t.prompt_index for t in self.trajectories]

    @staticmethod
    def concat(parts: list[ScoredRollout]) -> ScoredRollout:
        """Rows of all parts in order; group ids renumbered 0.. by first appearance."""
        out = ScoredRollout([], [], [], [], [], [], {})
        offset = 0
        for part in parts:
            out.trajectories += part.trajectories
            out.groups += [g + offset for g in part.groups]
            offset += max(part.groups, default=-1) + 1
            out.scores += part.scores
            out.acc += part.acc
            out.data_sources += part.data_sources
            out.baselines += part.baselines or []
            out.reward_fields += part.reward_fields
            for k, v in part.metrics.items():
                if not _is_field_mean(k):  # means are recomputed over all rows below
                    out.metrics[k] = out.metrics.get(k, 0.0) + v
        renumber: dict[int, int] = {}
        out.groups = [renumber.setdefault(g, len(renumber)) for g in out.groups]
        if not (parts and all(p.baselines is not None for p in parts)):
            out.baselines = None
        out._refresh_field_means()
        return out

    def select(self, keep: list[int]) -> ScoredRollout:
        def pick(xs: list[Any]) -> list[Any]:
            return [xs[i] for i in keep]

        return ScoredRollout(
            pick(self.trajectories),
            pick(self.groups),
            pick(self.scores),
            pick(self.acc),
            pick(self.data_sources),
            None if self.baselines is None else pick(self.baselines),
            dict(self.metrics),  # the field means are recomputed over the kept rows
            pick(self.reward_fields),
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

    def to_batch(self, *, pad_token_id: int) -> TrainBatch:
        """The rows as a :class:`TrainBatch`, padded to the longest response generated
        (not the configured maximum: every forward and backward then costs less)."""
        return build_batch(
            self.trajectories,
            pad_token_id=pad_token_id,
            response_width=max(1, max((len(t) for t in self.trajectories), default=1)),
            index=self.groups,
            scores=self.scores,
            acc=self.acc,
            data_sources=self.data_sources,
            reward_baselines=self.baselines,
        )


class RewardFailure(RuntimeError):
    """Too many of a batch's reward calls failed (``DataConfig.max_reward_failure_rate``)."""


def check_failure_rate(
    result: Any, max_rate: float, reward: str = "", row_names: list[str] | None = None
) -> None:
    """Stop when at least ``max_rate`` of the batch's reward calls raised or timed out: a
    reward that fails everywhere would otherwise train on a constant 0. The message names
    ``reward`` (``DataConfig.reward``) and the first failing row (``row_names``: a name
    per row, e.g. its prompt's id)."""
    failed = result.num_errors + result.num_timeouts
    if not result.scores or failed < max_rate * len(result.scores):
        return
    where = next((i for i, info in enumerate(result.infos) if "error" in info), None)
    first = result.infos[where]["error"] if where is not None else ""
    row = ""
    if where is not None and row_names is not None and where < len(row_names):
        row = f" on row {where} ({row_names[where]})"
    named = f"DataConfig.reward = {reward!r}: " if reward else ""
    raise RewardFailure(
        f"{named}{failed} of {len(result.scores)} reward calls failed ({result.num_errors} "
        f"errors, {result.num_timeouts} timeouts), at least DataConfig.max_reward_failure_rate "
        f"= {max_rate:g} of them; the first{row}: {first}"
    )


def reward_contexts(
    trajectories: list[Trajectory],
    texts: list[str],
    prompts: PromptSet,
    model_scores: list[float] | None = None,
) -> list[Any]:
    """One :class:`rewards.RewardContext` per trajectory (``texts``: decoded responses;
    ``model_scores``: the reward model's score per trajectory, if one ran)."""
    from rewards import RewardContext

    out = []
    scores = model_scores if model_scores is not None else [None] * len(trajectories)
    for traj, text, model_score in zip(trajectories, texts, scores):
        i = traj.prompt_index
        out.append(
            RewardContext(
                response=text,
                ground_truth=prompts.ground_truths[i],
                prompt=prompts.texts[i] if prompts.texts else "",
                messages=tuple(prompts.messages[i]) if prompts.messages else (),
                conversation=None if traj.conversation is None else tuple(traj.conversation),
                data_source=prompts.data_sources[i],
                extra_info=prompts.extra_infos[i] if prompts.extra_infos else {},
                response_length=len(traj),
                reward_model_score=model_score,
                images=tuple(prompts.images[i]) if prompts.images else (),
            )
        )
    return out


def score_rollout(
    trajectories: list[Trajectory],
    prompts: PromptSet,
    tokenizer: Any,
    cfg: Any,
    groups: list[int],
    model_scores: list[float] | None = None,
) -> ScoredRollout:
    """Decode responses and score them with the configured reward (+ overlong shaping).

    The reward receives ``data_source``, ``response_length`` (tokens after the prompt,
    EOS included) and ``DataConfig.reward_options`` as keywords, and whatever else of
    the :class:`rewards.RewardContext` its signature names (``prompt``, ``messages``,
    ``conversation``, ``extra_info``, ``context``); a batched reward is called once with
    every row's context. ``model_scores`` (the reward model's, when one is configured)
    reach the reward as ``RewardContext.reward_model_score`` and are logged as
    ``reward/reward_model/mean``. Reward exceptions and time-outs score 0 and are counted
    (``reward/num_errors``, ``reward/num_timeouts``); every numeric extra field of the
    results is logged as its mean, ``reward/<field>/mean`` (``weighted``'s per-term
    scores: ``reward/weighted/<term>/mean``).
    """
    import rewards

    d, a = cfg.data, cfg.algorithm
    texts = tokenizer.batch_decode([t.response_ids for t in trajectories], skip_special_tokens=True)
    contexts = reward_contexts(trajectories, texts, prompts, model_scores)
    extras = [
        {**d.reward_options, "data_source": c.data_source, "response_length": c.response_length}
        for c in contexts
    ]
    result = rewards.score_batch(
        d.reward,
        texts,
        [c.ground_truth for c in contexts],
        extras,
        timeout_s=d.reward_timeout_s,
        num_workers=d.reward_workers,
        contexts=contexts,
        deadline_s=d.reward_deadline_s,
        # A call SIGALRM cannot interrupt ends the run (with a message) a whole limit late.
        hard_limit_s=None if d.reward_timeout_s is None else d.reward_timeout_s + 5.0,
    )
    row_names = [
        f"prompt {prompts.ids[t.prompt_index]!r}" if t.prompt_index < len(prompts.ids) else ""
        for t in trajectories
    ]
    check_failure_rate(result, d.max_reward_failure_rate, str(d.reward), row_names)
    scores = [float(s) for s in result.scores]
    acc = [float(info.get("acc", s > 0)) for s, info in zip(scores, result.infos)]
    # Counters add up over processes and generation batches; the fields' means are
    # recomputed over the rows (ScoredRollout.reward_fields), never summed.
    metrics = {k: float(v) for k, v in result.metrics().items() if k in REWARD_COUNTERS}
    if a.overlong_buffer_len > 0:
        penalties = [
            rewards.overlong_penalty(
                len(t),
                max_length=cfg.rollout.max_response_length,
                buffer_length=a.overlong_buffer_len,
                penalty_factor=a.overlong_penalty_factor,
            )
            for t in trajectories
        ]
        scores = [s + p for s, p in zip(scores, penalties)]
        metrics["reward/overlong_penalty_sum"] = float(sum(penalties))
    sources = [c.data_source for c in contexts]
    fields = [numeric_fields(info) for info in result.infos]
    for row, model_score in zip(fields, model_scores or ()):
        row["reward_model"] = float(model_score)
    return ScoredRollout(
        list(trajectories), list(groups), scores, acc, sources, None, metrics, fields
    )
