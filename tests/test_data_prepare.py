"""``rlkit data prepare``, verl's file layout both ways, and the data fixes around it:
val sources read their own split, ``extra_info`` reaches rewards, ``on_error`` from gin,
a raw ``#### N`` ground truth in the gsm8k reward."""

from __future__ import annotations

import json

import gin
import pandas as pd
import pyarrow.parquet as pq
import pytest

import rewards
from rlkit.cli import COMMANDS
from rlkit.cli import main as rlkit_main
from rlkit.data import (
    GSM8K_INSTRUCTION,
    decode_extra_info,
    gsm8k_final_answer,
    load_prompt_dataset,
    load_report,
)
from rlkit.data.verl_format import write_verl
from rlkit.trainer.config import DataConfig, ExperimentConfig, ModelConfig
from rlkit.trainer.prompts import tokenize_prompts

VERL_COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def verl_gsm8k_rows(raw: list[dict], split: str) -> list[dict]:
    """Rows as verl's examples/data_preprocess/gsm8k.py makes them from the hub's rows."""
    rows = []
    for idx, example in enumerate(raw):
        question = example["question"] + " " + GSM8K_INSTRUCTION
        solution = example["answer"].split("#### ")[1].replace(",", "")
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": solution},
                "extra_info": {
                    "split": split,
                    "index": idx,
                    "answer": example["answer"],
                    "question": example["question"],
                },
            }
        )
    return rows


RAW = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "What is 999 + 1?", "answer": "999 + 1 = <<999+1=1000>>1000\n#### 1,000"},
]


def test_prepare_writes_verl_parquet_with_normalised_gsm8k_answers(tmp_path):
    out = tmp_path / "gsm8k"
    assert rlkit_main(["data", "prepare", "gsm8k", "--out", str(out), "--split", "test"]) == 0
    table = pq.read_table(out / "test.parquet")
    assert table.column_names == VERL_COLUMNS
    first = table.slice(0, 1).to_pylist()[0]
    assert first["data_source"] == "openai/gsm8k" and first["ability"] == "math"
    assert first["reward_model"] == {"style": "rule", "ground_truth": "18"}
    assert first["prompt"][0]["role"] == "user"
    assert first["prompt"][0]["content"].endswith(GSM8K_INSTRUCTION)
    assert first["extra_info"]["split"] == "test" and first["extra_info"]["index"] == 0
    # verl's gsm8k preprocessing: the raw question and the raw solution, by these names.
    assert first["prompt"][0]["content"].startswith(first["extra_info"]["question"])
    assert first["extra_info"]["question"].startswith("Janet")
    assert first["extra_info"]["answer"].endswith("#### 18")
    assert table.num_rows == 1319
    # The folder loads back through rlkit with the same ids and answers.
    back = load_prompt_dataset(str(out), split="test")
    assert back[0]["id"] == "gsm8k-test-00000" and back[0]["ground_truth"] == "18"


