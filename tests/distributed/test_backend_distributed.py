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
from transformers import AutoConfig

from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer
from tests.distributed.launch import accelerate_launch, launch_env
from tests.distributed.tiny_actor import global_batch
from tests.numerics import assert_gradients_close, gamma, reduction_depth

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
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    tokenizer = train_byte_tokenizer()
    return {
        "tied": build_tiny_qwen2(root / "tied", tokenizer, tie_word_embeddings=True),
        "untied": build_tiny_qwen2(root / "untied", tokenizer, tie_word_embeddings=False, seed=1),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory, model_dirs) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("backend")
    models = [f"{name}={path}" for name, path in model_dirs.items()]
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


SGD_LR, CLIP_NORM = 0.5, 0.05  # backend_checks.sgd_step: one clipped SGD step


def _depth(model_dir: Path) -> int:
    """D (tests/numerics.py) of global_batch's 4 rows of 10 tokens through this model."""
    config = AutoConfig.from_pretrained(model_dir)
    rows, positions = global_batch(config.vocab_size)["input_ids"].shape
    return reduction_depth(config, rows=rows, positions=positions)


def _assert_same_sgd_step(run: dict, ref: dict, model: str, model_dir: Path) -> None:
    """Gradients within 2 gamma_D of each tensor's largest element (tests/numerics.py); then
    p - lr c g with clip factor c = CLIP_NORM / norm, linear in g and c: the parameters
    differ by at most lr c (|dg| + |dc / c| |g|) <= 2 lr c tol max|g|, plus an ulp of |p|
    per run from the subtraction."""
    depth = _depth(model_dir)
    tol = 2 * gamma(depth)
    grads, ref_grads = _tensors(run, model, "grads"), _tensors(ref, model, "grads")
    assert_gradients_close(grads, ref_grads, depth=depth)
    params, ref_params = _tensors(run, model, "params"), _tensors(ref, model, "params")
    norm = ref["ranks"][0]["models"][model]["grad_norm"]
    clip = min(1.0, CLIP_NORM / (norm + 1e-6))
    g_max = max(g.abs().max().item() for g in ref_grads.values())
    p_max = max(p.abs().max().item() for p in ref_params.values())
    bound = 2 * SGD_LR * clip * tol * g_max + 2 * torch.finfo(torch.float32).eps * p_max
    print(
        f"{model}: max |grad diff| {_max_abs_diff(grads, ref_grads):.3g}, "
        f"max |param diff| {_max_abs_diff(params, ref_params):.3g} (bound {bound:.3g})"
    )
    assert _max_abs_diff(params, ref_params) <= bound


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


def test_two_process_update_equals_one_process_update_on_the_global_batch(runs, model_dirs):
    # Each of the 2 ranks holds 2 of the 4 rows; its loss is normalised by the GLOBAL token
    # count and multiplied by 2, and FSDP averages gradients, so gradients, the clipped SGD
    # update and the parameters must match one process on all 4 rows to float round-off:
    # the same sums split in two, bounded as in tests/numerics.py.
    two, one = runs["two_fsdp2"], runs["one_plain"]
    for model in MODELS:
        _assert_same_sgd_step(two, one, model, model_dirs[model])
        # The loss sums -w log p > 0 (all weights are positive: no cancellation), so its
        # own value is the scale of its terms: within 2 gamma_D of it.
        vocab_size = AutoConfig.from_pretrained(model_dirs[model]).vocab_size
        assert (global_batch(vocab_size)["weights"] > 0).all()
        tol = 2 * gamma(_depth(model_dirs[model]))
        one_result = one["ranks"][0]["models"][model]
        for result in two["ranks"]:
            assert result["models"][model]["loss_global"] == pytest.approx(
                one_result["loss_global"], rel=tol
            )


def test_clip_grad_norm_returns_the_same_global_norm_on_every_rank(runs, model_dirs):
    for model in MODELS:
        norms = [r["models"][model]["grad_norm"] for r in runs["two_fsdp2"]["ranks"]]
        single = runs["one_plain"]["ranks"][0]["models"][model]["grad_norm"]
        # Both ranks add the same two partial sums (a + b = b + a exactly in IEEE
        # arithmetic): the same value on both, on any CPU.
        assert norms[0] == norms[1]
        # |norm(g1) - norm(g2)| <= norm(g1 - g2): the gradients' rounding, 2 gamma_D.
        assert norms[0] == pytest.approx(single, rel=2 * gamma(_depth(model_dirs[model])))
        assert norms[0] > CLIP_NORM  # so the clip really scaled the update


def test_forced_fsdp2_with_activation_checkpointing_on_one_process_equals_plain(runs, model_dirs):
    # The same arithmetic on a one-rank mesh (its all-gather and reduce-scatter are copies);
    # the recomputed layers repeat the same ops. Bitwise equal on AVX2, but not asserted:
    # FSDP2's unsharded parameters are fresh 64-byte-aligned buffers, the plain model's
    # (loaded from safetensors) sit 32 bytes off that, and MKL's matmuls may split their
    # sums by operand alignment (Intel documents results that depend on alignment unless
    # its conditional-numerical-reproducibility mode is on) - 64 bytes is AVX-512's width.
    one_fsdp2, one_plain = runs["one_fsdp2"], runs["one_plain"]
    result = one_fsdp2["ranks"][0]
    assert result["is_sharded"] and result["distributed_type"] == "DistributedType.FSDP"
    for model in MODELS:
        assert result["models"][model]["sharding"]["mesh_sizes"] == [1]
        assert result["models"][model]["checkpoint_wrapped_layers"] == 2  # both decoder layers
        assert one_plain["ranks"][0]["models"][model]["checkpoint_wrapped_layers"] == 0
        _assert_same_sgd_step(one_fsdp2, one_plain, model, model_dirs[model])


@pytest.mark.parametrize("run_name", ["two_fsdp2", "one_plain", "one_fsdp2"])
def test_resume_from_sharded_checkpoint_continues_bitwise(runs, run_name):
    # Bitwise on any CPU: straight and resumed models are built the same way (same
    # allocations, same sharding), the checkpoint copies values into them in place, and
    # the later steps run the same ops on the same shapes in the same processes.
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
    # synced_gpus=True lets rank 0 keep joining the layers' all-gathers. The two forwards
    # need not round alike (other parameter buffers), but greedy choices only differ at a
    # near-tie: these tiny models' top-2 logit gaps on these prompts are >= 4e-3, rounding
    # ~1e-6.
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
                assert facts["shared_prefix"] == facts["shared_prefix_expected"]
                if result["process_index"] == 0:
                    assert all(len(r) == 1 for r in facts["stopping"] + facts["shared_prefix"])
                    assert facts["idle"] == []
                else:
                    assert all(len(r) == 6 for r in facts["stopping"] + facts["idle"])
                    assert all(len(r) == 6 for r in facts["shared_prefix"])


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
            assert export["max_abs_diff_vs_full_state_dict"] == 0.0  # copies: bitwise


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
