"""The dataset presets read from RLKIT_DATA_DIR: paths, row counts, rewards, errors.

The suite points RLKIT_DATA_DIR at its local copies (tests/conftest.py); the hub path
is tested in test_data_presets_hub.py."""

import shutil

import pytest

import rewards
from rlkit.data import (
    BOXED_INSTRUCTION,
    GSM8K_INSTRUCTION,
    SHARED_DATASETS,
    DataUnavailableError,
    PromptDataError,
    UnknownSharedDatasetError,
    load_prompt_dataset,
    load_shared_dataset,
    local_data_dir,
    shared_dataset_path,
)

EXPECTED_ROWS = [
    ("gsm8k", "train", 7473),
    ("gsm8k", "test", 1319),
    ("aime2024", "test", 30),
    ("aime2025", "test", 30),
    ("math500", "test", 500),
]


@pytest.mark.parametrize("name,split,num_rows", EXPECTED_ROWS)
def test_each_shared_set_loads_with_its_row_count_and_schema(name, split, num_rows):
    ds = load_shared_dataset(name, split)
    assert len(ds) == num_rows == SHARED_DATASETS[name].num_rows[split]
    assert ds.column_names == ["id", "prompt", "ground_truth", "data_source", "extra_info"]
    assert set(ds["data_source"]) == {name}
    assert len(set(ds["id"])) == num_rows  # ids are unique
    first = ds[0]["prompt"]
    assert first[-1]["role"] == "user"
    assert first[-1]["content"].endswith(SHARED_DATASETS[name].instruction)


def test_plain_load_of_a_shared_file_infers_the_data_source_from_its_folder():
    ds = load_prompt_dataset(str(shared_dataset_path("gsm8k", "test")))
    assert ds[0]["data_source"] == "gsm8k"
    assert ds[0]["id"] == "gsm8k-test-00000" and ds[0]["ground_truth"] == "18"


def test_presets_name_registered_rewards_and_instructions():
    assert {n: p.reward for n, p in SHARED_DATASETS.items()} == {
        "gsm8k": "gsm8k",
        "aime2024": "math",
        "aime2025": "math",
        "math500": "math",
        "dapo_math_17k": "math_dapo",
    }
    for preset in SHARED_DATASETS.values():
        assert preset.reward in rewards.names()
    assert SHARED_DATASETS["gsm8k"].instruction == GSM8K_INSTRUCTION
    assert SHARED_DATASETS["math500"].instruction == BOXED_INSTRUCTION


def test_the_local_folder_is_rlkit_data_dir():
    assert (local_data_dir() / "gsm8k" / "test.jsonl").is_file()
    assert shared_dataset_path("math500") == local_data_dir() / "math500" / "test.jsonl"


def test_unknown_names_and_splits_raise_clear_errors():
    with pytest.raises(UnknownSharedDatasetError, match="choose one of gsm8k, math500"):
        shared_dataset_path("gsm8k_v2")
    with pytest.raises(KeyError):  # the trainer catches KeyError to fall back to a path
        shared_dataset_path("/tmp/my.jsonl")
    with pytest.raises(ValueError, match="math500 has no split 'train'; it has test"):
        shared_dataset_path("math500", "train")


def test_rlkit_data_dir_names_the_folder_and_missing_files_say_how_to_fix(tmp_path, monkeypatch):
    copy = tmp_path / "data"
    (copy / "aime2024").mkdir(parents=True)
    shutil.copy(shared_dataset_path("aime2024"), copy / "aime2024" / "test.jsonl")
    monkeypatch.setenv("RLKIT_DATA_DIR", str(copy))
    assert local_data_dir() == copy
    assert len(load_shared_dataset("aime2024")) == 30
    # Set but without the file: no silent download, one message with the fix.
    with pytest.raises(DataUnavailableError, match="math500/test.jsonl.*rlkit data prepare"):
        load_shared_dataset("math500")
    assert issubclass(DataUnavailableError, PromptDataError)  # exit status 2 in the commands
    monkeypatch.setenv("RLKIT_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(DataUnavailableError, match="RLKIT_DATA_DIR"):
        local_data_dir()


def test_a_prepared_parquet_folder_serves_as_the_local_copy(tmp_path, monkeypatch):
    from rlkit.data.verl_format import prepare_dataset

    prepare_dataset("aime2025", tmp_path / "data" / "aime2025")
    monkeypatch.setenv("RLKIT_DATA_DIR", str(tmp_path / "data"))
    ds = load_shared_dataset("aime2025")
    assert len(ds) == 30 and ds[0]["id"] == "aime2025-I-1" and ds[0]["ground_truth"] == "70"
    assert ds[0]["prompt"][-1]["content"].endswith(BOXED_INSTRUCTION)  # not appended twice
    assert ds[0]["prompt"][-1]["content"].count(BOXED_INSTRUCTION) == 1


def test_no_parent_folder_is_searched_without_rlkit_data_dir(tmp_path, monkeypatch):
    (tmp_path / "shared" / "data" / "gsm8k").mkdir(parents=True)
    (tmp_path / "shared" / "data" / "gsm8k" / "test.jsonl").write_text(
        '{"question": "q", "answer": "1"}\n'
    )
    (tmp_path / "repo").mkdir()
    monkeypatch.delenv("RLKIT_DATA_DIR")
    monkeypatch.chdir(tmp_path / "repo")
    assert local_data_dir() is None
    with pytest.raises(DataUnavailableError, match="RLKIT_DATA_DIR is not set"):
        shared_dataset_path("gsm8k")
