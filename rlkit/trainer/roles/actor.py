"""The actor: the policy being trained, and the weights the rollout engine samples with."""

from __future__ import annotations

import warnings
from typing import Any

from rlkit.registry import ROLES
from rlkit.trainer.batch import TrainBatch
from rlkit.trainer.roles.role import RoleContext, TrainedRole
from rlkit.trainer.updater import policy_forward


def load_policy(
    ctx: RoleContext, *, trainable: bool, path: str | None = None, checkpointing: bool = False
) -> Any:
    """An :class:`~rlkit.modeling.modules.ActorModule` over the causal LM at ``path``
    (default ``ModelConfig.path``) with the run's forward settings."""
    from rlkit.modeling.modules import ActorModule
    from rlkit.models.loading import load_causal_lm
    from rlkit.models.vision_language import is_vision_language, vision_parameters

    m = ctx.config.model
    path = path or m.path
    backbone = load_causal_lm(
        path,
        dtype=m.dtype,
        gguf_file=m.gguf_file if path == m.path else None,
        gradient_checkpointing=checkpointing,
    )
    if not trainable:
        backbone.requires_grad_(False)
    elif m.freeze_vision_tower and is_vision_language(backbone.config):
        for parameter in vision_parameters(backbone):
            parameter.requires_grad_(False)
    return ActorModule(
        backbone,
        chunk_size=ctx.config.optim.logprob_chunk_size,
        remove_padding=m.use_remove_padding,
        share_prefix=m.share_prompt_prefix,
        sequence_parallel=ctx.backend.sequence_parallel,
    )


@ROLES.register("actor", summary="the policy: old log-probs and entropy, the policy update")
class ActorRole(TrainedRole):
    """The policy. Forward: pi_old's log-probs and entropy, where the algorithm needs them
    (else the update's own forward stands in, detached). Update: the policy loss over
    mini-batches, from step ``AlgorithmConfig.critic_warmup`` on; each applied optimizer
    step bumps the weights' version."""

    forward_phase = "old_log_prob"
    update_phase = "update_actor"
    update_order = 20
    checkpoint_name = "actor"

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        from rlkit.models.loading import add_lora, load_image_processor
        from rlkit.trainer.policy_weights import TrainerPolicyWeights

        m, o = ctx.config.model, ctx.config.optim
        if m.dtype != "float32" and m.lora_rank == 0:
            warnings.warn(
                f"ModelConfig.dtype={m.dtype!r} trains {m.dtype} parameters and optimizer state: "
                "updates smaller than the parameters' resolution are lost (most of an lr=1e-6 "
                "step in bfloat16). For the usual recipe keep dtype='float32' and set "
                "TrainerConfig.mixed_precision='bf16'.",
                stacklevel=2,
            )
        policy = load_policy(ctx, trainable=True, checkpointing=m.gradient_checkpointing)
        if m.lora_rank > 0:
            policy.backbone = add_lora(
                policy.backbone,
                rank=m.lora_rank,
                alpha=m.lora_alpha,
                target_modules=m.lora_target_modules,
            )
        self.prepare(policy, o.lr)
        processor = load_image_processor(m.path) if m.path else None
        self.weights = TrainerPolicyWeights(ctx.backend, self.module, ctx.tokenizer, processor)

    @property
    def backbone(self) -> Any:
        """The Hugging Face model inside the (possibly wrapped) actor."""
        return self.ctx.backend.unwrap(self.module).backbone

    def forward_needed(self) -> bool:
        # Exactly on-policy, the update's own forward gives pi_old (detached).
        return self.ctx.algorithm.needs.old_log_prob

    def forward(self, batch: TrainBatch) -> dict[str, float]:
        batch.old_log_prob, batch.entropy = self.ctx.updater.log_probs(
            self.module, batch, entropy=True
        )
        mask = batch.loss_mask
        return {"actor/entropy": float((batch.entropy * mask).sum() / mask.sum().clamp(min=1))}

    def update(self, batch: TrainBatch) -> dict[str, float]:
        a, step, updater = self.ctx.config.algorithm, self.ctx.step(), self.ctx.updater
        if step < a.critic_warmup:
            return {}
        out, applied = updater.optimize(
            "actor",
            self.module,
            self.optimizer,
            self.scheduler,
            updater.minibatches(batch, step),
            policy_forward(self.ctx.config.rollout.temperature, self.ctx.algorithm.needs.entropy),
            self.ctx.algorithm.actor_loss,
            step,
        )
        for _ in range(applied):
            self.weights.bump()
        if a.use_kl_in_reward or a.use_kl_loss:
            out["actor/kl_coef"] = (
                self.ctx.algorithm.kl_ctrl.value if a.use_kl_in_reward else a.kl_loss_coef
            )
        return out
