"""The trainer's batch: trajectories padded into typed tensors, and how rows are split.

Layout (as in verl): ``input_ids = [left-padded prompt | right-padded response]`` of
width ``P + T``; every per-token quantity is (B, T) and aligned with ``responses``.
Each field of :class:`TrainBatch` declares its layout (``sequence`` (B, P + T),
``token`` (B, T), ``row`` (B,) or ``object``, a Python list of B values), so
selecting rows and trimming padding columns never guess from a tensor's shape.

Beside its fields a batch carries **extras**: tensors by name that the run's roles provide
(the reference policy's ``ref_log_prob``, the critic's ``values``, a user role's own), each
``(B, T, ...)`` aligned with the responses or ``(B,)`` per response. They follow the rows
wherever the fields do (:meth:`TrainBatch.select`, :meth:`TrainBatch.trimmed`, the
processes' shares, micro-batches), so a loss that declares one receives its micro-batch's
slice without the batch knowing what it is.

Two masks, on purpose: ``attention_mask`` covers every real token (the model reads
tool outputs too), ``loss_mask`` only the tokens the policy sampled (what the
estimators receive as ``response_mask`` and every loss is averaged over). Rows added
to balance processes have an all-zero ``loss_mask``, so they contribute nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlkit.models.vision_language import concat_images
from rlkit.rollout.trajectory import NOT_GENERATED, Trajectory

SEQUENCE, TOKEN, ROW, OBJECT = "sequence", "token", "row", "object"


def _field(layout: str, *, default: Any = dataclasses.MISSING) -> Any:
    if default is dataclasses.MISSING:
        return field(metadata={"layout": layout})
    return field(default=default, metadata={"layout": layout})


@dataclass
class TrainBatch:
    """B rows of (prompt, response) as padded tensors; P = prompt width, T = response width.

    Written when the batch is built (:func:`build_batch`):

    Attributes:
        input_ids: (B, P+T) long; ``[left-padded prompt | right-padded response]``.
        attention_mask: (B, P+T) long; 1 on every real token (prompt, policy and tool tokens).
        position_ids: (B, P+T) long; positions of real tokens, starting at 0 per row.
        responses: (B, T) long; the response part of ``input_ids``.
        loss_mask: (B, T) float 0/1; 1 = token sampled by the policy (trained on).
        rollout_log_prob: (B, T) float32; the engine's log-probs, 0 where ``loss_mask`` is 0.
        policy_version: (B, T) long; weights version that sampled each token, -1 elsewhere.
        token_level_scores: (B, T) float32; the outcome score on the last sampled token,
            plus any per-token environment rewards.
        prompt_lengths, response_lengths: (B,) long; real tokens of prompt / response.
        index: (B,) long; group id (one prompt draw), what estimators receive as ``index``.
        scores: (B,) float32; the outcome score per row.
        acc: (B,) float32; correctness per row.
        data_sources: B strings (``None`` on balancing rows).
        multimodal_inputs: B dicts of extra model inputs (or ``None`` per text row).
        prompt_width: P.

    Written by the step's phases (``None`` until then), all (B, T) float32 unless noted:
        reward_baselines: (B,) the greedy response's score (ReMax).
        old_log_prob: the actor's log-probs before the update (pi_old).
        entropy: the actor's entropy at the rollout (logged).
        token_level_rewards: scores minus the KL penalty in the reward.
        advantages, returns: the estimator's outputs.
        rollout_is_weights: rollout importance-sampling weights.
        extras: what the roles provide, by name (``Role.provides``): ``(B, T, ...)``
            tensors aligned with the responses, or ``(B,)`` tensors per response.
    """

    input_ids: torch.Tensor = _field(SEQUENCE)
    attention_mask: torch.Tensor = _field(SEQUENCE)
    position_ids: torch.Tensor = _field(SEQUENCE)
    responses: torch.Tensor = _field(TOKEN)
    loss_mask: torch.Tensor = _field(TOKEN)
    rollout_log_prob: torch.Tensor = _field(TOKEN)
    policy_version: torch.Tensor = _field(TOKEN)
    token_level_scores: torch.Tensor = _field(TOKEN)
    prompt_lengths: torch.Tensor = _field(ROW)
    response_lengths: torch.Tensor = _field(ROW)
    index: torch.Tensor = _field(ROW)
    scores: torch.Tensor = _field(ROW)
    acc: torch.Tensor = _field(ROW)
    data_sources: list[str | None] = _field(OBJECT)
    multimodal_inputs: list[Mapping[str, torch.Tensor] | None] = _field(OBJECT)
    prompt_width: int = field(default=0)
    reward_baselines: torch.Tensor | None = _field(ROW, default=None)
    old_log_prob: torch.Tensor | None = _field(TOKEN, default=None)
    entropy: torch.Tensor | None = _field(TOKEN, default=None)
    token_level_rewards: torch.Tensor | None = _field(TOKEN, default=None)
    advantages: torch.Tensor | None = _field(TOKEN, default=None)
    returns: torch.Tensor | None = _field(TOKEN, default=None)
    rollout_is_weights: torch.Tensor | None = _field(TOKEN, default=None)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.responses.shape[0])

    def get(self, name: str) -> Any:
        """The tensor called ``name``: an extra, else the field of that name (``None`` if
        unset). Inputs declared by losses, estimators and roles are read through this."""
        if name in self.extras:
            return self.extras[name]
        if name in _ROW_ALIGNED:
            return getattr(self, name)
        raise KeyError(f"the batch has no tensor {name!r}")

    def _map(self, fn: Any) -> TrainBatch:
        """A copy with ``fn(layout, value)`` applied to every set row-aligned field and
        extra."""
        changes: dict[str, Any] = {}
        for name, layout in _ROW_ALIGNED.items():
            value = getattr(self, name)
            if value is not None:
                changes[name] = fn(layout, value)
        changes["extras"] = {k: fn(extra_layout(v), v) for k, v in self.extras.items()}
        return dataclasses.replace(self, **changes)

    def select(self, rows: torch.Tensor | Sequence[int]) -> TrainBatch:
        """The rows ``rows`` (an index tensor or list), in that order."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        as_list = idx.tolist()

        def pick(layout: str, value: Any) -> Any:
            if layout == OBJECT:
                return [value[i] for i in as_list]
            return value.index_select(0, idx.to(value.device))

        return self._map(pick)

    def trimmed(self) -> TrainBatch:
        """The same rows without columns that are padding in every row.

        Keeps the last ``P'`` prompt columns (``P'`` = the longest prompt here) and
        the first ``T'`` response columns (``T'`` = the longest response here, at
        least 1). Every real token, its position id and its masks survive, so any
        masked sum over the rows is unchanged, and a micro-batch of short rows costs
        its own length, not the step's longest.
        """
        p, t = self.prompt_width, self.responses.shape[1]
        if len(self) == 0:
            return self
        keep_p = int(self.prompt_lengths.max().clamp(min=1, max=p))
        keep_t = int(self.response_lengths.max().clamp(min=1, max=t))
        if keep_p == p and keep_t == t:
            return self

        def cut(layout: str, value: Any) -> Any:
            if layout == SEQUENCE:
                return value[:, p - keep_p : p + keep_t]
            if layout == TOKEN:
                return value[:, :keep_t]
            return value

        return dataclasses.replace(self._map(cut), prompt_width=keep_p)

    def to(self, device: torch.device | str) -> TrainBatch:
        return self._map(lambda layout, v: v if layout == OBJECT else v.to(device))

    def model_inputs(self) -> dict[str, Any]:
        """What the actor and critic forwards read: ids, masks, positions, responses,
        and the rows' multimodal inputs concatenated along their first dimension."""
        inputs: dict[str, Any] = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "responses": self.responses,
        }
        images = concat_images(self.multimodal_inputs)
        if images:
            inputs["multimodal"] = {k: v.to(self.input_ids.device) for k, v in images.items()}
        return inputs


