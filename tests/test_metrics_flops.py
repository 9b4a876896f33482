"""Training FLOPs as verl counts them, on a hand-sized config."""

from types import SimpleNamespace

from rlkit.metrics.flops import dense_parameters, training_flops

# hidden 8, 2 heads of 4 (1 kv head), MLP 16, 3 layers, vocabulary 10.
CONFIG = SimpleNamespace(
    hidden_size=8,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=16,
    num_hidden_layers=3,
    vocab_size=10,
)


def test_dense_parameters_count_projections_mlp_embedding_and_head():
    # attention: q 8x8, o 8x8, k 8x4, v 8x4 = 64 + 64 + 32 + 32 = 192
    # mlp: 3 x 8 x 16 = 384; per layer 576, x 3 layers = 1728; + 2 x 10 x 8 = 160
    assert dense_parameters(CONFIG) == 1888


def test_training_flops_add_six_per_parameter_token_and_quadratic_attention():
    # dense: 6 x 1888 x (3 + 5) = 90624
    # attention: 12 x (9 + 25) x head_dim 4 x 2 heads x 3 layers = 9792
    assert training_flops(CONFIG, [3, 5]) == 90624 + 9792


def test_mfu_uses_the_mixed_precision_dtype_not_the_parameters():
    # float32 parameters computed in bf16 have bf16's peak (about 15x fp32's on an H100).
    import torch

    from rlkit.trainer.step_metrics import compute_dtype

    module = torch.nn.Linear(2, 2)  # float32 parameters
    assert compute_dtype("no", module) == torch.float32
    assert compute_dtype("bf16", module) == torch.bfloat16
