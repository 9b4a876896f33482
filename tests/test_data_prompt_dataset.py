"""load_prompt_dataset / write_parquet / render_prompt on small files written here."""

import json

import pytest

from rlkit.data import (
    GSM8K_INSTRUCTION,
    PromptDataError,
    decode_extra_info,
    load_prompt_dataset,
    load_report,
    render_prompt,
    write_parquet,
)

ROWS = [
    {"id": "q-1", "question": "What is 2 + 2?", "answer": "4"},
    {"id": "q-2", "question": "What is 3 * 3?", "answer": "9", "level": 1},
]


def write_jsonl(path, rows, extra_lines=()):
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_rows_map_to_the_schema_with_an_instruction_suffix(tmp_path):
    path = write_jsonl(tmp_path / "toy.jsonl", ROWS)
    ds = load_prompt_dataset(str(path), instruction=GSM8K_INSTRUCTION)
    assert ds.column_names == ["id", "prompt", "ground_truth", "data_source", "extra_info"]
    first = dict(ds[0])
    assert json.loads(first.pop("extra_info")) == {"question": "What is 2 + 2?"}
    assert first == {
        "id": "q-1",
        "prompt": [{"role": "user", "content": f"What is 2 + 2? {GSM8K_INSTRUCTION}"}],
        "ground_truth": "4",
        "data_source": "toy",  # the file stem
    }
    # The raw question (as verl's preprocessing keeps it) and the row's other columns.
    assert json.loads(ds[1]["extra_info"]) == {"question": "What is 3 * 3?", "level": 1}
    assert ds["ground_truth"] == ["4", "9"]


def test_system_prompt_template_and_custom_keys(tmp_path):
    rows = [{"problem": "1+1?", "solution_value": " 2 ", "uid": 7}]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    ds = load_prompt_dataset(
        str(path),
        question_key="problem",
        answer_key="solution_value",
        id_key="uid",
        system_prompt="Be brief.",
        instruction="Q: {question}\nA:",
        data_source="toy_math",
    )
    assert ds[0]["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q: 1+1?\nA:"},
    ]
    assert ds[0]["id"] == "7" and ds[0]["ground_truth"] == "2"
    assert ds[0]["data_source"] == "toy_math"


def test_missing_ids_are_generated_from_the_data_source_and_row_index(tmp_path):
    rows = [{"question": "a?", "answer": "1"}, {"question": "b?", "answer": "2"}]
    ds = load_prompt_dataset(str(write_jsonl(tmp_path / "x.jsonl", rows)))
    assert ds["id"] == ["x-0", "x-1"]


def test_split_named_files_take_their_folder_as_data_source(tmp_path):
    (tmp_path / "mathy").mkdir()
    write_jsonl(tmp_path / "mathy" / "test.jsonl", ROWS)
    assert load_prompt_dataset(str(tmp_path / "mathy" / "test.jsonl"))[0]["data_source"] == "mathy"
    # A folder with <split>.jsonl loads by split.
    assert len(load_prompt_dataset(str(tmp_path / "mathy"), split="test")) == 2
    with pytest.raises(FileNotFoundError, match="no train.jsonl or train.parquet"):
        load_prompt_dataset(str(tmp_path / "mathy"), split="train")


@pytest.mark.parametrize(
    "bad_line,problem",
    [
        ('{"id": "x", "question": "q?", "answer": ', "invalid JSON"),
        ('{"id": "x", "answer": "1"}', "missing question key 'question'"),
        ('{"id": "x", "question": "q?"}', "missing answer key 'answer'"),
        ('{"id": "x", "question": "   ", "answer": "1"}', "empty question"),
        ('{"id": "x", "question": "q?", "answer": 4}', "answer 'answer' is int"),
        ('{"id": "x", "question": "q?", "answer": ""}', "empty answer"),
        ('["q?", "1"]', "expected a JSON object"),
        ('{"id": "q-1", "question": "again?", "answer": "1"}', "duplicate id 'q-1'"),
    ],
)
def test_malformed_row_error_names_file_line_and_problem(tmp_path, bad_line, problem):
    # Lines 1-2 good, line 3 blank (ignored), line 4 bad.
    path = write_jsonl(tmp_path / "bad.jsonl", ROWS, ["", bad_line])
    with pytest.raises(PromptDataError) as info:
        load_prompt_dataset(str(path))
    message = str(info.value)
    assert f"{path}:4: " in message and problem in message
    assert "on_error='skip'" in message  # the fix


def test_skip_mode_drops_malformed_rows_and_reports_them(tmp_path):
    bad = ['{"question": "q?", "answer": 4}', "not json", '{"question": "ok?", "answer": "5"}']
    path = write_jsonl(tmp_path / "mixed.jsonl", ROWS, bad)
    ds = load_prompt_dataset(str(path), on_error="skip")
    assert ds["ground_truth"] == ["4", "9", "5"]
    report = load_report(ds)
    assert report.num_rows == 3 and report.num_skipped == 2
    assert report.skipped[0].startswith(f"{path}:3: answer 'answer' is int")
    assert report.skipped[1].startswith(f"{path}:4: invalid JSON")
    # The report survives transformations that keep the dataset info.
    assert load_report(ds.select([0])).num_skipped == 2


def test_report_of_a_clean_load_counts_zero_skipped(tmp_path):
    ds = load_prompt_dataset(str(write_jsonl(tmp_path / "ok.jsonl", ROWS)))
    assert load_report(ds).num_skipped == 0 and load_report(ds).num_rows == 2
    with pytest.raises(ValueError, match="no load report"):
        load_report(ds.from_dict({"a": [1]}))


