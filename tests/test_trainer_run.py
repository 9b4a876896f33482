"""End-to-end trainer runs on a tiny model: outputs, resume, faults, bad input."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest
import torch

from rlkit.logging import read_metrics
from rlkit.trainer.checkpoint import verify_checkpoint
from rlkit.trainer.trainer import RLTrainer
from tests.experiment_factory import (
    LENGTH_REWARD,
    StepRun,
    assert_same_adam_update,
    assert_same_gradients,
    run_one_step,
    small_experiment,
)

VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/")


def _stable(records):
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in records]


def test_run_writes_metrics_tensorboard_config_and_checkpoint(demo_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    cfg = small_experiment(
        demo_model_dir,
        out,
        trainer={"total_steps": 2, "test_freq": 1, "save_freq": 1, "plot_learning_curve": True},
    )
    history = RLTrainer(cfg).run()
    assert len(history) == 2
    for key in (
        "actor/pg_loss",
        "actor/entropy",
        "actor/grad_norm",
        "actor/lr",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "critic/score/mean",
        "critic/advantages/mean",
        "response_length/mean",
        "response_length/clip_ratio",
        "prompt_length/mean",
        "global_seqlen/mean",
        "perf/throughput",
        "perf/total_num_tokens",
        "perf/cpu_memory_used_gb",
        "timing_s/gen",
        "timing_s/step",
        "timing_s/update_actor",
        "train/num_gen_batches",
        "val/arithmetic/mean@2",
        "val/arithmetic/pass@2",
    ):
        assert key in history[-1], key
    assert all(math.isfinite(v) for v in history[-1].values())
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]  # step 0 = validation before training
    events = list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    assert (
        "AlgorithmConfig" in (out / "config.gin").read_text()
        or (out / "resolved_config.json").exists()
    )
    assert (
        json.loads((out / "resolved_config.json").read_text())["algorithm"]["adv_estimator"]
        == "grpo"
    )
    assert (out / "checkpoints" / "global_step_2" / "COMPLETE").exists()
    assert (out / "learning_curve.png").stat().st_size > 1000
    low, high = (history[-1][f"val/arithmetic/mean@2_{end}"] for end in ("ci_low", "ci_high"))
    assert 0 <= low <= history[-1]["val/arithmetic/mean@2"] <= high <= 1
    # The run ends with a summary: held-out first -> last, and where things are.
    summary = capsys.readouterr().out.split("rlkit: finished at step 2")[1]
    assert "held-out arithmetic/mean@2: " in summary and "at step 0 -> " in summary
    assert f"checkpoints: {out / 'checkpoints'}" in summary
    assert f"curve: {out / 'learning_curve.png'}" in summary


def response_length_reward(response: str, ground_truth: str, **extra) -> float:
    return float(len(response))


def test_export_at_end_writes_a_hugging_face_model_with_the_trained_weights(
    demo_model_dir, tmp_path
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = small_experiment(
        demo_model_dir,
        tmp_path / "run",
        # A reward that differs between a group's responses, so the step changes weights.
        data={"reward": "tests.test_trainer_run:response_length_reward"},
        trainer={"total_steps": 1, "save_at_end": False, "export_hf_at_end": True},
    )
    trainer = RLTrainer(cfg)
    trainer.run()
    trained = {k: v.detach().clone() for k, v in trainer.actor.backbone.state_dict().items()}
    trainer.cleanup()
    exported = tmp_path / "run" / "hf_model"
    model = AutoModelForCausalLM.from_pretrained(exported)
    assert AutoTokenizer.from_pretrained(exported)("1+2=").input_ids  # tokenizer saved too
    state = model.state_dict()
    initial = AutoModelForCausalLM.from_pretrained(demo_model_dir).state_dict()
    assert any(not torch.equal(state[k], initial[k]) for k in state)  # the update is in it
    for k, v in trained.items():  # a copy of the values, no arithmetic: bitwise
        torch.testing.assert_close(state[k], v, rtol=0, atol=0)


def test_bf16_mixed_precision_computes_in_bf16_and_keeps_float32_parameters(
    demo_model_dir, tmp_path
):
    def one_step(mixed_precision: str):
        cfg = small_experiment(
            demo_model_dir,
            tmp_path / mixed_precision,
            data={"reward": "tests.test_trainer_run:response_length_reward"},
            trainer={
                "total_steps": 1,
                "save_at_end": False,
                "val_before_train": False,
                "mixed_precision": mixed_precision,
            },
        )
        trainer = RLTrainer(cfg)
        trainer.setup()
        before = {k: v.detach().clone() for k, v in trainer.actor.state_dict().items()}
        # The last layer's down projection, in the rollout and the training passes.
        out_dtypes: list[torch.dtype] = []
        hook = trainer.actor.backbone.model.layers[-1].mlp.down_proj.register_forward_hook(
            lambda module, args, out: out_dtypes.append(out.dtype)
        )
        metrics = trainer.step()
        hook.remove()
        after = trainer.actor.state_dict()
        dtypes = {v.dtype for v in after.values()}
        changed = any(not torch.equal(before[k], after[k]) for k in before)
        trainer.cleanup()
        return metrics, dtypes, changed, out_dtypes

    *_, full_dtypes = one_step("no")
    mixed, dtypes, changed, mixed_dtypes = one_step("bf16")
    assert dtypes == {torch.float32} and changed  # fp32 master weights, updated
    assert math.isfinite(mixed["actor/grad_norm"]) and mixed["actor/grad_norm"] > 0
    assert math.isfinite(mixed["actor/entropy"])
    # Every forward the step ran (the rollout's prefill and decode steps, the training
    # passes) computed in bf16 under mixed precision, and in float32 without it.
    assert set(full_dtypes) == {torch.float32} and len(full_dtypes) > 2
    assert set(mixed_dtypes) == {torch.bfloat16} and len(mixed_dtypes) > 2


def test_resume_continues_bitwise_identically(demo_model_dir, tmp_path):
    # Bitwise on any CPU: the checkpoint restores parameters, AdamW state, schedule, RNG
    # states and prompt order by copying their values (into the same kind of freshly built
    # model), nothing is recomputed; steps 3-4 then run the same ops on the same shapes in
    # the same order, in the same process (same thread count, same kernels), and CPU
    # kernels are deterministic for a given shape, dtype and thread count. Rounding is
    # therefore the same in both runs, whatever it is on this machine.
    # Validation every 2 steps in all runs: the interrupted run validates at its last step (2).
    straight = small_experiment(
        demo_model_dir, tmp_path / "straight", trainer={"total_steps": 4, "test_freq": 2}
    )
    RLTrainer(straight).run()
    first = small_experiment(
        demo_model_dir, tmp_path / "resumed", trainer={"total_steps": 2, "test_freq": 2}
    )
    RLTrainer(first).run()  # saves global_step_2 at the end
    second = small_experiment(
        demo_model_dir, tmp_path / "resumed", trainer={"total_steps": 4, "test_freq": 2}
    )
    trainer = RLTrainer(second)
    trainer.run()
    assert trainer.resumed_from.endswith("global_step_2")
    a = _stable(read_metrics(tmp_path / "straight" / "metrics.jsonl"))
    b = _stable(read_metrics(tmp_path / "resumed" / "metrics.jsonl"))
    assert a == b


def test_crash_while_saving_keeps_last_good_checkpoint(demo_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "crash"
    cfg = small_experiment(
        demo_model_dir, out, trainer={"total_steps": 2, "save_freq": 1, "save_at_end": True}
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    trainer.step_count = 0
    real = trainer.backend.save_sharded
    calls = {"n": 0}

    def dies_on_second_save(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            real(*args, **kwargs)
            raise KeyboardInterrupt("killed while writing checkpoint 2")
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer.backend, "save_sharded", dies_on_second_save)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    trainer.cleanup()
    ckpts = trainer.checkpoints
    assert ckpts.latest().name == "global_step_1"
    assert not (out / "checkpoints" / "global_step_2").exists()
    resumed = RLTrainer(small_experiment(demo_model_dir, out, trainer={"total_steps": 2}))
    resumed.run()
    assert resumed.resumed_from.endswith("global_step_1")
    assert (out / "checkpoints" / "global_step_2" / "COMPLETE").exists()


def test_ctrl_c_while_saving_finishes_the_checkpoint_then_stops(
    demo_model_dir, tmp_path, monkeypatch, capfd
):
    # A real SIGINT in the middle of the second save: the write completes (checkpoint 2
    # is the latest, manifest and all), and only then the run stops with KeyboardInterrupt.
    import os
    import signal

    out = tmp_path / "ctrl_c"
    cfg = small_experiment(
        demo_model_dir, out, trainer={"total_steps": 3, "save_freq": 1, "val_before_train": False}
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    real = trainer.backend.save_sharded
    calls = {"n": 0}

    def ctrl_c_during_second_save(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer.backend, "save_sharded", ctrl_c_during_second_save)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    trainer.cleanup()
    assert "stopping after checkpoint global_step_2 is written" in capfd.readouterr().err
    assert trainer.checkpoints.latest().name == "global_step_2"
    verify_checkpoint(out / "checkpoints" / "global_step_2")  # every file's checksum holds
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_full_disk_while_saving_says_so_and_keeps_the_previous_checkpoint(
    demo_model_dir, tmp_path, monkeypatch
):
    import errno

    out = tmp_path / "full"
    cfg = small_experiment(
        demo_model_dir, out, trainer={"total_steps": 2, "save_freq": 1, "val_before_train": False}
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    real = trainer.backend.save_sharded
    calls = {"n": 0}

    def disk_full_on_second_save(path, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            real(path, *args, **kwargs)  # a partial checkpoint on disk, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(trainer.backend, "save_sharded", disk_full_on_second_save)
    with pytest.raises(OSError, match="no space left on device") as err:
        trainer.train()
    trainer.cleanup()
    assert err.value.errno == errno.ENOSPC
    assert ".tmp-global_step_2" in str(err.value) and "global_step_1 is" in str(err.value)
    ckpts = out / "checkpoints"
    assert trainer.checkpoints.latest().name == "global_step_1"
    assert not list(ckpts.glob(".tmp-*")) and not (ckpts / "global_step_2").exists()
    resumed = RLTrainer(small_experiment(demo_model_dir, out, trainer={"total_steps": 2}))
    resumed.run()  # the previous checkpoint loads and the run finishes
    assert resumed.resumed_from.endswith("global_step_1")
    assert (ckpts / "global_step_2" / "COMPLETE").exists()


def test_a_step_saved_but_not_logged_is_logged_from_its_checkpoint_on_resume(
    demo_model_dir, tmp_path
):
    # The save comes before the step's log line (so timing_s/save_checkpoint is in it);
    # a kill between the two is what cutting the last line here stands for.
    out = tmp_path / "lost_line"
    cfg = small_experiment(demo_model_dir, out, trainer={"total_steps": 2, "save_freq": 1})
    first = RLTrainer(cfg).run()
    assert first[-1]["timing_s/save_checkpoint"] > 0
    log = out / "metrics.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:-1]))
    RLTrainer(small_experiment(demo_model_dir, out, trainer={"total_steps": 2})).run()
    records = read_metrics(log)
    assert [r["step"] for r in records] == [0, 1, 2]  # step 2 back, once
    restored = {k: v for k, v in first[-1].items() if k != "timing_s/save_checkpoint"}
    assert {k: v for k, v in records[-1].items() if k != "step"} == restored


def test_skipped_passes_and_saves_are_timed_as_zero(demo_model_dir, tmp_path):
    cfg = small_experiment(
        demo_model_dir,
        tmp_path / "timings",
        trainer={"total_steps": 1, "save_at_end": False},
        optim={"ppo_mini_batch_size": 4, "ppo_epochs": 1},  # on-policy: no old_log_prob pass
    )
    metrics = RLTrainer(cfg).run()[-1]
    assert metrics["timing_s/save_checkpoint"] == 0.0
    assert metrics["timing_s/old_log_prob"] == 0.0
    assert 0 < metrics["timing_s/generate_sequences"] <= metrics["timing_s/gen"]


def test_nan_loss_skips_the_update_and_reports_it(demo_model_dir, tmp_path):
    cfg = small_experiment(
        demo_model_dir,
        tmp_path / "nan",
        trainer={"total_steps": 1, "save_at_end": False},
        algorithm={"policy_loss": "tests.faulty_components:nan_loss", "use_kl_loss": False},
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    before = {k: v.clone() for k, v in trainer.actor.state_dict().items()}
    metrics = trainer.step()
    trainer.cleanup()
    assert metrics["actor/nan_skipped_updates"] >= 1
    for k, v in trainer.actor.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed although the loss was NaN"


def test_reward_that_raises_everywhere_stops_the_run_with_its_error(demo_model_dir, tmp_path):
    """Every call failing (DataConfig.max_reward_failure_rate = 1.0, the default) stops
    the run before an update on a constant 0, naming the count and the first error."""
    from rlkit.trainer.scoring import RewardFailure

    cfg = small_experiment(
        demo_model_dir,
        tmp_path / "bad_reward",
        trainer={"total_steps": 1, "save_at_end": False, "val_before_train": False},
        data={"reward": "tests.faulty_components:raising_reward"},
    )
    with pytest.raises(RewardFailure, match=r"16 of 16 reward calls failed.*reward server"):
        RLTrainer(cfg).run()  # 4 prompts x 4 responses


def test_a_reward_that_hangs_everywhere_costs_a_step_one_deadline_then_stops_the_run(
    demo_model_dir, tmp_path
):
    """16 calls that hang, 1 s limit each: 16 s in series. The phase's deadline (2 s) cuts
    the other calls off unstarted, and every call failing stops the run."""
    from rlkit.trainer.scoring import RewardFailure

    cfg = small_experiment(
        demo_model_dir,
        tmp_path / "hangs",
        trainer={"total_steps": 1, "save_at_end": False, "val_before_train": False},
        data={
            "reward": "tests.faulty_components:sleepy_reward",
            "reward_timeout_s": 1.0,
            "reward_deadline_s": 2.0,
        },
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    start = time.monotonic()
    with pytest.raises(RewardFailure, match=r"16 of 16 reward calls failed \(0 errors, 16 time"):
        trainer.step()
    trainer.cleanup()
    assert time.monotonic() - start < 12.0  # one rollout of the tiny model + 2 s of scoring


def test_long_prompts_are_filtered_or_truncated_and_counted(demo_model_dir, tmp_path):
    # "a+b=" prompts have 4-6 tokens; a limit of 5 cuts the longest ones.
    cfg = small_experiment(
        demo_model_dir,
        tmp_path / "filter",
        trainer={"total_steps": 1, "save_at_end": False},
        data={"max_prompt_length": 5, "truncation": "filter"},
    )
    metrics = RLTrainer(cfg).run()[-1]
    assert metrics["train/num_filtered_prompts"] > 0
    assert metrics["prompt_length/max"] <= 5
    cfg = small_experiment(
        demo_model_dir, tmp_path / "error", data={"max_prompt_length": 5, "truncation": "error"}
    )
    with pytest.raises(ValueError, match="max_prompt_length=5"):
        RLTrainer(cfg).run()


def test_missing_model_path_is_a_clear_error(tmp_path):
    cfg = small_experiment(tmp_path / "nowhere", tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="not a directory"):
        RLTrainer(cfg).run()


def test_on_policy_update_skips_old_logprob_pass_and_matches_the_explicit_one(
    demo_model_dir, tmp_path
):
    # One mini-batch per step and one epoch: pi_old is the current policy.
    def one_step(explicit: bool, **optim) -> StepRun:
        def prepare(trainer):
            assert not trainer.needs.old_log_prob
            trainer.algorithm.needs = dataclasses.replace(trainer.needs, old_log_prob=explicit)

        cfg = small_experiment(
            demo_model_dir,
            tmp_path / f"onpolicy_{explicit}_{'lr0' if optim else 'adam'}",
            data=LENGTH_REWARD,  # nonzero advantages: a real update to compare
            optim={"ppo_mini_batch_size": 4, **optim},
            trainer={"total_steps": 1, "save_at_end": False, "val_before_train": False},
        )
        return run_one_step(cfg, prepare)

    # The explicit pass computes pi_old in its own forward: the ratio is 1 up to rounding,
    # not exactly. lr = 0 compares the gradients within 2 gamma_D of float32 rounding; the
    # real AdamW step compares parameters within what Adam's sign-like steps allow (a
    # near-zero gradient element may step either way) - tests/numerics.py.
    for phase in ("gradients", "adam"):
        optim = {"lr": 0.0} if phase == "gradients" else {}
        fast, slow = one_step(explicit=False, **optim), one_step(explicit=True, **optim)
        assert fast.metrics["timing_s/old_log_prob"] == 0.0  # the pass was skipped
        assert slow.metrics["timing_s/old_log_prob"] > 0
        # Both are computed before the only optimizer step.
        for key in ("actor/entropy", "rollout/logprob_abs_diff_mean"):
            assert fast.metrics[key] == pytest.approx(slow.metrics[key], rel=1e-5, abs=1e-6), key
        if phase == "gradients":
            assert_same_gradients(fast, slow)
        else:
            assert_same_adam_update(fast, slow)


def test_lora_trains_only_adapters_and_uses_the_adapter_free_model_as_reference(
    demo_model_dir, tmp_path
):
    cfg = small_experiment(
        demo_model_dir,
        tmp_path / "lora",
        model={"path": str(demo_model_dir), "lora_rank": 4},
        data={"train_batch_size": 8},
        rollout={"n": 8, "max_response_length": 6},
        algorithm={"use_kl_loss": True, "kl_loss_type": "low_var_kl"},
        trainer={"total_steps": 1, "save_at_end": False, "val_before_train": False},
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    assert trainer.ref is None  # no second model: adapters off = reference
    state = trainer.actor.state_dict()
    base = {k: v.clone() for k, v in state.items() if "lora_" not in k}
    lora = {k: v.clone() for k, v in state.items() if "lora_B" in k}
    assert lora and all(float(v.abs().sum()) == 0 for v in lora.values())  # peft starts B at 0
    metrics = trainer.step()
    after = trainer.actor.state_dict()
    trainer.cleanup()
    trainable = {n for n, p in trainer.actor.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert math.isfinite(metrics["actor/kl_loss"]) and metrics["actor/nan_skipped_updates"] == 0
    assert all(torch.equal(after[k], v) for k, v in base.items())  # base weights frozen
    if metrics["critic/advantages/max"] != 0:  # a learning signal: the adapters must move
        assert any(float(after[k].abs().sum()) > 0 for k in lora)
