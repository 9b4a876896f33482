"""Decode-step attention over a prompt held once per group (cascade attention), and the
decode loop that uses it: the same attention, log-probs and tokens as the plain cache."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.kernels.attention import grouped_sdpa_attention, sdpa_attention
from rlkit.kernels.shared_prefix_decode import (
    SharedPrefix,
    reference_shared_prefix_attention,
    shared_prefix_attention,
)
from rlkit.rollout.embedded import kv_decode
from rlkit.rollout.embedded.kv_cache import check_prefixes_read, prefix_reader, shared_prefix_cache
from rlkit.rollout.embedded.kv_decode import decode
from tests.test_hf_engine import _reference_logprobs


def test_a_row_attends_over_its_groups_prompt_and_its_own_tokens_by_hand():
    # One group of n = 2 rows, one head of dimension 1, scale 1: scores are the keys.
    # Prompt: key 0, value 4. Row 0's own token: key ln 3, value 8. Row 1's: key 0, value 2.
    # Row 0: weights exp(0) : exp(ln 3) = 1 : 3 -> 0.25 * 4 + 0.75 * 8 = 7.
    # Row 1: weights 1 : 1 -> 0.5 * 4 + 0.5 * 2 = 3.
    prefix = SharedPrefix(torch.zeros(1, 1, 1, 1), torch.full((1, 1, 1, 1), 4.0), n=2)
    keys = torch.tensor([math.log(3.0), 0.0]).reshape(2, 1, 1, 1)
    values = torch.tensor([8.0, 2.0]).reshape(2, 1, 1, 1)
    query = torch.ones(2, 1, 1, 1)
    out = shared_prefix_attention(query, prefix, keys, values, mask=None, scale=1.0)
    assert out.shape == (2, 1, 1, 1)  # (B, 1, H, D)
    torch.testing.assert_close(out.flatten(), torch.tensor([7.0, 3.0]))
    # Row 1 left (its slot 1 stays empty); row 0 masks the prompt out: only its own value 8.
    prefix = SharedPrefix(prefix.keys, prefix.values, n=2, rows=torch.tensor([0]))
    mask = torch.tensor([False, True]).reshape(1, 1, 1, 2)
    out = shared_prefix_attention(query[:1], prefix, keys[:1], values[:1], mask, scale=1.0)
    torch.testing.assert_close(out.flatten(), torch.tensor([8.0]))


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize("rows", [None, [0, 2, 3, 5, 11]], ids=["all rows", "rows left"])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_shared_prefix_attention_equals_sdpa_over_each_rows_copied_prompt(
    heads, kv_heads, rows, mask_kind
):
    torch.manual_seed(0)
    groups, n, prompt, own, dim = 3, 4, 7, 5, 8
    rows = None if rows is None else torch.tensor(rows)
    batch = groups * n if rows is None else len(rows)
    prefix = SharedPrefix(
        torch.randn(groups, kv_heads, prompt, dim),
        torch.randn(groups, kv_heads, prompt, dim),
        n,
        rows,
    )
    query = torch.randn(batch, heads, 1, dim)
    keys, values = torch.randn(batch, kv_heads, own, dim), torch.randn(batch, kv_heads, own, dim)
    allowed = torch.rand(batch, 1, 1, prompt + own) > 0.3
    allowed[..., -1] = True  # the current token always attends to itself
    mask = {
        "none": None,
        "bool": allowed,
        "additive": torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf")),
    }[mask_kind]
    got = shared_prefix_attention(query, prefix, keys, values, mask)
    want = reference_shared_prefix_attention(query, prefix, keys, values, mask)
    assert got.shape == (batch, 1, heads, dim)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_bf16_inputs_err_no_more_than_sdpa_in_bf16():
    # Scores rounded to bf16 before the softmax would err about twice as much as SDPA,
    # which keeps them in float32; the kernel upcasts, so both err by the output rounding.
    torch.manual_seed(0)
    groups, n, prompt, own, dim = 4, 8, 200, 60, 128
    bf16 = lambda *shape: torch.randn(*shape).bfloat16()  # noqa: E731
    prefix = SharedPrefix(bf16(groups, 2, prompt, dim), bf16(groups, 2, prompt, dim), n)
    query, keys, values = bf16(32, 4, 1, dim) * 2, bf16(32, 2, own, dim), bf16(32, 2, own, dim)
    exact = reference_shared_prefix_attention(
        query.float(),
        SharedPrefix(prefix.keys.float(), prefix.values.float(), n),
        keys.float(),
        values.float(),
        None,
    )
    got = shared_prefix_attention(query, prefix, keys, values, None)
    sdpa = reference_shared_prefix_attention(query, prefix, keys, values, None)
    assert got.dtype == torch.bfloat16
    assert (got.float() - exact).abs().max() <= (sdpa.float() - exact).abs().max()


def test_more_than_one_query_token_is_refused():
    prefix = SharedPrefix(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), n=1)
    with pytest.raises(ValueError, match="one token per row"):
        shared_prefix_attention(
            torch.zeros(1, 1, 2, 4), prefix, torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), None
        )


@pytest.fixture(scope="module")
def grouped_model(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    grouped_sdpa_attention(model)
    return model


def _prompts(*widths: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(sum(widths))
    return [torch.randint(3, 200, (w,), generator=gen).tolist() for w in widths]


def _decode(model, prompts, shared, **kw):
    torch.manual_seed(0)
    defaults = dict(n=4, max_new_tokens=10, pad_token_id=0, stop_token_ids=[], warp=None)
    return decode(model, prompts, shared_prefix=shared, **{**defaults, **kw})


def test_greedy_decoding_with_the_shared_prefix_equals_the_in_place_cache(grouped_model):
    prompts = _prompts(40, 33, 47)  # different widths: left padding in the shared prompt
    plain = _decode(grouped_model, prompts, False, greedy=True)
    shared = _decode(grouped_model, prompts, True, greedy=True)
    assert shared.response_ids == plain.response_ids
    torch.testing.assert_close(
        torch.tensor(shared.log_probs), torch.tensor(plain.log_probs), atol=1e-5, rtol=1e-5
    )


def test_rows_that_stop_leave_the_shared_prefix_batch_with_exact_logprobs(grouped_model):
    prompts = _prompts(36, 50)
    stops = list(range(3, 80))  # about a third of the vocabulary: rows stop at varied steps
    out = _decode(grouped_model, prompts, True, n=5, stop_token_ids=stops)
    lengths = [len(r) for r in out.response_ids]
    assert len(set(lengths)) >= 3  # rows really left the batch at different steps
    for row, (resp, lps) in enumerate(zip(out.response_ids, out.log_probs)):
        assert all(t not in stops for t in resp[:-1])
        # The recorded log-probs are the full model's on prompt + response, recomputed.
        ref = _reference_logprobs(grouped_model, prompts[row // 5], resp, temperature=1.0)
        torch.testing.assert_close(torch.tensor(lps), ref, atol=1e-5, rtol=1e-5)


def test_the_loop_shares_long_prompts_of_groups_under_grouped_sdpa_only(
    grouped_model, tiny_model_dir, monkeypatch
):
    made = []
    real = kv_decode.shared_prefix_cache
    monkeypatch.setattr(kv_decode, "shared_prefix_cache", lambda *a: made.append(a) or real(*a))
    width = kv_decode.SHARED_PREFIX_MIN_TOKENS
    _decode(grouped_model, _prompts(width, 5), None, max_new_tokens=2)
    assert len(made) == 1  # the widest prompt sets the width: shared
    _decode(grouped_model, _prompts(width - 1, 5), None, max_new_tokens=2)
    _decode(grouped_model, _prompts(width, 5), None, n=1, max_new_tokens=2)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    sdpa_attention(plain)
    _decode(plain, _prompts(width, 5), None, max_new_tokens=2)
    assert len(made) == 1  # too short, one row per prompt, another attention: not shared


def test_asking_for_the_shared_prefix_under_another_attention_names_the_kernel(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    sdpa_attention(model)
    with pytest.raises(ValueError, match="grouped_sdpa"):
        _decode(model, _prompts(40), True)


def test_an_attention_that_ignores_the_shared_prompt_fails_loudly(tiny_model_dir):
    # Plain sdpa attends to what the cache returns: the rows' own tokens alone. The check
    # after the forward must catch that rather than let a wrong rollout through.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    sdpa_attention(model)
    ids = torch.tensor(_prompts(8, 8))
    cache = shared_prefix_cache(model.config, 8 + 4)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        cache.batch_repeat_interleave(2)
        model(
            input_ids=torch.ones(4, 1, dtype=torch.long),
            attention_mask=torch.ones(4, 9, dtype=torch.long),
            position_ids=torch.full((4, 1), 8),
            past_key_values=cache,
            use_cache=True,
            rlkit_shared_prefix=prefix_reader(cache),
        )
    with pytest.raises(RuntimeError, match="did not read the KV cache's shared prompt"):
        check_prefixes_read(cache, model)
