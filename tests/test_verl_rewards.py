"""verl's reward functions, its default per-data_source scoring and its exact GSM8K rule,
used through rlkit's trainer, ``rlkit train`` and ``rlkit eval`` unchanged."""

from __future__ import annotations

import json

import gin
import pytest

import rewards
from rewards.by_data_source import scorer_for
from rlkit.evaluation.eval_report import read_jsonl, summary_path
from rlkit.evaluation.harness import main as eval_main
from rlkit.train import main as train_main
from tests.gin_files import arithmetic_gin


@pytest.fixture(autouse=True)
def _no_gin_left_behind():
    """`rlkit train` runs in this process: its gin bindings must not reach later tests."""
    yield
    gin.clear_config()


VERL_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    wanted = (extra_info or {}).get("wanted", ground_truth)
    hit = float(wanted in solution_str or extra_info.get("always", False))
    return {"score": hit + bonus, "acc": hit, "source_len": float(len(data_source))}


def plain(data_source, solution_str, ground_truth, extra_info=None):
    return 0.25


def missing_truth(data_source, solution_str, extra_info=None):
    return 0.0


def broken(data_source, solution_str, ground_truth, extra_info=None):
    raise RuntimeError("this reward is broken")
"""


@pytest.fixture
def verl_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(VERL_REWARD)
    return path


def _verl_rows(path, rows):
    """A JSONL file in verl's row format (prompt messages, reward_model, extra_info)."""
    lines = [
        json.dumps(
            {
                "data_source": source,
                "prompt": [{"role": "user", "content": question}],
                "reward_model": {"style": "rule", "ground_truth": truth},
                "extra_info": extra,
            }
        )
        for source, question, truth, extra in rows
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_verl_reward_is_called_by_keyword_with_extra_info_and_options(verl_file):
    contexts = [
        rewards.RewardContext("the answer is 7", "7", data_source="src", extra_info={}),
        rewards.RewardContext("nothing", "7", data_source="src", extra_info={"always": True}),
    ]
    result = rewards.score_batch(
        f"{verl_file}:compute_score",
        [c.response for c in contexts],
        [c.ground_truth for c in contexts],
        [{"data_source": "src", "response_length": 3, "bonus": 0.5}] * 2,
        contexts=contexts,
    )
    assert result.num_errors == 0
    assert result.scores == [1.5, 1.5]
    # A dict's keys other than "score" become metrics, as verl's reward managers log them.
    assert result.metrics()["reward/source_len"] == 3.0
    plain = rewards.score_batch(f"{verl_file}:plain", ["x"], ["y"], [{"data_source": "s"}])
    assert plain.scores == [0.25] and plain.num_errors == 0


def test_a_verl_reward_scores_in_worker_processes_too(verl_file):
    result = rewards.score_batch(
        f"{verl_file}:compute_score", ["has 4"], ["4"], [{"data_source": "s"}], num_workers=1
    )
    assert result.scores == [1.0] and result.num_errors == 0


def _gin(tmp_path, model, bindings):
    config = tmp_path / "run.gin"
    config.write_text(arithmetic_gin(model, tmp_path / "out", bindings))
    return str(config)


def test_a_bad_verl_signature_stops_before_the_model_loads(tmp_path, verl_file, capsys):
    # The model path does not exist: the reward's signature is reported first.
    config = _gin(
        tmp_path, tmp_path / "no_model", {"DataConfig.reward": f"{verl_file}:missing_truth"}
    )
    assert train_main([config]) == 2
    err = capsys.readouterr().err
    assert "lacks ['ground_truth']" in err and "Traceback" not in err
    config = _gin(
        tmp_path,
        tmp_path / "no_model",
        {"DataConfig.reward": f"{verl_file}:plain", "DataConfig.reward_options": {"bonus": 1}},
    )
    assert train_main([config]) == 2
    assert "does not take the reward_options ['bonus']" in capsys.readouterr().err


def test_custom_reward_function_settings_train_with_a_verl_reward(
    tmp_path, tiny_model_dir, verl_file
):
    bindings = {
        "DataConfig.custom_reward_path": str(verl_file),
        "DataConfig.custom_reward_name": "compute_score",
        "DataConfig.reward": "default",  # left unset: custom_reward_path replaces it
        "DataConfig.reward_options": {"bonus": 0.0},
        "DataConfig.val_limit": None,
        "TrainerConfig.total_steps": 1,
        "TrainerConfig.test_freq": 0,
        "TrainerConfig.save_freq": 0,
        "OptimConfig.ppo_mini_batch_size": 4,
        "DataConfig.max_prompt_length": 64,
    }
    assert train_main([_gin(tmp_path, tiny_model_dir, bindings)]) == 0
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").open()]
    step = next(m for m in metrics if m.get("step") == 1)
    assert step["reward/num_errors"] == 0
    assert step["reward/source_len/mean"] > 0  # the dict's extra key, logged


def test_custom_reward_path_and_another_reward_conflict(tmp_path, verl_file, capsys):
    bindings = {"DataConfig.custom_reward_path": str(verl_file), "DataConfig.reward": "math"}
    assert train_main([_gin(tmp_path, tmp_path / "m", bindings)]) == 2
    assert "set one of the two" in capsys.readouterr().err


def test_eval_hands_the_reward_extra_info_as_training_does(tmp_path, tiny_model_dir, verl_file):
    data = _verl_rows(
        tmp_path / "verl.jsonl",
        [("src", "1+1=", "2", {"always": True}), ("src", "2+2=", "4", {"always": True})],
    )
    out = tmp_path / "eval.jsonl"
    argv = [str(tiny_model_dir), "--dataset", str(data), "--max-new-tokens", "2", "--quiet"]
    code = eval_main([*argv, "--reward", f"{verl_file}:compute_score", "--output", str(out)])
    assert code == 0
    assert all(r["scores"] == [1.0] for r in read_jsonl(out))


def test_eval_with_a_reward_failing_everywhere_exits_2(tmp_path, tiny_model_dir, verl_file, capsys):
    data = _verl_rows(tmp_path / "verl.jsonl", [("src", "1+1=", "2", {})])
    argv = [str(tiny_model_dir), "--dataset", str(data), "--max-new-tokens", "2", "--quiet"]
    assert (
        eval_main([*argv, "--reward", f"{verl_file}:broken", "--output", str(tmp_path / "o.jsonl")])
        == 2
    )
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert (
        last.startswith("rlkit eval: every reward call failed") and "this reward is broken" in last
    )


@pytest.mark.parametrize(
    ("source", "scorer"),
    [
        ("openai/gsm8k", ("gsm8k", {"method": "verl"})),
        ("gsm8k", ("gsm8k", {"method": "strict"})),
        ("HuggingFaceH4/MATH-500", ("hendrycks_math", {})),
        ("lighteval/MATH", ("hendrycks_math", {})),
        ("math500", ("math", {})),
        ("math_dapo", ("math_dapo", {})),
        ("aime2024", ("math_dapo", {})),
        ("numina_olympiads", ("prime_math", {})),
        ("hiyouga/geometry3k", ("geo3k", {})),
        ("my_source", None),
    ],
)
def test_by_data_source_picks_verls_default_scorer(source, scorer):
    assert scorer_for(source) == scorer


def test_by_data_source_scores_a_mixed_dataset(tmp_path, tiny_model_dir, capsys):
    data = _verl_rows(
        tmp_path / "mixed.jsonl",
        [
            ("openai/gsm8k", "1+1=", "2", {}),
            ("HuggingFaceH4/MATH-500", "x^2=4, x>0, x=", "2", {}),
            ("aime2024", "1+2=", "3", {}),
        ],
    )
    out = tmp_path / "mixed_eval.jsonl"
    argv = [str(tiny_model_dir), "--dataset", str(data), "--max-new-tokens", "2", "--quiet"]
    assert eval_main([*argv, "--reward", "by_data_source", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("rows are scored by") == 3  # once per source, not per row
    assert "1 'openai/gsm8k' rows are scored by gsm8k {'method': 'verl'}" in printed
    summary = json.loads(summary_path(out).read_text())
    assert summary["metrics"]["reward/num_errors"] == 0  # no "must be a number" errors
    direct = rewards.score_batch(
        "by_data_source",
        ["#### 2", r"so \boxed{2}", "#### 2."],
        ["2", "2", "2"],
        [{"data_source": s} for s in ("openai/gsm8k", "HuggingFaceH4/MATH-500", "openai/gsm8k")],
    )
    assert direct.scores == [1.0, 1.0, 0.0] and direct.num_errors == 0


def test_an_unknown_data_source_stops_training_with_one_message(tmp_path, tiny_model_dir, capsys):
    data = _verl_rows(tmp_path / "odd.jsonl", [("my_source", "1+1=", "2", {})] * 4)
    bindings = {
        "DataConfig.dataset_fn": None,
        "DataConfig.train_files": str(data),
        "DataConfig.reward": "by_data_source",
        "OptimConfig.ppo_mini_batch_size": 4,
        "DataConfig.max_prompt_length": 64,
    }
    assert train_main([_gin(tmp_path, tiny_model_dir, bindings)]) == 2
    err = capsys.readouterr().err
    assert "'my_source'" in err and "DataConfig.reward" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("response", "verl", "strict"),
    [
        ("#### 72", 1.0, 1.0),
        ("so #### 1,000 then #### 72", 1.0, 1.0),
        ("#### 72.", 0.0, 1.0),
        ("####72", 0.0, 1.0),
        ("#### $72", 0.0, 1.0),
        ("#### 72.0", 0.0, 1.0),
        ("#### 072", 0.0, 1.0),
        ("#### 72" + " padding" * 60, 0.0, 1.0),  # verl reads only the last 300 characters
    ],
)
def test_gsm8k_verl_method_matches_verls_rule(response, verl, strict):
    gsm8k = rewards.get("gsm8k")
    assert gsm8k(response, "72", method="verl")["score"] == verl
    assert gsm8k(response, "72")["score"] == strict
    # A raw GSM8K solution as reference is reduced by the same rule.
    assert gsm8k(response, "He has 70+2 = 72\n#### 72", method="verl")["score"] == verl


def _without_reward(gin_text: str) -> str:
    """The experiment with no ``DataConfig.reward`` line: the reward left at its default."""
    return gin_text.replace("DataConfig.reward = 'exact_match'\n", "")


def test_the_default_reward_scores_each_row_by_its_data_source():
    scored = rewards.score_batch(
        "default",
        ["#### 2.", r"so \boxed{\frac{1}{2}}", "#### 7", "The answer is 7"],
        ["2", "1/2", "7", "7"],
        [
            {"data_source": "openai/gsm8k"},  # verl's rule: "2." is no number -> 0
            {"data_source": "HuggingFaceH4/MATH-500"},  # MATH's checker: \frac{1}{2} = 1/2 -> 1
            {"data_source": "my_numbers"},  # no scorer: gsm8k strict reads "#### 7" -> 1
            {"data_source": "my_numbers"},  # strict needs "####" -> 0
        ],
    )
    assert scored.scores == [0.0, 1.0, 1.0, 0.0] and scored.num_errors == 0


def test_a_run_with_no_reward_set_trains_on_a_mixed_gsm8k_and_math_parquet(
    tmp_path, tiny_model_dir, capfd
):
    import pandas as pd

    rows = [
        ("openai/gsm8k", "1+1=", "2"),
        ("HuggingFaceH4/MATH-500", "Half of one is", r"\frac{1}{2}"),
        ("openai/gsm8k", "2+2=", "4"),
        ("HuggingFaceH4/MATH-500", "x^2=4, x>0, x=", "2"),
    ]
    data = tmp_path / "mixed.parquet"
    pd.DataFrame(
        [
            {
                "data_source": source,
                "prompt": [{"role": "user", "content": question}],
                "reward_model": {"style": "rule", "ground_truth": truth},
            }
            for source, question, truth in rows
        ]
    ).to_parquet(data)
    bindings = {
        "DataConfig.dataset_fn": None,
        "DataConfig.train_files": str(data),
        "DataConfig.max_prompt_length": 64,
        "OptimConfig.ppo_mini_batch_size": 4,
        "TrainerConfig.total_steps": 1,
        "TrainerConfig.val_before_train": False,
    }
    config = tmp_path / "run.gin"
    config.write_text(_without_reward(arithmetic_gin(tiny_model_dir, tmp_path / "out", bindings)))
    assert train_main([str(config)]) == 0
    printed = capfd.readouterr().out
    assert "2 'HuggingFaceH4/MATH-500' rows are scored by hendrycks_math" in printed
    assert "2 'openai/gsm8k' rows are scored by gsm8k {'method': 'verl'}" in printed
    logged = [
        json.loads(line)
        for line in (tmp_path / "out/metrics.jsonl").read_text().split("\n")
        if line
    ]
    assert logged[-1]["reward/num_errors"] == 0  # "\frac{1}{2}" reached hendrycks_math


def test_a_run_with_no_reward_set_stops_on_an_unknown_source_with_non_numeric_answers(
    tmp_path, tiny_model_dir, capsys
):
    data = _verl_rows(
        tmp_path / "odd.jsonl", [("my_source", "Half of one", r"\frac{1}{2}", {})] * 4
    )
    bindings = {
        "DataConfig.dataset_fn": None,
        "DataConfig.train_files": str(data),
        "DataConfig.max_prompt_length": 64,
        "OptimConfig.ppo_mini_batch_size": 4,
    }
    config = tmp_path / "run.gin"
    config.write_text(_without_reward(arithmetic_gin(tiny_model_dir, tmp_path / "out", bindings)))
    assert train_main([str(config)]) == 2
    err = capsys.readouterr().err
    assert "data_source 'my_source' has no scorer" in err and "Set DataConfig.reward" in err
    assert "Traceback" not in err and not (tmp_path / "out/metrics.jsonl").exists()
