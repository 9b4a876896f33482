"""TrainingBackend across real processes: 2 CPU processes (gloo, FSDP2) vs 1 process.

``backend_checks.py`` is run three times (module fixture): launched by
``accelerate launch --multi_gpu --num_processes 2`` (``--multi_gpu`` because on a machine
without GPUs accelerate's plain launcher starts ONE process whatever --num_processes says),
and twice as a single plain ``python`` process, with strategy "none" and forced "fsdp2".
Each test below asserts on the JSON and tensors those runs wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer
from tests.distributed.launch import accelerate_launch, launch_env

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).with_name("backend_checks.py")
REPO = Path(__file__).resolve().parents[2]
MODELS = ("tied", "untied")
TIMEOUT_S = 600  # a hang guard only, far above a normal launch (~15 s)


def _run(command: list[str], out: Path) -> dict:
    proc = subprocess.run(
        command, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert proc.returncode == 0, (
        f"{' '.join(command)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    ranks = sorted(out.glob("result_rank*.json"))
    return {"ranks": [json.loads(p.read_text()) for p in ranks], "dir": out}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("backend")
    tokenizer = train_byte_tokenizer()
    models = [
        f"tied={build_tiny_qwen2(root / 'tied', tokenizer, tie_word_embeddings=True)}",
        f"untied={build_tiny_qwen2(root / 'untied', tokenizer, tie_word_embeddings=False, seed=1)}",
    ]
    results = {}
    launch = accelerate_launch(2)
    commands = {
        "two_fsdp2": launch + [str(SCRIPT), "--strategy", "auto", "--expect-none-refused"],
        "one_plain": [sys.executable, str(SCRIPT), "--strategy", "none"],
        "one_fsdp2": [
            *(sys.executable, str(SCRIPT), "--strategy", "fsdp2"),
            "--activation-checkpointing",
        ],
    }
    for name, command in commands.items():
        out = root / name
        out.mkdir()
        results[name] = _run(command + ["--out", str(out), "--models", *models], out)
    return results


def _tensors(run: dict, model: str, what: str) -> dict[str, torch.Tensor]:
    return torch.load(run["dir"] / f"{model}_{what}.pt")


def _max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_each_launch_reports_from_every_rank(runs):
    # A hung launch fails in the fixture (subprocess timeout); here: every rank wrote.
    assert [len(runs[n]["ranks"]) for n in ("two_fsdp2", "one_plain", "one_fsdp2")] == [2, 1, 1]


def test_two_process_launch_selects_fsdp2_over_gloo(runs):
    for rank, result in enumerate(runs["two_fsdp2"]["ranks"]):
        assert result["process_index"] == rank
        assert result["num_processes"] == 2
        assert result["is_sharded"] is True
        assert result["distributed_type"] == "DistributedType.FSDP"
        assert result["device"].startswith("cpu")


def test_strategy_none_is_refused_when_two_processes_are_launched(runs):
    for result in runs["two_fsdp2"]["ranks"]:
        assert "strategy='none'" in result["strategy_none_refusal"]
        assert "2 processes" in result["strategy_none_refusal"]


def test_two_processes_hold_disjoint_dtensor_shards_of_every_parameter(runs):
    for model in MODELS:
        facts = [r["models"][model]["sharding"] for r in runs["two_fsdp2"]["ranks"]]
        for f in facts:
            assert f["num_dtensor_params"] == f["num_params"] > 0
            assert f["all_placements_shard0"]
            assert f["mesh_sizes"] == [2]
            # Each rank keeps about half: dim 0 split in two (rounded up on rank 0).
            assert f["local_numel"] < 0.51 * f["full_numel"]
            assert f["local_numel_summed_over_ranks"] == f["full_numel"]


def test_two_process_update_equals_one_process_update_on_the_global_batch(runs):
    # Each of the 2 ranks holds 2 of the 4 rows; its loss is normalised by the GLOBAL token
    # count and multiplied by 2, and FSDP averages gradients, so gradients, the clipped SGD
    # update and the parameters must match one process on all 4 rows to float round-off.
    two, one = runs["two_fsdp2"], runs["one_plain"]
    for model in MODELS:
        grad_diff = _max_abs_diff(_tensors(two, model, "grads"), _tensors(one, model, "grads"))
        param_diff = _max_abs_diff(_tensors(two, model, "params"), _tensors(one, model, "params"))
        print(f"{model}: max |grad diff| {grad_diff:.3g}, max |param diff| {param_diff:.3g}")
        assert grad_diff < 1e-6
        assert param_diff < 1e-6
        one_result = one["ranks"][0]["models"][model]
        for result in two["ranks"]:
            assert result["models"][model]["loss_global"] == pytest.approx(
                one_result["loss_global"], abs=1e-6
            )


def test_clip_grad_norm_returns_the_same_global_norm_on_every_rank(runs):
    for model in MODELS:
        norms = [r["models"][model]["grad_norm"] for r in runs["two_fsdp2"]["ranks"]]
        single = runs["one_plain"]["ranks"][0]["models"][model]["grad_norm"]
        assert norms[0] == norms[1]
        assert norms[0] == pytest.approx(single, rel=1e-6)
        assert norms[0] > 0.05  # so the clip to 0.05 really scaled the update


def test_forced_fsdp2_with_activation_checkpointing_on_one_process_is_bitwise_plain(runs):
    # The same arithmetic on a one-rank mesh; the recomputed layers repeat the same ops.
    one_fsdp2, one_plain = runs["one_fsdp2"], runs["one_plain"]
    result = one_fsdp2["ranks"][0]
    assert result["is_sharded"] and result["distributed_type"] == "DistributedType.FSDP"
    for model in MODELS:
        assert result["models"][model]["sharding"]["mesh_sizes"] == [1]
        assert result["models"][model]["checkpoint_wrapped_layers"] == 2  # both decoder layers
        assert one_plain["ranks"][0]["models"][model]["checkpoint_wrapped_layers"] == 0
        for what in ("grads", "params"):
            assert (
                _max_abs_diff(_tensors(one_fsdp2, model, what), _tensors(one_plain, model, what))
                == 0.0
            )


@pytest.mark.parametrize("run_name", ["two_fsdp2", "one_plain", "one_fsdp2"])
def test_resume_from_sharded_checkpoint_continues_bitwise(runs, run_name):
    run = runs[run_name]
    for model in MODELS:
        resume = run["ranks"][0]["models"][model]["resume"]
        assert resume["same_keys"]
        assert resume["bitwise_equal"], resume["max_abs_diff"]
        shards = [f for f in resume["checkpoint_files"] if f.endswith(".distcp")]
        assert len(shards) == len(run["ranks"])  # one shard file per process


@pytest.mark.parametrize("phase", ["generation_before_training", "export"])
def test_greedy_generation_in_context_equals_the_unsharded_model(runs, phase):
    # Rank 0 generates 3 tokens, rank 1 generates 6 (different prompts too): only
    # synced_gpus=True lets rank 0 keep joining the layers' all-gathers.
    for result in runs["two_fsdp2"]["ranks"]:
        for model in MODELS:
            facts = result["models"][model][phase]
            if phase == "export":
                sharded, unsharded = facts["trained_sharded"], facts["trained_reloaded"]
            else:
                sharded, unsharded = facts["sharded"], facts["unsharded"]
                assert facts["extra_kwargs"] == {"synced_gpus": True}
            assert sharded == unsharded
            assert len(sharded[0]) == 3 + 3 * result["process_index"]


def test_rlkit_decode_loop_keeps_ranks_in_step_when_one_finishes_early(runs):
    # Rank 0 stops every row at once (or has no prompts) while rank 1 decodes 6 tokens:
    # returning at all proves rank 0 kept joining the all-gathers.
    for run in runs.values():
        for result in run["ranks"]:
            for model in MODELS:
                facts = result["models"][model]["kv_decode"]
                assert facts["stopping"] == facts["stopping_expected"]
                assert facts["idle"] == facts["idle_expected"]
                if result["process_index"] == 0:
                    assert all(len(r) == 1 for r in facts["stopping"])
                    assert facts["idle"] == []
                else:
                    assert all(len(r) == 6 for r in facts["stopping"] + facts["idle"])


def test_frozen_model_is_sharded_without_optimizer_and_matches_plain_log_probs(runs):
    for run in runs.values():
        for result in run["ranks"]:
            for model in MODELS:
                frozen = result["models"][model]["frozen"]
                assert frozen["optimizer_is_none"]
                assert frozen["max_abs_diff_log_probs"] < 1e-5
                assert frozen["root_resharded_after_forward"] is result["is_sharded"]


def test_full_state_dict_keeps_wrapper_keys_on_main_and_is_empty_elsewhere(runs):
    main, other = runs["two_fsdp2"]["ranks"]
    single = runs["one_plain"]["ranks"][0]
    for model in MODELS:
        keys = main["models"][model]["full_state_dict_keys"]
        assert keys == single["models"][model]["full_state_dict_keys"]
        assert all(k.startswith("backbone.") for k in keys)
        # Tied embeddings are listed under both names, as model.state_dict() does.
        assert {"backbone.lm_head.weight", "backbone.model.embed_tokens.weight"} <= set(keys)
        assert other["models"][model]["full_state_dict_keys_off_main"] == []


def test_export_hf_writes_a_loadable_model_equal_to_the_gathered_weights(runs):
    for run in runs.values():
        for model in MODELS:
            export = run["ranks"][0]["models"][model]["export"]
            assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(export["files"])
            assert export["staging_left_over"] == []
            assert export["max_abs_diff_vs_full_state_dict"] == 0.0


def test_all_reduce_ops_across_two_processes(runs):
    # rank 0 sends [1, 3], rank 1 sends [2, 3]:
    # sum [3, 6]; mean [1.5, 3]; max [2, 3]; min [1, 3].
    for result in runs["two_fsdp2"]["ranks"]:
        assert result["all_reduce"] == {
            "sum": [3.0, 6.0],
            "mean": [1.5, 3.0],
            "max": [2.0, 3.0],
            "min": [1.0, 3.0],
        }
