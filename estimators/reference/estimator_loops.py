"""Loop references of verl 0.9's advantage estimators (and TRL's batch-std GRPO).

Written straight from the formulas in verl's ``verl/trainer/ppo/core_algos.py``
(per-row dictionaries of group scores, a step-by-step loop over time), keeping
verl's quirks so that the vectorised estimators can be compared number for
number: scores are unmasked reward sums, singleton groups use verl's fallbacks,
mask-0 tokens keep whatever verl writes there, ``masked_whiten`` divides token
sums by ``count + 1e-8``. Compare on valid tokens of non-degenerate inputs.

These are verl's formulas, not rlkit's plain math: rlkit's plain loops
(``estimators.gae.gae_advantages``, ``estimators.discounted_returns``) follow
rlkit's documented semantics (0 on mask-0 tokens, degenerate groups), and
``estimators.set_math("plain")`` runs them. Slow by design; the tests and
``benchmarks/estimators.py`` use these references.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from estimators.reference import prime_loops


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl: sum(values * mask) / (sum(mask) + 1e-8)."""
    return (values * mask).sum() / (mask.sum() + 1e-8)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl: (x - mean) * rsqrt(var * n / (n - 1) + 1e-8), stats over mask-1 entries."""
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    count = mask.sum()
    variance = variance * count / (count - 1)
    return (values - mean) * torch.rsqrt(variance + 1e-8)


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl ``gae``: reverse loop over t; V' and A' carry over mask-0 tokens; whitened A."""
    mask = mask.to(rewards.dtype)
    next_value = torch.zeros_like(rewards[:, 0])
    last_gae = torch.zeros_like(rewards[:, 0])
    reversed_advantages = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * last_gae
        next_value = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_value
        last_gae = candidate * mask[:, t] + (1 - mask[:, t]) * last_gae
        reversed_advantages.append(last_gae)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    returns = advantages + values
    return masked_whiten(advantages, mask), returns


def _groups(scores: torch.Tensor, index: Any) -> dict[Any, list[int]]:
    rows: dict[Any, list[int]] = defaultdict(list)
    for i in range(len(scores)):
        key = index[i].item() if isinstance(index, torch.Tensor) else index[i]
        rows[key].append(i)
    return rows


