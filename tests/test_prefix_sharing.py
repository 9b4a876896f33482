"""Shared-prefix forwards equal the plain rows: log-probs, entropy, values and gradients."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.kernels import apply_kernels
from rlkit.modeling.modules import ActorModule, CriticModule
from rlkit.modeling.prefix_sharing import prompt_groups
from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer
from rlkit.rollout.trajectory import Trajectory
from rlkit.trainer.batch import build_batch


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_qwen2(tmp_path_factory.mktemp("prefix") / "m", train_byte_tokenizer())


def load(model_dir, attention: str):
    """The model with attention ``sdpa``, ``eager`` or rlkit's kernel ``grouped_sdpa``."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir,
        dtype=torch.float32,
        attn_implementation="sdpa" if attention == "grouped_sdpa" else attention,
    )
    if attention == "grouped_sdpa":
        apply_kernels(model, overrides={"attention": attention}, platform="cpu")
    return model


def grouped_batch(vocab: int, *, tool_tokens: bool = False, seed: int = 0):
    """3 prompts of lengths 5, 2, 7 with 4, 1, 3 responses of 0..6 tokens, rows shuffled
    (a group need not be contiguous); with ``tool_tokens``, some response tokens are
    inserted (loss mask 0), as a tool turn's are."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (5, 2, 7)]
    rows = []
    for p, count in zip(prompts, (4, 1, 3)):
        for _ in range(count):
            n = rng.randrange(0, 7)
            response = [rng.randrange(3, vocab) for _ in range(n)]
            mask = [int(not (tool_tokens and 1 <= i <= 2)) for i in range(n)]
            rows.append((p, response, mask))
    rng.shuffle(rows)
    trajectories = [
        Trajectory(
            prompt_ids=p,
            response_ids=r,
            loss_mask=m,
            rollout_log_probs=[0.0] * len(r),
            policy_version=[0 if keep else -1 for keep in m],  # -1: inserted, not sampled
            prompt_index=0,
        )
        for p, r, m in rows
    ]
    return build_batch(
        trajectories,
        pad_token_id=0,
        response_width=6,
        index=list(range(len(rows))),
        scores=[0.0] * len(rows),
        acc=[0.0] * len(rows),
        data_sources=["toy"] * len(rows),
    )


def test_rows_are_grouped_by_their_real_prompt_tokens():
    ids = torch.tensor([[0, 5, 6, 9], [5, 5, 6, 9], [0, 5, 6, 8], [0, 0, 7, 1]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 1, 1]])
    # Prompt width 3: row 0 and row 2 have prompt [5, 6]; row 1 has [5, 5, 6]; row 3 [7].
    assert prompt_groups(ids, mask, 3) == [[0, 2], [1], [3]]


@pytest.mark.parametrize("attention", ["sdpa", "grouped_sdpa", "eager"])
@pytest.mark.parametrize("tool_tokens", [False, True])
def test_shared_prefix_log_probs_entropy_and_gradients_equal_the_plain_rows(
    model_dir, attention, tool_tokens
):
    results = {}
    for share in (False, True):
        backbone = load(model_dir, attention)
        actor = ActorModule(backbone, share_prefix=share)
        batch = grouped_batch(backbone.config.vocab_size, tool_tokens=tool_tokens)
        logp, entropy = actor(batch.model_inputs(), batch.prompt_width, 0.7, True)
        mask = batch.loss_mask.bool()
        # A loss that weighs every token differently, so each gradient term shows.
        weights = torch.linspace(0.5, 1.5, mask.numel()).reshape(mask.shape)
        ((logp + 0.1 * entropy) * weights * mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in backbone.named_parameters() if p.grad is not None}
        results[share] = (logp[mask], entropy[mask], grads)
    (lp0, en0, g0), (lp1, en1, g1) = results[False], results[True]
    torch.testing.assert_close(lp1, lp0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(en1, en0, rtol=1e-5, atol=1e-5)
    assert g0.keys() == g1.keys() and len(g0) > 10
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-4, atol=1e-6, msg=name)


def test_shared_prefix_values_equal_the_plain_rows(model_dir):
    out = {}
    for share in (False, True):
        critic = CriticModule(load(model_dir, "sdpa"), share_prefix=share)
        torch.nn.init.normal_(critic.value_head.weight, std=0.5)  # zero-initialised otherwise
        batch = grouped_batch(critic.backbone.config.vocab_size, seed=1)
        values = critic(batch.model_inputs(), batch.prompt_width)
        values[batch.loss_mask.bool()].sum().backward()
        out[share] = (values[batch.loss_mask.bool()], critic.value_head.weight.grad.clone())
    torch.testing.assert_close(out[True][0], out[False][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[True][1], out[False][1], rtol=1e-5, atol=1e-5)


def packed_lengths(batch, config) -> list[int]:
    """Each packed sequence's length: its prompt and its chunk's responses."""
    from rlkit.modeling.prefix_sharing import cheapest_chunks

    mask = batch.attention_mask
    prompts = mask[:, : batch.prompt_width].sum(1).tolist()
    responses = mask[:, batch.prompt_width :].sum(1).tolist()
    groups = prompt_groups(batch.input_ids, mask, batch.prompt_width)
    chunks = [c for g in groups for c in cheapest_chunks(g, prompts, responses, config)]
    return [prompts[c[0]] + sum(responses[r] for r in c) for c in chunks]


def test_grouped_sdpa_runs_the_packed_sequences_as_one_row_without_padding(model_dir):
    backbone = load(model_dir, "grouped_sdpa")
    seen = []
    backbone.model.embed_tokens.register_forward_hook(
        lambda module, args, out: seen.append(tuple(args[0].shape))
    )
    batch = grouped_batch(backbone.config.vocab_size)
    ActorModule(backbone, share_prefix=True)(batch.model_inputs(), batch.prompt_width, 1.0, False)
    lengths = packed_lengths(batch, backbone.config)
    # One row holding exactly the packed sequences' tokens; padded rows would be
    # len(lengths) x max(lengths).
    assert len(lengths) > 1 and min(lengths) < max(lengths)
    assert seen == [(1, sum(lengths))]


def test_a_model_that_does_not_hand_on_the_segments_is_refused(model_dir):
    from rlkit.kernels.segmented_attention import SEGMENTS_KWARG

    backbone = load(model_dir, "grouped_sdpa")

    def drop_segments(module, args, kwargs):
        kwargs.pop(SEGMENTS_KWARG, None)
        return args, kwargs

    for layer in backbone.model.layers:
        layer.register_forward_pre_hook(drop_segments, with_kwargs=True)
    batch = grouped_batch(backbone.config.vocab_size)
    actor = ActorModule(backbone, share_prefix=True)
    with pytest.raises(RuntimeError, match="set ModelConfig.share_prompt_prefix=False"):
        actor(batch.model_inputs(), batch.prompt_width, 1.0, False)


def test_an_attention_without_custom_masks_falls_back_to_plain_rows(model_dir):
    from rlkit.modeling.prefix_sharing import supports_prefix_sharing

    backbone = load(model_dir, "sdpa")
    assert supports_prefix_sharing(backbone.model, {"input_ids": None})
    assert not supports_prefix_sharing(backbone.model, {"multimodal": {"pixel_values": 1}})
    backbone.model.config._attn_implementation = "flash_attention_2"
    assert not supports_prefix_sharing(backbone.model, {})


def test_row_split_keeps_groups_whole_and_cuts_only_groups_too_large():
    from rlkit.trainer.prompt_groups import grouped_row_split

    # Groups {0,3} (longest response 5), {1,2,4} (2), {5} (9); at most 3 rows each.
    # By longest response: {1,2,4} | {0,3} | {5}; {0,3} + {5} fit together.
    lengths = [5, 1, 2, 4, 2, 9]
    parts = grouped_row_split([[0, 3], [1, 2, 4], [5]], lengths, micro_batch_size=3)
    assert [p.tolist() for p in parts] == [[1, 2, 4], [0, 3, 5]]
    # A group of 5 with at most 2 rows per micro-batch: chunks [0,1], [2,3], [4].
    parts = grouped_row_split([[0, 1, 2, 3, 4]], [1] * 5, micro_batch_size=2)
    assert [p.tolist() for p in parts] == [[0, 1], [2, 3], [4]]


def test_token_split_counts_each_group_as_one_packed_row():
    from rlkit.trainer.prompt_groups import grouped_token_split

    # Prompt 10 + responses 5, 5, 5 = one packed row of 25; a second group 4 + 6 = 10.
    prompts, responses = [10, 10, 10, 4], [5, 5, 5, 6]
    parts = grouped_token_split([[0, 1, 2], [3]], prompts, responses, max_tokens=50)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3]]  # 2 rows x 25 = 50 fits
    # A budget of 20: the first group is cut, 10 + 5 + 5 = 20 | 10 + 5 = 15.
    parts = grouped_token_split([[0, 1, 2], [3]], prompts, responses, max_tokens=20)
    assert sorted(p.tolist() for p in parts) == [[0, 1], [2], [3]]


def test_processes_get_whole_groups_when_they_split_evenly():
    from rlkit.trainer.prompt_groups import whole_group_shares

    groups = [[0, 1], [2, 3], [4, 5], [6, 7]]
    lengths = [9, 9, 1, 1, 8, 8, 2, 2]  # group tokens 18, 2, 16, 4
    # Balanced: {18, 2} = 20 and {16, 4} = 20 (heaviest with lightest).
    shares = whole_group_shares(groups, lengths, 2, balance=True)
    assert sorted(shares) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert whole_group_shares(groups, lengths, 2, balance=False) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert whole_group_shares([[0, 1], [2]], [1, 1, 1], 1, balance=True) is None  # sizes differ
    assert whole_group_shares(groups[:3], lengths[:6], 2, balance=True) is None  # 3 groups, 2


@pytest.mark.parametrize("dynamic", [False, True], ids=["rows", "token_budget"])
def test_a_trainer_step_with_shared_prefixes_equals_one_on_plain_rows(
    demo_model_dir, tmp_path, dynamic
):
    """Every pass of a PPO step (old and reference log-probs, values, actor and critic
    updates) on shared prefixes: the gradients the optimizer gets equal the plain rows'."""
    from tests.experiment_factory import (
        LENGTH_REWARD,
        assert_same_gradients,
        run_one_step,
        small_experiment,
    )

    def one_step(share: bool):
        cfg = small_experiment(
            demo_model_dir,
            tmp_path / f"share_{share}",
            data=LENGTH_REWARD,
            model={"share_prompt_prefix": share},
            algorithm={"adv_estimator": "gae", "use_kl_loss": True},
            optim={
                "lr": 0.0,
                "critic_lr": 0.0,
                "ppo_mini_batch_size": 2,
                "micro_batch_size": 3,  # groups of 4 are cut: sharing within each chunk
                "use_dynamic_bsz": dynamic,
                "max_token_len_per_micro_batch": 40,
            },
            trainer={"total_steps": 1, "save_at_end": False, "val_before_train": False},
        )
        return run_one_step(cfg)

    plain, shared = one_step(False), one_step(True)
    assert shared.metrics["critic/score/mean"] == plain.metrics["critic/score/mean"]
    assert_same_gradients(shared, plain)
    for key in ("actor/entropy", "critic/values/mean", "critic/vf_loss", "actor/kl_loss"):
        assert shared.metrics[key] == pytest.approx(plain.metrics[key], rel=1e-4, abs=1e-6), key


