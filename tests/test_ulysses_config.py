"""Ulysses settings that cannot be honoured stop at configuration time, naming the setting;
the head arithmetic of grouped-query models (no processes needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from transformers import Qwen2_5_VLConfig

from rlkit.modeling.ulysses import head_problems
from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer
from rlkit.trainer.config import DataConfig, ExperimentConfig, ModelConfig
from tests.gin_files import LENGTH_REWARD_RUN, arithmetic_gin

REPO = Path(__file__).resolve().parents[1]


def _problems(model_dir: Path, **model) -> str:
    cfg = ExperimentConfig(
        model=ModelConfig(path=str(model_dir), **model),
        data=DataConfig(train_files="train.jsonl", max_prompt_length=64),
    )
    with pytest.raises(ValueError) as caught:
        cfg.validate()
    return str(caught.value)


@pytest.fixture(scope="module")
def six_heads(tmp_path_factory) -> Path:
    """6 query heads over 3 key/value heads: split 3 ways, not 2 or 4."""
    out = tmp_path_factory.mktemp("six_heads")
    return build_tiny_qwen2(
        out, train_byte_tokenizer(), hidden_size=96, num_heads=6, num_kv_heads=3
    )


@pytest.mark.parametrize(
    ("heads", "kv", "k", "ok"),
    [
        (4, 2, 2, True),  # 2 query heads and 1 key/value head per process
        (4, 1, 2, True),  # the one key/value head is repeated: one copy per process
        (8, 2, 4, True),  # 2 key/value heads, each repeated twice
        (6, 3, 3, True),
        (6, 3, 2, False),  # 3 key/value heads: neither split 2 ways nor repeated to 2
        (4, 2, 3, False),  # 4 query heads do not split 3 ways
    ],
)
def test_heads_split_when_query_heads_divide_and_key_value_heads_divide_or_repeat(heads, kv, k, ok):
    config = type("Config", (), {"num_attention_heads": heads, "num_key_value_heads": kv})()
    assert (head_problems(config, k) == []) is ok


def test_a_size_that_splits_neither_the_heads_nor_the_kv_heads_names_the_setting(six_heads):
    text = _problems(six_heads, use_remove_padding=True, ulysses_sequence_parallel_size=2)
    assert "ulysses_sequence_parallel_size = 2: the model's 3 key/value heads" in text
    text = _problems(six_heads, use_remove_padding=True, ulysses_sequence_parallel_size=4)
    assert "= 4 does not divide the model's 6 attention heads" in text


def test_settings_ulysses_cannot_honour_are_named_with_their_fix(six_heads):
    text = _problems(
        six_heads, ulysses_sequence_parallel_size=3, kernel_overrides={"attention": "sdpa"}
    )
    assert "set ModelConfig.use_remove_padding = True" in text
    assert "sets attention = 'sdpa': remove that override" in text
    assert "heads" not in text  # 3 splits 6 query and 3 key/value heads


def test_a_vision_language_model_is_refused(tmp_path):
    Qwen2_5_VLConfig().save_pretrained(tmp_path)
    text = _problems(tmp_path, use_remove_padding=True, ulysses_sequence_parallel_size=2)
    assert "is a vision-language model" in text and "set it to 1" in text


def test_a_size_above_one_in_a_single_process_run_is_one_message(demo_model_dir, tmp_path):
    bindings = LENGTH_REWARD_RUN | {
        "ModelConfig.use_remove_padding": True,
        "ModelConfig.ulysses_sequence_parallel_size": 2,
    }
    cfg = tmp_path / "experiment.gin"
    cfg.write_text(arithmetic_gin(demo_model_dir, tmp_path / "run", bindings))
    proc = subprocess.run(
        [sys.executable, "-m", "rlkit.train", str(cfg)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "ulysses_sequence_parallel_size = 2 does not divide the 1 processes" in proc.stderr
    assert "Traceback" not in proc.stderr
