"""use_remove_padding: packing a micro-batch's real tokens into one row changes no number."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

from rlkit.kernels import apply_kernels
from rlkit.modeling.modules import ActorModule, CriticModule
from rlkit.rollout.base import RolloutBatch
from rlkit.rollout.trajectory import trajectories_from_rollout
from rlkit.trainer.batch import build_batch
from tests.experiment_factory import (
    LENGTH_REWARD,
    StepRun,
    assert_same_adam_update,
    assert_same_gradients,
    run_one_step,
    small_experiment,
)
from tests.numerics import assert_gradients_close, reduction_depth


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


def _load(model_dir, attention: str = "sdpa"):
    """The model under ``sdpa`` or rlkit's CPU kernel ``grouped_sdpa``."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if attention == "grouped_sdpa":
        apply_kernels(model, overrides={"attention": attention}, platform="cpu")
    return model


def _actor_outputs(model_dir, remove_padding: bool, attention: str = "sdpa"):
    torch.manual_seed(0)
    actor = ActorModule(_load(model_dir, attention), chunk_size=3, remove_padding=remove_padding)
    batch = ragged_batch()
    logp, ent = actor(batch.model_inputs(), batch.prompt_width, temperature=0.7)
    mask = batch.loss_mask
    (logp * mask).sum().add((ent * mask).sum()).backward()
    grads = {n: p.grad.clone() for n, p in actor.named_parameters() if p.grad is not None}
    return logp * mask, ent * mask, grads


@pytest.mark.parametrize("attention", ["sdpa", "grouped_sdpa"])
def test_actor_log_probs_entropy_and_gradients_equal_the_padded_forward(tiny_model_dir, attention):
    logp, ent, grads = _actor_outputs(tiny_model_dir, remove_padding=False)
    logp_rp, ent_rp, grads_rp = _actor_outputs(tiny_model_dir, True, attention)
    torch.testing.assert_close(logp_rp, logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_rp, ent, rtol=1e-5, atol=1e-5)
    # One packed row instead of padded rows: other shapes, other blocking of the float32
    # sums. Bounded relative to each tensor's largest gradient (tests/numerics.py); an
    # absolute 1e-6 came within 3x of real differences of near-zero elements on AVX2.
    config = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config
    batch = ragged_batch()
    depth = reduction_depth(config, rows=len(batch), positions=batch.input_ids.shape[1])
    assert_gradients_close(grads_rp, grads, depth=depth)


@pytest.mark.parametrize("attention", ["sdpa", "grouped_sdpa"])
def test_packed_rows_do_not_attend_to_each_other(tiny_model_dir, attention):
    # Changing another row's tokens must not move this row's log-probs.
    actor = ActorModule(_load(tiny_model_dir, attention), remove_padding=True)
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
    def one_step(remove_padding: bool, **optim) -> StepRun:
        return run_one_step(
            small_experiment(
                demo_model_dir,
                tmp_path / f"rp_{remove_padding}_{'lr0' if optim else 'adam'}",
                data=LENGTH_REWARD,  # nonzero advantages: a real update to compare
                model={"use_remove_padding": remove_padding},
                optim=optim,
                trainer={"total_steps": 1, "save_at_end": False, "val_before_train": False},
            )
        )

    # lr = 0: both mini-batches' gradients at the same parameters; then the real AdamW step.
    # Gradients within 2 gamma_D of float32 rounding, parameters within what Adam's
    # sign-like steps allow (tests/numerics.py): Adam's update of a near-zero gradient
    # element follows its rounding.
    for phase in ("gradients", "adam"):
        optim = {"lr": 0.0} if phase == "gradients" else {}
        padded, packed = one_step(False, **optim), one_step(True, **optim)
        # Same seed, same rollout (generation never packs: the same kernels on the same
        # shapes, bitwise on any CPU); the update sees the same numbers. The entropy comes
        # from the old-log-prob pass, before any update.
        assert packed.metrics["critic/score/mean"] == padded.metrics["critic/score/mean"]
        want = padded.metrics["actor/entropy"]
        assert packed.metrics["actor/entropy"] == pytest.approx(want, rel=1e-4)
        if phase == "gradients":
            assert_same_gradients(packed, padded)
            # ppo_kl (mean old - new log-prob) is pure rounding here; after an Adam step it
            # would follow the parameters that near-zero gradients moved either way.
            want = padded.metrics["actor/ppo_kl"]
            assert packed.metrics["actor/ppo_kl"] == pytest.approx(want, rel=1e-4, abs=1e-6)
        else:
            assert_same_adam_update(packed, padded)