def test_packing_is_chosen_only_where_it_saves_flops():
    from types import SimpleNamespace

    from rlkit.modeling.prefix_sharing import cheapest_chunks

    # Qwen2.5-0.5B's shape: D = 2 x 355M weights of the layers, A = 4 x 64 x 14 x 24.
    config = SimpleNamespace(
        hidden_size=896,
        num_attention_heads=14,
        num_key_value_heads=2,
        num_hidden_layers=24,
        intermediate_size=4864,
        vocab_size=151936,
    )
    group = list(range(8))
    # A 1024-token prompt, 8 responses of 64: packed 1536 tokens instead of 8 x 1088.
    assert cheapest_chunks(group, [1024] * 8, [64] * 8, config) == [group]
    # A 64-token prompt, 8 responses of 4096: attention over 32,832 packed tokens would
    # cost far more than the prompt saves; the rows stay plain.
    assert cheapest_chunks(group, [64] * 8, [4096] * 8, config) == [[r] for r in group]
    # Attended per response (grouped_sdpa's segments): prompt + first response, then each
    # response over 64 + 4096 keys, the plain rows' own attention: the whole group packs.
    assert cheapest_chunks(group, [64] * 8, [4096] * 8, config, per_response_attention=True) == [
        group
    ]


def test_the_test_batches_really_share_their_prompts(model_dir):
    from rlkit.modeling.prefix_sharing import cheapest_chunks, prompt_groups

    config = load(model_dir, "sdpa").config
    batch = grouped_batch(config.vocab_size)
    mask = batch.attention_mask
    groups = prompt_groups(batch.input_ids, mask, batch.prompt_width)
    prompts = mask[:, : batch.prompt_width].sum(1).tolist()
    responses = mask[:, batch.prompt_width :].sum(1).tolist()
    chunks = [c for g in groups for c in cheapest_chunks(g, prompts, responses, config)]
    assert max(len(c) for c in chunks) >= 3  # the equality tests above compare real packing
