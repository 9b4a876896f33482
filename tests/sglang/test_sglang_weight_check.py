"""The SGLang engine's weight check and top log-probs, against one REAL CPU SGLang server.

The server (module-scoped) serves a tiny random Llama (``llama3`` of
:mod:`rlkit.models.tiny_families`, float32): Llama-family classes answer
``/get_weights_by_name`` for every Hugging Face name, Qwen2 (the package's other servers)
for none. What is checked:

* a healthy sync compares 8 read-back slices (``slice_names``' sample of the 21
  parameters) and passes;
* a sync that never reaches the server, after one AdamW step at learning rate 1e-6,
  fails naming the parameters and the sync method, although the log-prob probe alone
  passes it (the step moves the probe's log-probs by ~7e-5, under its 1e-3 tolerance);
* ``verify_every=2`` checks syncs 1 and 3, not 2;
* top log-probs are ``log_softmax(logits / T)`` of the trainer's model (renormalised over
  top-k in ``sampling`` mode), the same distribution as the rollout log-probs;
* a Qwen2 server (no reads by name) degrades to the log-prob probe instead of failing.
"""

from __future__ import annotations

import copy
import logging
import math

import pytest
import torch

from rlkit.models.tiny_families import build_tiny_family
from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.base import SamplingParams
from rlkit.rollout.servers.errors import WeightMismatchError
from rlkit.rollout.servers.options import split_server_options
from rlkit.rollout.sglang.client import (
    generate_body,
    parse_top_log_probs,
    parse_weight_rows,
    served_dtype,
)
from tests.numerics import gamma, reduction_depth
from tests.sglang.conftest import CPU_SERVER, require_sglang
from tests.sglang.local_policy import LocalPolicyWeights

PROMPTS = [[1, 20, 30, 40], [1, 50, 60], [1, 70, 80, 90, 100]]
SAMPLED = 8
"""Parameters the check reads back: ``slice_names``' default count (the model has 21)."""
PROBE_TOLERANCE = 1e-3
"""The log-prob probe's default tolerance for a float32 server."""


# ------------------------------------------------------------------ no server needed
def test_generate_body_is_unchanged_without_top_logprobs_and_asks_for_k_with_them():
    params = SamplingParams(max_new_tokens=4, temperature=0.7)
    body = generate_body([1, 2], params, {"temperature": 0.7}, "sampling")
    assert body == {
        "input_ids": [1, 2],
        "sampling_params": {"temperature": 0.7},
        "return_logprob": True,
    }
    params = SamplingParams(max_new_tokens=4, temperature=0.7, top_logprobs=5)
    with_top = generate_body([1, 2], params, {"temperature": 0.7}, "sampling")
    assert with_top == body | {"top_logprobs_num": 5}


def test_filtered_top_log_probs_keep_the_support_and_add_the_renormalisation():
    # Sampled token 8: -2.0 under temperature only, -0.5 renormalised, so log Z = 1.5.
    # Token 9 is outside the support [7, 8]: dropped; 7 and 8 rise by 1.5.
    meta = {
        "output_top_logprobs": [[[-1.0, 7, None], [-2.0, 8, None], [-3.0, 9, None]]],
        "output_token_logprobs": [[-2.0, 8, None]],
        "output_token_sampling_logprobs": [-0.5],
        "output_token_sampling_mask": [[7, 8]],
    }
    assert parse_top_log_probs(meta, want_filtered=True) == [{7: 0.5, 8: -0.5}]
    assert parse_top_log_probs(meta, want_filtered=False) == [{7: -1.0, 8: -2.0, 9: -3.0}]


def test_weight_rows_flatten_row_major_and_report_the_row_length():
    assert parse_weight_rows([[1.0, 2.0], [3.0, 4.0]]) == ([1.0, 2.0, 3.0, 4.0], 2)
    assert parse_weight_rows([0.5]) == ([0.5], 1)


def test_served_dtype_follows_sglangs_auto_rule():
    assert served_dtype("float32", None) == "float32"
    assert served_dtype("half", None) == "float16"
    # auto: a float32 checkpoint is served in float16 (Gemma's in bfloat16), others as saved.
    assert served_dtype("auto", {"torch_dtype": "float32", "model_type": "llama"}) == "float16"
    assert served_dtype("auto", {"dtype": "float32", "model_type": "gemma2"}) == "bfloat16"
    assert served_dtype("auto", {"dtype": "bfloat16"}) == "bfloat16"
    assert served_dtype("auto", None) is None


