"""Shaping rewards (format, DAPO overlong buffer, length penalty) and their composition."""

import pickle

import pytest
import torch

import rewards
from rewards.answer_format import has_think_answer_format
from rewards.length_penalty import length_penalty_value, linear_length_penalty
from rewards.overlong import overlong_buffer_penalty

fmt = rewards.get("format")


def test_shaping_rewards_are_registered():
    assert {"format", "overlong_buffer", "length_penalty", "combined"} <= set(rewards.names())


# -- format -------------------------------------------------------------------
@pytest.mark.parametrize(
    "response",
    [
        "<think>2+2 is 4</think><answer>4</answer>",
        "<think>\nlong thought\n</think>\n\n<answer> 4 </answer>\n",
        "<think>2+2</think> So the answer is $\\boxed{4}$.",
    ],
)
def test_think_then_answer_gets_the_format_score(response):
    assert fmt(response, "4") == 1.0
    assert fmt(response, "4", score=0.5) == 0.5


@pytest.mark.parametrize(
    "response,why",
    [
        ("<answer>4</answer>", "no thinking block"),
        ("<think>2+2</think>", "no answer after it"),
        ("<think></think><answer>4</answer>", "empty thinking"),
        ("<think>a</think><think>b</think><answer>4</answer>", "two blocks"),
        ("<think>a</think><answer>4</answer> trailing words", "text after the answer tag"),
        ("<think>a</think><answer> </answer>", "empty answer"),
        ("<answer>4</answer><think>a</think>", "answer before thinking"),
        ("thinking</think><answer>4</answer>", "unopened block"),
    ],
)
def test_malformed_responses_get_zero(response, why):
    assert fmt(response, "4") == 0.0, why


def test_answer_style_and_open_tag_options():
    tagged = "<think>a</think><answer>4</answer>"
    boxed = "<think>a</think> $\\boxed{4}$"
    assert not has_think_answer_format(tagged, answer_style="boxed")
    assert not has_think_answer_format(boxed, answer_style="tag")
    # Templates that open <think> in the prompt: the response starts inside it.
    assert fmt("a</think><answer>4</answer>", "4", require_open_tag=False) == 1.0
    with pytest.raises(ValueError, match="answer_style"):
        has_think_answer_format(tagged, answer_style="xml")


# -- DAPO overlong buffer -----------------------------------------------------
def test_overlong_penalty_matches_hand_computed_values():
    # Lmax = 100, Lb = 20, factor 1: free up to 80, ramp over 80..100, -1 beyond.
    lengths = torch.tensor([0, 80, 81, 90, 95, 100, 101, 500])
    # 81 -> -(81-80)/20 = -0.05; 90 -> -10/20 = -0.5; 95 -> -15/20 = -0.75; 100 -> -1.
    expected = torch.tensor([0.0, 0.0, -0.05, -0.5, -0.75, -1.0, -1.0, -1.0])
    out = overlong_buffer_penalty(lengths, max_length=100, buffer_length=20, penalty_factor=1.0)
    torch.testing.assert_close(out, expected)
    assert out.dtype == torch.float32 and out.shape == lengths.shape


def test_overlong_penalty_scales_with_the_factor_and_keeps_batch_shape():
    lengths = torch.tensor([[90, 70], [100, 99]])
    # factor 0.5: 90 -> -0.5*0.5 = -0.25; 99 -> -(19/20)*0.5 = -0.475.
    out = overlong_buffer_penalty(lengths, 100, 20, penalty_factor=0.5)
    torch.testing.assert_close(out, torch.tensor([[-0.25, 0.0], [-0.5, -0.475]]))


def test_overlong_penalty_of_zero_is_positive_zero():
    out = overlong_buffer_penalty(torch.tensor([10]), 100, 20)
    assert torch.signbit(out).item() is False


def test_registered_overlong_reward_reads_response_length_from_extras():
    reward = rewards.get("overlong_buffer")
    # DAPO paper values: Lmax = 20480, Lb = 4096; 18432 tokens -> -(18432-16384)/4096 = -0.5.
    assert (
        reward("...", "", max_response_length=20480, buffer_length=4096, response_length=18432)
        == -0.5
    )
    assert rewards.overlong_penalty(18432, max_length=20480, buffer_length=4096) == -0.5
    with pytest.raises(ValueError, match="needs response_length"):
        reward("...", "", max_response_length=100, buffer_length=20)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"max_length": 100, "buffer_length": 0}, "buffer_length"),
        ({"max_length": 100, "buffer_length": 101}, "buffer_length"),
        ({"max_length": 100, "buffer_length": 20, "penalty_factor": -1.0}, "penalty_factor"),
    ],
)
def test_overlong_penalty_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        overlong_buffer_penalty(torch.tensor([1]), **kwargs)


