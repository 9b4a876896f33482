"""Tensor parallelism on CPU (gloo): the split model against the unsplit one, and whole
training runs against runs without it.

- 2 processes, t = 2, for the demo's Qwen2, a GQA family with per-head norms (Qwen3), a
  mixture-of-experts family (Qwen3-MoE, experts replicated over the tensor-parallel
  processes), Llama 3, Mistral, Gemma2 (soft-capping, sliding windows), Gemma3 and a
  family whose plan rlkit writes itself (HunYuan dense): log-probs,
  entropy, values, loss, every gradient and the gradient norm equal the unsplit model's
  within ``2 gamma_D`` (tests/numerics.py).
- 4 processes as 2 x 2 (FSDP2 x TP), with activation checkpointing: the same, each
  data-parallel group on its rows.
- ``rlkit train`` (PPO with a KL loss: actor, reference and critic split) with t = 2 on
  2 processes logs the metrics of the same run on one process (both sample every prompt
  from the rank-0 seed), saves checkpoints that resume at t = 1 with the same next step,
  and exports a model that transformers loads and that generates.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer
from rlkit.models.tiny_families import build_tiny_family
from tests.distributed.launch import free_port, launch_env
from tests.distributed.test_trainer_two_processes import train_two_processes
from tests.gin_files import LENGTH_REWARD_RUN, arithmetic_gin

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FAMILIES = (
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "llama3",
    "mistral",
    "gemma2",
    "gemma3",
    "hunyuan_v1_dense",
)

# Metrics of two runs that compute the same step by different float32 paths (split
# matmuls, other summation orders) agree to ~1e-6 of their size; a lost row, a wrong
# normaliser or another sample moves them by 1e-2 or more.
METRIC_RTOL = 1e-4
NOT_COMPARED = ("timing", "perf/", "time", "throughput", "memory", "system/")


def _build_hunyuan(out: Path, tokenizer) -> None:
    config = transformers.HunYuanDenseV1Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(0)
    transformers.HunYuanDenseV1ForCausalLM(config).save_pretrained(out)


@pytest.fixture(scope="module")
def model_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tensor_parallel")
    tokenizer = train_byte_tokenizer()
    build_tiny_qwen2(root / "models" / "qwen2", tokenizer)
    for family in FAMILIES[1:-1]:
        build_tiny_family(family, root / "models" / family, tokenizer, seed=0)
    _build_hunyuan(root / "models" / "hunyuan_v1_dense", tokenizer)
    return root


def _run_checks(root: Path, processes: int, families: tuple[str, ...], *extra: str) -> dict:
    out = root / f"results_{processes}.json"
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)),
        *("--master_port", str(free_port())),
        *("-m", "tests.distributed.tensor_parallel_checks", str(out), "2", *extra, *families),
    ]
    proc = subprocess.run(
        command, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


def _assert_within(results: dict, families: tuple[str, ...]) -> None:
    assert {case.split("/")[0] for case in results} == set(families)
    for case, quantities in results.items():
        for quantity, (diff, tol) in quantities.items():
            assert diff <= tol, f"{case}: {quantity} differs by {diff:.3g} > {tol:.3g}"


def test_two_tensor_parallel_processes_compute_the_unsplit_step(model_root):
    _assert_within(_run_checks(model_root, 2, FAMILIES), FAMILIES)


def test_fsdp2_by_tensor_parallel_grid_of_four_computes_the_unsplit_step(model_root):
    # With the backend's activation checkpointing: the backward recomputes split layers.
    families = ("qwen2", "qwen3_moe")
    results = _run_checks(model_root, 4, families, "--activation-checkpointing")
    _assert_within(results, families)


# ------------------------------------------------------------------ whole runs
def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _assert_same_metrics(got: list[dict], want: list[dict]) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want]
    compared = 0
    for g, w in zip(got, want):
        keys = [k for k in w if not any(part in k for part in NOT_COMPARED)]
        assert set(keys) <= set(g), sorted(set(keys) - set(g))
        for key in keys:
            assert g[key] == pytest.approx(w[key], rel=METRIC_RTOL, abs=1e-6), (g["step"], key)
            compared += 1
    assert compared > 50


def _gin(model: str, out: Path, t: int, preset: str = "grpo", **extra) -> str:
    bindings = {
        **LENGTH_REWARD_RUN,
        "TrainerConfig.total_steps": 2,
        "TrainerConfig.save_freq": 1,
        "ModelConfig.tensor_parallel_size": t,
    }
    return arithmetic_gin(model, out, bindings | extra, preset=preset)


def _train_one_process(text: str, tmp_path: Path) -> str:
    cfg = tmp_path / "one.gin"
    cfg.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "rlkit.train", str(cfg)],
        cwd=REPO,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout + proc.stderr


def test_tensor_parallel_ppo_logs_the_one_process_run_resumes_unsplit_and_exports(
    demo_model_dir, tmp_path
):
    # PPO with a KL loss: the actor, its frozen reference and the critic are all split.
    split, one = tmp_path / "split", tmp_path / "one"
    ppo = {"preset": "ppo", "AlgorithmConfig.use_kl_loss": True}
    text = _gin(demo_model_dir, split, 2, **ppo, **{"TrainerConfig.export_hf_at_end": True})
    log = train_two_processes(text, tmp_path).stdout
    assert "ModelConfig.tensor_parallel_size: 2 processes split every layer" in log
    _train_one_process(_gin(demo_model_dir, one, 1, **ppo), tmp_path)
    _assert_same_metrics(_records(split), _records(one))

    # The step-1 checkpoint, saved split over 2 processes, resumed by one unsplit process:
    # its step 2 is the split run's step 2 (weights, Adam moments and sampling state).
    resumed = tmp_path / "resumed"
    shutil.copytree(split, resumed)
    shutil.rmtree(resumed / "checkpoints" / "global_step_2")
    (resumed / "checkpoints" / "latest").write_text("global_step_1")
    shutil.rmtree(resumed / "hf_model")
    log = _train_one_process(_gin(demo_model_dir, resumed, 1, **ppo), tmp_path)
    assert "ModelConfig.tensor_parallel_size: 2 -> 1" in log
    _assert_same_metrics(_records(resumed), _records(split))

    # The export at the end holds the step-2 checkpoint's weights, gathered from the shards.
    dcp_to_torch_save(split / "checkpoints" / "global_step_2" / "actor", tmp_path / "ck.pt")
    saved = torch.load(tmp_path / "ck.pt", weights_only=False)["model"]
    model = transformers.AutoModelForCausalLM.from_pretrained(split / "hf_model")
    exported = model.state_dict()
    backbone = {k.removeprefix("backbone."): v for k, v in saved.items()}
    assert set(exported) <= set(backbone) and len(exported) > 10
    for name, value in exported.items():
        assert torch.equal(value, backbone[name]), name
    tokenizer = transformers.AutoTokenizer.from_pretrained(split / "hf_model")
    prompt = tokenizer("12+7=", return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] > prompt["input_ids"].shape[1]
