"""Linear layers on weights packed once for oneDNN give the plain layers' results."""

from contextlib import contextmanager

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlkit.kernels.packed_linear import SMALLEST_PACKED, can_pack, packed_linears, packs_exactly
from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.base import SamplingParams
from tests.numerics import U32

needs_bf16 = pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="oneDNN has no bf16 kernels on this CPU (packing then leaves bf16 layers plain)",
)


class LocalWeights:
    """A single-process PolicyWeights whose context is an autocast region, as the
    trainer's is under mixed precision."""

    version = 0

    def __init__(self, model, autocast: bool) -> None:
        self.model, self.autocast = model, autocast

    @contextmanager
    def generation_context(self):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            yield self.model, {}


def _layer(bias: bool = True, dtype: torch.dtype = torch.float32) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(256, 512, bias=bias).to(dtype)  # 2^17 entries: packed in float32 too


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random Qwen2 whose MLP weights (128 x 1024) are packed in float32 and bf16, its
    q/o weights (128 x 128) in bf16 only, its k/v weights (128 x 64) never."""
    from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer

    out = tmp_path_factory.mktemp("packable_qwen2")
    return build_tiny_qwen2(out, train_byte_tokenizer(), hidden_size=128, intermediate_size=1024)


def _packed_count(model_dir, autocast: bool, exact_only: bool = False) -> int:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return sum(can_pack(m, exact_only=exact_only) for m in model.modules())


def _rollout(model_dir, linear_weights: str, autocast: bool, loop: str = "rlkit"):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = ROLLOUT_ENGINES.get("hf")(
        tokenizer=tok,
        weights=LocalWeights(model, autocast),
        decode_loop=loop,
        linear_weights=linear_weights,
    )
    prompts = [tok(t).input_ids for t in ["12+3=", "45+67=", "9*9="]]
    torch.manual_seed(0)
    return engine.generate(prompts, SamplingParams(max_new_tokens=8, n=3, temperature=1.0))


@needs_bf16
@pytest.mark.parametrize("loop", ["rlkit", "generate"])
def test_bf16_rollouts_are_bitwise_the_plain_ones(model_dir, loop):
    # Under autocast the packed product is oneDNN's bf16 kernel on the same blocked
    # weight that F.linear reorders at every call: same tokens, same float log-probs.
    # (Where this CPU's packed kernel sums in another order, "auto" packs nothing.)
    exact = packs_exactly(torch.bfloat16)
    layers = 2 * 5 + 1  # q, o, gate, up, down per layer; the head
    assert _packed_count(model_dir, autocast=True, exact_only=True) == (layers if exact else 0)
    plain = _rollout(model_dir, "plain", autocast=True, loop=loop)
    for option in ("auto", "packed") if exact else ("auto",):
        packed = _rollout(model_dir, option, autocast=True, loop=loop)
        assert packed.response_ids == plain.response_ids
        assert packed.rollout_log_probs == plain.rollout_log_probs


def test_float32_rollouts_agree_with_the_plain_ones_to_rounding(model_dir):
    # Another float32 kernel sums in another order. A log-prob is a difference of logits
    # whose longest sum runs over the intermediate width (1,024 terms, 2 layers deep, then
    # the head's 128): about 2,200 roundings of u = 2^-24 relative to logits of size ~1,
    # i.e. ~1.3e-4 in the worst case (a random walk: ~50x less); tokens stay the same
    # unless a uniform lands within that distance of a CDF step (seeded here, it does not).
    assert _packed_count(model_dir, autocast=False) == 2 * 3  # gate, up, down
    plain = _rollout(model_dir, "plain", autocast=False)
    packed = _rollout(model_dir, "packed", autocast=False)
    assert packed.response_ids == plain.response_ids
    assert packed.rollout_log_probs != plain.rollout_log_probs  # rounded differently
    bound = 2 * 2200 * U32
    for a, b in zip(packed.rollout_log_probs, plain.rollout_log_probs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=bound, rtol=0)


def test_float32_rollouts_are_left_plain_by_default(model_dir):
    # "auto" packs only where results stay bitwise the same: no float32 layer.
    assert _packed_count(model_dir, autocast=False, exact_only=True) == 0
    plain = _rollout(model_dir, "plain", autocast=False)
    default = _rollout(model_dir, "auto", autocast=False)
    assert default.response_ids == plain.response_ids
    assert default.rollout_log_probs == plain.rollout_log_probs


@needs_bf16
@pytest.mark.parametrize("bias", [True, False])
def test_a_packed_layer_under_autocast_is_bitwise_f_linear(bias):
    layer = _layer(bias)
    x = torch.randn(2, 7, 256)  # float32 in: autocast casts it, as F.linear's does
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = layer(x)
        with packed_linears(layer) as packed:
            got = layer(x)
        with packed_linears(layer, exact_only=True) as packed_exactly:
            exact = layer(x)
    assert packed == 1 and packed_exactly == int(packs_exactly(torch.bfloat16))
    assert got.dtype == exact.dtype == torch.bfloat16
    assert torch.equal(exact, expected)
    # Packed whatever the order of the sums: each output is a 256-term float32 sum rounded
    # once to bf16 (8 significant bits), so another order moves it by one rounding at most.
    scale = expected.float().abs().max()
    torch.testing.assert_close(got.float(), expected.float(), rtol=2**-7, atol=2**-7 * scale)


def test_a_packed_float32_layer_agrees_with_f_linear_to_rounding():
    layer = _layer()
    x = torch.randn(64, 256)
    with torch.no_grad():
        expected = layer(x)
        with packed_linears(layer):
            got = layer(x)
    # 256 products summed, plus the bias: at most 257 roundings of the terms' size, each way.
    scale = (x.abs() @ layer.weight.abs().T + layer.bias.abs()).max()
    assert (got - expected).abs().max() <= 2 * 257 * U32 * scale


def test_layers_run_plain_again_after_the_context_even_on_error():
    model = nn.Sequential(_layer(), nn.ReLU(), nn.Linear(512, 256))
    with pytest.raises(RuntimeError, match="boom"), packed_linears(model) as packed:
        assert packed == 2
        assert all("forward" in vars(m) for m in (model[0], model[2]))
        raise RuntimeError("boom")
    assert not any("forward" in vars(m) for m in model.modules())


def test_calls_the_packed_weight_cannot_serve_exactly_run_f_linear():
    layer = _layer()
    x = torch.randn(7, 2, 256).transpose(0, 1)  # strided: F.linear rounds it its own way
    with packed_linears(layer):
        with torch.no_grad():
            assert torch.equal(layer(x), nn.functional.linear(x, layer.weight, layer.bias))
        # Gradients on: the packed product has no backward, the plain one runs.
        y = layer(torch.randn(3, 256))
        y.sum().backward()
    assert layer.weight.grad is not None
    # Autocast switched on after packing in float32: F.linear under autocast runs.
    with packed_linears(layer), torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(torch.randn(3, 256)).dtype == torch.bfloat16
    # Packed under bf16 autocast, called under fp16 autocast: F.linear computes in fp16.
    bf16, fp16 = (torch.autocast("cpu", dtype=d) for d in (torch.bfloat16, torch.float16))
    with torch.no_grad(), bf16, packed_linears(layer), fp16:  # entered left to right
        assert layer(torch.randn(3, 256)).dtype == torch.float16


def test_float32_never_counts_as_exact():
    assert not packs_exactly(torch.float32)  # MKL's F.linear and oneDNN sum differently
    assert not can_pack(_layer(), exact_only=True)
    assert can_pack(_layer())


def test_layers_that_cannot_be_packed_are_left_alone():
    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    half = _layer(dtype=torch.float16)
    small = nn.Linear(255, 512)  # one entry-row short of SMALLEST_PACKED in float32
    model = nn.Sequential(half, Scaled(256, 512), small)
    assert not can_pack(half)  # oneDNN packs float32 and bf16 only
    assert not can_pack(model[1])  # its own forward would be skipped
    assert small.weight.numel() < SMALLEST_PACKED[torch.float32]
    assert not can_pack(small)  # F.linear is faster at this size
    with packed_linears(model) as packed:
        assert packed == 0


def test_a_model_sharded_by_fsdp_is_left_plain():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = nn.Sequential(_layer(), nn.ReLU(), nn.Linear(512, 256))
        fully_shard(model[0], mesh=init_device_mesh("cpu", (1,)))
        assert can_pack(model[2])  # the layer alone would be packed
        with packed_linears(model) as packed:
            assert packed == 0
        assert not any("forward" in vars(m) for m in model.modules())
    finally:
        dist.destroy_process_group()


def test_an_unknown_linear_weights_option_lists_the_known_ones(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    known = r"'auto', 'packed', 'plain'"
    with pytest.raises(ValueError, match=rf"unknown linear_weights 'fast'.*{known}"):
        ROLLOUT_ENGINES.get("hf")(tokenizer=tok, weights=None, linear_weights="fast")