def test_empty_and_all_bad_files_are_clear_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(PromptDataError, match="no prompts to load"):
        load_prompt_dataset(str(empty))
    all_bad = write_jsonl(tmp_path / "bad.jsonl", [], ["nope", "{}"])
    with pytest.raises(PromptDataError, match="all 2 rows were malformed"):
        load_prompt_dataset(str(all_bad), on_error="skip")


def test_bad_arguments_and_paths(tmp_path):
    path = write_jsonl(tmp_path / "ok.jsonl", ROWS)
    with pytest.raises(ValueError, match="on_error must be one of"):
        load_prompt_dataset(str(path), on_error="ignore")
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_prompt_dataset(str(tmp_path / "missing.jsonl"))
    (tmp_path / "data.csv").write_text("question,answer\n")
    with pytest.raises(PromptDataError, match="unsupported file type '.csv'"):
        load_prompt_dataset(str(tmp_path / "data.csv"))


def test_non_utf8_line_is_reported_with_its_line(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes(json.dumps(ROWS[0]).encode() + b'\n{"question": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(PromptDataError, match=r"latin.jsonl:2: not UTF-8"):
        load_prompt_dataset(str(path))


def test_parquet_round_trip_keeps_every_row(tmp_path):
    ds = load_prompt_dataset(str(write_jsonl(tmp_path / "src.jsonl", ROWS)), system_prompt="S")
    out = write_parquet(ds, tmp_path / "out" / "train.parquet")
    assert out.is_file()
    back = load_prompt_dataset(str(out))
    assert back.to_list() == ds.to_list()
    # The folder loads by split too.
    assert load_prompt_dataset(str(tmp_path / "out"), split="train").to_list() == ds.to_list()


def test_parquet_question_rows_report_row_numbers(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"question": ["a?", "b?", ""], "answer": ["1", "2", "3"]})
    pq.write_table(table, tmp_path / "q.parquet")
    with pytest.raises(PromptDataError, match=r"q.parquet row 3: empty question"):
        load_prompt_dataset(str(tmp_path / "q.parquet"))
    assert len(load_prompt_dataset(str(tmp_path / "q.parquet"), on_error="skip")) == 2


def test_verl_style_rows_load_with_their_ground_truth(tmp_path):
    verl_row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "2+2?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"split": "train", "index": 0},
    }
    ds = load_prompt_dataset(str(write_jsonl(tmp_path / "verl.jsonl", [verl_row])))
    assert ds[0] == {
        "id": "0",
        "prompt": [{"role": "user", "content": "2+2?"}],
        "ground_truth": "4",
        "data_source": "openai/gsm8k",
        "extra_info": '{"index": 0, "split": "train"}',
    }
    assert decode_extra_info(ds[0]["extra_info"]) == {"split": "train", "index": 0}


def test_verl_parquet_extra_info_survives_loading_with_mixed_keys(tmp_path):
    import pandas as pd

    rows = [
        {
            "data_source": "toy",
            "prompt": [{"role": "user", "content": f"{a}+1?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + 1)},
            "extra_info": {"index": a, "a": a, "tags": ["x"] * a},
        }
        for a in range(3)
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    ds = load_prompt_dataset(str(tmp_path / "train.parquet"))
    assert [decode_extra_info(x) for x in ds["extra_info"]] == [
        {"index": 0, "a": 0, "tags": []},
        {"index": 1, "a": 1, "tags": ["x"]},
        {"index": 2, "a": 2, "tags": ["x", "x"]},
    ]
    assert ds["id"] == ["0", "1", "2"]  # verl's extra_info.index is the id


def test_question_rows_without_extra_info_get_their_question_and_other_columns(tmp_path):
    ds = load_prompt_dataset(str(write_jsonl(tmp_path / "q.jsonl", ROWS)))
    assert [decode_extra_info(x) for x in ds["extra_info"]] == [
        {"question": "What is 2 + 2?"},
        {"question": "What is 3 * 3?", "level": 1},
    ]


def test_an_extra_info_that_is_not_an_object_names_the_row(tmp_path):
    row = {"question": "1+1?", "answer": "2", "extra_info": [1, 2]}
    with pytest.raises(PromptDataError, match=r"bad.jsonl:1: extra_info must be a JSON object"):
        load_prompt_dataset(str(write_jsonl(tmp_path / "bad.jsonl", [row])))


def test_write_parquet_requires_the_schema(tmp_path):
    import datasets

    with pytest.raises(ValueError, match="lacks schema column"):
        write_parquet(datasets.Dataset.from_dict({"question": ["a"]}), tmp_path / "x.parquet")


# -- render_prompt ------------------------------------------------------------
class TemplateTokenizer:
    chat_template = "has one"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_render_prompt_uses_the_chat_template_when_present():
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert render_prompt(messages, TemplateTokenizer()) == "<system>S<user>Q<assistant>"
    # Asked not to, or without a template: plain "role: content" lines.
    plain = "system: S\nuser: Q\nassistant:"
    assert render_prompt(messages, TemplateTokenizer(), use_chat_template=False) == plain
    assert render_prompt(messages, None) == plain


def test_render_prompt_with_a_real_tokenizer_template():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, "[UNK]"))
    )
    tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    messages = [{"role": "user", "content": "2+2?"}]
    assert render_prompt(messages, tok) == "[user] 2+2?\n[assistant]"


@pytest.mark.parametrize(
    "messages,match",
    [
        ("just a string", "list of chat messages"),
        ([], "no messages"),
        ([{"content": "x"}], "string 'role'"),
        ([{"role": "user"}], "no string 'content'"),
    ],
)
def test_render_prompt_rejects_malformed_messages(messages, match):
    with pytest.raises(ValueError, match=match):
        render_prompt(messages, None)
