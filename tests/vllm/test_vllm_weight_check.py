"""The vLLM engine's weight check and top-k log-probs against the package's REAL CPU vLLM
server (tiny random Qwen2 with tied embeddings, float32, served untied).

The weight check: after a sync, rlkit's worker extension sums each group of the weights
the server computes with (its CPU kernels repack every linear layer) and the engine
compares the sums with the trainer's. The tiny model has 5 groups: ``embed_tokens``,
``layers.0``, ``layers.1``, ``norm`` and ``lm_head``. Engines that sync with their own
settings are attached to the same server by URL, so no second server is started; every
test leaves the server holding policy ``a``, as the package's other tests expect.

Top-k log-probs: the values are the trainer's ``log_softmax(logits / T)`` at the listed
ids, to the rollout tests' tolerance (``tests/vllm/test_vllm_rollout.py``: measured
gaps below 1e-5 in float32, a wrong temperature moves them by more than 1e-2).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch

from rlkit.rollout.base import SamplingParams
from rlkit.rollout.servers import weight_check
from rlkit.rollout.servers.errors import RolloutError, WeightMismatchError
from rlkit.rollout.servers.options import ServerOptions
from rlkit.rollout.vllm.engine import VLLMEngine
from tests.sglang.local_policy import LocalPolicyWeights
from tests.vllm.test_vllm_rollout import PROMPTS, TOLERANCE, stepped_copy

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GROUPS = 5  # embed_tokens, layers.0, layers.1, norm, lm_head


@pytest.fixture(scope="module")
def stepped(hf_models) -> torch.nn.Module:
    """Policy ``a`` after one AdamW step: every weight, norms included, has moved."""
    return stepped_copy(hf_models["a"])


@pytest.fixture
def restore_a(engine, hf_models):
    """Sync policy ``a`` back through the package's engine once the test is done."""
    yield
    engine.sync_weights(LocalPolicyWeights(hf_models["a"], version=90))


def attached(engine, tmp_path: Path, cls: type[VLLMEngine] = VLLMEngine, **options) -> VLLMEngine:
    """An engine of class ``cls`` attached by URL to the package's server."""
    url = engine.sync_endpoints[0].url
    return cls(ServerOptions(urls=[url], log_dir=str(tmp_path), **options))


def test_the_server_holds_the_served_models_weights(engine, hf_models):
    # As started (or synced back to a): the packed CPU layers read back to a's weights.
    served = engine._run(engine._served_checksums(engine.sync_endpoints[0]))
    expected = weight_check.group_checksums(hf_models["a"].state_dict().items(), torch.float32)
    assert len(expected) == GROUPS
    assert weight_check.checksum_mismatches(expected, served) == []


def test_a_healthy_sync_passes_the_weight_check(engine, stepped, restore_a):
    metrics = engine.sync_weights(LocalPolicyWeights(stepped, version=91))
    assert metrics["weight_sync/params_checked"] == GROUPS
    assert metrics["timing_s/weight_check"] > 0
    assert metrics["weight_sync/logprob_max_abs_diff"] < 1e-3


class _SkippedReload(VLLMEngine):
    """A sync that never reaches the server: answers as if it had, loads nothing."""

    def _load(self, weights, version, targets) -> None:
        pass


def test_a_sync_that_does_not_reach_the_server_is_a_weight_mismatch(engine, stepped, tmp_path):
    skipping = attached(engine, tmp_path, _SkippedReload)
    try:
        with pytest.raises(WeightMismatchError) as caught:
            skipping.sync_weights(LocalPolicyWeights(stepped, version=1))
    finally:
        skipping.close()
    message = str(caught.value)
    # The step moved every group, and the server still holds a's: all 5 differ.
    assert f"{GROUPS} of {GROUPS} differ" in message
    # The first four are named (embeddings, layers in order, then the rest by name).
    for group in ["embed_tokens", "layers.0", "layers.1", "lm_head"]:
        assert f"{group}: sum of squares" in message
    assert "and 1 more" in message
    assert "by a disk snapshot that each server reloaded in place" in message
    assert "reload_weights" in message and engine.sync_endpoints[0].url in message


