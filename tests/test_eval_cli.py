"""``rlkit eval``: the command line around evaluate(), on a tiny local model."""

from __future__ import annotations

import json
import re

import pytest

from rlkit.cli import main as rlkit_main
from rlkit.evaluation.eval_report import read_jsonl, summary_path
from rlkit.evaluation.harness import main, parse_options


def _write_problems(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def toy_jsonl(tmp_path):
    rows = [{"id": f"q{i}", "question": f"{i}+{i}=", "answer": str(2 * i)} for i in range(3)]
    return _write_problems(tmp_path / "toy.jsonl", rows)


def test_eval_on_a_file_writes_one_record_per_problem(tiny_model_dir, toy_jsonl, tmp_path, capsys):
    out = tmp_path / "res" / "toy.jsonl"
    code = main(
        [str(tiny_model_dir), "--dataset", str(toy_jsonl), "--reward", "exact_match",
         "--max-new-tokens", "3", "--output", str(out), "--quiet", "--no-chat-template"]
    )  # fmt: skip
    assert code == 0
    records = read_jsonl(out)
    assert [r["id"] for r in records] == ["q0", "q1", "q2"]
    assert [r["ground_truth"] for r in records] == ["0", "2", "4"]
    # --no-chat-template renders "role: content" lines ending with "assistant:".
    assert records[1]["prompt"] == "user: 1+1=\nassistant:"
    summary = json.loads(summary_path(out).read_text())
    assert summary["settings"]["reward"] == "exact_match"
    assert summary["settings"]["command"].startswith("rlkit eval ")
    assert summary["settings"]["max_new_tokens"] == 3 and summary["settings"]["n"] == 1
    assert summary["metrics"]["num_problems"] == 3
    printed = capsys.readouterr().out
    assert "accuracy (mean@1)" in printed and "pass@1" in printed and str(out) in printed


def test_rlkit_eval_dispatches_and_limits_a_shared_set(tiny_model_dir, tmp_path):
    out = tmp_path / "gsm8k.jsonl"
    code = rlkit_main(
        ["eval", str(tiny_model_dir), "--dataset", "gsm8k", "--limit", "2", "--n", "2",
         "--temperature", "1.0", "--max-new-tokens", "2", "--output", str(out), "--quiet"]
    )  # fmt: skip
    assert code == 0
    records = read_jsonl(out)
    assert len(records) == 2
    assert records[0]["id"] == "gsm8k-test-00000" and records[0]["data_source"] == "gsm8k"
    assert all(len(r["responses"]) == 2 for r in records)
    # The preset's GSM8K instruction is appended to the question.
    assert records[0]["question"].endswith('output the final answer after "####".')
    summary = json.loads(summary_path(out).read_text())
    assert summary["settings"]["reward"] == "gsm8k"
    assert set(summary["metrics"]) >= {"accuracy", "mean@2", "pass@1", "pass@2"}


def test_several_samples_without_a_temperature_are_refused(tiny_model_dir, toy_jsonl, capsys):
    with pytest.raises(SystemExit) as exited:
        main([str(tiny_model_dir), "--dataset", str(toy_jsonl), "--reward", "exact_match",
              "--n", "4"])  # fmt: skip
    assert exited.value.code == 2 and "temperature > 0" in capsys.readouterr().err


def test_a_dataset_file_needs_a_reward(tiny_model_dir, toy_jsonl, capsys):
    assert main([str(tiny_model_dir), "--dataset", str(toy_jsonl)]) == 2
    assert "name its reward with --reward" in capsys.readouterr().err


def test_an_unknown_dataset_names_the_choices(tiny_model_dir, capsys):
    assert main([str(tiny_model_dir), "--dataset", "gsm9k"]) == 2
    assert re.search("neither a shared set .*gsm8k", capsys.readouterr().err)


def test_a_missing_model_directory_is_reported(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path / "nope"), "--dataset", "gsm8k"])
    assert exited.value.code == 2 and "does not exist" in capsys.readouterr().err


