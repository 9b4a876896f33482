"""``rlkit export``: a training checkpoint -> a Hugging Face model directory that reproduces
the trained actor's log-probs (exactly, for one CPU process), in one process whatever
number of processes saved it; and ``TrainerConfig.export_freq``."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlkit.export import main as export_main
from tests.experiment_factory import LENGTH_REWARD, small_experiment
from tests.gin_files import LENGTH_REWARD_RUN, arithmetic_gin

# Fixed token ids, all below the demo model's vocabulary size.
INPUT_IDS = torch.tensor([[5, 17, 40, 41, 3, 60, 61, 9], [70, 12, 13, 80, 4, 4, 90, 100]])


def logprobs(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=INPUT_IDS).logits.float(), dim=-1)


@dataclass
class TrainedRun:
    out: Path
    actor_logprobs: torch.Tensor
    """The trainer's own actor at the end of training, on INPUT_IDS."""
    chat_template: str | None


def train(model_dir: str, out: Path, **model_fields) -> TrainedRun:
    from rlkit.trainer.trainer import RLTrainer

    cfg = small_experiment(
        model_dir,
        out,
        data={**LENGTH_REWARD, "val_limit": None},  # a gradient every step; no validation
        model=model_fields,
        optim={"ppo_mini_batch_size": 4, "micro_batch_size": 8},
        trainer={"total_steps": 2, "save_freq": 1, "export_freq": 1, "export_hf_at_end": True},
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    try:
        trainer.train()
        actor = logprobs(trainer.backend.unwrap(trainer.actor).backbone)
        template = trainer.tokenizer.chat_template
    finally:
        trainer.cleanup()
    return TrainedRun(out, actor, template)


@pytest.fixture(scope="module")
def run(demo_model_dir, tmp_path_factory) -> TrainedRun:
    return train(demo_model_dir, tmp_path_factory.mktemp("export") / "run")


def load(directory: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(directory).eval()


def test_export_reproduces_the_trained_actor_exactly(run, tmp_path):
    out = tmp_path / "hf"
    assert export_main([str(run.out / "checkpoints" / "global_step_2"), str(out)]) == 0
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert torch.equal(logprobs(load(out)), run.actor_logprobs)
    # ... and the end-of-run export of the same weights.
    assert torch.equal(logprobs(load(run.out / "hf_model")), run.actor_logprobs)
    assert AutoTokenizer.from_pretrained(out).chat_template == run.chat_template


def test_export_of_a_run_directory_takes_its_latest_checkpoint(run, tmp_path):
    assert export_main([str(run.out), str(tmp_path / "hf")]) == 0
    assert torch.equal(logprobs(load(tmp_path / "hf")), run.actor_logprobs)


def test_export_freq_writes_every_step_and_step_1_is_the_step_1_checkpoint(run, tmp_path):
    exports = run.out / "hf_exports"
    assert sorted(p.name for p in exports.iterdir()) == ["global_step_1", "global_step_2"]
    assert torch.equal(logprobs(load(exports / "global_step_2")), run.actor_logprobs)
    step1 = logprobs(load(exports / "global_step_1"))
    assert not torch.equal(step1, run.actor_logprobs)  # it trained in step 2
    assert export_main([str(run.out / "checkpoints" / "global_step_1"), str(tmp_path / "hf1")]) == 0
    assert torch.equal(logprobs(load(tmp_path / "hf1")), step1)


def test_model_override_and_the_runs_chat_template(run, demo_model_dir, tmp_path):
    """A run directory moved elsewhere: --model names the base model; the run's
    ModelConfig.chat_template goes into the exported tokenizer."""
    moved = tmp_path / "moved"
    shutil.copytree(run.out, moved)
    resolved = json.loads((moved / "resolved_config.json").read_text())
    resolved["model"]["path"] = str(tmp_path / "gone")
    resolved["model"]["chat_template"] = "{{ messages[0]['content'] }}"
    (moved / "resolved_config.json").write_text(json.dumps(resolved))
    ckpt = str(moved / "checkpoints" / "global_step_2")
    assert export_main([ckpt, str(tmp_path / "refused")]) == 2  # the model is not there
    assert export_main([ckpt, str(tmp_path / "hf"), "--model", str(demo_model_dir)]) == 0
    assert torch.equal(logprobs(load(tmp_path / "hf")), run.actor_logprobs)
    template = AutoTokenizer.from_pretrained(tmp_path / "hf").chat_template
    assert template == "{{ messages[0]['content'] }}"


def test_export_refuses_a_non_checkpoint_and_an_occupied_destination(run, tmp_path, capsys):
    assert export_main([str(tmp_path), str(tmp_path / "hf")]) == 2
    assert "not a complete rlkit checkpoint" in capsys.readouterr().err
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("x")
    assert export_main([str(run.out), str(occupied)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert export_main([str(run.out), str(occupied), "--overwrite"]) == 0
    assert not (occupied / "keep.txt").exists()


def test_lora_adapters_are_merged(demo_model_dir, tmp_path):
    pytest.importorskip("peft")
    run = train(demo_model_dir, tmp_path / "run", lora_rank=4, lora_alpha=8)
    out = tmp_path / "hf"
    assert export_main([str(run.out), str(out)]) == 0
    model = load(out)
    assert not any("lora" in name for name, _ in model.named_parameters())
    # Merging adds B @ A into the weight: the same function up to rounding.
    torch.testing.assert_close(logprobs(model), run.actor_logprobs, rtol=0, atol=1e-5)


@pytest.mark.distributed
@pytest.mark.slow
def test_one_process_exports_a_two_process_sharded_checkpoint(demo_model_dir, tmp_path):
    from tests.distributed.test_trainer_two_processes import train_two_processes

    out = tmp_path / "run"
    bindings = {
        **LENGTH_REWARD_RUN,
        "TrainerConfig.total_steps": 1,
        "TrainerConfig.export_hf_at_end": True,
    }
    train_two_processes(arithmetic_gin(demo_model_dir, out, bindings), tmp_path)
    ckpt = out / "checkpoints" / "global_step_1"
    assert len(list((ckpt / "actor").glob("*.distcp"))) == 2
    assert export_main([str(ckpt), str(tmp_path / "hf")]) == 0
    # hf_model: the FSDP2 shards gathered by the 2 processes at the end of training.
    assert torch.equal(logprobs(load(tmp_path / "hf")), logprobs(load(out / "hf_model")))


def test_export_freq_must_be_a_non_negative_integer(tmp_path):
    cfg = small_experiment("unused", tmp_path, trainer={"export_freq": -1})
    with pytest.raises(ValueError, match="TrainerConfig.export_freq must be"):
        cfg.validate()


def test_cpu_offload_is_refused_on_cpu_naming_the_field(demo_model_dir, tmp_path):
    """Offloading moves FSDP2 shards from an accelerator to host memory: without an
    accelerator the run stops at setup, before any process group or model exists."""
    from rlkit.trainer.fsdp_cpu_shim import has_accelerator
    from rlkit.trainer.trainer import RLTrainer

    if has_accelerator():
        pytest.skip("checks the CPU-only refusal")
    cfg = small_experiment(demo_model_dir, tmp_path / "run", trainer={"cpu_offload": True})
    with pytest.raises(ValueError, match=r"needs an accelerator.*TrainerConfig\.cpu_offload"):
        RLTrainer(cfg).setup()
