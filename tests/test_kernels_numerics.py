"""Each CPU-runnable kernel equals the Hugging Face code it replaces (forward and backward)."""

import math

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config, Qwen3Config
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP, Qwen2RMSNorm, Qwen2RotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm

from rlkit.kernels.rms_norm import hf_rms_norm, torch_lean_rms_norm
from rlkit.kernels.rotary import hf_rotary
from rlkit.kernels.swiglu import hf_swiglu, torch_lean_swiglu
from tests.numerics import assert_gradients_close


def _forward_backward(fn, inputs, params):
    """Output and gradients w.r.t. inputs and params for a fixed random upstream gradient."""
    out = fn(*inputs)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    grads = torch.autograd.grad((out * upstream).sum(), [*inputs, *params])
    return out.detach(), grads


def _random_rms_norm(cls, size, dtype):
    norm = cls(size, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(size))
    return norm


@pytest.mark.parametrize("cls", [Qwen2RMSNorm, Qwen3RMSNorm, LlamaRMSNorm])
# (B, S, H), and (B, S, heads, head_dim) as Qwen3's q_norm / k_norm see it.
@pytest.mark.parametrize("shape", [(3, 5, 16), (2, 4, 3, 8)])
def test_lean_rms_norm_matches_hf_forward_and_backward_float32(cls, shape):
    torch.manual_seed(0)
    norm = _random_rms_norm(cls, shape[-1], torch.float32)
    x = torch.randn(shape, requires_grad=True)
    got = _forward_backward(lambda t: torch_lean_rms_norm(norm, t), [x], [norm.weight])
    want = _forward_backward(lambda t: norm(t), [x], [norm.weight])
    # Forward: the same float32 ops on the same shapes as HF's, so bitwise on any CPU.
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    # Backward: an analytic formula against autograd's chain, other sums. The longest chain
    # of sums is the mean over the hidden size then the weight gradient's sum over rows:
    # within 2 gamma_D of each gradient's largest element (tests/numerics.py; measured
    # <= 2e-7 of it). A fixed rtol 1e-5 / atol 1e-6 came within 5x on scalar kernels.
    rows = x.numel() // shape[-1]
    depth = shape[-1] + rows + 4
    assert_gradients_close(dict(enumerate(got[1])), dict(enumerate(want[1])), depth=depth)


def test_lean_rms_norm_matches_hf_in_bfloat16():
    torch.manual_seed(1)
    norm = _random_rms_norm(Qwen2RMSNorm, 32, torch.bfloat16)
    x = torch.randn(4, 6, 32, dtype=torch.bfloat16, requires_grad=True)
    got = _forward_backward(lambda t: torch_lean_rms_norm(norm, t), [x], [norm.weight])
    want = _forward_backward(lambda t: norm(t), [x], [norm.weight])
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    for g, w in zip(got[1], want[1]):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=2e-2)


def test_lean_rms_norm_hand_computed():
    # x = [3, 4]: mean(x^2) = 12.5, rms = 3.5355339; x / rms = [0.8485281, 1.1313708];
    # with w = [1, 2]: y = [0.8485281, 2.2627417] (eps = 1e-6 changes the 7th digit).
    norm = Qwen2RMSNorm(2, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0]))
    y = torch_lean_rms_norm(norm, torch.tensor([[3.0, 4.0]]))
    torch.testing.assert_close(y, torch.tensor([[0.8485281, 2.2627417]]), rtol=1e-6, atol=1e-6)


def test_hf_rms_norm_kernel_is_the_module_forward():
    norm = _random_rms_norm(Qwen2RMSNorm, 8, torch.float32)
    x = torch.randn(2, 8)
    assert torch.equal(hf_rms_norm(norm, x), norm(x))


def _mlp(cls, config_cls, dtype):
    config = config_cls(
        hidden_size=16, intermediate_size=24, hidden_act="silu", num_attention_heads=4
    )
    return cls(config).to(dtype)


@pytest.mark.parametrize(("cls", "config_cls"), [(Qwen2MLP, Qwen2Config), (Qwen3MLP, Qwen3Config)])
def test_lean_swiglu_matches_hf_mlp_float64(cls, config_cls):
    torch.manual_seed(2)
    mlp = _mlp(cls, config_cls, torch.float64)
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    params = list(mlp.parameters())
    got = _forward_backward(lambda t: torch_lean_swiglu(mlp, t), [x], params)
    want = _forward_backward(lambda t: mlp(t), [x], params)
    torch.testing.assert_close(got[0], want[0], rtol=1e-12, atol=1e-12)
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_lean_swiglu_matches_llama_mlp_with_bias_float32():
    torch.manual_seed(3)
    from transformers.models.llama.modeling_llama import LlamaMLP

    mlp = LlamaMLP(
        LlamaConfig(hidden_size=16, intermediate_size=24, mlp_bias=True, num_attention_heads=4)
    )
    x = torch.randn(4, 16, requires_grad=True)
    params = list(mlp.parameters())
    got = _forward_backward(lambda t: torch_lean_swiglu(mlp, t), [x], params)
    want = _forward_backward(lambda t: mlp(t), [x], params)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-6)
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_lean_swiglu_hand_computed_activation():
    # Identity projections of width 1: out = silu(x) * x.
    # x = 1: silu(1) = 1 / (1 + e^-1) = 0.7310586 -> out = 0.7310586;
    # d/dx [silu(x) x] = silu(x) + x * s (1 + x (1 - s)) at s = 0.7310586:
    #   0.7310586 + 0.7310586 * (1 + 0.2689414) = 1.6587155.
    mlp = _mlp(Qwen2MLP, Qwen2Config, torch.float64)
    mlp.gate_proj = mlp.up_proj = mlp.down_proj = torch.nn.Identity()
    x = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    out = torch_lean_swiglu(mlp, x)
    (grad,) = torch.autograd.grad(out.sum(), x)
    s = 1 / (1 + math.exp(-1))
    assert out.item() == pytest.approx(s, abs=1e-12)
    assert grad.item() == pytest.approx(s + s * (1 + (1 - s)), abs=1e-12)


def test_hf_swiglu_kernel_is_the_module_forward():
    mlp = _mlp(Qwen2MLP, Qwen2Config, torch.float32)
    x = torch.randn(2, 16)
    assert torch.equal(hf_swiglu(mlp, x), mlp(x))


def test_reference_rotary_matches_hf_apply_rotary_pos_emb():
    torch.manual_seed(4)
    config = Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
    rotary = Qwen2RotaryEmbedding(config)
    q = torch.randn(2, 4, 6, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 6, 8, dtype=torch.float64, requires_grad=True)
    cos, sin = rotary(q, torch.arange(6).expand(2, 6))

    def run(fn):
        q_out, k_out = fn(q, k, cos, sin)
        return _forward_backward(
            lambda a, b: torch.cat([q_out.flatten(), k_out.flatten()]), [q, k], []
        )

    got, want = run(hf_rotary), run(modeling_qwen2.apply_rotary_pos_emb)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
