"""How a mini-batch is cut into micro-batches never changes the update.

Micro-batches are formed from length-sorted rows and trimmed to their own longest
prompt and response (``TrainBatch.trimmed``); losses are normalised by the whole
mini-batch, so any split gives the same gradient up to float rounding.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.modeling.modules import ActorModule
from tests.experiment_factory import (
    LENGTH_REWARD,
    StepRun,
    assert_same_adam_update,
    assert_same_gradients,
    run_one_step,
    small_experiment,
)
from tests.numerics import assert_gradients_close, reduction_depth
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
    # Other shapes, other blocking of the float32 sums: rounding-level differences, bounded
    # relative to each tensor's largest gradient (tests/numerics.py). An absolute 1e-7 was
    # within 1.4x of real differences on AVX2 (near-zero elements of small tensors).
    depth = reduction_depth(actor.backbone.config, rows=2, positions=micro.input_ids.shape[1])
    assert_gradients_close(grads_t, grads, depth=depth)


def _one_step(model_dir, out_dir, loss_agg_mode, **optim) -> StepRun:
    return run_one_step(
        small_experiment(
            model_dir,
            out_dir,
            data=LENGTH_REWARD,  # responses of different lengths: nonzero advantages
            algorithm={"use_kl_loss": False, "loss_agg_mode": loss_agg_mode},
            optim={"ppo_mini_batch_size": 2, **optim},  # 2 prompts x 4 responses = 8 rows
            trainer={"total_steps": 1, "save_freq": 0, "save_at_end": False, "tensorboard": False},
        )
    )


SPLITS = {
    "one micro-batch": {"micro_batch_size": 8},
    "micro-batches of 3": {"micro_batch_size": 3},
    "token budget": {"use_dynamic_bsz": True, "max_token_len_per_micro_batch": 30},
}


def _runs(model_dir, tmp_path, loss_agg_mode, **optim) -> dict[str, StepRun]:
    runs = {
        name: _one_step(
            model_dir, tmp_path / name.replace(" ", "_"), loss_agg_mode, **split, **optim
        )
        for name, split in SPLITS.items()
    }
    ref = runs["one micro-batch"]
    assert len(ref.grads) == 2  # 2 mini-batches of 2 prompts: 2 optimizer steps
    for run in runs.values():
        # Generation comes before the update and never sees the split: every run samples
        # with the same seed, model and kernels on the same shapes, so the rollout (and
        # everything computed from it before the update) is bitwise the same on any CPU.
        assert run.metrics["response_length/mean"] == ref.metrics["response_length/mean"]
        assert run.metrics["critic/advantages/max"] == ref.metrics["critic/advantages/max"]
    return runs


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_split_does_not_change_the_gradients(demo_model_dir, tmp_path, loss_agg_mode):
    # lr = 0: the parameters never move, so both mini-batches' gradients are taken at the
    # same parameters in every run, and differ only by float32 rounding: within 2 gamma_D
    # (~1.7e-4) of each tensor's largest element (tests/numerics.py). A wrong normaliser or
    # a lost token changes them by 1e-2 or more.
    runs = _runs(demo_model_dir, tmp_path, loss_agg_mode, lr=0.0)
    for name in ("micro-batches of 3", "token budget"):
        assert_same_gradients(runs[name], runs["one micro-batch"])


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_split_does_not_change_the_adam_update(demo_model_dir, tmp_path, loss_agg_mode):
    # End to end with the experiment's AdamW (lr 1e-3). Adam's step is ~lr * sign(grad), so a
    # gradient element that is ~0 may step either way with rounding (an absolute 1e-6, a
    # thousandth of a step, failed by 1.1e-6 to 2.7e-6 on AVX2, AVX-512 and scalar kernels):
    # the parameters are compared with a bound no such flip can break, and almost all must
    # agree to lr/1000 (tests/numerics.py). Adam hides a scale error; the test above checks
    # the gradients themselves.
    runs = _runs(demo_model_dir, tmp_path, loss_agg_mode)
    for name in ("micro-batches of 3", "token budget"):
        assert_same_adam_update(runs[name], runs["one micro-batch"])
