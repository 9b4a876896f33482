"""The prompt order is resumable: a restored sampler continues exactly."""

import pytest

from rlkit.trainer.prompts import PromptSampler


def test_sampler_covers_each_prompt_once_per_epoch():
    s = PromptSampler(10, seed=3)
    first = s.next(10)
    assert sorted(first) == list(range(10))
    assert s.epoch == 1 and s.position == 0


def test_restored_sampler_continues_identically():
    a = PromptSampler(7, seed=1)
    a.next(5)
    state = a.state_dict()
    expected = a.next(9)  # crosses an epoch boundary
    b = PromptSampler(7, seed=1)
    b.load_state_dict(state)
    assert b.next(9) == expected


def test_restoring_onto_different_data_is_an_error():
    s = PromptSampler(7, seed=1)
    with pytest.raises(ValueError, match="data changed"):
        PromptSampler(8, seed=1).load_state_dict(s.state_dict())
