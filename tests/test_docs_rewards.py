"""docs/rewards.md's "Rewards from your own code" examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import gin
import pytest

import rewards
from rewards.context import RewardContext

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "rewards.md").read_text()
SECTION = DOC[DOC.index("## Rewards from your own code") : DOC.index("## Scoring a batch")]


def _block(lang: str, starts_with: str) -> str:
    for block in re.findall(rf"```{lang}\n(.*?)```", SECTION, flags=re.S):
        if block.lstrip().startswith(starts_with):
            return block
    raise AssertionError(f"no ```{lang} block starting with {starts_with!r} in the section")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    gin.clear_config()
    yield tmp_path
    gin.clear_config()


def _data_config_from(gin_text: str, folder: Path):
    from rlkit.train import parse_config
    from rlkit.trainer.config import (
        AlgorithmConfig,
        DataConfig,
        RolloutConfig,
        check_registered_names,
    )

    (folder / "experiment.gin").write_text(gin_text)
    parse_config([str(folder / "experiment.gin")], [])
    data = DataConfig()
    check_registered_names(AlgorithmConfig(), data, RolloutConfig())  # raises if unresolved
    return data


def test_the_file_reward_example_is_named_from_gin_and_scores(in_tmp):
    (in_tmp / "my_reward.py").write_text(_block("python", "# my_reward.py"))
    data = _data_config_from(_block("gin", "# my_experiment.gin"), in_tmp)
    context = RewardContext(response="so 18", ground_truth="18", extra_info={"bonus": 0.5})
    out = rewards.score_batch(data.reward, ["so 18"], ["18"], contexts=[context])
    # Ends with "18": 1.0, plus the bonus 0.5.
    assert out.scores == [1.5] and out.infos == [{"correct": 1.0}]


def test_the_batched_judge_example_scores_the_batch_in_one_call(in_tmp):
    (in_tmp / "my_judge.py").write_text(_block("python", "# my_judge.py"))
    data = _data_config_from(_block("gin", 'DataConfig.reward = "my_judge.py:judge"'), in_tmp)
    responses = ["short", "a much longer response"]
    extras = [dict(data.reward_options) for _ in responses]
    out = rewards.score_batch(data.reward, responses, ["", ""], extras)
    # Lengths 5 and 22 against the threshold 10: 0.0 and 1.0.
    assert out.scores == [0.0, 1.0]
    assert [i["length"] for i in out.infos] == [5.0, 22.0]


def test_the_weighted_example_prints_what_the_page_shows(in_tmp, capsys):
    (in_tmp / "fmt.py").write_text(_block("python", "# fmt.py"))
    data = _data_config_from(_block("gin", 'DataConfig.reward = "weighted"'), in_tmp)
    assert [t["reward"] for t in data.reward_options["terms"]] == ["gsm8k", "fmt.py:fmt"]
    exec(compile(_block("python", "import rewards"), "rewards.md", "exec"), {})  # noqa: S102
    expected = _block("text", "{'score'").strip()
    assert capsys.readouterr().out.strip() == expected