# ------------------------------------------------------------------ one Llama server
@pytest.fixture(scope="module")
def llama(tmp_path_factory, tokenizer) -> dict[str, torch.nn.Module]:
    """The served model ``a`` and ``a`` after one AdamW step at learning rate 1e-6."""
    from transformers import AutoModelForCausalLM

    path = build_tiny_family("llama3", tmp_path_factory.mktemp("llama") / "a", tokenizer)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    stepped = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(stepped.parameters(), lr=1e-6)
    ids = torch.tensor([[1, *range(40, 70)]])
    stepped(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    return {"path": path, "a": model.eval(), "stepped": stepped.eval()}


@pytest.fixture(scope="module")
def served(llama, tokenizer, tmp_path_factory):
    """One CPU SGLang server serving ``a``, with its engine (tensor sync)."""
    require_sglang()
    engine = ROLLOUT_ENGINES.get("sglang")(
        model_path=str(llama["path"]),
        tokenizer=tokenizer,
        seed=0,
        num_servers=1,
        weight_sync="tensor",
        log_dir=str(tmp_path_factory.mktemp("sglang_llama_logs")),
        max_concurrency=8,
        request_timeout_s=60.0,
        **CPU_SERVER,
    )
    try:
        yield engine
    finally:
        engine.close()


def attached(served, **options):
    """Another engine on the same server (its own sync settings and version labels)."""
    urls = tuple(e.url for e in served.sync_endpoints)
    return ROLLOUT_ENGINES.get("sglang")(urls=urls, num_servers=0, vocab_size=259, **options)


@pytest.mark.sglang
@pytest.mark.slow
def test_healthy_sync_compares_read_back_slices(served, llama):
    metrics = served.sync_weights(LocalPolicyWeights(llama["stepped"], version=1))
    assert metrics["weight_sync/params_checked"] == SAMPLED
    assert metrics["timing_s/weight_check"] > 0
    assert metrics["weight_sync/logprob_max_abs_diff"] < 1e-5
    metrics = served.sync_weights(LocalPolicyWeights(llama["a"], version=2))
    assert metrics["weight_sync/params_checked"] == SAMPLED


def skipping(served, weight_check: str):
    """An engine on the same server whose sync never reaches it (``_load`` does nothing),
    comparing weights by ``weight_check``."""
    from rlkit.rollout.sglang.engine import SGLangEngine

    class Skipping(SGLangEngine):
        def _load(self, weights, version, targets) -> None:
            pass

    Skipping.weight_check = weight_check
    urls = tuple(e.url for e in served.sync_endpoints)
    options, own = split_server_options({"urls": urls, "vocab_size": 259})
    return Skipping(options, num_servers=0, weight_sync="tensor", **own)


@pytest.mark.sglang
@pytest.mark.slow
def test_skipped_sync_after_a_small_update_fails_naming_parameters_and_method(served, llama):
    served.sync_weights(LocalPolicyWeights(llama["a"], version=3))
    stepped = LocalPolicyWeights(llama["stepped"], version=10)
    # The log-prob probe alone passes the skipped sync: the step moves the probe's
    # log-probs by ~7e-5, under the 1e-3 float32 tolerance.
    probe_only = skipping(served, weight_check="none")
    try:
        metrics = probe_only.sync_weights(stepped)
    finally:
        probe_only.close()
    assert metrics["weight_sync/params_checked"] == 0
    assert 0 < metrics["weight_sync/logprob_max_abs_diff"] < PROBE_TOLERANCE
    # The slices do not pass it: AdamW's first step moves every trained weight by ~lr.
    checked = skipping(served, weight_check="slices")
    try:
        with pytest.raises(WeightMismatchError) as caught:
            checked.sync_weights(LocalPolicyWeights(llama["stepped"], version=11))
    finally:
        checked.close()
    message = str(caught.value)
    assert "/update_weights_from_tensor" in message
    assert f"of {SAMPLED} differ" in message
    assert "model.layers.0." in message and "on the server" in message
    served.sync_weights(LocalPolicyWeights(llama["a"], version=4))


@pytest.mark.sglang
@pytest.mark.slow
def test_verify_every_two_checks_the_first_and_third_sync_only(served, llama):
    engine = attached(served, weight_sync="tensor", verify_every=2)
    try:
        runs = [
            engine.sync_weights(LocalPolicyWeights(llama[name], version=v))
            for v, name in [(21, "stepped"), (22, "a"), (23, "stepped")]
        ]
    finally:
        engine.close()
        served.sync_weights(LocalPolicyWeights(llama["a"], version=5))
    checked = [m["weight_sync/params_checked"] for m in runs]
    assert checked == [SAMPLED, 0, SAMPLED]
    assert math.isnan(runs[1]["weight_sync/logprob_max_abs_diff"])
    assert runs[1]["timing_s/weight_check"] == 0.0
    assert runs[2]["weight_sync/logprob_max_abs_diff"] < 1e-5


@torch.no_grad()
def trainer_log_probs(model, prompt, response, temperature: float, top_k: int = 0):
    """(L, V) ``log_softmax(logits / T)`` at each response position (greedy: T = 1),
    renormalised over the ``top_k`` most likely tokens when given."""
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0].double()
    logits = logits[len(prompt) - 1 : -1] / (temperature if temperature > 0 else 1.0)
    if top_k > 0:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.log_softmax(logits, dim=-1)


