"""``benchmarks/scale_memory.py``: its arithmetic on hand-computed cases, and its tables."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import load_benchmark

scale = load_benchmark("scale_memory.py")
QWEN7B = scale.MODELS[0]


def test_fsdp2_on_one_node_is_state_plus_gathered_layer_plus_activations():
    layout = scale.Layout("FSDP2")
    # state 16 B x 7.62e9 / 8 GPUs = 15.24 GB; two bf16 layers 2 x 2 x 7.62e9 / 28 = 1.09 GB;
    # activations (28 x 2 x 3584 + 34 x 3584 x 18944 / 14336) B x 16384 tokens = 5.93 GB.
    expected = 15.24 + 1.0886 + 5.9330
    assert scale.per_gpu_gb(QWEN7B, layout, 8, 16384) == pytest.approx(expected, rel=1e-3)


def test_kv_cache_per_token_follows_grouped_and_latent_attention():
    assert QWEN7B.kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2  # 57,344 B
    deepseek = scale.MODELS[-1]
    assert deepseek.kv_bytes_per_token() == 61 * (512 + 64) * 2  # MLA's latent


def test_tensor_and_sequence_parallelism_divide_the_activations():
    base = scale.per_gpu_gb(QWEN7B, scale.Layout("a"), 16, 16384)
    split = scale.per_gpu_gb(QWEN7B, scale.Layout("b", tp=8, sp=2), 16, 16384)
    acts = QWEN7B.activation_bytes_per_token() * 16384 / 1e9
    gathered = 4 * QWEN7B.layer_params / 1e9
    assert base - split == pytest.approx(acts * (1 - 1 / 16) + gathered * (1 - 1 / 8), rel=1e-6)


def test_the_script_prints_both_hardware_tables(capsys):
    scale.main(["--tokens", "4096"])
    out = capsys.readouterr().out
    assert out.count("## Training memory per GPU") == 2 and "DeepSeek-V3 (671B)" in out
    assert "rlkit runs today: FSDP2, FSDP2 + Ulysses 8, FSDP2 + TP 8." in out
    assert "Qwen2.5-7B 4; Qwen2.5-32B 8;" in out and "(671B) none (MLA: no plan)" in out
