"""rlkit's decode loop: exact categorical sampling, shared prefill, finished rows dropped."""

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlkit.rollout.embedded import kv_decode
from rlkit.rollout.embedded.kv_decode import decode, sample_categorical
from tests.test_hf_engine import _reference_logprobs


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("budget", [1 << 23, 12])  # one chunk; 3 rows per chunk
def test_sample_categorical_draws_each_index_with_its_probability(monkeypatch, budget):
    monkeypatch.setattr(kv_decode, "CDF_BUDGET", budget)
    torch.manual_seed(0)
    probs = torch.tensor([0.5, 0.25, 0.0, 0.25])
    draws = sample_categorical(probs.log().expand(40_000, 4))
    freq = torch.bincount(draws, minlength=4).float() / 40_000
    # Binomial standard deviation sqrt(0.25 * 0.75 / 40000) ~ 0.0022; 0.01 is > 4 sigma.
    torch.testing.assert_close(freq, probs, atol=0.01, rtol=0)
    assert freq[2] == 0  # probability 0 (log -inf): never drawn


def test_sample_categorical_never_draws_excluded_tail_tokens():
    # All mass on index 1; the -inf tail after it must not be reached even when u ~ 1.
    torch.manual_seed(0)
    logp = torch.tensor([[float("-inf"), 0.0, float("-inf"), float("-inf")]]).expand(5_000, 4)
    assert sample_categorical(logp).eq(1).all()


def test_greedy_decode_equals_transformers_generate(model_and_tok):
    model, tok = model_and_tok
    prompts = [tok("12+3=").input_ids, tok("7=").input_ids, tok("hello there").input_ids]
    out = decode(
        model,
        prompts,
        n=2,
        max_new_tokens=7,
        pad_token_id=0,
        stop_token_ids=[],
        warp=None,
        greedy=True,
    )
    for row, response in enumerate(out.response_ids):
        prompt = prompts[row // 2]
        with torch.no_grad():
            ref = model.generate(
                torch.tensor([prompt]), max_new_tokens=7, do_sample=False, pad_token_id=0
            )
        assert response == ref[0, len(prompt) :].tolist()
    assert out.finish_reasons == ["length"] * 6


def test_rows_that_stop_leave_the_batch_and_the_rest_keep_exact_logprobs(model_and_tok):
    model, tok = model_and_tok
    torch.manual_seed(0)
    prompts = [tok("45+67=").input_ids, tok("1+1=").input_ids]  # different lengths
    stops = list(range(3, 120))  # about half the vocabulary: rows stop at varied steps
    out = decode(
        model, prompts, n=6, max_new_tokens=6, pad_token_id=0, stop_token_ids=stops, warp=None
    )
    lengths = [len(r) for r in out.response_ids]
    assert len(set(lengths)) >= 3  # rows really left the batch at different steps
    for row, (resp, lps, reason) in enumerate(
        zip(out.response_ids, out.log_probs, out.finish_reasons)
    ):
        assert reason == ("stop" if resp[-1] in stops else "length")
        assert all(t not in stops for t in resp[:-1])  # nothing generated after a stop
        ref = _reference_logprobs(model, prompts[row // 6], resp, temperature=1.0)
        torch.testing.assert_close(torch.tensor(lps), ref, atol=1e-5, rtol=1e-5)


def test_the_in_place_cache_samples_bitwise_what_transformers_cache_samples(
    model_and_tok, monkeypatch
):
    model, tok = model_and_tok
    prompts = [tok("45+67=").input_ids, tok("1+1=").input_ids]

    def sample():
        torch.manual_seed(0)
        stops = list(range(3, 120))  # rows stop at varied steps: rows leave both caches
        return decode(
            model, prompts, n=4, max_new_tokens=12, pad_token_id=0, stop_token_ids=stops, warp=None
        )

    made = []  # the caches the first run used
    real = kv_decode.in_place_cache
    monkeypatch.setattr(
        kv_decode,
        "in_place_cache",
        lambda c, capacity: made.append(real(c, capacity)) or made[-1],
    )
    in_place = sample()
    assert len(made) == 1 and made[0] is not None
    monkeypatch.setattr(kv_decode, "in_place_cache", lambda config, capacity: None)
    dynamic = sample()  # transformers' DynamicCache, which copies per token
    assert len({len(r) for r in in_place.response_ids}) >= 3
    assert in_place.response_ids == dynamic.response_ids
    assert in_place.log_probs == dynamic.log_probs  # the same floats, not just close
    assert in_place.finish_reasons == dynamic.finish_reasons


def test_warp_defines_the_sampled_and_recorded_distribution(model_and_tok):
    model, tok = model_and_tok
    torch.manual_seed(0)
    prompt = tok("9+9=").input_ids

    def top2(scores):  # keep the two best tokens only
        kth = scores.topk(2, dim=-1).values[:, -1:]
        return scores.masked_fill(scores < kth, float("-inf"))

    out = decode(
        model, [prompt], n=8, max_new_tokens=4, pad_token_id=0, stop_token_ids=[], warp=top2
    )
    for resp, lps in zip(out.response_ids, out.log_probs):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + resp])).logits[0, len(prompt) - 1 : -1]
        ref = torch.log_softmax(top2(logits), -1).gather(-1, torch.tensor(resp)[:, None])
        torch.testing.assert_close(torch.tensor(lps), ref.squeeze(-1), atol=1e-5, rtol=1e-5)


def test_no_prompts_give_no_rows(model_and_tok):
    model, _ = model_and_tok
    out = decode(model, [], n=4, max_new_tokens=3, pad_token_id=0, stop_token_ids=[2], warp=None)
    assert (out.response_ids, out.log_probs, out.finish_reasons) == ([], [], [])


def test_a_cache_without_row_operations_names_the_generate_fallback():
    class LegacyCacheModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, **kwargs):
            logits = torch.zeros(*input_ids.shape, 5)
            return SimpleNamespace(logits=logits, past_key_values=((torch.zeros(1),),))

    with pytest.raises(TypeError, match="decode_loop='generate'"):
        decode(
            LegacyCacheModel(),
            [[1, 2]],
            n=2,
            max_new_tokens=2,
            pad_token_id=0,
            stop_token_ids=[],
            warp=None,
        )
