"""What a rollout engine is asked for and what it returns: :class:`SamplingParams` in,
:class:`RolloutBatch` out.

Kept apart from the engine interface (:mod:`rlkit.rollout.base`) so that the turn
generators (:mod:`rlkit.rollout.turns`), one of which the interface's default
``RolloutEngine.turns`` returns, use these types without importing the interface:
``base`` imports ``turns``, and both import this module. ``rlkit.rollout.base`` and
``rlkit.rollout`` export both names too. :class:`SamplingParams` is defined in
:mod:`rlkit.models.sampling_params`, a layer below, where the rewards can reach it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlkit.models.sampling_params import SamplingParams

__all__ = ["RolloutBatch", "SamplingParams", "TopLogProbs"]


@dataclass
class TopLogProbs:
    """The engine's most likely tokens at each of one row's ``L`` response positions.

    Attributes:
        ids: (L, k) token ids, most likely first.
        log_probs: (L, k) float32 log-probs of ``ids`` under the distribution the
            engine sampled from (temperature, top-k and top-p applied, as
            :attr:`RolloutBatch.rollout_log_probs`). A position with fewer than ``k``
            candidates (a server answering fewer, tokens filtered out) is padded with
            id ``-1`` and log-prob ``-inf``.
    """

    ids: torch.Tensor
    log_probs: torch.Tensor

    @classmethod
    def from_lists(cls, per_position: list[dict[int, float]], k: int) -> TopLogProbs:
        """From one ``{token id: log-prob}`` per position (a server's answer), padded
        to ``k`` columns and sorted most likely first."""
        ids = torch.full((len(per_position), k), -1, dtype=torch.long)
        log_probs = torch.full((len(per_position), k), float("-inf"))
        for t, entries in enumerate(per_position):
            ranked = sorted(entries.items(), key=lambda e: -e[1])[:k]
            for j, (token, value) in enumerate(ranked):
                ids[t, j], log_probs[t, j] = token, value
        return cls(ids, log_probs)


@dataclass
class RolloutBatch:
    """Responses for ``len(prompt_ids) // n`` prompts, grouped contiguously.

    For prompts ``[p0, p1]`` and ``n = 2`` the rows are
    ``[p0 r0, p0 r1, p1 r0, p1 r1]`` and ``prompt_index == [0, 0, 1, 1]``.

    Attributes:
        prompt_ids: the prompt's token ids, one list per row.
        response_ids: generated token ids per row (EOS / stop token included if produced).
        rollout_log_probs: log-prob of each generated token under the sampling
            distribution (temperature, top-k and top-p applied), same lengths as
            ``response_ids``.
        finish_reasons: ``"stop"`` (EOS / stop token) or ``"length"`` per row.
        prompt_index: index of the row's prompt in the request.
        token_versions: per row, the weights version that sampled each response token,
            for engines that update weights under a running generation (``None`` for a
            token, or for the whole batch: the version the caller sampled with).
        metrics: engine-side numbers: the names the engine declares in
            :attr:`~rlkit.rollout.base.RolloutEngine.counters` and
            :attr:`~rlkit.rollout.base.RolloutEngine.gauges` (logged with the step), and
            per-call rates such as ``rollout/response_tokens_per_s`` (not logged).
        top_log_probs: per row, the engine's most likely tokens at every response
            position (:class:`TopLogProbs`), when ``SamplingParams.top_logprobs > 0``
            and the engine can report them; otherwise ``None``.
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    rollout_log_probs: list[list[float]]
    finish_reasons: list[str]
    prompt_index: list[int]
    metrics: dict[str, float] = field(default_factory=dict)
    token_versions: list[list[int | None]] | None = None
    top_log_probs: list[TopLogProbs] | None = None

    def __len__(self) -> int:
        return len(self.response_ids)

    def validate(self) -> None:
        """Raise ``ValueError`` if the per-row lists disagree in length."""
        n = len(self.response_ids)
        for name in ("prompt_ids", "rollout_log_probs", "finish_reasons", "prompt_index"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"RolloutBatch.{name} has {len(getattr(self, name))} rows, expected {n}"
                )
        for i, (ids, lps) in enumerate(zip(self.response_ids, self.rollout_log_probs)):
            if len(ids) != len(lps):
                raise ValueError(f"row {i}: {len(ids)} response tokens but {len(lps)} log-probs")
        for i, (ids, vs) in enumerate(zip(self.response_ids, self.token_versions or [])):
            if len(ids) != len(vs):
                raise ValueError(f"row {i}: {len(ids)} response tokens but {len(vs)} versions")
        for i, (ids, top) in enumerate(zip(self.response_ids, self.top_log_probs or [])):
            if top.ids.shape[0] != len(ids):
                raise ValueError(
                    f"row {i}: {len(ids)} response tokens but top log-probs of {top.ids.shape[0]}"
                )
        if self.top_log_probs is not None and len(self.top_log_probs) != n:
            raise ValueError(
                f"RolloutBatch.top_log_probs has {len(self.top_log_probs)} rows, expected {n}"
            )
        if self.token_versions is not None and len(self.token_versions) != n:
            raise ValueError(
                f"RolloutBatch.token_versions has {len(self.token_versions)} rows, expected {n}"
            )
