"""rlkit's glue around the torch_npu ops, checked on CPU against their documented formulas.

No NPU and no torch_npu exist here. A stand-in ``torch_npu`` module implements
the documented semantics of each op in plain torch (``npu_rms_norm`` returns
``(y, 1/rms)``; ``npu_swiglu`` splits its input in halves A, B and returns
``silu(A) * B``; ``npu_rotary_mul(x, r1, r2) = x * r1 + rotate_half(x) * r2``;
``npu_cross_entropy_loss(..., reduction="none")`` returns ``(-log p(target),
log_softmax, zloss, lse)``). The tests therefore check rlkit's argument order,
concatenation order, tuple indexing and patch installation, NOT the Ascend
kernels, whose numerics were never run.
"""

import copy
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen2 import modeling_qwen2

import rlkit.kernels.availability as availability
from rlkit.device import CPUPlatform
from rlkit.kernels import apply_kernels, choose
from rlkit.kernels.naive_logprobs import naive_linear_logprobs
from rlkit.kernels.rotary import npu_rotary


class FakeNPU(CPUPlatform):
    """Selects the NPU kernels while tensors stay on the CPU."""

    name = "npu"


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _documented_torch_npu():
    mod = types.ModuleType("torch_npu")

    def npu_rms_norm(x, gamma, epsilon=1e-6):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + epsilon)
        return (x.float() * rstd).to(x.dtype) * gamma, rstd

    def npu_swiglu(x, dim=-1):
        a, b = x.chunk(2, dim=dim)
        return F.silu(a) * b

    def npu_rotary_mul(x, r1, r2):
        return x * r1 + _rotate_half(x) * r2

    def npu_cross_entropy_loss(input, target, weight=None, reduction="mean", ignore_index=-100):
        assert reduction == "none"
        log_prob = input.log_softmax(-1)
        loss = -log_prob.gather(-1, target[:, None]).squeeze(-1)
        return loss, log_prob, torch.zeros(()), torch.zeros(())

    for fn in (npu_rms_norm, npu_swiglu, npu_rotary_mul, npu_cross_entropy_loss):
        setattr(mod, fn.__name__, fn)
    return mod


@pytest.fixture
def fake_npu(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", _documented_torch_npu())
    monkeypatch.setattr(availability, "package_available", lambda name: name == "torch_npu")
    return FakeNPU()


_SIZES = dict(
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
)


def _logits_and_grads(model):
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(1))
    logits = model(input_ids=ids).logits
    upstream = torch.randn(logits.shape, generator=torch.Generator().manual_seed(2))
    grads = torch.autograd.grad((logits * upstream).sum(), list(model.parameters()))
    return logits.detach(), grads


@pytest.mark.parametrize(
    "build",
    [
        lambda: Qwen2ForCausalLM(Qwen2Config(**_SIZES)),
        lambda: Qwen3ForCausalLM(Qwen3Config(**_SIZES, head_dim=8)),
    ],
    ids=["qwen2", "qwen3"],
)
def test_npu_glue_patches_model_without_changing_logits_or_grads(fake_npu, build):
    torch.manual_seed(0)
    reference = build().eval()
    reference.set_attn_implementation("eager")
    patched = copy.deepcopy(reference)
    want = _logits_and_grads(reference)  # before the process-wide rotary patch
    modeling = sys.modules[type(patched.model.layers[0].self_attn).__module__]
    original_rotary = modeling.apply_rotary_pos_emb
    try:
        chosen = apply_kernels(patched, overrides={"attention": "eager"}, platform=fake_npu)
        assert chosen["rms_norm"] == "npu_rms_norm"
        assert chosen["swiglu"] == "npu_swiglu"
        assert chosen["rotary"] == "npu_rotary_mul"
        assert chosen["logprobs"] == "npu_cross_entropy"
        assert modeling.apply_rotary_pos_emb is npu_rotary
        got = _logits_and_grads(patched)
    finally:
        apply_kernels(patched, platform="cpu")  # "hf" rotary restores the module function
    assert modeling.apply_rotary_pos_emb is original_rotary
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_rotary_restore_leaves_other_architectures_untouched(fake_npu):
    model = Qwen3ForCausalLM(Qwen3Config(**_SIZES, head_dim=8))
    before = modeling_qwen2.apply_rotary_pos_emb
    try:
        apply_kernels(model, overrides={"attention": "eager"}, platform=fake_npu)
        assert modeling_qwen2.apply_rotary_pos_emb is before  # only Qwen3's module patched
    finally:
        apply_kernels(model, platform="cpu")


def test_npu_cross_entropy_logprobs_glue_matches_naive(fake_npu):
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(11, 6, generator=gen, requires_grad=True)
    weight = torch.randn(19, 6, generator=gen, requires_grad=True)
    labels = torch.randint(0, 19, (11,), generator=gen)
    choice = choose("logprobs", fake_npu)
    assert choice.name == "npu_cross_entropy"
    kwargs = dict(temperature=0.8, chunk_size=4, compute_entropy=True)
    got_lp, got_ent = choice.fn(hidden, weight, None, labels, **kwargs)
    want_lp, want_ent = naive_linear_logprobs(hidden, weight, None, labels, **kwargs)
    torch.testing.assert_close(got_lp, want_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_ent, want_ent, rtol=1e-5, atol=1e-5)
    got = torch.autograd.grad(got_lp.sum() + got_ent.sum(), [hidden, weight])
    want = torch.autograd.grad(want_lp.sum() + want_ent.sum(), [hidden, weight])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