_ROW_ALIGNED: dict[str, str] = {
    f.name: f.metadata["layout"] for f in dataclasses.fields(TrainBatch) if "layout" in f.metadata
}
"""Each row-aligned field of :class:`TrainBatch` and its layout."""


def extra_layout(value: torch.Tensor) -> str:
    """An extra's layout: ``row`` for a (B,) tensor, else ``token`` (B, T, ...)."""
    return ROW if value.dim() == 1 else TOKEN


def extra_problem(name: str, value: Any, rows: int, width: int) -> str | None:
    """Why ``value`` cannot be the extra ``name`` of a batch of ``rows`` rows and
    ``width`` response columns, or ``None``."""
    if not isinstance(value, torch.Tensor):
        return f"batch.extras[{name!r}] is a {type(value).__name__}, not a torch.Tensor"
    shape, want = tuple(value.shape), f"({rows}, {width}) per token or ({rows},) per response"
    if value.dim() == 0 or shape[0] != rows or (value.dim() > 1 and shape[1] != width):
        return f"batch.extras[{name!r}] has shape {shape}; expected {want}"
    return None


def _right_padded(rows: Sequence[Sequence[Any]], width: int, pad: Any, dtype: torch.dtype):
    # Padded as Python lists, then one tensor: a per-row torch.tensor costs more than
    # the rest of build_batch at a few hundred rows.
    return torch.tensor([list(r) + [pad] * (width - len(r)) for r in rows], dtype=dtype).reshape(
        len(rows), width
    )


