"""RewardModel on a tiny random Qwen2 reward model with a locally built tokenizer."""

import pytest
import torch

from rewards import RewardModel
from tests.reward_models import SENTENCES, save_tiny_reward_model


@pytest.fixture(scope="module", params=[True, False], ids=["chat_template", "plain"])
def model_dir(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("rm")
    save_tiny_reward_model(path, chat_template=request.param)
    return path


PROMPTS = [
    "what is two plus two",
    [{"role": "system", "content": "let us think"}, {"role": "user", "content": "how many clips"}],
    "natalia sold clips to her friends how many clips did she sell altogether",
    "may",
]
RESPONSES = ["the answer is four", "four", "she sold half as many clips in may step by step", "two"]


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_batched_scores_equal_one_at_a_time_scores(model_dir, padding_side):
    single = RewardModel(model_dir, batch_size=1, padding_side=padding_side)
    batched = RewardModel(model_dir, batch_size=3, padding_side=padding_side)  # 3 + 1 rows
    one_by_one = single.score(PROMPTS, RESPONSES)
    together = batched.score(PROMPTS, RESPONSES)
    assert len(together) == 4
    torch.testing.assert_close(torch.tensor(together), torch.tensor(one_by_one), atol=1e-5, rtol=0)


def test_padding_side_does_not_change_scores(model_dir):
    left = RewardModel(model_dir, batch_size=4, padding_side="left")(PROMPTS, RESPONSES)
    right = RewardModel(model_dir, batch_size=4, padding_side="right")(PROMPTS, RESPONSES)
    torch.testing.assert_close(torch.tensor(left), torch.tensor(right), atol=1e-5, rtol=0)


def test_scores_are_real_model_outputs_that_depend_on_the_response(model_dir):
    rm = RewardModel(model_dir, batch_size=2)
    scores = rm.score(["what is two plus two"] * 2, ["four", "the answer is four"])
    assert all(isinstance(s, float) for s in scores)
    assert scores[0] != scores[1]
    # The same pair in another batch position gives the same score.
    again = rm.score(["may", "what is two plus two"], ["two", "four"])
    assert again[1] == pytest.approx(scores[0], abs=1e-5)


def test_text_uses_the_chat_template_when_there_is_one(model_dir):
    rm = RewardModel(model_dir)
    text = rm.text("what is two plus two", "four")
    if rm.tokenizer.chat_template:
        assert text == "user: what is two plus two<|im_end|>\nassistant: four<|im_end|>\n"
    else:
        assert text == "what is two plus twofour"
        messages = [{"role": "user", "content": "hi"}]
        assert rm.text(messages, "four") == "user: hi\nassistant: four"


def test_max_length_keeps_the_end_of_the_response(model_dir):
    rm = RewardModel(model_dir, max_length=6, batch_size=2)
    long_prompt = " ".join(SENTENCES)
    # Truncation drops the start, so prompts differing only at the start score the same.
    a, b = rm.score([long_prompt, "what is " + long_prompt], ["four", "four"])
    assert a == pytest.approx(b, abs=1e-5)


def test_bad_inputs_and_models_raise(tmp_path, model_dir):
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        RewardModel(model_dir).score(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="batch_size"):
        RewardModel(model_dir, batch_size=0)
    save_tiny_reward_model(tmp_path, chat_template=False, num_labels=2)
    with pytest.raises(ValueError, match="a reward model has 1"):
        RewardModel(tmp_path)
