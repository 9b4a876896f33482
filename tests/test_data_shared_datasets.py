"""The shared data presets: paths, row counts, rewards, the RLKIT_SHARED_DATA override."""

import shutil

import pytest

import rewards
from rlkit.data import (
    BOXED_INSTRUCTION,
    GSM8K_INSTRUCTION,
    SHARED_DATASETS,
    UnknownSharedDatasetError,
    load_prompt_dataset,
    load_shared_dataset,
    shared_data_dir,
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
    }
    for preset in SHARED_DATASETS.values():
        assert preset.reward in rewards.names()
    assert SHARED_DATASETS["gsm8k"].instruction == GSM8K_INSTRUCTION
    assert SHARED_DATASETS["math500"].instruction == BOXED_INSTRUCTION


def test_shared_dir_is_found_next_to_the_repository():
    assert (shared_data_dir() / "gsm8k" / "test.jsonl").is_file()
    assert shared_dataset_path("math500") == shared_data_dir() / "math500" / "test.jsonl"


def test_unknown_names_and_splits_raise_clear_errors():
    with pytest.raises(UnknownSharedDatasetError, match="choose one of gsm8k, aime2024"):
        shared_dataset_path("gsm8k_v2")
    with pytest.raises(KeyError):  # the trainer catches KeyError to fall back to a path
        shared_dataset_path("/tmp/my.jsonl")
    with pytest.raises(ValueError, match="math500 has no split 'train'; it has test"):
        shared_dataset_path("math500", "train")


def test_env_var_overrides_the_folder(tmp_path, monkeypatch):
    copy = tmp_path / "data"
    (copy / "aime2024").mkdir(parents=True)
    shutil.copy(shared_dataset_path("aime2024"), copy / "aime2024" / "test.jsonl")
    monkeypatch.setenv("RLKIT_SHARED_DATA", str(copy))
    assert shared_data_dir() == copy
    assert len(load_shared_dataset("aime2024")) == 30
    with pytest.raises(FileNotFoundError, match="math500/test.jsonl is missing"):
        shared_dataset_path("math500")
    monkeypatch.setenv("RLKIT_SHARED_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="RLKIT_SHARED_DATA"):
        shared_data_dir()


def test_folder_is_found_from_the_working_directory_when_not_next_to_the_package(
    tmp_path, monkeypatch
):
    import rlkit.data.shared_datasets as shared

    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "repo" / "sub").mkdir(parents=True)
    monkeypatch.delenv("RLKIT_SHARED_DATA", raising=False)
    monkeypatch.setattr(shared, "_REPO_ROOT", tmp_path / "installed" / "site")
    monkeypatch.chdir(tmp_path / "repo" / "sub")
    # From repo/sub: sub/../shared/data no, sub/shared/data no, repo/../shared/data yes.
    assert shared_data_dir() == tmp_path / "shared" / "data"