def token_level_scores(
    loss_mask: torch.Tensor, scores: torch.Tensor, token_rewards: torch.Tensor
) -> torch.Tensor:
    """(B, T) rewards per token: each row's score on its last sampled token (the last 1
    of ``loss_mask``), plus the environment's per-token rewards. A row with no sampled
    token gets no score."""
    width = loss_mask.shape[1]
    sampled = loss_mask > 0
    last = width - 1 - sampled.flip(1).float().argmax(dim=1)  # (B,) last sampled position
    placed = torch.zeros_like(token_rewards)
    placed[torch.arange(len(scores)), last] = torch.where(sampled.any(dim=1), scores, 0.0)
    return token_rewards + placed


def _raise_for_first_bad_row(trajectories: Sequence[Trajectory]) -> None:
    for i, traj in enumerate(trajectories):
        traj.validate(f"trajectory {i}")


def _check_lengths(trajectories: Sequence[Trajectory]) -> None:
    """Every per-token list of every row has one entry per response token."""
    if not all(
        len(t.loss_mask) == len(t.rollout_log_probs) == len(t.policy_version) == len(t)
        and (t.token_rewards is None or len(t.token_rewards) == len(t))
        for t in trajectories
    ):
        _raise_for_first_bad_row(trajectories)


def _check_values(trajectories: Sequence[Trajectory], real: torch.Tensor, b: TrainBatch) -> None:
    """The checks of :meth:`Trajectory.validate` on the padded tensors at once (a Python
    loop over every token costs more than building the batch); a bad row then raises
    its own message."""
    mask, lp, version = b.loss_mask, b.rollout_log_prob, b.policy_version
    generated, inserted = mask == 1, (mask == 0) & real.bool()
    bad = (
        ((mask != 0) & ~generated)
        | (generated & (~torch.isfinite(lp) | (version < 0)))
        | (inserted & ((lp != 0) | (version != NOT_GENERATED)))
    )
    if bad.any():
        _raise_for_first_bad_row(trajectories)


def build_batch(
    trajectories: Sequence[Trajectory],
    *,
    pad_token_id: int,
    response_width: int,
    index: Sequence[int],
    scores: Sequence[float],
    acc: Sequence[float],
    data_sources: Sequence[str],
    reward_baselines: Sequence[float] | None = None,
) -> TrainBatch:
    """Pad trajectories and their per-row rewards into a :class:`TrainBatch`.

    Args:
        trajectories: the rows (checked as :meth:`Trajectory.validate` does).
        pad_token_id: token used for padding (masked out everywhere).
        response_width: T, at least the longest response.
        index: group id per row.
        scores, acc, data_sources: the outcome score, correctness and data source per row.
        reward_baselines: per-row baseline score (ReMax), if any.

    Raises:
        ValueError: a trajectory is inconsistent, a per-row list has the wrong length,
            or a response is longer than ``response_width``.
    """
    b = len(trajectories)
    _check_lengths(trajectories)
    per_row = {"index": index, "scores": scores, "acc": acc, "data_sources": data_sources}
    if reward_baselines is not None:
        per_row["reward_baselines"] = reward_baselines
    for name, values in per_row.items():
        if len(values) != b:
            raise ValueError(f"build_batch: {len(values)} {name} for {b} trajectories")
    longest = max((len(t) for t in trajectories), default=0)
    if longest > response_width:
        raise ValueError(
            f"a response has {longest} tokens, more than response_width={response_width}"
        )
    p = max((len(t.prompt_ids) for t in trajectories), default=1)
    prompt_lengths = torch.tensor([len(t.prompt_ids) for t in trajectories], dtype=torch.long)
    response_lengths = torch.tensor([len(t) for t in trajectories], dtype=torch.long)
    prompts = torch.tensor(
        [[pad_token_id] * (p - len(t.prompt_ids)) + list(t.prompt_ids) for t in trajectories],
        dtype=torch.long,
    ).reshape(b, p)
    responses = _right_padded(
        [t.response_ids for t in trajectories], response_width, pad_token_id, torch.long
    )
    prompt_mask = (torch.arange(p) >= (p - prompt_lengths)[:, None]).long()
    real = (torch.arange(response_width) < response_lengths[:, None]).long()
    attention_mask = torch.cat([prompt_mask, real], dim=1)
    loss_mask = _right_padded([t.loss_mask for t in trajectories], response_width, 0, torch.float32)
    scores_t = torch.as_tensor(list(scores), dtype=torch.float32).reshape(b)
    token_rewards = [t.token_rewards or () for t in trajectories]
    batch = TrainBatch(
        input_ids=torch.cat([prompts, responses], dim=1),
        attention_mask=attention_mask,
        # Positions count real tokens only, so left padding does not shift them.
        position_ids=(attention_mask.cumsum(dim=1) - 1).clamp(min=0),
        responses=responses,
        loss_mask=loss_mask,
        rollout_log_prob=_right_padded(
            [t.rollout_log_probs for t in trajectories], response_width, 0.0, torch.float32
        ),
        policy_version=_right_padded(
            [t.policy_version for t in trajectories], response_width, NOT_GENERATED, torch.long
        ),
        token_level_scores=token_level_scores(
            loss_mask, scores_t, _right_padded(token_rewards, response_width, 0.0, torch.float32)
        ),
        prompt_lengths=prompt_lengths,
        response_lengths=response_lengths,
        index=torch.as_tensor(list(index), dtype=torch.long).reshape(b),
        scores=scores_t,
        acc=torch.as_tensor(list(acc), dtype=torch.float32).reshape(b),
        data_sources=list(data_sources),
        multimodal_inputs=[t.multimodal_inputs for t in trajectories],
        prompt_width=p,
        reward_baselines=None
        if reward_baselines is None
        else torch.as_tensor(list(reward_baselines), dtype=torch.float32).reshape(b),
    )
    _check_values(trajectories, real, batch)
    return batch


