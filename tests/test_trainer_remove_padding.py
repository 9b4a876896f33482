"""use_remove_padding: packing a micro-batch's real tokens into one row changes no number."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

from rlkit.rollout.base import RolloutBatch
from rlkit.rollout.trajectory import trajectories_from_rollout
from rlkit.trainer.batch import build_batch
from rlkit.trainer.modules import ActorModule, CriticModule
from rlkit.trainer.trainer import RLTrainer
from tests.experiment_factory import small_experiment


def ragged_batch():
    # Prompts of 1..5 tokens (left padding 4..0) and responses of 0..4 tokens (right
    # padding): every padding case, including an empty response.
    prompts = [[5, 6, 7, 8, 9], [11], [12, 13], [14, 15, 16], [17, 18, 19, 20]]
    responses = [[21, 22, 23], [24, 25, 26, 27], [], [28], [29, 30]]
    rollout = RolloutBatch(
        prompt_ids=prompts,
        response_ids=responses,
        rollout_log_probs=[[0.0] * len(r) for r in responses],
        finish_reasons=["length"] * 5,
        prompt_index=list(range(5)),
    )
    return build_batch(
        trajectories_from_rollout(rollout, policy_version=0),
        pad_token_id=0,
        response_width=4,
        index=list(range(5)),
        scores=[0.0] * 5,
        acc=[0.0] * 5,
        data_sources=["toy"] * 5,
    )


def _actor_outputs(model_dir, remove_padding: bool):
    torch.manual_seed(0)
    actor = ActorModule(
        AutoModelForCausalLM.from_pretrained(model_dir), chunk_size=3, remove_padding=remove_padding
    )
    batch = ragged_batch()
    logp, ent = actor(batch.model_inputs(), batch.prompt_width, temperature=0.7)
    mask = batch.loss_mask
    (logp * mask).sum().add((ent * mask).sum()).backward()
    grads = {n: p.grad.clone() for n, p in actor.named_parameters() if p.grad is not None}
    return logp * mask, ent * mask, grads


def test_actor_log_probs_entropy_and_gradients_equal_the_padded_forward(tiny_model_dir):
    logp, ent, grads = _actor_outputs(tiny_model_dir, remove_padding=False)
    logp_rp, ent_rp, grads_rp = _actor_outputs(tiny_model_dir, remove_padding=True)
    torch.testing.assert_close(logp_rp, logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_rp, ent, rtol=1e-5, atol=1e-5)
    assert grads.keys() == grads_rp.keys() and len(grads) > 0
    for name in grads:
        torch.testing.assert_close(grads_rp[name], grads[name], rtol=1e-4, atol=1e-6)


def test_packed_rows_do_not_attend_to_each_other(tiny_model_dir):
    # Changing another row's tokens must not move this row's log-probs.
    actor = ActorModule(AutoModelForCausalLM.from_pretrained(tiny_model_dir), remove_padding=True)
    batch = ragged_batch()
    with torch.no_grad():
        before, _ = actor(batch.model_inputs(), batch.prompt_width)
        batch.input_ids[0, -4:-1] = torch.tensor([40, 41, 42])  # row 0's response
        after, _ = actor(batch.model_inputs(), batch.prompt_width)
    torch.testing.assert_close(after[1:], before[1:], rtol=0, atol=1e-6)
    assert not torch.allclose(after[0, 1:3], before[0, 1:3])


def test_critic_values_equal_the_padded_forward(tiny_model_dir):
    batch = ragged_batch()
    mask = batch.loss_mask
    values = []
    for remove_padding in (False, True):
        critic = CriticModule(
            AutoModel.from_pretrained(tiny_model_dir), remove_padding=remove_padding
        )
        torch.nn.init.normal_(critic.value_head.weight, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            values.append(critic(batch.model_inputs(), batch.prompt_width) * mask)
    torch.testing.assert_close(values[1], values[0], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_trainer_step_with_remove_padding_matches_the_padded_step(demo_model_dir, tmp_path):
    def one_step(remove_padding: bool):
        cfg = small_experiment(
            demo_model_dir,
            tmp_path / f"rp_{remove_padding}",
            model={"use_remove_padding": remove_padding},
            trainer={"total_steps": 1, "save_at_end": False, "val_before_train": False},
        )
        trainer = RLTrainer(cfg)
        trainer.setup()
        metrics = trainer.step()
        params = {k: v.detach().clone() for k, v in trainer.actor.state_dict().items()}
        trainer.cleanup()
        return metrics, params

    padded, padded_params = one_step(False)
    packed, packed_params = one_step(True)
    # Same seed, same rollout (generation never packs); the update sees the same numbers.
    assert packed["critic/score/mean"] == padded["critic/score/mean"]
    for key in ("actor/entropy", "actor/pg_loss", "actor/grad_norm", "actor/ppo_kl"):
        assert packed[key] == pytest.approx(padded[key], rel=1e-4, abs=1e-6), key
    for k in padded_params:
        torch.testing.assert_close(packed_params[k], padded_params[k], rtol=1e-4, atol=1e-6)