# -- length penalty -----------------------------------------------------------
def test_length_penalty_matches_hand_computed_values():
    # Lt = 50, Lmax = 150, coef 0.4: (L - 50) / 100 * -0.4, clipped to [-0.4, 0].
    lengths = torch.tensor([0, 50, 75, 100, 150, 400])
    # 75 -> -0.25*0.4 = -0.1; 100 -> -0.5*0.4 = -0.2; 150 and beyond -> -0.4.
    expected = torch.tensor([0.0, 0.0, -0.1, -0.2, -0.4, -0.4])
    out = linear_length_penalty(lengths, max_length=150, target_length=50, coef=0.4)
    torch.testing.assert_close(out, expected)


def test_length_penalty_without_target_penalises_every_token():
    # Lt = 0: -L / Lmax; 25 of 100 tokens -> -0.25.
    reward = rewards.get("length_penalty")
    assert reward("...", "", max_response_length=100, response_length=25) == -0.25
    with pytest.raises(ValueError, match="target_length"):
        linear_length_penalty(torch.tensor([1]), max_length=10, target_length=10)


def test_scalar_and_tensor_forms_agree_on_a_grid():
    lengths = torch.arange(0, 130)
    tensor_overlong = overlong_buffer_penalty(lengths, 100, 20, 0.7)
    tensor_length = linear_length_penalty(lengths, 120, 30, 0.3)
    for i, length in enumerate(lengths.tolist()):
        scalar = rewards.overlong_penalty(
            length, max_length=100, buffer_length=20, penalty_factor=0.7
        )
        assert scalar == pytest.approx(tensor_overlong[i].item(), abs=1e-6)
        scalar = length_penalty_value(length, max_length=120, target_length=30, coef=0.3)
        assert scalar == pytest.approx(tensor_length[i].item(), abs=1e-6)


# -- composition --------------------------------------------------------------
OVERLONG = ("overlong_buffer", {"max_response_length": 100, "buffer_length": 20})


def test_compose_sums_base_and_shaping_and_reports_each_part():
    reward = rewards.compose("gsm8k", shaping=["format", OVERLONG])
    out = reward("<think>9*2</think><answer>#### 18</answer>", "18", response_length=90)
    # 1 (correct) + 1 (format) - 0.5 (90 tokens: -(90-80)/20) = 1.5
    assert out == {
        "score": 1.5,
        "gsm8k": 1.0,
        "acc": 1.0,
        "pred": "18",
        "format": 1.0,
        "overlong_buffer": -0.5,
    }


def test_combined_reward_by_name_equals_compose():
    response, extra = "<think>x</think><answer>#### 17</answer>", {"response_length": 95}
    composed = rewards.compose("gsm8k", shaping=["format", OVERLONG])(response, "18", **extra)
    named = rewards.get("combined")(
        response, "18", base="gsm8k", shaping=["format", OVERLONG], **extra
    )
    # 0 (wrong) + 1 (format) - 0.75 (95 tokens: -15/20) = 0.25
    assert composed == named and named["score"] == 0.25 and named["acc"] == 0.0


def test_base_options_reach_the_base_and_static_options_beat_per_sample_ones():
    reward = rewards.compose("gsm8k", base_options={"method": "flexible"})
    assert reward("so 18 in total", "18")["score"] == 1.0
    shaped = rewards.compose("gsm8k", shaping=[("length_penalty", {"max_response_length": 10})])
    # response_length comes from the call; 5 of 10 tokens -> -0.5.
    assert shaped("#### 18", "18", response_length=5)["score"] == 0.5


def test_same_term_twice_gets_a_numbered_key():
    out = rewards.compose("gsm8k", shaping=["format", ("format", {"score": 0.5})])(
        "<think>a</think><answer>#### 1</answer>", "1"
    )
    # 1 + 1 + 0.5
    assert out["score"] == 2.5 and out["format"] == 1.0 and out["format#2"] == 0.5


def test_compose_checks_names_when_built_and_is_picklable():
    with pytest.raises(KeyError, match="Did you mean 'format'"):
        rewards.compose("gsm8k", shaping=["formatt"])
    with pytest.raises(TypeError, match="bad shaping term"):
        rewards.compose("gsm8k", shaping=[("format", "score=1")])
    reward = rewards.compose("math", shaping=["format"])
    assert pickle.loads(pickle.dumps(reward))("<think>a</think>\\boxed{2}", "2")["score"] == 2.0
