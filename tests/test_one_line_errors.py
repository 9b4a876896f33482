"""User mistakes answered with one message and exit status 2, not a traceback: a gin typo
(with the closest field), a changed configuration in a used run folder (after the data
files are checked), an evaluation of a Parquet file without a reward."""

from __future__ import annotations

import gin
import pytest

from rlkit.evaluation.harness import main as eval_main
from rlkit.train import main as train_main
from tests.gin_files import arithmetic_gin

RUN = {
    "TrainerConfig.total_steps": 1,
    "TrainerConfig.val_before_train": False,
    "TrainerConfig.save_freq": 1,
    "OptimConfig.ppo_mini_batch_size": 4,
    "DataConfig.max_prompt_length": 64,
    "DataConfig.val_limit": None,
}


def _config(tmp_path, model, bindings, name="run.gin"):
    path = tmp_path / name
    path.write_text(arithmetic_gin(model, tmp_path / "out", bindings))
    return str(path)


def test_a_gin_typo_names_the_closest_field(tmp_path, capsys):
    config = _config(tmp_path, tmp_path / "m", {})
    assert train_main([config, "--gin_param", "DataConfig.rewrd = 'math'"]) == 2
    err = capsys.readouterr().err
    assert "Did you mean DataConfig.reward?" in err and "Traceback" not in err
    assert train_main([config, "--gin_param", "DataConfg.reward = 'math'"]) == 2
    assert "Did you mean DataConfig?" in capsys.readouterr().err


def test_a_changed_configuration_in_a_used_run_folder(tmp_path, tiny_model_dir, capfd):
    assert train_main([_config(tmp_path, tiny_model_dir, RUN)]) == 0
    capfd.readouterr()
    changed = RUN | {"RolloutConfig.temperature": 0.5}
    assert train_main([_config(tmp_path, tiny_model_dir, changed, "changed.gin")]) == 2
    err = capfd.readouterr().err
    assert "RolloutConfig.temperature: 1.0 -> 0.5" in err and "Traceback" not in err
    assert "resume_mode='disable'" in err and "another TrainerConfig.output_dir" in err
    # A missing data file is reported as such, not as a changed configuration.
    missing = changed | {"DataConfig.dataset_fn": None, "DataConfig.train_files": "nope.jsonl"}
    assert train_main([_config(tmp_path, tiny_model_dir, missing, "missing.gin")]) == 2
    err = capfd.readouterr().err
    assert "data file nope.jsonl does not exist" in err and "differs" not in err


def test_eval_of_a_parquet_file_without_a_reward_exits_2(tmp_path, tiny_model_dir, capsys):
    import pandas as pd

    path = tmp_path / "problems.parquet"
    pd.DataFrame({"question": ["1+1="], "answer": ["2"]}).to_parquet(path)
    assert eval_main([str(tiny_model_dir), "--dataset", str(path)]) == 2
    assert "name its reward with --reward" in capsys.readouterr().err


def test_an_unknown_engine_option_stops_before_the_model_loads(tmp_path, capsys):
    bindings = {"RolloutConfig.engine_options": {"generation_batch_sise": 8}}
    # The model folder does not exist: the option is reported before anything loads.
    assert train_main([_config(tmp_path, tmp_path / "no_model", bindings)]) == 2
    err = capsys.readouterr().err
    assert "unknown option(s) ['generation_batch_sise']" in err
    assert "did you mean generation_batch_size?" in err and "Traceback" not in err


def test_an_unknown_sglang_engine_option_stops_before_the_model_loads(tmp_path, capsys):
    bindings = {
        "RolloutConfig.engine": "sglang",
        "RolloutConfig.engine_options": {"device": "cpu", "max_concurency": 8},
    }
    # SGLang's factory forwards options to its engine: those are checked too, up front.
    assert train_main([_config(tmp_path, tmp_path / "no_model", bindings)]) == 2
    err = capsys.readouterr().err
    assert "unknown option(s) ['max_concurency']" in err
    assert "did you mean max_concurrency?" in err and "Traceback" not in err


