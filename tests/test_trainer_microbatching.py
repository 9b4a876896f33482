"""How a mini-batch is cut into micro-batches never changes the update.

Micro-batches are formed from length-sorted rows and trimmed to their own longest
prompt and response (``TrainBatch.trimmed``); losses are normalised by the whole
mini-batch, so any split gives the same gradient up to float rounding.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.trainer.modules import ActorModule
from rlkit.trainer.trainer import RLTrainer
from tests.experiment_factory import small_experiment
from tests.test_trainer_remove_padding import ragged_batch


def test_trimmed_micro_batch_gives_the_full_width_log_probs_and_gradients(tiny_model_dir):
    batch = ragged_batch()  # prompts 1..5 tokens, responses 0..4 tokens, P = 5, T = 4
    micro = batch.select([1, 3])  # prompts [11], [14, 15, 16]; responses of 4 and 1 tokens
    trimmed = micro.trimmed()
    # Longest prompt here 3 (of 5), longest response 4 (of 4): two left columns go.
    assert trimmed.prompt_width == 3 and trimmed.input_ids.shape == (2, 7)
    outputs = []
    for b in (micro, trimmed):
        torch.manual_seed(0)
        actor = ActorModule(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
        logp, ent = actor(b.model_inputs(), b.prompt_width, temperature=0.7)
        mask = b.loss_mask
        (logp * mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in actor.named_parameters() if p.grad is not None}
        outputs.append((logp * mask, ent * mask, grads))
    (logp, ent, grads), (logp_t, ent_t, grads_t) = outputs
    torch.testing.assert_close(logp_t, logp[:, : logp_t.shape[1]], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent_t, ent[:, : ent_t.shape[1]], rtol=1e-5, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(grads_t[name], grads[name], rtol=1e-4, atol=1e-7)


def _one_step(model_dir, out_dir, loss_agg_mode, **optim):
    cfg = small_experiment(
        model_dir,
        out_dir,
        # A length-based reward: responses of different lengths, nonzero advantages.
        data={"reward": "length_penalty", "reward_options": {"max_response_length": 6}},
        algorithm={"use_kl_loss": False, "loss_agg_mode": loss_agg_mode},
        optim={"ppo_mini_batch_size": 2, **optim},  # 2 prompts x 4 responses = 8 rows
        trainer={"total_steps": 1, "save_freq": 0, "save_at_end": False, "tensorboard": False},
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    try:
        metrics = trainer.step()
        backbone = trainer.backend.unwrap(trainer.actor).backbone
        params = {n: p.detach().clone() for n, p in backbone.named_parameters()}
    finally:
        trainer.cleanup()
    return metrics, params


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_split_does_not_change_the_update(demo_model_dir, tmp_path, loss_agg_mode):
    splits = {
        "one micro-batch": {"micro_batch_size": 8},
        "micro-batches of 3": {"micro_batch_size": 3},
        "token budget": {"use_dynamic_bsz": True, "max_token_len_per_micro_batch": 30},
    }
    runs = {}
    for name, optim in splits.items():
        cfg_dir = tmp_path / name.replace(" ", "_")
        runs[name] = _one_step(demo_model_dir, cfg_dir, loss_agg_mode, **optim)
    (m0, p0) = runs["one micro-batch"]
    assert m0["actor/grad_norm"] > 0  # a real update happened
    for name in ("micro-batches of 3", "token budget"):
        metrics, params = runs[name]
        # The same seed gives the same rollout; only the split differs.
        assert metrics["response_length/mean"] == m0["response_length/mean"]
        assert metrics["actor/pg_loss"] == pytest.approx(m0["actor/pg_loss"], rel=1e-5, abs=1e-7)
        assert metrics["actor/grad_norm"] == pytest.approx(m0["actor/grad_norm"], rel=1e-4)
        # Adam's first step is ~lr * sign(grad) = 1e-3 per element, and a gradient that is
        # ~0 may flip sign with rounding; 1e-6 is a thousandth of a step. The gradient's
        # scale is checked through grad_norm above (Adam would hide a scale error).
        for key in p0:
            torch.testing.assert_close(params[key], p0[key], rtol=0, atol=1e-6)