def grpo(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl ``grpo``: (s - mean) / (std + eps); singleton: mean 0, std 1."""
    scores = rewards.sum(dim=-1)
    out = scores.clone()
    for rows in _groups(scores, index).values():
        group = scores[rows]
        mean, std = (group.mean(), group.std()) if len(rows) > 1 else (0.0, 1.0)
        for i in rows:
            out[i] = (scores[i] - mean) / (std + epsilon) if norm_by_std else scores[i] - mean
    advantages = out[:, None] * mask.to(rewards.dtype)
    return advantages, advantages


def grpo_batch_std(
    rewards: torch.Tensor, mask: torch.Tensor, index: Any, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL ``scale_rewards="batch"``: (s - group mean) / (std of all scores + eps)."""
    scores = rewards.sum(dim=-1)
    batch_std = scores.std()
    out = scores.clone()
    for rows in _groups(scores, index).values():
        mean = scores[rows].mean()
        for i in rows:
            out[i] = (scores[i] - mean) / (batch_std + epsilon)
    advantages = out[:, None] * mask.to(rewards.dtype)
    return advantages, advantages


def grpo_passk(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl ``grpo_passk``: best of group gets (top1 - top2) [/ (std + eps)]."""
    scores = rewards.sum(dim=-1)
    out = torch.zeros_like(scores)
    for rows in _groups(scores, index).values():
        group = scores[rows]
        if len(rows) < 2:
            raise ValueError("Pass@k requires at least 2 samples per group")
        top, where = torch.topk(group, 2)
        margin = top[0] - top[1]
        if norm_by_std:
            margin = margin / (group.std() + epsilon)
        out[rows[where[0].item()]] = margin
    advantages = out[:, None] * mask.to(rewards.dtype)
    return advantages, advantages


def rloo(
    rewards: torch.Tensor, mask: torch.Tensor, index: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl ``rloo``: s * n / (n - 1) - mean * n / (n - 1); singleton keeps s."""
    scores = rewards.sum(dim=-1)
    out = scores.clone()
    for rows in _groups(scores, index).values():
        n = len(rows)
        if n > 1:
            mean = scores[rows].mean()
            for i in rows:
                out[i] = scores[i] * n / (n - 1) - mean * n / (n - 1)
    advantages = out[:, None] * mask.to(rewards.dtype)
    return advantages, advantages


def opo(rewards: torch.Tensor, mask: torch.Tensor, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl ``opo``: s - sum(len * s) / sum(len) over the group; singleton baseline 0."""
    scores = rewards.sum(dim=-1)
    lengths = mask.to(rewards.dtype).sum(dim=-1)
    out = scores.clone()
    for rows in _groups(scores, index).values():
        baseline = 0.0
        if len(rows) > 1:
            baseline = (lengths[rows] * scores[rows]).sum() / lengths[rows].sum()
        for i in rows:
            out[i] = scores[i] - baseline
    advantages = out[:, None] * mask.to(rewards.dtype)
    return advantages, advantages


def reinforce_plus_plus_baseline(
    rewards: torch.Tensor, mask: torch.Tensor, index: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl ``reinforce_plus_plus_baseline``: whiten(tile(s - mean) * m) * m; singleton mean 0."""
    scores = rewards.sum(dim=-1)
    mask = mask.to(rewards.dtype)
    out = scores.clone()
    for rows in _groups(scores, index).values():
        mean = scores[rows].mean() if len(rows) > 1 else 0.0
        for i in rows:
            out[i] = scores[i] - mean
    tiled = out[:, None].tile([1, rewards.shape[1]]) * mask
    advantages = masked_whiten(tiled, mask) * mask
    return advantages, advantages


def reinforce_plus_plus(
    rewards: torch.Tensor, mask: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl ``reinforce_plus_plus``: G_t = r_t + gamma * G, G reset by mask-0; whiten(G) * m."""
    mask = mask.to(rewards.dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return masked_whiten(returns, mask) * mask, returns


def remax(
    rewards: torch.Tensor, mask: torch.Tensor, reward_baselines: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl ``remax``: G = reverse cumsum of r * m (step loop here); A = G - b * m."""
    mask = mask.to(rewards.dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = running + rewards[:, t] * mask[:, t]
        returns[:, t] = running
    return returns - reward_baselines[:, None] * mask, returns


def gpg(
    rewards: torch.Tensor, mask: torch.Tensor, index: Any, f_norm: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl ``gpg``: alpha * (s - mean) / f_norm, alpha = B / max(#nonzero s, 1); singleton mean 0."""
    scores = rewards.sum(dim=-1)
    alpha = len(scores) / max(int(torch.count_nonzero(scores)), 1)
    out = scores.clone()
    for rows in _groups(scores, index).values():
        mean = scores[rows].mean() if len(rows) > 1 else 0.0
        for i in rows:
            out[i] = alpha * (scores[i] - mean) / f_norm
    advantages = out[:, None] * mask.to(rewards.dtype)
    return advantages, advantages


def dr_grpo(
    rewards: torch.Tensor, mask: torch.Tensor, index: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl ``grpo`` with ``norm_adv_by_std_in_grpo=False``."""
    return grpo(rewards, mask, index, norm_by_std=False)


def call(name: str, inputs: dict[str, Any], **settings: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the loop reference of estimator ``name`` on the estimator's keyword inputs.

    Args:
        name: canonical estimator name.
        inputs: ``token_level_rewards``, ``response_mask`` and, where the
            estimator needs them, ``index``, ``values``, ``reward_baselines``,
            ``process_rewards``.
        **settings: gamma, lam, epsilon, norm_by_std, f_norm, reward_dpo_coef,
            reward_gt_coef as the estimator would receive them.

    Returns:
        The reference's (advantages, returns).
    """
    r, m = inputs["token_level_rewards"], inputs["response_mask"]
    index = inputs.get("index")
    gamma, lam = settings.get("gamma", 1.0), settings.get("lam", 1.0)
    epsilon, norm = settings.get("epsilon", 1e-6), settings.get("norm_by_std", True)
    table = {
        "gae": lambda: gae(r, inputs["values"], m, gamma, lam),
        "grpo": lambda: grpo(r, m, index, epsilon, norm),
        "dr_grpo": lambda: dr_grpo(r, m, index),
        "grpo_batch_std": lambda: grpo_batch_std(r, m, index, epsilon),
        "grpo_passk": lambda: grpo_passk(r, m, index, epsilon, norm),
        "rloo": lambda: rloo(r, m, index),
        "opo": lambda: opo(r, m, index),
        "reinforce_plus_plus": lambda: reinforce_plus_plus(r, m, gamma),
        "reinforce_plus_plus_baseline": lambda: reinforce_plus_plus_baseline(r, m, index),
        "remax": lambda: remax(r, m, inputs["reward_baselines"]),
        "gpg": lambda: gpg(r, m, index, settings.get("f_norm", 1.0)),
        "prime": lambda: prime_loops.prime_advantages(
            r,
            m,
            index,
            inputs["process_rewards"],
            settings.get("reward_dpo_coef", 5.0),
            settings.get("reward_gt_coef", 5.0),
        ),
    }
    if name not in table:
        raise KeyError(f"no loop reference for estimator {name!r}")
    return table[name]()


def random_inputs(
    seed: int,
    group_sizes: list[int],
    length: int,
    dtype: torch.dtype = torch.float64,
    mask_kind: str = "right_padded",
    reward_kind: str = "dense",
) -> dict[str, Any]:
    """Random estimator inputs of the kind on which the references give verl's numbers.

    Every row has at least one valid token; rows are shuffled so groups are not
    contiguous; rewards are zero on mask-0 tokens (verl sums them unmasked).

    Args:
        seed: torch seed.
        group_sizes: size of each group (B = their sum).
        length: T >= 1.
        dtype: floating dtype of rewards, values and baselines.
        mask_kind: "right_padded" (valid prefix), "contiguous" (one valid run
            anywhere: left and right padding) or "holes" (random interior mask-0
            tokens as in multi-turn observation spans).
        reward_kind: "dense" (normal noise on every valid token) or "outcome"
            (0/1 on each row's last valid token: ties and zero-std groups).

    Returns:
        Keyword inputs: token_level_rewards, response_mask (bool), index (int64
        tensor), values, reward_baselines.
    """
    gen = torch.Generator().manual_seed(seed)
    batch = sum(group_sizes)
    groups = torch.cat([torch.full((n,), g) for g, n in enumerate(group_sizes)])
    index = groups[torch.randperm(batch, generator=gen)] if batch else groups
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    positions = torch.arange(length)[None, :]
    starts = torch.zeros(batch, dtype=torch.long)
    if mask_kind == "contiguous":
        starts = (torch.rand(batch, generator=gen) * (length - lengths + 1)).long()
    mask = (positions >= starts[:, None]) & (positions < (starts + lengths)[:, None])
    if mask_kind == "holes":
        mask = torch.rand(batch, length, generator=gen) < 0.6
        mask[torch.arange(batch), torch.randint(0, length, (batch,), generator=gen)] = True
    if reward_kind == "outcome":
        last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & mask
        rewards = last * torch.randint(0, 2, (batch, 1), generator=gen)
    else:
        rewards = torch.randn(batch, length, generator=gen) * mask
    return {
        "token_level_rewards": rewards.to(dtype),
        "response_mask": mask,
        "index": index,
        "values": torch.randn(batch, length, generator=gen).to(dtype),
        "reward_baselines": torch.randn(batch, generator=gen).to(dtype),
    }