def test_an_in_process_run_leaves_no_gin_binding_behind(tmp_path):
    # A configuration built later in this process (a notebook's, a sweep's) takes the
    # dataclasses' defaults, not the bindings of the run that came before it.
    from rlkit.trainer.config import DataConfig

    bindings = {"DataConfig.max_prompt_length": 7, "RolloutConfig.engine_options": "fast"}
    assert train_main([_config(tmp_path, tmp_path / "no_model", bindings)]) == 2
    with pytest.raises(ValueError, match="no bound parameters"):
        gin.query_parameter("DataConfig.max_prompt_length")
    assert DataConfig().max_prompt_length != 7


def test_a_missing_gin_include_is_one_message(tmp_path, capsys):
    config = tmp_path / "run.gin"
    config.write_text("include 'missing_preset.gin'\n")
    assert train_main([str(config)]) == 2
    err = capsys.readouterr().err
    assert "Unable to open file: missing_preset.gin" in err and "Traceback" not in err


def test_engine_options_given_as_a_string_are_one_message(tmp_path, capsys):
    bindings = {"RolloutConfig.engine_options": "fast"}
    assert train_main([_config(tmp_path, tmp_path / "no_model", bindings)]) == 2
    err = capsys.readouterr().err
    assert "engine_options must be a dict" in err and "got 'fast'" in err
    assert "['a', 'f', 's', 't']" not in err and "Traceback" not in err


def test_one_response_per_prompt_under_grpo_stops_before_the_model_loads(tmp_path, capsys):
    bindings = {"RolloutConfig.n": 1, "OptimConfig.ppo_mini_batch_size": 4}
    assert train_main([_config(tmp_path, tmp_path / "no_model", bindings)]) == 2
    err = capsys.readouterr().err
    assert "RolloutConfig.n = 1 with AlgorithmConfig.adv_estimator = 'grpo'" in err
    assert "advantage 0" in err and "reinforce_plus_plus" in err  # one that needs no group


def test_epochs_over_a_batch_larger_than_the_data_are_one_message(tmp_path, tiny_model_dir, capsys):
    # 32 prompts, 64 per step: one epoch would be no step at all (it trained nothing and
    # exited 0); a training set smaller than one batch is refused before any step.
    bindings = RUN | {"TrainerConfig.total_epochs": 1, "DataConfig.train_batch_size": 64}
    del bindings["TrainerConfig.total_steps"]
    assert train_main([_config(tmp_path, tiny_model_dir, bindings)]) == 2
    err = capsys.readouterr().err
    assert "has 32 prompts, fewer than DataConfig.train_batch_size = 64" in err
    assert "Traceback" not in err


def test_zero_steps_on_a_new_folder_says_so(tmp_path, tiny_model_dir, capsys):
    bindings = RUN | {"TrainerConfig.total_steps": 0}
    assert train_main([_config(tmp_path, tiny_model_dir, bindings)]) == 0
    out = capsys.readouterr().out
    assert "TrainerConfig.total_steps = 0: nothing to train" in out
    assert "already holds a run" not in out


def test_resume_disabled_on_a_used_folder_is_one_message(tmp_path, tiny_model_dir, capfd):
    assert train_main([_config(tmp_path, tiny_model_dir, RUN)]) == 0
    capfd.readouterr()
    again = RUN | {"TrainerConfig.resume_mode": "disable"}
    assert train_main([_config(tmp_path, tiny_model_dir, again, "again.gin")]) == 2
    err = capfd.readouterr().err
    assert "already holds a run" in err and "overwrite=True" in err
    assert "Traceback" not in err


def test_a_binary_file_given_to_from_verl_is_one_message(tmp_path, capsys):
    from rlkit.from_verl import main as from_verl_main

    script = tmp_path / "run.sh"
    script.write_bytes(bytes(range(128, 256)))
    assert from_verl_main([str(script)]) == 2
    err = capsys.readouterr().err
    assert "is not a text file" in err and "Traceback" not in err