def test_prepare_jsonl_and_errors(tmp_path, capsys):
    code = rlkit_main(["data", "prepare", "aime2024", "--out", str(tmp_path), "--format", "jsonl"])
    assert code == 0
    rows = [json.loads(line) for line in (tmp_path / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and rows[0]["reward_model"]["ground_truth"] == "204"
    assert rlkit_main(["data", "prepare", "gsm9k", "--out", str(tmp_path)]) == 2
    assert "unknown dataset preset 'gsm9k'" in capsys.readouterr().err
    assert (
        rlkit_main(["data", "prepare", "math500", "--out", str(tmp_path), "--split", "train"]) == 2
    )
    assert "math500 has no split 'train'" in capsys.readouterr().err


def test_cli_lists_data_and_export():
    assert COMMANDS["data"][0] == "rlkit.data_cli:main"
    assert COMMANDS["export"][0] == "rlkit.export:main"


def test_a_verl_file_loads_in_rlkit_and_writes_back_the_same_layout(tmp_path):
    path = tmp_path / "verl" / "train.parquet"
    path.parent.mkdir()
    pd.DataFrame(verl_gsm8k_rows(RAW, "train")).to_parquet(path)
    ds = load_prompt_dataset(str(path))
    assert ds["ground_truth"] == ["7", "1000"]
    assert ds["data_source"] == ["openai/gsm8k"] * 2
    assert ds["id"] == ["0", "1"]  # verl's extra_info.index
    extra = decode_extra_info(ds[1]["extra_info"])
    assert extra["answer"].endswith("#### 1,000") and extra["split"] == "train"
    # ... and back: the same columns and values verl reads.
    out = write_verl(ds, tmp_path / "back" / "train.parquet", split="train")
    again = pq.read_table(out).to_pylist()
    original = pq.read_table(path).to_pylist()
    assert list(again[0]) == VERL_COLUMNS
    for a, b in zip(again, original, strict=True):
        assert a["prompt"] == b["prompt"] and a["reward_model"] == b["reward_model"]
        assert a["data_source"] == b["data_source"] and a["ability"] == b["ability"]
        assert {k: a["extra_info"][k] for k in b["extra_info"]} == b["extra_info"]


def test_extra_info_of_verl_rows_reaches_the_reward(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from rewards import score_batch
    from rewards.context import RewardContext

    path = tmp_path / "train.parquet"
    pd.DataFrame(verl_gsm8k_rows(RAW, "train")).to_parquet(path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = tokenize_prompts(
        load_prompt_dataset(str(path)),
        tokenizer,
        max_prompt_length=512,
        truncation="error",
        use_chat_template=False,
        name="train",
    )
    assert prompts.extra_infos[1]["question"] == RAW[1]["question"]
    assert prompts.extra_infos[1]["index"] == 1
    seen = []

    def reward(response, ground_truth, *, extra_info, **_):
        seen.append(extra_info["answer"])
        return 1.0

    # As the trainer's scoring builds them (rlkit.trainer.scoring): extra_info per prompt.
    contexts = [
        RewardContext(response="#### 7", ground_truth=prompts.ground_truths[0],
                      extra_info=prompts.extra_infos[0])
    ]  # fmt: skip
    score_batch(reward, ["#### 7"], [prompts.ground_truths[0]], contexts=contexts)
    assert seen == [RAW[0]["answer"]]


def test_gsm8k_reward_accepts_a_raw_solution_as_ground_truth():
    gsm8k = rewards.get("gsm8k")
    assert gsm8k("so #### 1000", RAW[1]["answer"])["score"] == 1.0
    assert gsm8k("so #### 7", RAW[0]["answer"])["acc"] == 1.0
    assert gsm8k("so #### 8", RAW[0]["answer"])["acc"] == 0.0
    assert gsm8k_final_answer(RAW[1]["answer"]) == "1000"
    with pytest.raises(ValueError, match="ground truth must be a number"):
        gsm8k("#### 1", "no number here")


def test_val_files_folder_reads_its_held_out_split_and_skipped_rows_are_counted(
    tmp_path, tiny_model_dir
):
    from transformers import AutoTokenizer

    from rlkit.trainer.builders import load_prompts

    (tmp_path / "train.jsonl").write_text('{"question": "t", "answer": "1"}\n')
    (tmp_path / "test.jsonl").write_text(
        '{"question": "v", "answer": "2"}\n{"question": "bad"}\nnot json\n'
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = DataConfig(use_chat_template=False, train_files=str(tmp_path), val_files=str(tmp_path))
    data.on_error = "skip"
    train, skipped_train = load_prompts(data, "train", tokenizer, None)
    val, skipped_val = load_prompts(data, "val", tokenizer, None)
    assert (train.ground_truths, skipped_train) == (["1"], 0)
    assert (val.ground_truths, skipped_val) == (["2"], 2)
    data.on_error = "raise"
    with pytest.raises(Exception, match="on_error='skip'"):
        load_prompts(data, "val", tokenizer, None)


def test_on_error_is_a_gin_field_with_two_choices():
    gin.clear_config()
    try:
        gin.parse_config("DataConfig.on_error = 'skip'")
        assert DataConfig().on_error == "skip"
    finally:
        gin.clear_config()
    cfg = ExperimentConfig(
        model=ModelConfig(path="m"), data=DataConfig(train_files="t.jsonl", on_error="ignore")
    )
    with pytest.raises(ValueError, match=r"DataConfig.on_error must be raise\|skip"):
        cfg.validate()


def test_load_report_counts_skips_for_metrics(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"question": "q", "answer": "1"}\n{"question": ""}\n')
    assert load_report(load_prompt_dataset(str(path), on_error="skip")).num_skipped == 1