def check_top_log_probs(batch, model, temperature: float, top_k: int = 0) -> int:
    """Assert every row's top log-probs against the trainer; return how many sampled
    tokens were among them (their entry must be their rollout log-prob)."""
    assert batch.top_log_probs is not None and len(batch.top_log_probs) == len(batch)
    present = 0
    rows = zip(batch.prompt_ids, batch.response_ids, batch.rollout_log_probs, batch.top_log_probs)
    for prompt, response, lps, top in rows:
        assert top.ids.shape == top.log_probs.shape == (len(response), 5)
        width = len(prompt) + len(response)
        tol = 2 * gamma(reduction_depth(model.config, rows=1, positions=width))
        ref = trainer_log_probs(model, prompt, response, temperature, top_k)
        torch.testing.assert_close(
            top.log_probs.double(), ref.gather(-1, top.ids), rtol=0, atol=tol
        )
        for t, token in enumerate(response):
            hit = (top.ids[t] == token).nonzero()
            if len(hit):
                present += 1
                assert float(top.log_probs[t, hit[0, 0]]) == pytest.approx(lps[t], abs=1e-6)
    return present


@pytest.mark.sglang
@pytest.mark.slow
def test_top_log_probs_are_the_rollout_distribution(served, llama):
    served.sync_weights(LocalPolicyWeights(llama["a"], version=6))
    model = llama["a"]
    params = SamplingParams(max_new_tokens=12, temperature=0.7, n=2, top_logprobs=5)
    batch = served.generate(PROMPTS, params)
    check_top_log_probs(batch, model, 0.7)
    # ...and not the temperature-1 log-probs, so the check above means something.
    row = batch.top_log_probs[0]
    t1 = trainer_log_probs(model, batch.prompt_ids[0], batch.response_ids[0], 1.0)
    assert (row.log_probs.double() - t1.gather(-1, row.ids)).abs().max() > 1e-2
    # Greedy: the sampled token is the most likely one, its entry the first column.
    greedy = served.generate(
        PROMPTS, SamplingParams(max_new_tokens=8, temperature=0.0, top_logprobs=5)
    )
    assert check_top_log_probs(greedy, model, 0.0) == sum(len(r) for r in greedy.response_ids)
    # top-k 20 in sampling mode: renormalised over the 20 kept tokens, as the rollout's.
    params = SamplingParams(max_new_tokens=12, temperature=0.8, top_k=20, n=2, top_logprobs=5)
    check_top_log_probs(served.generate(PROMPTS, params), model, 0.8, top_k=20)
    # Without top_logprobs the batch carries none.
    assert served.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2)).top_log_probs is None


@pytest.mark.sglang
@pytest.mark.slow
def test_qwen2_server_that_reads_no_names_falls_back_to_the_probe(engine, hf_models, caplog):
    # The package's Qwen2 servers: Qwen2ForCausalLM has no get_weights_by_name in 0.5.23.
    urls = tuple(e.url for e in engine.sync_endpoints)
    qwen = ROLLOUT_ENGINES.get("sglang")(urls=urls, num_servers=0, weight_sync="tensor")
    try:
        with caplog.at_level(logging.WARNING, logger="rlkit.rollout.sglang.engine"):
            first = qwen.sync_weights(LocalPolicyWeights(hf_models["a"], version=70))
        second = qwen.sync_weights(LocalPolicyWeights(hf_models["a"], version=71))
    finally:
        qwen.close()
        engine.sync_weights(LocalPolicyWeights(hf_models["a"], version=72))
    assert [first["weight_sync/params_checked"], second["weight_sync/params_checked"]] == [0, 0]
    assert first["weight_sync/logprob_max_abs_diff"] < 1e-5
    assert "answered none of" in caplog.text