def test_with_verify_every_2_only_the_first_and_third_syncs_are_checked(
    engine, hf_models, stepped, tmp_path, restore_a
):
    sparse = attached(engine, tmp_path, verify_every=2)
    try:
        policies = [stepped, hf_models["a"], stepped]
        runs = [
            sparse.sync_weights(LocalPolicyWeights(p, version=v)) for v, p in enumerate(policies)
        ]
    finally:
        sparse.close()
    checked = [m["weight_sync/params_checked"] for m in runs]
    assert checked == [GROUPS, 0, GROUPS]
    assert runs[1]["timing_s/weight_check"] == 0.0
    diffs = [m["weight_sync/logprob_max_abs_diff"] for m in runs]
    assert diffs[0] < 1e-3 and math.isnan(diffs[1]) and diffs[2] < 1e-3


class _NoExtension(VLLMEngine):
    """Asks for an extension method the server lacks, as a server started without
    rlkit's extension answers (HTTP 500: the worker has no such attribute)."""

    extension_info_method = "rlkit_not_an_extension_method"


def test_a_server_without_the_extension_is_left_to_the_logprob_probe_with_one_warning(
    engine, hf_models, tmp_path, caplog
):
    plain = attached(engine, tmp_path, _NoExtension)
    try:
        with caplog.at_level(logging.WARNING, logger="rlkit.rollout.vllm.engine"):
            runs = [plain.sync_weights(LocalPolicyWeights(hf_models["a"], v)) for v in (1, 2)]
    finally:
        plain.close()
    assert [m["weight_sync/params_checked"] for m in runs] == [0, 0]
    assert all(m["weight_sync/logprob_max_abs_diff"] < 1e-3 for m in runs)
    warnings = [r.getMessage() for r in caplog.records if "worker extension" in r.getMessage()]
    assert len(warnings) == 1 and "only the log-prob probe checks them" in warnings[0]


def trainer_log_probs(model, prompt: list[int], response: list[int], temperature: float):
    """``log_softmax(logits / T)`` over the vocabulary at each response position, (L, V)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].double()
    return torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)


def test_top_logprobs_are_the_trainers_log_softmax_at_the_listed_ids(engine, hf_models):
    params = SamplingParams(max_new_tokens=8, temperature=0.8, n=2, top_logprobs=5)
    batch = engine.generate(PROMPTS, params)
    assert batch.top_log_probs is not None and len(batch.top_log_probs) == 8
    sampled_listed = 0
    for prompt, response, lps, top in zip(
        batch.prompt_ids, batch.response_ids, batch.rollout_log_probs, batch.top_log_probs
    ):
        assert top.ids.shape == top.log_probs.shape == (len(response), 5)
        reference = trainer_log_probs(hf_models["a"], prompt, response, 0.8)
        at_ids = reference.gather(-1, top.ids).float()
        torch.testing.assert_close(top.log_probs, at_ids, rtol=0, atol=TOLERANCE)
        # They are the trainer's 5 most likely tokens, most likely first (compared by
        # value: two nearly tied tokens may come in either order).
        best = reference.topk(5, dim=-1).values.float()
        torch.testing.assert_close(top.log_probs, best, rtol=0, atol=TOLERANCE)
        for t, token in enumerate(response):
            listed = (top.ids[t] == token).nonzero()
            if len(listed):
                sampled_listed += 1
                assert top.log_probs[t, listed[0, 0]] == torch.tensor(lps[t], dtype=torch.float32)
    assert sampled_listed > 0
    # Asking for none changes nothing: no top log-probs in the batch.
    plain = engine.generate(PROMPTS, SamplingParams(max_new_tokens=4, temperature=0.8))
    assert plain.top_log_probs is None


def test_more_top_logprobs_than_the_server_answers_are_refused_naming_the_limit(engine, tmp_path):
    too_many = SamplingParams(max_new_tokens=2, top_logprobs=65)
    # A started server's limit (64) is known: refused before anything is sent.
    with pytest.raises(ValueError, match=r"top_logprobs=65 .*--max-logprobs 64"):
        engine.generate(PROMPTS[:1], too_many)
    # An attached server's is not: the server refuses, and the error says what to change.
    other = attached(engine, tmp_path)
    try:
        with pytest.raises(RolloutError, match=r"max allowed: 64.*--max-logprobs 65 or more"):
            other.generate(PROMPTS[:1], too_many)
    finally:
        other.close()
