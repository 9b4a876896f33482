"""The presets' hub path, against local folders laid out like the hub repositories.

Nothing here reaches the network: ``RLKIT_HUB_MIRROR`` points the loader at a folder of
``<owner>/<name>/`` repositories written by the tests (a dataset card with the hub's
``configs`` and Parquet files at the hub's paths), which ``datasets.load_dataset``
reads as it reads a downloaded hub repository. What is not tested: that the public
repositories still have these layouts and columns (checked by hand when the presets
were written).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlkit.data import (
    GSM8K_INSTRUCTION,
    DataUnavailableError,
    decode_extra_info,
    load_prompt_dataset,
    load_shared_dataset,
)

GSM8K_CARD = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
- config_name: socratic
  data_files:
  - split: test
    path: socratic/test-*
---
"""

AIME2025_CARD = """---
configs:
- config_name: AIME2025-I
  data_files:
  - split: test
    path: aime2025-I.jsonl
- config_name: AIME2025-II
  data_files:
  - split: test
    path: aime2025-II.jsonl
---
"""


# The suite's local copies (tests/conftest.py sets RLKIT_DATA_DIR), read before a test unsets it.
LOCAL_DATA = Path(os.environ["RLKIT_DATA_DIR"])


def _local_rows(name: str, split: str, n: int) -> list[dict]:
    lines = (LOCAL_DATA / name / f"{split}.jsonl").read_text().splitlines()[:n]
    return [json.loads(line) for line in lines]


def _parquet(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.fixture
def hub_mirror(tmp_path, monkeypatch) -> Path:
    """A mirror of openai/gsm8k (3 raw rows per split) and opencompass/AIME2025, used
    instead of the hub; RLKIT_DATA_DIR unset; a private datasets cache."""
    mirror = tmp_path / "mirror"
    gsm8k = mirror / "openai" / "gsm8k"
    for split in ("train", "test"):
        # The hub's answer column is the full solution, ending in "#### N".
        raw = [
            {"question": r["question"], "answer": r["solution"]}
            for r in _local_rows("gsm8k", split, 3)
        ]
        _parquet(gsm8k / "main" / f"{split}-00000-of-00001.parquet", raw)
    _parquet(gsm8k / "socratic" / "test-00000-of-00001.parquet", [{"question": "x", "answer": "y"}])
    (gsm8k / "README.md").write_text(GSM8K_CARD)
    aime = mirror / "opencompass" / "AIME2025"
    aime.mkdir(parents=True)
    rows = _local_rows("aime2025", "test", 30)
    for part, chunk in (("I", rows[:15]), ("II", rows[15:])):
        with (aime / f"aime2025-{part}.jsonl").open("w") as f:
            for r in chunk:
                f.write(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n")
    (aime / "README.md").write_text(AIME2025_CARD)
    monkeypatch.setenv("RLKIT_HUB_MIRROR", str(mirror))
    monkeypatch.delenv("RLKIT_DATA_DIR", raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    return mirror


def test_gsm8k_from_the_hub_layout_normalises_the_raw_answers(hub_mirror):
    ds = load_shared_dataset("gsm8k", "test")
    local = _local_rows("gsm8k", "test", 3)
    assert len(ds) == 3
    assert ds["id"] == [r["id"] for r in local]  # the same ids as the local copy
    assert ds["ground_truth"] == [r["answer"] for r in local] == ["18", "3", "70000"]
    assert ds[0]["data_source"] == "gsm8k"
    assert ds[0]["prompt"][-1]["content"].endswith(GSM8K_INSTRUCTION)
    assert decode_extra_info(ds[0]["extra_info"])["solution"].endswith("#### 18")
    assert load_shared_dataset("gsm8k", "train")["id"][0] == "gsm8k-train-00000"


def test_a_preset_made_of_two_hub_configs_is_concatenated(hub_mirror):
    ds = load_shared_dataset("aime2025")
    local = _local_rows("aime2025", "test", 30)
    assert ds["id"] == [r["id"] for r in local]  # aime2025-I-1 ... aime2025-II-15
    assert ds["ground_truth"] == [r["answer"] for r in local]


def test_a_missing_hub_dataset_is_one_message_naming_the_id_and_rlkit_data_dir(hub_mirror):
    with pytest.raises(DataUnavailableError) as info:
        load_shared_dataset("math500")
    message = str(info.value)
    assert "HuggingFaceH4/MATH-500" in message and "RLKIT_DATA_DIR=/path/to/data" in message
    assert "rlkit data prepare math500" in message


def test_a_hub_layout_folder_as_val_source_reads_its_test_split(hub_mirror, tmp_path):
    # A downloaded repository with train/test and no config name needed.
    repo = tmp_path / "snapshot"
    _parquet(repo / "data" / "train-00000-of-00001.parquet", [{"question": "t", "answer": "1"}])
    _parquet(repo / "data" / "test-00000-of-00001.parquet", [{"question": "v", "answer": "2"}])
    assert load_prompt_dataset(str(repo), split="train")["ground_truth"] == ["1"]
    assert load_prompt_dataset(str(repo), split="validation")["ground_truth"] == ["2"]


def test_rlkit_eval_offline_without_a_cache_exits_2_with_one_message(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RLKIT_DATA_DIR"}
    env |= {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    (tmp_path / "model").mkdir()  # a model directory (its config is read, its weights never)
    (tmp_path / "model" / "config.json").write_text('{"model_type": "qwen2"}')
    done = subprocess.run(
        [sys.executable, "-m", "rlkit.cli", "eval", str(tmp_path / "model"), "--dataset", "gsm8k"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "openai/gsm8k" in done.stderr and "RLKIT_DATA_DIR=/path/to/data" in done.stderr
