"""A reward in a file of the user's own, named "path/to/file.py:function", works wherever
a reward is named, and every way the path can be wrong stops with one clear message."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rewards
from rlkit.registry import ESTIMATORS, REWARDS, UnknownNameError, file_module_name
from rlkit.rollout.trajectory import Trajectory
from rlkit.trainer.config import AlgorithmConfig, DataConfig, RolloutConfig, check_registered_names
from rlkit.trainer.prompts import PromptSet
from rlkit.trainer.scoring import score_rollout
from tests.experiment_factory import small_experiment

ROOT = Path(__file__).resolve().parents[1]

MY_REWARD = '''
import math

SCALE = 0.5


def score(response, ground_truth, *, extra_info, **extra):
    """1 for the exact answer, plus the row's bonus."""
    return {"score": float(response.strip() == ground_truth) + extra_info["bonus"], "seen": 1.0}


def helper():
    return None


def _private():
    return None
'''


class CharTokenizer:
    """Decodes each id as the character with that code point (no model needed)."""

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(chr(i) for i in row) for row in ids]


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def _row(text: str, prompt_index: int) -> Trajectory:
    ids = [ord(c) for c in text]
    return Trajectory([1], ids, [1] * len(ids), [0.0] * len(ids), [0] * len(ids), prompt_index)


def _prompts(ground_truths: list[str], bonuses: list[float]) -> PromptSet:
    n = len(ground_truths)
    return PromptSet(
        token_ids=[[1]] * n,
        ground_truths=ground_truths,
        data_sources=["toy"] * n,
        messages=[[{"role": "user", "content": "q"}]] * n,
        texts=["q"] * n,
        extra_infos=[{"bonus": b} for b in bonuses],
    )


def test_rewards_get_imports_the_function_from_an_absolute_path(tmp_path):
    path = _write(tmp_path / "user", "my_reward.py", MY_REWARD)
    fn = rewards.get(f"{path}:score")
    # Exact answer "5" = "5": 1.0, plus the bonus 0.25 -> 1.25.
    assert fn(" 5", "5", extra_info={"bonus": 0.25}) == {"score": 1.25, "seen": 1.0}
    assert fn.__module__ == file_module_name(str(path))


def test_relative_and_home_paths_name_the_same_module_so_importing_twice_is_one_import(
    tmp_path, monkeypatch
):
    path = _write(tmp_path / "user", "my_reward.py", MY_REWARD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    by_abs = REWARDS.get(f"{path}:score")
    by_rel = REWARDS.get("user/my_reward.py:score")
    by_home = REWARDS.get("~/user/my_reward.py:score")
    assert by_abs is by_rel is by_home
    assert sys.modules[by_abs.__module__].SCALE == 0.5


def test_a_file_function_pickles_into_a_fresh_process(tmp_path):
    path = _write(tmp_path / "user", "my_reward.py", MY_REWARD)
    fn = REWARDS.get(f"{path}:score")
    assert pickle.loads(pickle.dumps(fn)) is fn  # same process: the same function
    code = (
        "import pickle, sys\n"
        "import rlkit.registry\n"
        "fn = pickle.loads(sys.stdin.buffer.read())\n"
        "print(fn('x', 'x', extra_info={'bonus': 0.5})['score'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=pickle.dumps(fn),
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().strip() == "1.5"  # exact (1.0) + bonus 0.5


def test_a_file_function_scores_in_worker_processes(tmp_path):
    path = _write(tmp_path / "user", "my_reward.py", MY_REWARD)
    fn = REWARDS.get(f"{path}:score")
    extras = [{"extra_info": {"bonus": 0.0}}, {"extra_info": {"bonus": 1.0}}]
    out = rewards.score_batch(fn, ["a", "b"], ["a", "c"], extras, num_workers=1)
    rewards.batch_scoring.close_pools()
    assert out.num_errors == 0, out.infos
    assert out.scores == [1.0, 1.0]  # exact 1 + 0; not exact 0 + 1


def test_other_registries_take_file_paths_too(tmp_path):
    path = _write(
        tmp_path / "user", "my_estimator.py", "def est(rewards, mask, **kw):\n    return 7\n"
    )
    assert ESTIMATORS.get(f"{path}:est")(None, None) == 7


def test_the_trainer_scoring_uses_a_reward_from_a_file(tmp_path, monkeypatch):
    _write(tmp_path / "user", "my_reward.py", MY_REWARD)
    monkeypatch.chdir(tmp_path)
    cfg = small_experiment(tmp_path, tmp_path, data={"reward": "user/my_reward.py:score"})
    prompts = _prompts(["5", "7"], bonuses=[0.25, 2.0])
    rows = [_row("5", 0), _row("6", 0), _row("7", 1)]
    scored = score_rollout(rows, prompts, CharTokenizer(), cfg, groups=[0, 0, 1])
    # "5" vs "5": 1 + 0.25; "6" vs "5": 0 + 0.25; "7" vs "7": 1 + 2.0.
    assert scored.scores == [1.25, 0.25, 3.0]
    assert scored.metrics["reward/num_errors"] == 0
    assert scored.metrics["reward/seen/mean"] == 1.0  # the extra field's mean: (1+1+1)/3


def test_combined_takes_a_file_reward_as_its_base(tmp_path):
    path = _write(
        tmp_path / "user",
        "exact.py",
        "def exact(response, ground_truth, **kw):\n    return float(response == ground_truth)\n",
    )
    reward = rewards.compose(
        f"{path}:exact", shaping=[("length_penalty", {"max_response_length": 4})]
    )
    # exact 1.0, length penalty -min(2/4, 1) = -0.5 -> 0.5.
    assert reward("ab", "ab", response_length=2)["score"] == 0.5


def _check(reward: str, options: dict | None = None) -> None:
    check_registered_names(
        AlgorithmConfig(), DataConfig(reward=reward, reward_options=options or {}), RolloutConfig()
    )


def test_a_missing_file_names_the_resolved_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnknownNameError) as info:
        _check("rewards_dir/nope.py:score")
    msg = str(info.value)
    assert f"{tmp_path / 'rewards_dir' / 'nope.py'} does not exist" in msg
    assert f"relative paths are read from the working directory {tmp_path}" in msg


def test_a_missing_function_lists_the_public_callables_the_file_defines(tmp_path):
    path = _write(tmp_path / "user", "my_reward.py", MY_REWARD)
    with pytest.raises(UnknownNameError) as info:
        _check(f"{path}:scor")
    msg = str(info.value)
    assert f"file {path} has no attribute 'scor'" in msg
    assert "Did you mean 'score'?" in msg
    # Defined there and public: helper, score (not _private, not the imported math).
    assert msg.endswith("Public callables defined there: helper, score")


def test_an_attribute_that_is_not_callable_is_refused(tmp_path):
    path = _write(tmp_path / "user", "my_reward.py", MY_REWARD)
    with pytest.raises(
        UnknownNameError, match=r"'SCALE' in reward function file .* is not callable \(type float\)"
    ):
        _check(f"{path}:SCALE")


def test_a_file_that_raises_on_import_names_the_file_and_the_exception(tmp_path):
    path = _write(tmp_path / "user", "broken.py", "x = 1 / 0\n")
    with pytest.raises(UnknownNameError) as info:
        _check(f"{path}:score")
    assert f"importing reward function file {path}" in str(info.value)
    assert "raised ZeroDivisionError: division by zero" in str(info.value)
    assert file_module_name(str(path)) not in sys.modules  # a fixed file imports afresh


def test_a_file_path_without_a_function_says_how_to_name_one(tmp_path):
    path = _write(tmp_path / "user", "my_reward.py", MY_REWARD)
    with pytest.raises(UnknownNameError, match="name the function in the file"):
        _check(str(path))
    with pytest.raises(UnknownNameError, match="expected 'path/to/file.py:function'"):
        _check(f"{path}:")


def test_the_config_check_follows_the_names_inside_combined_and_weighted(tmp_path):
    missing = tmp_path / "missing.py"
    with pytest.raises(UnknownNameError, match="does not exist"):
        _check("combined", {"base": f"{missing}:score"})
    with pytest.raises(UnknownNameError, match="does not exist"):
        _check("weighted", {"terms": [{"reward": "gsm8k"}, {"reward": f"{missing}:fmt"}]})
    with pytest.raises(UnknownNameError, match="does not exist"):
        _check("final_turn", {"base": f"{missing}:score"})