def test_a_directory_that_is_not_a_model_is_one_message_before_any_loading(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a model")
    for path, said in (
        (tmp_path, "not a Hugging Face model directory"),
        (tmp_path / "notes.txt", "is a file"),
    ):
        with pytest.raises(SystemExit) as exited:
            main([str(path), "--dataset", "gsm8k"])
        assert exited.value.code == 2 and said in capsys.readouterr().err


def test_engine_options_parse_as_literals_or_strings():
    parsed = parse_options(["num_servers=2", "device=cpu", "urls=['http://a:1']"], "--x")
    assert parsed == {"num_servers": 2, "device": "cpu", "urls": ["http://a:1"]}
    with pytest.raises(SystemExit, match="key=value"):
        parse_options(["oops"], "--engine-option")


def test_an_unknown_engine_option_is_rejected_by_the_engine(tiny_model_dir, toy_jsonl, tmp_path):
    with pytest.raises(TypeError, match="unknown option"):
        main([str(tiny_model_dir), "--dataset", str(toy_jsonl), "--reward", "exact_match",
              "--engine-option", "bogus=1", "--output", str(tmp_path / "x.jsonl")])  # fmt: skip


def first_character_is_even(response: str, ground_truth: str, **extra) -> float:
    """A reward that depends on the model's text only, so two models score differently."""
    return float(bool(response) and ord(response[0]) % 2 == 0)


@pytest.fixture(scope="module")
def second_model_dir(tmp_path_factory):
    from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer

    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny_b"), train_byte_tokenizer(), seed=1)


def _compare_args(model, baseline, dataset, out):
    return [str(model), "--compare", str(baseline), "--dataset", str(dataset),
            "--reward", "tests.test_eval_cli:first_character_is_even", "--n", "2",
            "--temperature", "1.0", "--max-new-tokens", "2", "--output", str(out), "--quiet",
            "--no-chat-template"]  # fmt: skip


def test_compare_pairs_two_models_over_the_same_problems(
    tiny_model_dir, second_model_dir, tmp_path, capsys
):
    rows = [{"id": f"q{i}", "question": f"{i}+{i + 1}=", "answer": "x"} for i in range(6)]
    dataset = _write_problems(tmp_path / "six.jsonl", rows)
    out = tmp_path / "a.jsonl"
    assert main(_compare_args(tiny_model_dir, second_model_dir, dataset, out)) == 0
    a, b = read_jsonl(out), read_jsonl(tmp_path / "a.baseline.jsonl")
    assert [r["id"] for r in a] == [r["id"] for r in b] == [f"q{i}" for i in range(6)]
    assert json.loads(summary_path(tmp_path / "a.baseline.jsonl").read_text())["settings"][
        "model"
    ] == str(second_model_dir)
    # The paired differences, recomputed from the two files: per problem, the fraction of
    # its 2 responses correct under model A minus under model B; t(0.975, 5) = 2.570582.
    diffs = [ra["num_correct"] / 2 - rb["num_correct"] / 2 for ra, rb in zip(a, b)]
    mean = sum(diffs) / 6
    std = (sum((d - mean) ** 2 for d in diffs) / 5) ** 0.5
    saved = json.loads((tmp_path / "a.comparison.json").read_text())
    accuracy = saved["metrics"]["accuracy"]
    assert saved["unit"] == "problem" and saved["num_problems"] == 6
    assert accuracy["difference"]["mean"] == pytest.approx(mean)
    if std > 0:
        half = 2.570582 * std / 6**0.5
        assert accuracy["difference"]["low"] == pytest.approx(mean - half, abs=1e-5)
        assert accuracy["difference"]["high"] == pytest.approx(mean + half, abs=1e-5)
        assert 0.0 <= accuracy["p_value"] <= 1.0
    assert set(saved["metrics"]) == {"accuracy", "pass@1", "pass@2"}
    printed = capsys.readouterr().out
    assert "paired over 6 problems" in printed and accuracy["verdict"] in printed


def test_a_model_compared_with_its_copy_differs_by_exactly_zero(tiny_model_dir, tmp_path, capsys):
    import shutil

    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")
    dataset = _write_problems(
        tmp_path / "p.jsonl",
        [{"id": f"q{i}", "question": f"{i}=", "answer": "x"} for i in range(4)],
    )
    assert main(_compare_args(tiny_model_dir, copy, dataset, tmp_path / "same.jsonl")) == 0
    # Same weights, same seed, same problems: the same responses, so every difference is 0.
    saved = json.loads((tmp_path / "same.comparison.json").read_text())
    for metric in saved["metrics"].values():
        assert metric["difference"]["mean"] == 0.0 and metric["p_value"] == 1.0
        assert metric["verdict"] == "not distinguishable (interval includes 0)"


def test_a_missing_baseline_directory_is_reported(tiny_model_dir, toy_jsonl, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main([str(tiny_model_dir), "--compare", str(tmp_path / "nope"), "--dataset",
              str(toy_jsonl), "--reward", "exact_match"])  # fmt: skip
    assert exited.value.code == 2 and "does not exist" in capsys.readouterr().err
