"""Every configuration field with a range or a fixed set of values is checked by
``ExperimentConfig.validate()``, before any work, naming the field, its value and what
is allowed.

The cases are generated from the dataclass fields and their rules, so a new field is
noticed: it needs a rule in its section (``checked(default, RULE)``, the field's
``rule`` metadata; ``rlkit/trainer/config/rules.py``) (or an implied
``bool`` / ``dict`` one), or a place in :data:`FREE_FORM` below with the reason.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gin
import pytest

from rlkit.trainer.config import (
    Choice,
    DataConfig,
    ExperimentConfig,
    ModelConfig,
    Number,
    OfType,
    Pair,
    ResumeMode,
    ServerCores,
    rules_for,
)

SECTIONS: dict[str, type] = {
    f.name: f.default_factory for f in dataclasses.fields(ExperimentConfig)
}  # attribute of ExperimentConfig -> section class

FREE_FORM: dict[str, set[str]] = {
    # Paths: checked where they are opened (check_model_dir, the dataset loaders, ...).
    # Names a registry resolves (ExperimentConfig.from_gin -> check_registered_names),
    # text, and values another checker owns are listed with them.
    "ModelConfig": {
        "path",  # non-empty checked by validate(); the directory by check_model_dir
        "gguf_file",
        "tokenizer_path",
        "chat_template",  # resolve_chat_template, in validate()
        "lora_target_modules",  # peft's module names or "all-linear"
        "critic_path",
    },
    "DataConfig": {
        "train_files",  # a path or a shared set name
        "val_files",
        "dataset_fn",  # a gin reference to a callable
        "question_key",  # column names of the user's data
        "answer_key",
        "instruction",  # prompt text
        "system_prompt",
        "reward",  # REWARDS registry, a module or a file path
        "custom_reward_path",  # with custom_reward_name, becomes reward (same checks)
        "custom_reward_name",
    },
    "RewardModelConfig": {"path", "tokenizer_path", "chat_template"},  # validate() checks them
    "PrimeConfig": {"model_path"},  # check_model_dir, in validate()
    "RolloutConfig": {"engine", "agent_loop"},  # ROLLOUT_ENGINES, AGENT_LOOPS registries
    "AlgorithmConfig": {  # ESTIMATORS, POLICY_LOSSES, AGGREGATIONS, KL_PENALTIES, ...
        "adv_estimator",
        "policy_loss",
        "loss_agg_mode",
        "kl_loss_type",
        "kl_penalty",
        "rollout_is_mode",  # ROLLOUT_CORRECTIONS (with aliases such as "icepop")
        "value_loss",
        "roles",  # ROLES registry names or file paths (check_registered_names)
    },
    "OptimConfig": set(),
    "TrainerConfig": {
        "output_dir",  # created by the run
        "platform",  # a registered platform name (plugins may add some)
    },
}


def bad_values(rule: Any) -> list[Any]:
    """Values ``rule`` must refuse: just outside each bound, the wrong type."""
    if isinstance(rule, Number):
        values: list[Any] = ["x", float("nan")]
        if not rule.optional:
            values.append(None)
        step = 1 if rule.integer else 0.5
        values += [rule.ge - step] if rule.ge is not None else []
        values += [rule.gt] if rule.gt is not None else []
        values += [rule.le + step] if rule.le is not None else []
        values += [rule.lt] if rule.lt is not None else []
        values += [1.5] if rule.integer else []
        return values
    if isinstance(rule, Choice):
        return ["not-a-choice", 3]
    if isinstance(rule, OfType):
        return ["yes", 1] if rule.kind is bool else [["a"], "a=1"]
    if isinstance(rule, Pair):
        return [(0.9,), ("a", "b"), (0.9, 1.0)]
    if isinstance(rule, ResumeMode):
        return ["latest", "no/such/checkpoint", None]
    if isinstance(rule, ServerCores):
        return ["fast", 0, -1, 1.5, True, None]
    raise AssertionError(f"no bad values for {rule!r}: extend bad_values")


def valid_config() -> ExperimentConfig:
    return ExperimentConfig(
        model=ModelConfig(path="some/model"), data=DataConfig(train_files="train.jsonl")
    )


CASES = [
    pytest.param(attr, name, value, id=f"{cls.__name__}.{name}={value!r}")
    for attr, cls in SECTIONS.items()
    for name, rule in rules_for(cls).items()
    for value in bad_values(rule)
]


def test_the_defaults_with_a_model_and_data_are_valid():
    valid_config().validate()


def test_every_field_has_a_rule_or_is_listed_as_free_form():
    assert set(FREE_FORM) == {cls.__name__ for cls in SECTIONS.values()}
    for cls in SECTIONS.values():
        names = {f.name for f in dataclasses.fields(cls)}
        ruled, free = set(rules_for(cls)), FREE_FORM[cls.__name__]
        assert not ruled & free, f"{cls.__name__}: both a rule and free-form: {ruled & free}"
        assert names == ruled | free, (
            f"{cls.__name__}: fields without a rule (give it one with checked(...), or list them "
            f"in FREE_FORM with the reason): {sorted(names - ruled - free)}; "
            f"unknown names: {sorted((ruled | free) - names)}"
        )


@pytest.mark.parametrize(("attr", "name", "value"), CASES)
def test_an_out_of_range_or_wrong_type_value_is_named_with_what_is_allowed(attr, name, value):
    cfg = valid_config()
    setattr(cfg, attr, dataclasses.replace(getattr(cfg, attr), **{name: value}))
    with pytest.raises(ValueError, match="invalid experiment configuration") as info:
        cfg.validate()
    section = type(getattr(cfg, attr)).__name__
    assert f"{section}.{name} must be " in str(info.value)
    assert f"got {value!r}" in str(info.value)


def test_every_problem_is_reported_at_once():
    cfg = valid_config()
    cfg.rollout = dataclasses.replace(cfg.rollout, max_response_length=0, temperature=0.0)
    cfg.optim = dataclasses.replace(cfg.optim, ppo_mini_batch_size=0, lr="1e-6x")
    cfg.trainer = dataclasses.replace(cfg.trainer, resume_mode="latest")
    with pytest.raises(ValueError) as info:
        cfg.validate()  # ppo_mini_batch_size = 0 is reported, not divided by
    text = str(info.value)
    assert "RolloutConfig.max_response_length must be >= 1, got 0" in text
    assert "RolloutConfig.temperature must be > 0, got 0.0" in text
    assert "OptimConfig.ppo_mini_batch_size must be >= 1, got 0" in text
    assert "OptimConfig.lr must be a finite number >= 0, got '1e-6x'" in text
    assert "TrainerConfig.resume_mode must be auto|disable|an existing checkpoint path" in text
    assert "multiple of" not in text  # the batch check waits for valid sizes


def test_resume_mode_takes_an_existing_checkpoint_path(tmp_path):
    cfg = valid_config()
    cfg.trainer.resume_mode = str(tmp_path)
    cfg.validate()


def test_the_batch_sizes_must_still_divide():
    cfg = valid_config()
    cfg.data.train_batch_size, cfg.optim.ppo_mini_batch_size = 8, 3
    with pytest.raises(ValueError, match=r"train_batch_size \(8\) must be a multiple of"):
        cfg.validate()


@pytest.mark.parametrize(
    ("timeout", "deadline", "ok"),
    [(10.0, 60.0, True), (10.0, 10.0, True), (10.0, 5.0, False), (10.0, None, True)],
)
def test_the_reward_deadline_must_hold_one_whole_call(timeout, deadline, ok):
    cfg = valid_config()
    cfg.data.reward_timeout_s, cfg.data.reward_deadline_s = timeout, deadline
    if ok:
        cfg.validate()
        return
    with pytest.raises(ValueError, match=r"reward_deadline_s \(5\) is shorter than one call's"):
        cfg.validate()


def test_from_gin_checks_the_fields_before_a_model_builder_runs(tmp_path):
    from rlkit.train import parse_config

    gin.clear_config()
    try:
        parse_config(
            [str(Path(__file__).resolve().parents[1] / "experiments" / "demo.gin")],
            [
                f"arithmetic_sft_model.output_dir = '{tmp_path}/m'",
                "RolloutConfig.max_response_length = -1",
                "ModelConfig.dtype = 'float8'",
            ],
        )
        with pytest.raises(ValueError) as info:
            ExperimentConfig.from_gin()
    finally:
        gin.clear_config()
    assert "RolloutConfig.max_response_length must be >= 1, got -1" in str(info.value)
    assert "ModelConfig.dtype must be float32|bfloat16|float16, got 'float8'" in str(info.value)
    assert not (tmp_path / "m").exists()  # the demo's warm-up model was not built


def test_one_step_off_with_the_embedded_engine_names_the_engines_that_can_run_ahead():
    cfg = valid_config()
    cfg.trainer = dataclasses.replace(cfg.trainer, rollout_mode="one_step_off")
    with pytest.raises(ValueError) as info:
        cfg.validate()  # the default engine, 'hf', samples from the trainer's own module
    text = str(info.value)
    assert "TrainerConfig.rollout_mode = 'one_step_off'" in text
    assert "RolloutConfig.engine = 'hf'" in text
    assert "(sglang, vllm)" in text and "rollout_mode = 'sync'" in text


def test_one_step_off_in_a_launch_of_several_processes_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = valid_config()
    cfg.rollout = dataclasses.replace(cfg.rollout, engine="sglang")
    cfg.data = dataclasses.replace(cfg.data, reward_workers=1)
    cfg.trainer = dataclasses.replace(cfg.trainer, rollout_mode="one_step_off")
    with pytest.raises(ValueError, match="runs in one process; this launch has WORLD_SIZE=2"):
        cfg.validate()
    monkeypatch.setenv("WORLD_SIZE", "1")
    cfg.validate()  # one process with a server engine is valid


def test_one_step_off_asks_for_reward_workers_since_its_rollout_thread_has_no_time_limits():
    cfg = valid_config()
    cfg.rollout = dataclasses.replace(cfg.rollout, engine="sglang")
    cfg.trainer = dataclasses.replace(cfg.trainer, rollout_mode="one_step_off")
    with pytest.raises(ValueError, match=r"set DataConfig.reward_workers >= 1"):
        cfg.validate()


def async_config(**trainer) -> ExperimentConfig:
    """A valid config for ``rollout_mode = 'async'`` but for ``trainer``'s settings."""
    cfg = valid_config()
    cfg.rollout = dataclasses.replace(cfg.rollout, engine="sglang")
    cfg.data = dataclasses.replace(cfg.data, reward_workers=1)
    cfg.trainer = dataclasses.replace(cfg.trainer, rollout_mode="async", **trainer)
    return cfg


