"""verl 0.9.1's default scoring of math rows, reproduced exactly: every math ``data_source``
of verl's table scores each crafted response (``tests/verl_reward_cases.py``) as verl's
own ``default_compute_score`` does, plus hand-computed cases of each rule and of DAPO's
overlong buffer in the trainer."""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace

import pytest
from transformers import AutoTokenizer

import rewards
from rewards.by_data_source import by_data_source, scorer_for
from tests import verl_reward_cases as cases
from tests.verl_oracle import OracleUnavailableError, load

FAMILIES = {
    "math_dapo": cases.math_dapo_cases,
    "hendrycks_math": cases.hendrycks_cases,
    "prime_math": cases.prime_cases,
    "geo3k": cases.geo3k_cases,
    "gsm8k": cases.gsm8k_cases,
}
ALL_SOURCES = (
    cases.MATH_DAPO_SOURCES
    + cases.HENDRYCKS_SOURCES
    + cases.PRIME_SOURCES
    + cases.GEO3K_SOURCES
    + cases.GSM8K_SOURCES
)


def _oracle():
    try:
        return load()
    except OracleUnavailableError as error:
        pytest.fail(str(error), pytrace=False)


def _verl(source: str, response: str, truth: str):
    with contextlib.redirect_stdout(io.StringIO()):  # verl prints the errors it catches
        return _oracle().default_compute_score(source, response, truth)


def _comparable(family: str, result):
    # rlkit's gsm8k returns {"score", "acc", "pred"} where verl returns the score alone.
    return repr(result["score"] if family == "gsm8k" else result)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_crafted_response_scores_as_verl_scores_it(family):
    crafted = FAMILIES[family]()
    _oracle()
    mismatches = []
    for source, response, truth in crafted:
        ours = _comparable(family, by_data_source(response, truth, data_source=source))
        theirs = repr(_verl(source, response, truth))
        if ours != theirs:
            mismatches.append(
                f"{source} {response!r:.120} vs {truth!r}: rlkit {ours}, verl {theirs}"
            )
    assert not mismatches, f"{len(mismatches)} of {len(crafted)} differ:\n" + "\n".join(
        mismatches[:5]
    )


def test_the_crafted_set_is_large_and_covers_every_source():
    sizes = {family: len(make()) for family, make in FAMILIES.items()}
    assert sum(sizes.values()) >= 10_000 and sizes["prime_math"] >= 1_000
    covered = {source for make in FAMILIES.values() for source, _, _ in make()}
    assert covered == set(ALL_SOURCES)


@pytest.mark.parametrize("source", ALL_SOURCES)
def test_each_verl_source_is_scored_by_the_reward_named_after_its_rule(source):
    name = scorer_for(source)[0]
    family = next(f for f, make in FAMILIES.items() if source in {s for s, _, _ in make()[:50]})
    assert name == family


def test_aime_prefix_is_case_sensitive_as_in_verl():
    assert scorer_for("aime_custom") == ("math_dapo", {})
    assert scorer_for("AIME2024") is None and scorer_for("numina_other") is None
    with pytest.raises(NotImplementedError):
        _verl("AIME2024", "Answer: 1", "1")


def test_rlkit_sources_keep_their_scorers():
    assert scorer_for("gsm8k") == ("gsm8k", {"method": "strict"})
    assert scorer_for("math500") == ("math", {})
    assert scorer_for("dapo_math_17k") == ("math_dapo", {})


# -- math_dapo ----------------------------------------------------------------
def test_math_dapo_scores_the_last_answer_line_plus_one_and_a_wrong_one_minus_one():
    reward = rewards.get("math_dapo")
    assert reward("So the sum is 204.\nAnswer: 204", "204") == {
        "score": 1.0,
        "acc": True,
        "pred": "204",
    }
    assert reward("Answer: 205", "204") == {"score": -1.0, "acc": False, "pred": "205"}
    assert reward("Answer: 204\nAnswer: 205", "204")["acc"] is False  # the last line counts


def test_math_dapo_normalises_units_dollars_and_commas_minerva_style():
    reward = rewards.get("math_dapo")
    assert reward("answer: $1,000$ dollars", "1000")["pred"] == "1000"
    assert reward("Answer: x = \\frac12", "\\frac{1}{2}")["score"] == 1.0
    assert reward("Answer: 90^\\circ", "90")["score"] == 1.0


def test_math_dapo_falls_back_to_the_box_compared_as_written():
    reward = rewards.get("math_dapo")
    assert reward("so \\boxed{204}", "204") == {"score": 1.0, "acc": True, "pred": "204"}
    assert reward("so \\boxed{ 204}", "204")["score"] == -1.0  # no normalisation
    assert reward("nothing here", "204") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}


def test_math_dapo_reads_only_the_last_300_and_100_characters():
    reward = rewards.get("math_dapo")
    assert reward("Answer: 204\n" + "x" * 300, "204")["pred"] == "[INVALID]"
    assert reward("Answer: 204\n" + "x" * 280, "204")["score"] == 1.0
    assert reward("\\boxed{204}" + "." * 90, "204")["score"] == -1.0  # box cut at 100
    assert reward("\\boxed{204}" + "." * 89, "204")["score"] == 1.0


