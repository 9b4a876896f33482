"""An RL algorithm as the trainer sees it: registered pieces and what a step needs.

:class:`Algorithm` is built from :class:`~rlkit.trainer.config.AlgorithmConfig`'s
registry names (so every gin preset works unchanged). It owns the three computations
between a step's forward passes: advantages (KL in the reward, the estimator, rollout
importance weights), the actor loss and the critic loss. Which roles run is not its
business: every tensor a piece reads is declared by name, and
:func:`~rlkit.trainer.data_contract.plan_roles` finds the roles that provide them.

Estimators and losses are reached only through their registries and keep their
one pure-function signature each. A policy loss or an estimator may declare inputs
when it is registered::

    @POLICY_LOSSES.register("my_loss", inputs=("ref_log_prob",))
    def my_loss(old_log_prob, log_prob, advantages, response_mask, *, ref_log_prob, **kw): ...

and then receives each as a keyword tensor, sliced to the micro-batch
(:data:`~rlkit.trainer.data_contract.BATCH_INPUTS`, :data:`~rlkit.trainer.data_contract.
LOSS_INPUTS`, or any role's ``provides``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

import algorithms
import estimators
from rlkit.registry import ESTIMATORS, POLICY_LOSSES, VALUE_LOSSES, Entry
from rlkit.trainer.batch import TrainBatch
from rlkit.trainer.data_contract import plan_roles, registered_inputs


@dataclass(frozen=True)
class Needs:
    """What the actor and the rollout must compute for an algorithm (the other roles
    follow from the inputs the pieces declare).

    Attributes:
        greedy_baseline: one greedy response per prompt is generated and scored (ReMax).
        old_log_prob: the actor's no-grad forward before the update; ``False`` when
            the single update sees exactly the policy that generated, so
            ``sg(log pi_theta)`` stands in for pi_old.
        entropy: the actor's forward also returns the entropy (a loss term, a loss
            input, or the entropy metric of an on-policy step).
    """

    greedy_baseline: bool
    old_log_prob: bool
    entropy: bool


class Algorithm:
    """The estimator, policy loss, value loss and KL settings of an experiment.

    Args:
        config: the :class:`~rlkit.trainer.config.ExperimentConfig`; its ``algorithm``
            section names the registered pieces, ``optim`` and ``rollout`` give the
            update schedule, the value clip and the length normaliser.

    Raises:
        UnknownNameError: a name is not registered.
        DataContractError: a declared input that nothing in the run provides.
    """

    def __init__(self, config: Any) -> None:
        a, o = config.algorithm, config.optim
        self.cfg = a
        # Process-wide, read at every call: the registered functions stay the same.
        algorithms.set_math(a.math)
        estimators.set_math(a.math)
        self.estimator: Entry = ESTIMATORS.entry(a.adv_estimator)
        self.policy_loss: Entry = POLICY_LOSSES.entry(a.policy_loss)
        self.value_loss: Entry = VALUE_LOSSES.entry(a.value_loss)
        self.loss_inputs = registered_inputs(self.policy_loss)
        self.estimator_inputs = registered_inputs(self.estimator)
        self.plan = plan_roles(config)
        self.roles: tuple[str, ...] = self.plan.roles
        self.cliprange_value = o.cliprange_value
        self.norm_length = config.rollout.max_response_length
        self.kl_ctrl = algorithms.make_kl_controller(
            kind=a.kl_ctrl_type, kl_coef=a.kl_coef, target_kl=a.kl_target, horizon=a.kl_horizon
        )
        # Exactly on-policy: one epoch over one mini-batch, and nothing needs pi_old
        # before the update (KL in the reward, rollout correction).
        on_policy = (
            o.ppo_epochs == 1
            and o.ppo_mini_batch_size >= config.data.train_batch_size
            and not a.use_kl_in_reward
            and a.rollout_is_level is None
        )
        self.needs = Needs(
            greedy_baseline=bool(self.estimator.extra.get("needs_reward_baselines")),
            old_log_prob=not on_policy,
            entropy=a.entropy_coeff != 0 or "entropy" in self.loss_inputs or on_policy,
        )

    @property
    def name(self) -> str:
        return f"{self.estimator.name} + {self.policy_loss.name}"

    # ------------------------------------------------------------ advantages
    def compute_advantages(self, batch: TrainBatch) -> dict[str, float]:
        """Fill ``token_level_rewards``, ``advantages``, ``returns`` (and
        ``rollout_is_weights``) of ``batch``; return the phase's metrics."""
        a = self.cfg
        mask = batch.loss_mask
        metrics: dict[str, float] = {}
        rewards = batch.token_level_scores
        if a.use_kl_in_reward:
            kl = algorithms.kl_penalty(batch.old_log_prob, batch.get("ref_log_prob"), a.kl_penalty)
            kl = kl * mask
            beta = self.kl_ctrl.value
            rewards = rewards - beta * kl
            seq_kl = (kl.sum(-1) / mask.sum(-1).clamp(min=1)).mean().item()
            self.kl_ctrl.update(seq_kl, n_steps=len(batch))
            metrics |= {
                "actor/reward_kl_penalty": seq_kl,
                "actor/reward_kl_penalty_coeff": beta,  # the beta this step used, as verl
            }
        batch.token_level_rewards = rewards
        batch.advantages, batch.returns = self.estimator.fn(
            rewards,
            mask,  # the loss mask: tokens a tool or user inserted are skipped as padding is
            index=batch.index,
            values=batch.extras.get("values"),
            reward_baselines=batch.reward_baselines,
            gamma=a.gamma,
            lam=a.lam,
            norm_by_std=a.norm_adv_by_std_in_grpo,
            **{name: batch.get(name) for name in self.estimator_inputs},
            **a.estimator_options,
        )
        if a.rollout_is_level is not None:
            batch.rollout_is_weights, is_metrics = algorithms.rollout_is_weights(
                batch.old_log_prob,
                batch.rollout_log_prob,
                mask,
                level=a.rollout_is_level,
                mode=a.rollout_is_mode,
                threshold=a.rollout_is_threshold,
                threshold_low=a.rollout_is_threshold_low,
            )
            metrics |= {k: float(v) for k, v in is_metrics.items()}
        if batch.old_log_prob is not None:  # on-policy updates report the mean themselves
            diff = (batch.old_log_prob - batch.rollout_log_prob).abs() * mask
            metrics["rollout/logprob_diff_max"] = diff.max().item() if mask.any() else 0.0
            metrics["rollout/logprob_abs_diff_mean"] = float(diff.sum() / mask.sum().clamp(min=1))
        return metrics

    # ----------------------------------------------------------------- losses
    def normalisers(self, mini: TrainBatch) -> dict[str, Any]:
        """The global normalisers of a mini-batch, passed to every micro-batch's loss."""
        mask = mini.loss_mask
        return {
            "num_tokens": mask.sum().clamp(min=1).item(),
            "num_seqs": (mask.sum(-1) > 0).sum().clamp(min=1).item(),
            "norm_length": self.norm_length,
        }

    def actor_loss(
        self,
        micro: TrainBatch,
        outputs: tuple[torch.Tensor, torch.Tensor | None],
        norms: dict[str, Any],
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, Any]]:
        """The actor's loss on one micro-batch.

        Args:
            micro: the micro-batch (advantages and declared inputs filled).
            outputs: the policy forward's ``(log_prob, entropy)``: (b, T') current
                log-probs with gradient, and the entropy with gradient (``None`` when
                not needed).
            norms: :meth:`normalisers` of the mini-batch.

        Returns:
            loss: pg_loss − entropy_coeff·agg(entropy) + kl_loss_coef·agg(kl), normalised
                by the whole mini-batch.
            additive: ``actor/pg_loss``, ``actor/loss`` (they sum over micro-batches).
            parts: token-mean metrics of this micro-batch.
        """
        a = self.cfg
        log_prob, entropy = outputs
        mask = micro.loss_mask
        on_policy = not self.needs.old_log_prob
        # Exactly on-policy, the old policy is the current one: pi_old = sg(pi_theta).
        old_log_prob = log_prob.detach() if on_policy else micro.old_log_prob
        pg_loss, pg_metrics = self.policy_loss.fn(
            old_log_prob,
            log_prob,
            micro.advantages,
            mask,
            loss_agg_mode=a.loss_agg_mode,
            clip_ratio=a.clip_ratio,
            clip_ratio_low=a.clip_ratio_low,
            clip_ratio_high=a.clip_ratio_high,
            clip_ratio_c=a.clip_ratio_c,
            rollout_is_weights=micro.rollout_is_weights,
            **norms,
            **{n: entropy if n == "entropy" else micro.get(n) for n in self.loss_inputs},
            **a.loss_options,
        )
        loss = pg_loss
        parts = {f"actor/{k}": v for k, v in pg_metrics.items()}
        tokens = mask.sum().clamp(min=1)
        if on_policy:  # metrics the skipped old-log-prob pass would have given
            parts["actor/entropy"] = (entropy.detach() * mask).sum() / tokens
            diff = (log_prob.detach() - micro.rollout_log_prob).abs() * mask
            parts["rollout/logprob_abs_diff_mean"] = diff.sum() / tokens
        if a.entropy_coeff != 0:
            ent = algorithms.aggregate_loss(entropy, mask, a.loss_agg_mode, **norms)
            loss = loss - a.entropy_coeff * ent
        if a.use_kl_loss:
            kl = algorithms.kl_penalty(log_prob, micro.get("ref_log_prob"), a.kl_loss_type)
            loss = loss + a.kl_loss_coef * algorithms.aggregate_loss(
                kl, mask, a.loss_agg_mode, **norms
            )
            parts["actor/kl_loss"] = (kl * mask).sum() / tokens
        return loss, {"actor/pg_loss": pg_loss.detach(), "actor/loss": loss.detach()}, parts

    def critic_loss(
        self, micro: TrainBatch, vpreds: torch.Tensor, norms: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, Any]]:
        """(value loss, additive ``critic/vf_loss``, token-mean metrics) of one micro-batch."""
        loss, vf_metrics = self.value_loss.fn(
            vpreds,
            micro.returns,
            micro.get("values"),
            micro.loss_mask,
            cliprange_value=self.cliprange_value,
            loss_agg_mode=self.cfg.loss_agg_mode,
            **norms,
        )
        parts = {f"critic/{k}": v for k, v in vf_metrics.items()}
        return loss, {"critic/vf_loss": loss.detach()}, parts
