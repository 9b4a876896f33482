"""One GRPO step per supported family, on policy, and the guard that watches for the
opposite: rollout and training log-probs that disagree.

``rollout/logprob_abs_diff_mean`` is the mean |training log-prob - rollout log-prob| over
the step's response tokens. At the first step both sides hold the same weights, so it is
float rounding only: at most ``2 gamma_D`` of the log-probs' magnitude (the suite's
numerics module), about 1e-3 for these models and responses; a sliding window or a
soft-cap dropped by one side costs 1e-2 to 5e-1 (``tests/test_model_families.py``).
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from rlkit.models.tiny import train_byte_tokenizer
from rlkit.models.tiny_families import FAMILIES, build_tiny_family
from rlkit.trainer.logprob_guard import BOUNDS, JUMP, METRIC, LogProbGuard, lowest_precision
from tests.distributed.test_trainer_two_processes import train_two_processes
from tests.experiment_factory import run_one_step, small_experiment
from tests.gin_files import arithmetic_gin
from tests.numerics import gamma, reduction_depth

PROMPT_TOKENS = 32  # the arithmetic prompts, rendered by the byte tokenizer's template


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, str]:
    tokenizer = train_byte_tokenizer()
    root = tmp_path_factory.mktemp("families")
    return {f: str(build_tiny_family(f, root / f, tokenizer)) for f in FAMILIES}


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_grpo_step_trains_each_family_on_policy(family_dirs, family, tmp_path):
    cfg = small_experiment(
        family_dirs[family],
        tmp_path / "run",
        data={"reward": _varied_reward(tmp_path), "max_prompt_length": PROMPT_TOKENS},
        rollout={"max_response_length": 12},  # prompt + 12 tokens: past every 4-token window
        trainer={"total_steps": 1},
    )
    run = run_one_step(cfg)
    depth = reduction_depth(run.model_config, rows=1, positions=PROMPT_TOKENS + 12)
    # Log-probs are about -log(vocab) = -5.6 for a random model.
    assert run.metrics[METRIC] <= 2 * gamma(depth) * 6.0
    assert run.metrics["actor/grad_norm"] > 0 and torch.isfinite(
        torch.tensor(run.metrics["actor/pg_loss"])
    )
    moved = [n for n in run.params if not torch.equal(run.params[n], run.initial[n])]
    assert moved, "the step changed no parameter"


def _varied_reward(tmp_path) -> str:
    """A reward file scoring the share of digits in a response: it differs between a
    random policy's responses, so every group has advantages and the step a gradient."""
    path = tmp_path / "digits.py"
    path.write_text(
        "def digits(response, ground_truth, **extra):\n"
        "    return sum(c.isdigit() for c in response) / max(len(response), 1)\n"
    )
    return f"{path}:digits"


@pytest.mark.slow
@pytest.mark.distributed
def test_a_windowed_soft_capped_family_trains_on_policy_on_two_processes(family_dirs, tmp_path):
    """Gemma2 (alternating sliding-window layers, attention and final-logit soft-capping)
    under FSDP2 over 2 processes: the shared-prefix passes and the decode loop agree."""
    out = tmp_path / "run"
    gin_text = arithmetic_gin(
        family_dirs["gemma2"],
        out,
        {
            "RolloutConfig.max_response_length": 12,
            "DataConfig.max_prompt_length": PROMPT_TOKENS,
            "OptimConfig.ppo_mini_batch_size": 2,
            "DataConfig.reward": _varied_reward(tmp_path),
            "TrainerConfig.total_steps": 1,
            "TrainerConfig.save_freq": 0,
            "TrainerConfig.save_at_end": False,
        },
    )
    proc = train_two_processes(gin_text, tmp_path)
    assert "processes=2" in proc.stdout + proc.stderr
    assert "soft-capping" in proc.stdout + proc.stderr  # the family's note, logged once
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 1 and record[METRIC] <= BOUNDS["float32"]
    assert METRIC not in proc.stderr  # the guard stayed quiet


def test_the_guard_warns_at_step_one_above_the_dtype_bound():
    guard = LogProbGuard("float32")
    with pytest.warns(UserWarning, match=r"logprob_abs_diff_mean = 0.098 at step 1.*float32"):
        assert guard.check(1, {METRIC: 0.098}) is not None


def test_the_guard_stays_quiet_within_the_bound_and_on_steady_values():
    guard = LogProbGuard("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert guard.check(1, {METRIC: 2e-7}) is None  # rounding: quiet
        assert guard.check(2, {METRIC: 3e-7}) is None
        assert guard.check(3, {"actor/pg_loss": 1.0}) is None  # no value this step


def test_the_guard_warns_again_only_when_the_value_jumps():
    guard = LogProbGuard("bfloat16")  # bound 5e-2
    with pytest.warns(UserWarning):
        guard.check(1, {METRIC: 0.06})  # step 1, above 5e-2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # 0.2 <= JUMP (4) x 0.06 = 0.24: a drift, not a jump.
        assert guard.check(2, {METRIC: 0.2}) is None
    with pytest.warns(UserWarning, match="at step 3"):
        # 0.9 > 4 x 0.2 = 0.8 and above the bound: a jump.
        assert JUMP * 0.2 < 0.9
        guard.check(3, {METRIC: 0.9})


def test_the_bound_follows_the_lowest_precision_in_use():
    assert lowest_precision(["float32", "no", None]) == "float32"
    assert lowest_precision(["float32", "bf16", "auto"]) == "bfloat16"
    assert lowest_precision(["float16", "float32"]) == "float16"
    assert LogProbGuard(lowest_precision(["float32", "bf16"])).bound == BOUNDS["bfloat16"]


def test_the_guard_is_off_when_rollout_log_probs_are_of_a_filtered_distribution():
    # Under top-p / top-k the engine's log-probs are of the renormalised filtered
    # distribution and the trainer's of the full one: they differ by design.
    guard = LogProbGuard("float32", filtered_sampling=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert guard.check(1, {METRIC: 0.3}) is None
