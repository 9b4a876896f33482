"""apply_kernels patches tiny Qwen2/Qwen3/Llama models in place; logits and grads unchanged."""

import copy

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import rlkit.device
from rlkit.kernels import KernelUnavailableError, apply_kernels, set_overrides
from rlkit.kernels.patching import MLP_CLASSES, RMS_NORM_CLASSES
from rlkit.ops import token_logprobs_and_entropy
from tests.numerics import assert_gradients_close, reduction_depth

_SIZES = dict(
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
)
FAMILIES = {
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**_SIZES)),
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**_SIZES, head_dim=8)),
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**_SIZES)),
}
LEAN = {"rms_norm": "torch_lean", "swiglu": "torch_lean", "attention": "eager"}


@pytest.fixture(autouse=True)
def _clean_state():
    rlkit.device.reset()
    set_overrides(None)
    yield
    set_overrides(None)


def _model(family, seed=0):
    torch.manual_seed(seed)
    model = FAMILIES[family]()
    model.eval()  # no dropout, so two forwards are comparable
    return model


def _batch(seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (2, 7), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding in the second row
    return ids, mask


def _logits_and_grads(model):
    ids, mask = _batch()
    logits = model(input_ids=ids, attention_mask=mask).logits
    upstream = torch.randn(logits.shape, generator=torch.Generator().manual_seed(2))
    loss = (logits * upstream * mask[..., None]).sum()
    grads = torch.autograd.grad(loss, [p for p in model.parameters()])
    return logits.detach(), grads


def _instance_forwards(model, classes):
    return [
        m
        for m in model.modules()
        if (type(m).__module__, type(m).__name__) in classes and "forward" in m.__dict__
    ]


def _assert_same_gradients(model, got, want):
    # Other kernels, other float32 rounding: each tensor within 2 gamma_D of its largest
    # element (tests/numerics.py; measured <= 1.2e-6 of it, AVX2 and scalar kernels). An
    # absolute 1e-5 came within 5x of real differences (gradients up to ~40 here).
    names = [name for name, _ in model.named_parameters()]
    ids = _batch()[0]
    depth = reduction_depth(model.config, rows=ids.shape[0], positions=ids.shape[1])
    assert_gradients_close(dict(zip(names, got)), dict(zip(names, want)), depth=depth)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_patched_model_gives_same_logits_and_grads(family):
    reference = _model(family)
    reference.set_attn_implementation("eager")
    patched = copy.deepcopy(reference)
    chosen = apply_kernels(patched, overrides=LEAN, platform="cpu")
    assert chosen == {
        "rms_norm": "torch_lean",
        "rotary": "hf",
        "swiglu": "torch_lean",
        "attention": "eager",
        "logprobs": "chunked",
    }
    # Every norm (Qwen3: also q_norm/k_norm) and every MLP got an instance forward;
    # the reference copy did not.
    norms = 2 * 2 + 1 + (2 * 2 if family == "qwen3" else 0)
    assert len(_instance_forwards(patched, RMS_NORM_CLASSES)) == norms
    assert len(_instance_forwards(patched, MLP_CLASSES)) == 2
    assert _instance_forwards(reference, RMS_NORM_CLASSES) == []
    got, want = _logits_and_grads(patched), _logits_and_grads(reference)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    _assert_same_gradients(reference, got[1], want[1])


def test_sdpa_and_eager_attention_agree_with_left_padding_forward_and_backward():
    # float32: HF's eager attention in float64 turns left-padded rows into NaN
    # (transformers 5.19), so the comparison is made where both are defined.
    eager = _model("qwen2")
    eager.set_attn_implementation("eager")
    sdpa = copy.deepcopy(eager)
    assert (
        apply_kernels(sdpa, overrides={"attention": "sdpa"}, platform="cpu")["attention"] == "sdpa"
    )
    assert sdpa.config._attn_implementation == "sdpa"
    got, want = _logits_and_grads(sdpa), _logits_and_grads(eager)
    keep = _batch()[1].bool()  # padded query rows are unused (their gradient is masked too)
    torch.testing.assert_close(got[0][keep], want[0][keep], rtol=1e-5, atol=1e-5)
    _assert_same_gradients(eager, got[1], want[1])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_grouped_head_sdpa_equals_sdpa_with_padding_packing_and_a_kv_cache(family):
    # 4 query heads over 2 key/value heads: transformers' sdpa copies each key/value head
    # twice under a padding mask; grouped_sdpa hands SDPA the 2 heads as they are. The
    # same kernel: forwards measured equal to the bit here; the backward sums a key's
    # gradient over its query heads in another order.
    sdpa = _model(family)
    apply_kernels(sdpa, overrides={"attention": "sdpa"}, platform="cpu")
    grouped = copy.deepcopy(sdpa)
    assert apply_kernels(grouped, platform="cpu")["attention"] == "grouped_sdpa"
    assert grouped.config._attn_implementation == "rlkit_grouped_sdpa"
    (got_logits, got_grads), (want_logits, want_grads) = (
        _logits_and_grads(grouped),
        _logits_and_grads(sdpa),
    )
    keep = _batch()[1].bool()
    torch.testing.assert_close(got_logits[keep], want_logits[keep], rtol=1e-6, atol=1e-6)
    _assert_same_gradients(sdpa, got_grads, want_grads)
    # Rows packed into one sequence (remove-padding): positions restart per row.
    ids, mask = _batch()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    packed = {"input_ids": ids[keep][None], "position_ids": positions[keep][None]}
    torch.testing.assert_close(
        grouped(**packed).logits, sdpa(**packed).logits, rtol=1e-6, atol=1e-6
    )
    # Decoding over a KV cache: one query token against the cache, under the padding mask.
    generated = [
        m.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
        for m in (grouped, sdpa)
    ]
    assert torch.equal(*generated)


def test_default_cpu_choice_patches_nothing():
    model = _model("qwen2")
    chosen = apply_kernels(model)
    assert chosen["rms_norm"] == chosen["swiglu"] == chosen["rotary"] == "hf"
    assert _instance_forwards(model, RMS_NORM_CLASSES | MLP_CLASSES) == []


def test_reapplying_native_kernels_restores_the_class_forward():
    model = _model("llama")
    apply_kernels(model, overrides=LEAN, platform="cpu")
    assert _instance_forwards(model, RMS_NORM_CLASSES)
    apply_kernels(model, overrides=LEAN, platform="cpu")  # idempotent
    apply_kernels(model, overrides={"rms_norm": "hf", "swiglu": "hf"}, platform="cpu")
    assert _instance_forwards(model, RMS_NORM_CLASSES | MLP_CLASSES) == []


def test_gin_style_overrides_apply_to_model_ops():
    model = _model("qwen2")
    set_overrides({"swiglu": "torch_lean"})
    assert apply_kernels(model, platform="cpu")["swiglu"] == "torch_lean"
    assert len(_instance_forwards(model, MLP_CLASSES)) == 2


def test_non_silu_mlp_is_left_alone():
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**_SIZES, hidden_act="gelu"))
    apply_kernels(model, overrides={"swiglu": "torch_lean"}, platform="cpu")
    assert _instance_forwards(model, MLP_CLASSES) == []