def test_async_runs_two_steps_ahead_by_default_and_max_staleness_sets_how_far():
    from rlkit.trainer.config import async_depth

    def config(**trainer):
        cfg = async_config(**trainer)
        cfg.data = dataclasses.replace(cfg.data, train_batch_size=8)
        cfg.optim = dataclasses.replace(cfg.optim, ppo_mini_batch_size=4, ppo_epochs=1)
        cfg.validate()
        return cfg

    # u = ppo_epochs * ceil(train_batch_size / ppo_mini_batch_size) = 1 * ceil(8 / 4) = 2
    assert optimizer_steps(config()) == 2
    assert async_depth(config()) == (2, 4)  # None: two steps, 2 * u = 4 versions
    assert async_depth(config(max_staleness=7)) == (3, 7)  # 7 // 2 = 3 steps ahead
    assert async_depth(config(max_staleness=2)) == (1, 2)  # one step ahead, as one_step_off


def test_async_with_a_staleness_bound_below_one_step_names_the_bound_it_needs():
    cfg = async_config()
    cfg.optim = dataclasses.replace(cfg.optim, ppo_epochs=2)  # u = 2 * ceil(batch / mini)
    u = 2 * -(-cfg.data.train_batch_size // cfg.optim.ppo_mini_batch_size)
    cfg.trainer = dataclasses.replace(cfg.trainer, max_staleness=u - 1)
    with pytest.raises(ValueError) as info:
        cfg.validate()
    text = str(info.value)
    assert f"TrainerConfig.max_staleness = {u - 1} is below the {u} optimizer steps" in text
    assert f"set max_staleness >= {u} (one step ahead)" in text


def test_negative_staleness_and_unknown_partial_rollout_policies_are_refused():
    with pytest.raises(ValueError) as info:
        async_config(max_staleness=-1, partial_rollout="pause").validate()
    text = str(info.value)
    assert "TrainerConfig.max_staleness must be" in text and "got -1" in text
    assert "TrainerConfig.partial_rollout must be finish|continue, got 'pause'" in text


def test_async_refuses_dapo_refills_more_than_one_step_ahead_and_names_one_step_off():
    cfg = async_config()
    cfg.algorithm = dataclasses.replace(cfg.algorithm, filter_groups=True)
    with pytest.raises(ValueError, match=r"use rollout_mode = 'one_step_off'"):
        cfg.validate()
    u = optimizer_steps(cfg)
    cfg.trainer = dataclasses.replace(cfg.trainer, max_staleness=u)  # one step ahead
    cfg.validate()


def optimizer_steps(cfg: ExperimentConfig) -> int:
    from rlkit.trainer.config import optimizer_steps_per_step

    return optimizer_steps_per_step(cfg)


def test_continuing_generations_under_new_weights_needs_an_engine_that_can():
    from rlkit.registry import ROLLOUT_ENGINES

    cfg = async_config(partial_rollout="continue")
    cfg.validate()  # sglang pauses, syncs and continues its running requests

    @ROLLOUT_ENGINES.register("server_without_pause", holds_own_weights=True)
    def server_without_pause(**_):  # a server engine that can only sync when idle
        raise AssertionError("not built by validation")

    try:
        cfg.rollout = dataclasses.replace(cfg.rollout, engine="server_without_pause")
        with pytest.raises(ValueError) as info:
            cfg.validate()
    finally:
        ROLLOUT_ENGINES.unregister("server_without_pause")
    text = str(info.value)
    assert "partial_rollout = 'continue'" in text and "'server_without_pause'" in text
    assert "use sglang, or partial_rollout = 'finish'" in text


def test_continuing_partial_rollouts_outside_async_is_refused_rather_than_ignored():
    cfg = async_config(partial_rollout="continue")
    cfg.trainer = dataclasses.replace(cfg.trainer, rollout_mode="one_step_off")
    with pytest.raises(ValueError, match=r"applies to rollout_mode = 'async' \(in 'one_step_off'"):
        cfg.validate()
