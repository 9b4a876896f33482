"""Vision-language policies: a tiny Qwen2.5-VL (built locally, warmed up on naming the colour
of a square) through image prompts, rollout, training steps and their bad input."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import AutoTokenizer

from rlkit.data.image_prompts import ImagePromptRenderer
from rlkit.data.prompt_dataset import PromptDataError
from rlkit.models.loading import load_causal_lm
from rlkit.rollout.embedded.kv_decode import decode
from rlkit.tasks.colour_shapes import colour_dataset
from rlkit.trainer.prompts import tokenize_prompts
from tests.experiment_factory import assert_same_gradients, run_one_step, small_experiment
from tests.numerics import gamma, reduction_depth

N = 4
MAX_NEW = 8


def vision_experiment(model_dir, out, **sections):
    """4 image prompts x 4 responses of up to 8 tokens per step, rewarded by length (so a
    group's responses always differ in reward)."""
    data = {
        "dataset_fn": functools.partial(colour_dataset, limit=16),
        "max_prompt_length": 32,
        "val_limit": 4,
        "reward": "length_penalty",
        "reward_options": {"max_response_length": MAX_NEW},
    } | sections.pop("data", {})
    rollout = {"max_response_length": MAX_NEW} | sections.pop("rollout", {})
    trainer = {"total_steps": 1, "val_before_train": False} | sections.pop("trainer", {})
    return small_experiment(model_dir, out, data=data, rollout=rollout, trainer=trainer, **sections)


@pytest.fixture(scope="module")
def vision_model(vision_model_dir):
    model = load_causal_lm(vision_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(vision_model_dir)
    renderer = ImagePromptRenderer.for_model(vision_model_dir, tokenizer)
    return model, tokenizer, renderer


def image_prompts(tokenizer, renderer, limit=3):
    return tokenize_prompts(
        colour_dataset("val", limit=limit),
        tokenizer,
        max_prompt_length=32,
        truncation="error",
        use_chat_template=True,
        name="val",
        images=renderer,
    )


def test_an_image_prompt_stands_as_one_image_token_per_merged_patch(vision_model):
    # 56 x 56 pixels = 4 x 4 patches of 14; merged 2 x 2 -> 4 image tokens, between the
    # vision start and end tokens, where the message had <image>.
    model, tokenizer, renderer = vision_model
    prompts = image_prompts(tokenizer, renderer, limit=1)
    ids, images = prompts.token_ids[0], prompts.multimodal[0]
    c = model.config
    assert images["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert images["pixel_values"].shape == (16, 3 * 2 * 14 * 14)
    start = ids.index(c.vision_start_token_id)
    assert ids[start : start + 6] == [
        c.vision_start_token_id,
        *[c.image_token_id] * 4,
        c.vision_end_token_id,
    ]
    assert tokenizer.decode(ids[start + 6 :]) == "colour?"
    assert prompts.images[0][0].size == (56, 56)


def test_image_prompt_rollout_log_probs_equal_transformers_teacher_forced_pass(vision_model):
    """Each sampled token's log-prob (KV-cache decode, vision tower once per prompt, rlkit's
    positions) against transformers' own forward over prompt + response, which merges the
    image features and derives the multimodal positions itself.

    Tolerance: both are float32 chains of the same sums in other orders (a cache read vs
    a full pass), so they differ by at most 2 gamma_D of the logits' magnitude
    (tests/numerics.py), D for one row of prompt + response; the log-softmax adds the
    vocabulary's sum, which D counts."""
    model, tokenizer, renderer = vision_model
    prompts = image_prompts(tokenizer, renderer)
    torch.manual_seed(0)
    result = decode(
        model,
        prompts.token_ids,
        n=N,
        max_new_tokens=MAX_NEW,
        pad_token_id=tokenizer.pad_token_id,
        stop_token_ids=[tokenizer.eos_token_id],
        warp=None,
        images=prompts.multimodal,
    )
    assert len(result.response_ids) == N * len(prompts)
    width = max(map(len, prompts.token_ids)) + MAX_NEW
    tol = 2 * gamma(reduction_depth(model.config, rows=1, positions=width))
    image = model.config.image_token_id
    for row, (response, log_probs) in enumerate(zip(result.response_ids, result.log_probs)):
        prompt, images = prompts.token_ids[row // N], prompts.multimodal[row // N]
        ids = torch.tensor([prompt + response])
        types = torch.tensor([[int(t == image) for t in prompt] + [0] * len(response)])
        with torch.no_grad():
            logits = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                mm_token_type_ids=types,
                **images,
            ).logits[0, len(prompt) - 1 : -1]
        want = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(prompt) :, None])
        scale = logits.abs().max().item()
        torch.testing.assert_close(torch.tensor(log_probs), want[:, 0], rtol=0, atol=tol * scale)


def test_the_n_samples_of_an_image_prompt_run_its_vision_tower_once(vision_model):
    model, tokenizer, renderer = vision_model
    prompts = image_prompts(tokenizer, renderer)
    calls = []
    hook = model.model.visual.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    try:
        decode(
            model,
            prompts.token_ids,
            n=N,
            max_new_tokens=3,
            pad_token_id=tokenizer.pad_token_id,
            stop_token_ids=[],
            warp=None,
            images=prompts.multimodal,
        )
    finally:
        hook.remove()
    assert calls == [16 * len(prompts)]  # one pass over each prompt's 16 patches


@pytest.mark.parametrize("remove_padding", [False, True])
def test_a_grpo_step_on_image_prompts_scores_with_the_samplers_log_probs(
    vision_model_dir, tmp_path, remove_padding
):
    # The trainer's own check: the engine's log-probs against the actor's forward over
    # the whole batch (padded rows or one packed row) agree to float rounding.
    run = run_one_step(
        vision_experiment(vision_model_dir, tmp_path, model={"use_remove_padding": remove_padding})
    )
    m = run.metrics
    assert m["rollout/logprob_diff_max"] < 1e-4
    assert m["actor/grad_norm"] > 0 and m["prompt_length/mean"] > 6


@pytest.mark.parametrize("attention", ["grouped_sdpa", "sdpa"])
def test_packed_image_rows_give_the_padded_rows_gradients(vision_model_dir, tmp_path, attention):
    # grouped_sdpa attends each packed row within its segment; sdpa reads the row
    # boundaries from the text positions rlkit puts first (4 position rows, not 3).
    runs = [
        run_one_step(
            vision_experiment(
                vision_model_dir,
                tmp_path / str(packed),
                model={"use_remove_padding": packed, "kernel_overrides": {"attention": attention}},
                optim={"lr": 0.0},
            )
        )
        for packed in (False, True)
    ]
    assert_same_gradients(runs[1], runs[0])


def _is_vision(name: str) -> bool:
    return ".visual." in f".{name}"


@pytest.mark.parametrize("freeze", [False, True])
def test_a_grpo_step_trains_the_vision_tower_unless_it_is_frozen(
    vision_model_dir, tmp_path, freeze
):
    run = run_one_step(
        vision_experiment(vision_model_dir, tmp_path, model={"freeze_vision_tower": freeze})
    )
    vision = [n for n in run.initial if _is_vision(n)]
    language = [n for n in run.initial if not _is_vision(n)]
    assert vision and language
    grads = run.grads[0]
    moved = {n for n in run.initial if not torch.equal(run.initial[n], run.params[n])}
    assert any(n in moved for n in language)
    if freeze:
        assert not any(n in grads for n in vision)  # not even handed to the optimizer
        assert not any(n in moved for n in vision)
    else:
        assert all(n in grads for n in vision)
        assert any(grads[n].abs().max() > 0 for n in vision)
        assert any(n in moved for n in vision)


def test_images_on_a_text_only_model_stop_at_the_row(demo_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)
    with pytest.raises(
        PromptDataError,
        match=r"train prompt 0 .* has 1 image\(s\), but the "
        r"model is text-only; set ModelConfig.path to a vision-language",
    ):
        tokenize_prompts(
            colour_dataset("train", limit=2),
            tokenizer,
            max_prompt_length=32,
            truncation="error",
            use_chat_template=True,
            name="train",
        )


def test_an_image_prompt_is_never_cut_by_left_truncation(vision_model):
    _, tokenizer, renderer = vision_model
    with pytest.raises(
        PromptDataError,
        match=r"image prompt \(never cut\) of 13 tokens > "
        r"DataConfig.max_prompt_length=8; .*truncation to filter",
    ):
        tokenize_prompts(
            colour_dataset("val", limit=1),
            tokenizer,
            max_prompt_length=8,
            truncation="left",
            use_chat_template=True,
            name="val",
            images=renderer,
        )


def test_a_vision_language_model_on_a_server_engine_stops_at_config_time(
    vision_model_dir, tmp_path
):
    with pytest.raises(ValueError, match="is a vision-language model") as info:
        vision_experiment(vision_model_dir, tmp_path, rollout={"engine": "sglang"}).validate()
    assert "RolloutConfig.engine = 'sglang' cannot serve it: set RolloutConfig.engine = 'hf'" in (
        str(info.value)
    )


def test_a_tool_agent_step_on_image_prompts_scores_with_the_samplers_log_probs(
    vision_model_dir, tmp_path
):
    # Each turn's context (prompt with its image, earlier turns, tool answers) is generated
    # from again with the prompt's images; the trainer's forward agrees with the sampler.
    run = run_one_step(
        vision_experiment(
            vision_model_dir,
            tmp_path,
            rollout={
                "agent_loop": "tool_agent",
                "agent": {"tools": ["calculator"], "max_turns": 2, "max_turn_tokens": 4},
            },
        )
    )
    assert run.metrics["rollout/logprob_diff_max"] < 1e-4
    assert run.metrics["actor/grad_norm"] > 0


def test_an_image_token_sampled_in_an_earlier_turn_is_read_as_text(vision_model):
    """A context whose response part holds the image token (sampled by the policy): only
    the prompt's image tokens take the image's features; the later one keeps its token
    embedding and text position. The reference builds that input by hand from
    transformers' own vision features and positions (``mm_token_type_ids`` marks the
    prompt's image tokens only); transformers' forward itself refuses such ids."""
    model, tokenizer, renderer = vision_model
    prompts = image_prompts(tokenizer, renderer, limit=1)
    image = model.config.image_token_id
    context = prompts.token_ids[0] + [image, tokenizer.eos_token_id]
    torch.manual_seed(0)
    result = decode(
        model,
        [context],
        n=1,
        max_new_tokens=4,
        pad_token_id=tokenizer.pad_token_id,
        stop_token_ids=[],
        warp=None,
        images=prompts.multimodal,
    )
    ids = torch.tensor([context + result.response_ids[0]])
    types = torch.tensor([[int(t == image) for t in prompts.token_ids[0]]])
    types = torch.cat([types, torch.zeros(1, ids.shape[1] - types.shape[1], dtype=torch.long)], 1)
    trunk, images = model.model, prompts.multimodal[0]
    with torch.no_grad():
        features = trunk.get_image_features(**images, return_dict=True).pooler_output[0]
        embeds = trunk.get_input_embeddings()(ids)
        embeds[types.bool()] = features
        positions, _ = trunk.get_rope_index(
            ids, mm_token_type_ids=types, image_grid_thw=images["image_grid_thw"]
        )
        logits = model(inputs_embeds=embeds, position_ids=positions).logits
    logits = logits[0, len(context) - 1 : -1]
    want = torch.log_softmax(logits, -1).gather(-1, ids[0, len(context) :, None])[:, 0]
    # As in the teacher-forcing test above: 2 gamma_D of the logits' magnitude.
    tol = 2 * gamma(reduction_depth(model.config, rows=1, positions=ids.shape[1]))
    atol = tol * logits.abs().max().item()
    torch.testing.assert_close(torch.tensor(result.log_probs[0]), want, rtol=0, atol=atol)


def picture_names_the_truth(response: str, ground_truth: str, images: list, **_: object) -> float:
    """1 when the row's one picture shows the ground truth's colour (whatever the
    response): a reward that reads the images, to see they are the row's own."""
    from rlkit.tasks.colour_shapes import COLOURS

    (picture,) = images
    pixel = max(picture.getdata(), key=sum)  # the brightest: the square's colour

    def distance(name: str) -> float:
        # shades scale the colour down, so compare directions, not values
        rgb = COLOURS[name]
        norm = sum(c * c for c in rgb) ** 0.5 * sum(c * c for c in pixel) ** 0.5
        return -sum(a * b for a, b in zip(rgb, pixel)) / norm

    return float(min(COLOURS, key=distance) == ground_truth)


def test_a_reward_that_names_images_receives_the_rows_pictures(vision_model_dir, tmp_path):
    run = run_one_step(
        vision_experiment(
            vision_model_dir,
            tmp_path,
            data={
                "reward": "tests.test_vision_language:picture_names_the_truth",
                "reward_options": {},
            },
        )
    )
    assert run.metrics["critic/score/mean"] == 1.0


def test_a_ppo_step_runs_critic_and_reference_over_image_rows_with_a_token_budget(
    vision_model_dir, tmp_path
):
    # GAE needs the critic's values (a Qwen2.5-VL trunk with a value head), the KL loss
    # the reference's log-probs; micro-batches are cut by a token budget that counts the
    # image tokens (every prompt is 13 tokens, 4 of them the image's).
    run = run_one_step(
        vision_experiment(
            vision_model_dir,
            tmp_path,
            algorithm={"adv_estimator": "gae", "use_kl_loss": True},
            model={"use_remove_padding": True},
            optim={"use_dynamic_bsz": True, "max_token_len_per_micro_batch": 48},
        )
    )
    m = run.metrics
    assert m["rollout/logprob_diff_max"] < 1e-4
    for key in ("critic/vf_loss", "actor/kl_loss", "critic/values/mean"):
        assert torch.isfinite(torch.tensor(m[key])), key
    assert m["actor/grad_norm"] > 0 and m["critic/grad_norm"] > 0


def test_qwen2_vl_inputs_built_by_rlkit_equal_transformers_own_forward():
    """Qwen2-VL (the first generation) goes through the same functions: rlkit's image
    embeddings and multimodal positions give transformers' own forward exactly (the
    same operations in the same order)."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from rlkit.models.vision_language import image_embeddings, rope_positions, vision_trunk

    image, start, end = 290, 292, 293
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": 300,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [4, 2, 2],
            },
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2},
        image_token_id=image,
        video_token_id=291,
        vision_start_token_id=start,
        vision_end_token_id=end,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(config).eval()
    # two left-padded rows, each with one 56 x 56 image (4 x 4 patches -> 4 tokens)
    ids = torch.tensor(
        [
            [0, 0, 5, start, *[image] * 4, end, 7, 8],
            [5, 6, 9, start, *[image] * 4, end, 7, 8],
        ]
    )
    mask = (ids != 0).long()
    images = {
        "pixel_values": torch.randn(32, 3 * 2 * 14 * 14),
        "image_grid_thw": torch.tensor([[1, 4, 4], [1, 4, 4]]),
    }
    trunk = vision_trunk(model)
    positions, _ = rope_positions(trunk, ids, mask, images["image_grid_thw"])
    with torch.no_grad():
        ours = model(
            inputs_embeds=image_embeddings(trunk, ids, images),
            position_ids=positions,
            attention_mask=mask,
        ).logits
        theirs = model(
            input_ids=ids, attention_mask=mask, mm_token_type_ids=(ids == image).int(), **images
        ).logits
    assert torch.equal(ours[mask.bool()], theirs[mask.bool()])


def test_a_vision_language_run_exports_a_model_that_renders_images_again(
    vision_model_dir, tmp_path
):
    # Both exports, at the end of the run and by `rlkit export` from its checkpoint, are
    # Qwen2.5-VL directories with the image processor beside the weights.
    from rlkit.export import main as export_main
    from rlkit.trainer.trainer import RLTrainer

    out = tmp_path / "run"
    cfg = vision_experiment(
        vision_model_dir, out, trainer={"save_freq": 1, "export_hf_at_end": True}
    )
    RLTrainer(cfg).run()
    exported = tmp_path / "exported"
    assert export_main([str(out / "checkpoints" / "global_step_1"), str(exported)]) == 0
    at_end = out / "hf_model"
    first = load_causal_lm(str(at_end))
    for directory in (at_end, exported):
        model = load_causal_lm(str(directory))
        assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
        tokenizer = AutoTokenizer.from_pretrained(directory)
        renderer = ImagePromptRenderer.for_model(str(directory), tokenizer)
        prompts = image_prompts(tokenizer, renderer, limit=1)
        assert prompts.multimodal[0]["image_grid_thw"].tolist() == [[1, 4, 4]]
        for (name, a), b in zip(first.state_dict().items(), model.state_dict().values()):
            assert torch.equal(a, b), name
    initial = load_causal_lm(vision_model_dir).state_dict()
    assert any(not torch.equal(initial[n], t) for n, t in first.state_dict().items())