# -- hendrycks_math -----------------------------------------------------------
def test_hendrycks_math_accepts_equivalent_spellings_of_the_boxed_answer():
    reward = rewards.get("hendrycks_math")
    assert reward("\\boxed{\\dfrac12}", "\\frac{1}{2}") == 1.0
    assert reward("\\boxed{0.5}", "\\frac{1}{2}") == 1.0
    assert reward("\\boxed{1/2}", "\\frac{1}{2}") == 1.0
    assert reward("\\boxed{x = 5}", "5") == 1.0
    assert reward("\\boxed{90^\\circ}", "90") == 1.0
    assert reward("\\boxed{\\sqrt3}", "\\sqrt{3}") == 1.0
    assert reward("\\boxed 7$.", "7") == 1.0


def test_hendrycks_math_scores_0_without_a_closed_boxed_answer():
    reward = rewards.get("hendrycks_math")
    assert reward("\\boxed{6}", "7") == 0.0
    assert reward("\\boxed{7", "7") == 0.0
    assert reward("\\fbox{7}", "7") == 0.0
    assert reward("The answer is 7", "7") == 0.0
    assert reward("", "7") == 0.0


# -- prime_math ---------------------------------------------------------------
def test_prime_math_cuts_the_answer_from_the_text_and_grades_it():
    reward = rewards.get("prime_math")
    assert reward("Thus the answer is 12. Done", "12") == 1.0
    assert reward("answer: \\frac{1}{2}", "0.5") == 1.0
    assert reward("answer: x^2 + 2x + 1", "(x+1)^2") == 1.0  # SymPy
    assert reward("answer: 2/4", "1/2") == 0.0  # unreduced fractions must match as written
    assert reward("answer: 13", "12") == 0.0


def test_prime_math_reads_pi_both_ways_and_percentages():
    reward = rewards.get("prime_math")
    assert reward("answer: 6.28", "2\\pi") == 1.0  # pi = 3.14
    assert reward("answer: 0.5", "50") == 1.0  # reference / 100
    assert reward("answer: x_2", "11") == 0.0  # a subscript on a non-number: an error


# -- geo3k --------------------------------------------------------------------
def test_geo3k_weighs_accuracy_nine_tenths_and_format_one_tenth():
    reward = rewards.get("geo3k")
    assert reward("<think>a</think> so \\boxed{3}", "3") == 1.0
    assert reward("\\boxed{3}", "3") == 0.9
    assert reward("<think>a</think> so \\boxed{4}", "3") == 0.1
    assert reward("3", "3") == 0.0


# -- DAPO's overlong buffer in the trainer ------------------------------------
def test_overlong_penalty_and_acc_match_verls_dapo_reward_manager(tiny_model_dir, tmp_path):
    from rlkit.rollout.base import RolloutBatch
    from rlkit.rollout.trajectory import trajectories_from_rollout
    from rlkit.trainer.prompts import PromptSet
    from rlkit.trainer.scoring import score_rollout
    from tests.experiment_factory import small_experiment

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = small_experiment(tiny_model_dir, tmp_path, data={"reward": "by_data_source"})
    eos = tok.eos_token_id
    texts = ["Answer: 7", "Answer: 8", "x" * 4 + "\nAnswer: 7", "x" * 10 + "\nAnswer: 7"]
    ids = [tok.encode(t, add_special_tokens=False) + [eos] for t in texts]
    lengths = [len(i) for i in ids]  # verl's valid_response_length counts the EOS
    max_len, buffer_len, factor = lengths[-1], lengths[-1] - lengths[0], 0.5
    cfg.rollout = replace(cfg.rollout, max_response_length=max_len)
    cfg.algorithm = replace(
        cfg.algorithm, overlong_buffer_len=buffer_len, overlong_penalty_factor=factor
    )
    rollout = RolloutBatch(
        prompt_ids=[[5]] * 4,
        response_ids=ids,
        rollout_log_probs=[[0.0] * n for n in lengths],
        finish_reasons=["stop"] * 4,
        prompt_index=[0] * 4,
    )
    prompts = PromptSet(token_ids=[[5]], ground_truths=["7"], data_sources=["math_dapo"])
    trajectories = trajectories_from_rollout(rollout, policy_version=0)
    scored = score_rollout(trajectories, prompts, tok, cfg, groups=[0] * 4)
    # verl: expected = Lmax - Lb; penalty = min(-(L - expected) / Lb * factor, 0). The
    # first two responses are exactly Lmax - Lb long (no penalty), the last exactly Lmax
    # (the whole factor), whatever the tokenizer's lengths are.
    assert lengths[0] == lengths[1] == max_len - buffer_len < lengths[2] < max_len
    assert scored.scores[:2] == [1.0, -1.0] and scored.scores[3] == 1.0 - factor
    assert scored.acc == [1.0, 0.0, 1.0, 1.0]  # the reward's acc, not the penalised score
    for length, score, base in zip(lengths, scored.scores, (1.0, -1.0, 1.0, 1.0)):
        verl = min(-(length - (max_len - buffer_len)) / buffer_len * factor, 0)
        assert score == pytest.approx(base + verl, abs=1e-12)
    assert scored.metrics["reward/overlong_penalty_sum"] == pytest.approx(
        -factor - (lengths[2] - lengths[0]) / buffer_len * factor
    )
