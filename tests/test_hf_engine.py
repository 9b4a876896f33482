"""The embedded rollout engine returns the sampling distribution's log-probs."""

from contextlib import contextmanager

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.base import SamplingParams


class LocalWeights:
    """A single-process PolicyWeights around a plain transformers model."""

    version = 0

    def __init__(self, model):
        self.model = model

    @contextmanager
    def generation_context(self):
        yield self.model, {}


@pytest.fixture(scope="module", params=["rlkit", "generate"])
def engine_and_model(tiny_model_dir, request):
    """The engine with each decode loop: every test below holds for both."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = ROLLOUT_ENGINES.get("hf")(
        model_path=str(tiny_model_dir),
        tokenizer=tok,
        weights=LocalWeights(model),
        seed=0,
        decode_loop=request.param,
    )
    return engine, model, tok


def _reference_logprobs(model, prompt, response, temperature):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(response)]
    return (
        torch.log_softmax(logits / temperature, -1)
        .gather(-1, torch.tensor(response)[:, None])
        .squeeze(-1)
    )


def test_rows_are_grouped_by_prompt_n_at_a_time(engine_and_model):
    engine, _, tok = engine_and_model
    prompts = [tok("12+3=").input_ids, tok("7+70=").input_ids, tok("1=").input_ids]
    out = engine.generate(prompts, SamplingParams(max_new_tokens=5, n=2, temperature=1.0))
    assert out.prompt_index == [0, 0, 1, 1, 2, 2]
    assert out.prompt_ids[2] == prompts[1]
    assert all(1 <= len(r) <= 5 for r in out.response_ids)
    for ids, reason in zip(out.response_ids, out.finish_reasons):
        assert reason == ("stop" if ids[-1] == tok.eos_token_id else "length")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_are_tempered_model_logprobs(engine_and_model, temperature):
    engine, model, tok = engine_and_model
    prompts = [tok("12+3=").input_ids, tok("45+67=").input_ids]  # different lengths: left padding
    torch.manual_seed(0)
    out = engine.generate(prompts, SamplingParams(max_new_tokens=6, n=2, temperature=temperature))
    for prompt, resp, lps in zip(out.prompt_ids, out.response_ids, out.rollout_log_probs):
        ref = _reference_logprobs(model, prompt, resp, temperature)
        torch.testing.assert_close(torch.tensor(lps), ref, atol=1e-5, rtol=1e-5)


def test_top_k_logprobs_are_renormalised_over_the_kept_tokens(engine_and_model):
    engine, model, tok = engine_and_model
    prompt = tok("3+4=").input_ids
    out = engine.generate([prompt], SamplingParams(max_new_tokens=4, n=3, temperature=1.0, top_k=5))
    for resp, lps in zip(out.response_ids, out.rollout_log_probs):
        ids = torch.tensor([prompt + resp])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(resp)]
        kth = logits.topk(5, dim=-1).values[:, -1:]
        filtered = logits.masked_fill(logits < kth, float("-inf"))
        ref = torch.log_softmax(filtered, -1).gather(-1, torch.tensor(resp)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(lps), ref, atol=1e-5, rtol=1e-5)


def test_top_p_logprobs_are_renormalised_over_the_nucleus(engine_and_model):
    engine, model, tok = engine_and_model
    prompt = tok("8+9=").input_ids
    params = SamplingParams(max_new_tokens=4, n=3, temperature=0.8, top_p=0.6)
    out = engine.generate([prompt], params)
    for resp, lps in zip(out.response_ids, out.rollout_log_probs):
        ids = torch.tensor([prompt + resp])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(resp)] / 0.8
        # Keep the smallest set of top tokens whose mass reaches 0.6 (the token that
        # crosses 0.6 is kept), then renormalise: sorted cumulative mass before each.
        probs, order = logits.softmax(-1).sort(dim=-1, descending=True)
        drop_sorted = (probs.cumsum(-1) - probs) >= 0.6
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        ref = torch.log_softmax(logits.masked_fill(drop, float("-inf")), -1)
        ref = ref.gather(-1, torch.tensor(resp)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(lps), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("decode_loop", ["rlkit", "generate"])
def test_checkpoint_generation_defaults_do_not_change_the_sampling_distribution(
    tiny_model_dir, decode_loop
):
    # Chat checkpoints ship generation_config.json with sampling defaults (Qwen2.5:
    # repetition_penalty 1.05, top_k 20, top_p 0.8, temperature 0.7). The engine must
    # sample from softmax(logits / T) as asked, or the trainer's log-probs disagree.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.generation_config.update(
        repetition_penalty=1.5,
        top_k=3,
        top_p=0.5,
        temperature=0.2,
        no_repeat_ngram_size=2,
        min_length=30,
        output_scores=True,
        return_dict_in_generate=True,
    )
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = ROLLOUT_ENGINES.get("hf")(
        tokenizer=tok, weights=LocalWeights(model), decode_loop=decode_loop
    )
    prompt = tok("5+5=").input_ids
    torch.manual_seed(0)
    out = engine.generate([prompt], SamplingParams(max_new_tokens=8, n=4, temperature=1.0))
    for resp, lps in zip(out.response_ids, out.rollout_log_probs):
        ref = _reference_logprobs(model, prompt, resp, 1.0)
        torch.testing.assert_close(torch.tensor(lps), ref, atol=1e-5, rtol=1e-5)


def test_greedy_is_deterministic_and_argmax(engine_and_model):
    engine, model, tok = engine_and_model
    prompt = tok("99+1=").input_ids
    a = engine.generate([prompt], SamplingParams(max_new_tokens=4, temperature=0.0))
    b = engine.generate([prompt], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert a.response_ids == b.response_ids
    ids = torch.tensor([prompt])
    with torch.no_grad():
        first = model(ids).logits[0, -1].argmax().item()
    assert a.response_ids[0][0] == first


def test_unknown_engine_option_is_rejected(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(TypeError, match="generation_batchsize"):
        ROLLOUT_ENGINES.get("hf")(tokenizer=tok, weights=None, generation_batchsize=3)


def test_unknown_decode_loop_lists_the_known_ones(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError, match=r"unknown decode_loop 'vllm'.*'rlkit', 'generate'"):
        ROLLOUT_ENGINES.get("hf")(tokenizer=tok, weights=None, decode_loop="vllm")


def test_both_decode_loops_agree_greedily_across_generation_batches(tiny_model_dir):
    # generation_batch_size 4 with n=2: the rlkit loop decodes 2 prompts per call, generate
    # 4 rows per call; the 5 prompts then span 3 calls and both must give the same rows.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [tok(t).input_ids for t in ["1+2=", "33+4=", "x", "hello", "9*9="]]
    params = SamplingParams(max_new_tokens=5, n=2, temperature=0.0)
    outs = {
        loop: ROLLOUT_ENGINES.get("hf")(
            tokenizer=tok, weights=LocalWeights(model), generation_batch_size=4, decode_loop=loop
        ).generate(prompts, params)
        for loop in ("rlkit", "generate")
    }
    assert outs["rlkit"].response_ids == outs["generate"].response_ids
    assert outs["rlkit"].finish_reasons == outs["generate"].finish_reasons
    assert outs["rlkit"].prompt_index == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    for a, b in zip(outs["rlkit"].rollout_log_probs, outs["generate"].rollout_log_probs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=1e-5)