def pad_rows_to_multiple(batch: TrainBatch, multiple: int) -> TrainBatch:
    """Append copies of row 0 with an all-zero loss mask until ``len % multiple == 0``.

    Such rows make every process run the same number of forward passes (FSDP's
    collectives need that) while adding nothing to losses or gradients.
    """
    missing = -len(batch) % multiple
    if missing == 0:
        return batch
    if len(batch) == 0:
        raise ValueError("cannot pad an empty batch: it has no row to copy")
    pad = batch.select([0] * missing)
    zeroed = {
        name: torch.zeros_like(value)
        for name in ("loss_mask", "advantages", "returns")
        if (value := getattr(pad, name)) is not None
    }
    pad = dataclasses.replace(pad, data_sources=[None] * missing, **zeroed)

    return _concat(batch, pad)


def _concat(first: TrainBatch, second: TrainBatch) -> TrainBatch:
    changes: dict[str, Any] = {}
    for name, layout in _ROW_ALIGNED.items():
        a, b = getattr(first, name), getattr(second, name)
        if a is not None:
            changes[name] = a + b if layout == OBJECT else torch.cat([a, b])
    changes["extras"] = {k: torch.cat([v, second.extras[k]]) for k, v in first.extras.items()}
    return dataclasses.replace(first, **changes)


def length_sorted_split(
    prompt_lengths: torch.Tensor, response_lengths: torch.Tensor, micro_batch_size: int
) -> list[torch.Tensor]:
    """Chunks of at most ``micro_batch_size`` rows, formed after sorting rows by length.

    Rows are ordered by response length, then prompt length (stable), so each
    chunk holds rows of similar length and :meth:`Batch.trimmed` cuts most of its
    padding. Which rows share a micro-batch does not change the gradient (losses
    are normalised by the whole mini-batch), only the floating-point summation order.

    Returns:
        Index tensors, each sorted ascending; together a permutation of the rows.
    """
    if not len(response_lengths):
        return []
    key = response_lengths * (int(prompt_lengths.max()) + 1) + prompt_lengths
    order = torch.argsort(key, stable=True)
    return [chunk.sort().values for chunk in order.split(micro_batch_size)]


def token_budget_split(
    seq_lengths: torch.Tensor, max_tokens: int, min_parts: int = 1
) -> list[torch.Tensor]:
    """Partition rows into micro-batches whose padded token count fits ``max_tokens``.

    Rows are placed longest first into the part with the fewest tokens (a
    balanced greedy partition); the number of parts is the smallest that fits
    but at least ``min_parts`` (so processes can agree on one count). A row
    longer than the budget gets a part of its own.

    Returns:
        Index tensors, one per part, each sorted ascending; together a permutation.
    """
    n = int(seq_lengths.numel())
    if n == 0:
        return [torch.zeros(0, dtype=torch.long) for _ in range(min_parts)]
    lengths = seq_lengths.tolist()
    total = sum(lengths)
    parts = max(min_parts, -(-total // max_tokens))
    while True:
        bins: list[list[int]] = [[] for _ in range(min(parts, n))]
        load = [0] * len(bins)
        for i in sorted(range(n), key=lambda j: -lengths[j]):
            k = min(range(len(bins)), key=load.__getitem__)
            bins[k].append(i)
            load[k] += lengths[i]
        # The padded cost of a part is rows x its longest row.
        fits = all(len(b) * max(lengths[i] for i in b) <= max_tokens or len(b) == 1 for b in bins)
        if fits or len(bins) == n:
            out = [torch.tensor(sorted(b), dtype=torch.long) for b in bins]
            out += [torch.zeros(0, dtype=torch.long)] * (min_parts - len(out))
            return out
        parts += 1
