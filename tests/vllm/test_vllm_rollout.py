"""The vLLM engine against a REAL CPU vLLM server (tiny random Qwen2, float32).

What is checked: the batch layout; greedy tokens equal the embedded engine's; the
rollout log-probs equal a teacher-forced ``log_softmax(filter(logits / T))`` of the
sampled tokens; stop tokens end a response; a seeded run repeats; a weight sync after a
real optimizer step makes the server sample from the stepped model.

Tolerance of the log-prob checks, 1e-4: both sides compute in float32, but vLLM's CPU
kernels (attention, fused MLP, its own sampler) sum in other orders than transformers'
eager forward; over these 2-layer models and 16-token responses the measured gap is
below 1e-5, and a wrong temperature, filter or weight version moves it by more than 1e-2.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.base import SamplingParams
from rlkit.rollout.embedded.engine import HFEngine
from tests.sglang.local_policy import LocalPolicyWeights
from tests.sglang.test_sglang_rollout import max_rollout_diff

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = [[1, 20, 30, 40], [1, 50, 60], [1, 70, 80, 90, 100], [1, 110]]
TOLERANCE = 1e-4


def test_batch_has_n_rows_per_prompt_grouped_in_prompt_order(engine):
    batch = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=1.0, n=3))
    batch.validate()
    # 4 prompts x n=3 = 12 rows; rows 0-2 belong to prompt 0, rows 3-5 to prompt 1, ...
    assert batch.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert batch.prompt_ids == [p for p in PROMPTS for _ in range(3)]
    for ids, reason in zip(batch.response_ids, batch.finish_reasons):
        # "length" means exactly max_new_tokens; "stop" means it ended on EOS (id 2).
        assert (reason == "length" and len(ids) == 8) or (reason == "stop" and ids[-1] == 2)
    # One request per prompt (n samples each), none retried.
    assert batch.metrics["rollout/num_requests"] == 4.0
    assert batch.metrics["rollout/num_retries"] == 0.0


def test_greedy_tokens_equal_the_embedded_engines(engine, hf_models, tokenizer):
    params = SamplingParams(max_new_tokens=16, temperature=0.0, n=2)
    served = engine.generate(PROMPTS, params)
    embedded = HFEngine(
        LocalPolicyWeights(hf_models["a"], version=0),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=[tokenizer.eos_token_id],
    ).generate(PROMPTS, params)
    assert served.response_ids == embedded.response_ids
    assert served.finish_reasons == embedded.finish_reasons
    # Greedy log-probs are log_softmax of the raw logits on both sides.
    for a, b in zip(served.rollout_log_probs, embedded.rollout_log_probs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_sampled_log_probs_equal_a_teacher_forced_pass_at_the_temperature(
    engine, hf_models, temperature
):
    batch = engine.generate(
        PROMPTS, SamplingParams(max_new_tokens=16, temperature=temperature, n=2)
    )
    assert max_rollout_diff(batch, hf_models["a"], temperature) < TOLERANCE
    # ...and they are NOT the temperature-1 log-probs (so the check above means something).
    assert max_rollout_diff(batch, hf_models["a"], 1.0) > 1e-2


@pytest.mark.parametrize("top_k, top_p", [(20, 1.0), (-1, 0.8)])
def test_sampled_log_probs_are_renormalised_over_the_kept_tokens(engine, hf_models, top_k, top_p):
    params = SamplingParams(max_new_tokens=12, temperature=0.9, top_k=top_k, top_p=top_p, n=2)
    batch = engine.generate(PROMPTS, params)
    assert max_rollout_diff(batch, hf_models["a"], 0.9, top_k=top_k, top_p=top_p) < TOLERANCE
    # Renormalising over the kept tokens raises every log-prob: not the unfiltered ones.
    assert max_rollout_diff(batch, hf_models["a"], 0.9) > 1e-2


def seeded_batch(engine, prompts, params, seed: int = 7):
    """``prompts`` sampled by a fresh engine attached to ``engine``'s server, seeded ``seed``."""
    attached = ROLLOUT_ENGINES.get("vllm")(
        urls=[engine.sync_endpoints[0].url], num_servers=0, seed=seed
    )
    try:
        return attached.generate(prompts, params)
    finally:
        attached.close()


def test_a_seeded_engine_repeats_its_samples(engine):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, n=3)
    first, second = (seeded_batch(engine, PROMPTS, params) for _ in range(2))
    assert first.response_ids == second.response_ids
    # n=3 samples of one prompt are three draws, not one draw three times.
    assert len({tuple(r) for r in first.response_ids[:3]}) > 1


def test_a_stop_token_ends_the_response_and_is_kept(engine):
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    path = seeded_batch(engine, PROMPTS[:1], params).response_ids[0]
    # The first token of the sample not seen earlier in it: stopping there is unambiguous.
    cut = next(i for i in range(2, len(path)) if path[i] not in path[:i])
    stopped = seeded_batch(engine, PROMPTS[:1], replace(params, stop_token_ids=(path[cut],)))
    # The same seed draws the same tokens until the stop token ends the response.
    assert stopped.response_ids == [path[: cut + 1]]
    assert stopped.finish_reasons == ["stop"]


def stepped_copy(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` after one AdamW step on a next-token loss (every weight moves by ~lr)."""
    stepped = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(stepped.parameters(), lr=1e-2)
    ids = torch.tensor([[1, 20, 30, 40, 50, 60, 70, 80]])
    stepped(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    return stepped.eval()


def test_a_sync_after_an_optimizer_step_makes_the_server_sample_the_stepped_model(
    engine, hf_models
):
    stepped = stepped_copy(hf_models["a"])
    metrics = engine.sync_weights(LocalPolicyWeights(stepped, version=1))
    # The engine's own check: a fixed sequence scored on the server and on the trainer's model.
    assert metrics["weight_sync/logprob_max_abs_diff"] < 1e-3
    batch = engine.generate(PROMPTS, SamplingParams(max_new_tokens=16, temperature=1.0, n=2))
    assert max_rollout_diff(batch, stepped, 1.0) < TOLERANCE
    assert max_rollout_diff(batch, hf_models["a"], 1.0) > 1e-3
    # The tied model's output layer moved too (the served copy is untied): back to ``a``.
    engine.sync_weights(LocalPolicyWeights(hf_models["a"], version=2))
    batch = engine.generate(PROMPTS, SamplingParams(max_new_tokens=16, temperature=1.0, n=2))
    assert max_rollout_diff(batch, hf_models["a"], 1.0) < TOLERANCE