def test_data_prepare_out_naming_a_file_is_one_message(tmp_path, capsys):
    from rlkit.data_cli import main as data_main

    target = tmp_path / "train.parquet"
    target.write_text("")
    assert data_main(["prepare", "gsm8k", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert "is a file; name a folder" in err and "Traceback" not in err


def test_lengths_past_the_models_positions_stop_before_it_loads(tmp_path, tiny_model_dir, capsys):
    # the tiny model has 512 positions: 64 + 10**9 tokens would allocate for a billion
    bindings = RUN | {"RolloutConfig.max_response_length": 10**9}
    assert train_main([_config(tmp_path, tiny_model_dir, bindings)]) == 2
    err = capsys.readouterr().err
    assert "= 1000000064 tokens, past the 512 positions" in err and "Traceback" not in err


def test_a_training_set_smaller_than_one_batch_is_one_message(tmp_path, tiny_model_dir, capsys):
    bindings = RUN | {"arithmetic_dataset.limit": 3}  # 3 prompts, 4 per batch
    assert train_main([_config(tmp_path, tiny_model_dir, bindings)]) == 2
    err = capsys.readouterr().err
    assert "has 3 prompts, fewer than DataConfig.train_batch_size = 4" in err
    assert "Traceback" not in err


def test_a_bracket_left_open_in_a_gin_file_is_one_message(tmp_path, capsys):
    config = tmp_path / "run.gin"
    config.write_text("ModelConfig.path = (\n")
    assert train_main([str(config)]) == 2
    err = capsys.readouterr().err
    assert "bad gin configuration" in err and "EOF in multi-line statement" in err
    assert "Traceback" not in err


def test_a_verl_override_as_a_gin_param_names_rlkits_setting_and_from_verl(tmp_path, capsys):
    config = _config(tmp_path, tmp_path / "m", {})
    assert train_main([config, "--gin_param", "actor_rollout_ref.actor.optim.lr=1e-6"]) == 2
    err = capsys.readouterr().err
    assert "is a verl override, not a gin binding" in err and "Traceback" not in err
    assert "--gin_param 'OptimConfig.lr = 1e-6'" in err and "rlkit from-verl" in err


def _jsonl_rows(path, count):
    import json

    rows = [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path.name


def test_data_files_written_as_a_hydra_list_string_are_read_as_that_list(
    tmp_path, tiny_model_dir, monkeypatch
):
    from rlkit.trainer.config import ExperimentConfig
    from rlkit.trainer.run_dir import check_data_files
    from rlkit.trainer.trainer import RLTrainer
    from tests.experiment_factory import small_experiment

    monkeypatch.chdir(tmp_path)
    a, b = _jsonl_rows(tmp_path / "a.jsonl", 4), _jsonl_rows(tmp_path / "b.jsonl", 2)
    for written in (f"['{a}', '{b}']", f"[{a},{b}]"):
        cfg: ExperimentConfig = small_experiment(
            tiny_model_dir,
            tmp_path / "out",
            data={
                "dataset_fn": None,
                "train_files": written,
                "max_prompt_length": 64,
                "reward": "exact_match",
            },
        )
        check_data_files(cfg.data)
        trainer = RLTrainer(cfg)
        trainer.setup()
        try:  # both files, in order: 4 + 2 prompts
            assert trainer.train_prompts.ground_truths == ["1", "2", "3", "4", "1", "2"]
        finally:
            trainer.cleanup()
    missing = small_experiment(
        tiny_model_dir,
        tmp_path / "out",
        data={"dataset_fn": None, "train_files": f"['{a}', 'nope.jsonl']"},
    )
    with pytest.raises(FileNotFoundError, match="data file nope.jsonl does not exist"):
        check_data_files(missing.data)


def test_a_kernel_cache_capacity_that_would_crash_bf16_stops_before_the_model_loads(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    # ideep's cache at 0 entries makes the first bf16 product a segmentation fault.
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "0")
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")  # restored after the test
    bf16 = RUN | {"TrainerConfig.mixed_precision": "bf16"}
    config = _config(tmp_path, tiny_model_dir, bf16)
    assert train_main([config]) == 2
    err = capsys.readouterr().err
    assert "LRU_CACHE_CAPACITY='0' in the environment" in err and "Traceback" not in err