def test_logprobs_override_in_apply_kernels_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="token_logprobs_and_entropy"):
        apply_kernels(_model("qwen2"), overrides={"logprobs": "naive"})


def test_unknown_op_and_unavailable_kernel_are_clear_errors():
    with pytest.raises(ValueError, match="model ops: rms_norm, rotary, swiglu, attention"):
        apply_kernels(_model("qwen2"), overrides={"layer_norm": "hf"})
    with pytest.raises(KernelUnavailableError, match="runs only on npu"):
        apply_kernels(_model("qwen2"), overrides={"rms_norm": "npu_rms_norm"}, platform="cpu")


def test_chunked_logprobs_on_model_hidden_states_match_model_logits():
    # What the trainer does: final hidden states + lm_head weight instead of logits.
    model = _model("qwen2").double()
    ids, _ = _batch()
    out = model(input_ids=ids, output_hidden_states=True)
    labels = ids[:, 1:]
    lp, ent = token_logprobs_and_entropy(
        out.hidden_states[-1][:, :-1], model.lm_head.weight, labels, temperature=0.7, chunk_size=4
    )
    log_probs = (out.logits[:, :-1] / 0.7).log_softmax(-1)
    torch.testing.assert_close(lp, log_probs.gather(-1, labels[..., None]).squeeze(-1))
    torch.testing.assert_close(ent, -(log_probs.exp() * log_probs).sum(-1))
    (got,) = torch.autograd.grad(lp.sum() + ent.sum(), model.lm_head.weight, retain_graph=True)
    want_lp = log_probs.gather(-1, labels[..., None]).sum()
    (want,) = torch.autograd.grad(
        want_lp - (log_probs.exp() * log_probs).sum(), model.lm_head.weight
    )
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
