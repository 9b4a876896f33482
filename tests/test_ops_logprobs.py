"""Fused, chunked log-prob + entropy equals the naive log_softmax + gather (CPU)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.kernels.naive_logprobs import naive_linear_logprobs
from rlkit.ops import logprobs_and_entropy_from_logits, token_logprobs_and_entropy


def _naive(hidden, weight, labels, temperature, bias=None):
    """Reference: full logits, log_softmax, gather; entropy = -sum p log p."""
    h = hidden.reshape(-1, hidden.shape[-1])
    lp, ent = naive_linear_logprobs(
        h, weight, bias, labels.reshape(-1), temperature=temperature, compute_entropy=True
    )
    return lp.reshape(labels.shape), ent.reshape(labels.shape)


def _problem(n, v, h, dtype, seed, with_bias=False, lead=None):
    gen = torch.Generator().manual_seed(seed)
    shape = (n,) if lead is None else lead
    hidden = torch.randn(*shape, h, generator=gen, dtype=dtype).requires_grad_()
    weight = torch.randn(v, h, generator=gen, dtype=dtype).requires_grad_()
    bias = torch.randn(v, generator=gen, dtype=dtype).requires_grad_() if with_bias else None
    labels = torch.randint(0, v, shape, generator=gen)
    grad_lp = torch.randn(shape, generator=gen, dtype=dtype)
    grad_ent = torch.randn(shape, generator=gen, dtype=dtype)
    return hidden, weight, bias, labels, grad_lp, grad_ent


def _values_and_grads(fn, hidden, weight, bias, labels, grad_lp, grad_ent):
    lp, ent = fn()
    params = [hidden, weight] + ([bias] if bias is not None else [])
    grads = torch.autograd.grad((lp * grad_lp).sum() + (ent * grad_ent).sum(), params)
    return lp.detach(), ent.detach(), grads


def _logit_scale(hidden, weight, bias, temperature) -> float:
    """M: the largest magnitude of the terms of a logit, max_j (sum_i |h_i w_ji| + |b_j|) / T."""
    with torch.no_grad():
        terms = hidden.abs() @ weight.abs().T
        if bias is not None:
            terms = terms + bias.abs()
        return terms.max().item() / temperature


def _compare(dtype, tol, n, v, h, chunk, temperature, with_bias, seed, per_logit_scale=False):
    hidden, weight, bias, labels, g_lp, g_ent = _problem(n, v, h, dtype, seed, with_bias)
    if per_logit_scale:
        tol = tol * (1 + _logit_scale(hidden, weight, bias, temperature))

    def fused():
        return token_logprobs_and_entropy(
            hidden, weight, labels, temperature=temperature, chunk_size=chunk, lm_head_bias=bias
        )

    def naive():
        return _naive(hidden, weight, labels, temperature, bias)

    got = _values_and_grads(fused, hidden, weight, bias, labels, g_lp, g_ent)
    want = _values_and_grads(naive, hidden, weight, bias, labels, g_lp, g_ent)
    torch.testing.assert_close(got[0], want[0], rtol=tol, atol=tol)
    torch.testing.assert_close(got[1], want[1], rtol=tol, atol=tol)
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    v=st.integers(2, 40),
    h=st.integers(1, 12),
    chunk=st.integers(1, 64),
    temperature=st.floats(0.25, 4.0),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fused_matches_naive_values_and_grads_float64_to_1e10(
    n, v, h, chunk, temperature, with_bias, seed
):
    _compare(torch.float64, 1e-10, n, v, h, chunk, temperature, with_bias, seed)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 40),
    v=st.integers(2, 40),
    h=st.integers(1, 12),
    chunk=st.integers(1, 64),
    temperature=st.floats(0.25, 4.0),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fused_matches_naive_values_and_grads_float32_to_1e5(
    n, v, h, chunk, temperature, with_bias, seed
):
    # 1e-5 per unit of logit size: a float32 logit is off by up to gamma_{h+1} (u = 2^-24,
    # h <= 12) of its terms' magnitude M (_logit_scale), the log-sum-exp over v <= 40 adds
    # gamma_v of M + log v, and log-probs, entropies and their gradients inherit absolute
    # errors proportional to 1 + M: 2 gamma_{h+v+32} (1 + M) ~ 1e-5 (1 + M). A fixed 1e-5
    # failed 3 in 8,000 random cases (temperature ~0.3: M ~ 30 while log p ~ 0); scaled,
    # the worst of 8,000 reached 0.08 of it, with AVX2 and scalar kernels.
    _compare(
        torch.float32, 1e-5, n, v, h, chunk, temperature, with_bias, seed, per_logit_scale=True
    )


@pytest.mark.parametrize("chunk", [1, 3, 4, 10, 11, 1024])
def test_tokens_not_divisible_by_chunk_and_temperature_not_one(chunk):
    # 10 tokens in chunks of 3 and 4 leave partial last chunks; T = 0.6.
    _compare(torch.float64, 1e-10, 10, 23, 5, chunk, 0.6, True, seed=7)


def test_hand_computed_two_token_vocabulary():
    # hidden = [1], W = [[0], [2 ln 3]], T = 2 -> z = [0, ln 3] -> p = [1/4, 3/4].
    # log p(1) = ln(3/4) = -0.2876821; H = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.5623351.
    hidden = torch.tensor([[1.0]], dtype=torch.float64, requires_grad=True)
    weight = torch.tensor([[0.0], [2 * math.log(3.0)]], dtype=torch.float64)
    lp, ent = token_logprobs_and_entropy(hidden, weight, torch.tensor([1]), temperature=2.0)
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-12)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-12)
    # d log p(1)/dz = onehot - p = [-1/4, 1/4]; dz/dh = W^T / T = [0, ln 3]
    # -> d log p(1)/dh = 1/4 * ln 3 = 0.2746531.
    (grad,) = torch.autograd.grad(lp.sum(), hidden)
    assert grad.item() == pytest.approx(0.25 * math.log(3.0), abs=1e-12)


def test_uniform_logits_give_log_vocab_entropy():
    # All-zero weight -> uniform over V = 8: log p = -ln 8, H = ln 8 = 2.0794415.
    hidden = torch.randn(5, 3, dtype=torch.float64)
    lp, ent = token_logprobs_and_entropy(
        hidden, torch.zeros(8, 3, dtype=torch.float64), torch.arange(5)
    )
    torch.testing.assert_close(lp, torch.full((5,), -math.log(8), dtype=torch.float64))
    torch.testing.assert_close(ent, torch.full((5,), math.log(8), dtype=torch.float64))


def test_batch_by_time_shape_is_preserved():
    hidden, weight, _, labels, _, _ = _problem(0, 17, 4, torch.float64, 3, lead=(2, 5))
    lp, ent = token_logprobs_and_entropy(hidden, weight, labels, chunk_size=3)
    want_lp, want_ent = _naive(hidden, weight, labels, 1.0)
    assert lp.shape == ent.shape == (2, 5)
    torch.testing.assert_close(lp, want_lp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ent, want_ent, rtol=1e-12, atol=1e-12)


def test_gradient_of_log_probs_alone_and_of_entropy_alone():
    hidden, weight, _, labels, _, _ = _problem(9, 13, 4, torch.float64, 5)
    for pick in (0, 1):
        got = torch.autograd.grad(
            token_logprobs_and_entropy(hidden, weight, labels, chunk_size=4)[pick].sum(),
            [hidden, weight],
        )
        want = torch.autograd.grad(
            _naive(hidden, weight, labels, 1.0)[pick].sum(), [hidden, weight]
        )
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


def test_compute_entropy_false_returns_none_and_same_log_prob_grads():
    hidden, weight, _, labels, _, _ = _problem(7, 11, 3, torch.float64, 2)
    lp, ent = token_logprobs_and_entropy(hidden, weight, labels, compute_entropy=False)
    assert ent is None
    got = torch.autograd.grad(lp.sum(), [hidden, weight])
    want = torch.autograd.grad(_naive(hidden, weight, labels, 1.0)[0].sum(), [hidden, weight])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


def test_frozen_head_gets_no_gradient_and_no_grad_mode_builds_no_graph():
    hidden, weight, _, labels, _, _ = _problem(6, 9, 3, torch.float64, 4)
    frozen = weight.detach()
    lp, ent = token_logprobs_and_entropy(hidden, frozen, labels, chunk_size=2)
    (lp.sum() + ent.sum()).backward()
    assert frozen.grad is None and hidden.grad is not None
    with torch.no_grad():
        lp, ent = token_logprobs_and_entropy(hidden, weight, labels)
    assert lp.grad_fn is None and ent.grad_fn is None


def test_bfloat16_inputs_give_float32_outputs_close_to_naive():
    hidden, weight, _, labels, g_lp, g_ent = _problem(12, 50, 16, torch.bfloat16, 9)
    got = _values_and_grads(
        lambda: token_logprobs_and_entropy(hidden, weight, labels, chunk_size=5),
        hidden, weight, None, labels, g_lp.float(), g_ent.float(),
    )  # fmt: skip
    want = _values_and_grads(
        lambda: _naive(hidden, weight, labels, 1.0),
        hidden, weight, None, labels, g_lp.float(), g_ent.float(),
    )  # fmt: skip
    assert got[0].dtype == torch.float32 and got[2][1].dtype == torch.bfloat16
    torch.testing.assert_close(got[0], want[0], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(got[1], want[1], rtol=1e-3, atol=1e-3)
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=2e-2)


def _saved_numels(fn):
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sizes


def test_autograd_saves_no_tokens_by_vocab_tensor():
    # N = 64 tokens, V = 1000, H = 8: any saved (N x V) tensor has 64,000 elements,
    # while the inputs are at most V x H = 8,000.
    hidden, weight, _, labels, _, _ = _problem(64, 1000, 8, torch.float32, 1)
    fused = _saved_numels(lambda: token_logprobs_and_entropy(hidden, weight, labels, chunk_size=16))
    naive = _saved_numels(lambda: _naive(hidden, weight, labels, 1.0))
    assert max(fused) <= 8_000
    assert max(naive) >= 64_000  # the check can tell the difference


def test_explicit_kernel_choice_is_honoured():
    # 5 tokens x 7 vocab = 35 elements: only the naive kernel saves such a tensor
    # (the inputs are 5 x 3 and 7 x 3).
    hidden, weight, _, labels, _, _ = _problem(5, 7, 3, torch.float64, 8)
    for kernel, saves_logits in (("naive", True), ("chunked", False)):
        sizes = _saved_numels(
            lambda k=kernel: token_logprobs_and_entropy(hidden, weight, labels, kernel=k)
        )
        assert (35 in sizes) == saves_logits, kernel
    naive = token_logprobs_and_entropy(hidden, weight, labels, kernel="naive")
    fused = token_logprobs_and_entropy(hidden, weight, labels, kernel="chunked")
    torch.testing.assert_close(naive[0], fused[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(labels=torch.tensor([0, -100, 2])), "-100"),
        (dict(labels=torch.tensor([0, 1, 7])), r"\[0, 7\)"),
        (dict(labels=torch.tensor([0.0, 1.0, 2.0])), "integer"),
        (dict(labels=torch.tensor([0, 1])), "leading shape"),
        (dict(weight=torch.zeros(4, 7)), "out, in"),
        (dict(weight=torch.zeros(7, 4, dtype=torch.float64)), "share dtype"),
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(bias=torch.zeros(3)), "lm_head_bias"),
    ],
)
def test_bad_input_raises_clear_error(change, message):
    args = dict(
        hidden=torch.zeros(3, 4),
        weight=torch.zeros(7, 4),
        labels=torch.tensor([0, 1, 2]),
        temperature=1.0,
        chunk_size=2,
        bias=None,
    )
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=message):
        token_logprobs_and_entropy(
            args["hidden"],
            args["weight"],
            args["labels"],
            temperature=args["temperature"],
            chunk_size=args["chunk_size"],
            lm_head_bias=args["bias"],
        )


# -- the variant from logits ---------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 30),
    v=st.integers(2, 30),
    chunk=st.integers(1, 40),
    temperature=st.floats(0.25, 4.0),
    seed=st.integers(0, 2**16),
)
def test_from_logits_matches_log_softmax_gather_float64(n, v, chunk, temperature, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(n, v, generator=gen, dtype=torch.float64)).requires_grad_()
    labels = torch.randint(0, v, (n,), generator=gen)
    g_lp, g_ent = (
        torch.randn(n, generator=gen, dtype=torch.float64),
        torch.randn(n, generator=gen, dtype=torch.float64),
    )
    lp, ent = logprobs_and_entropy_from_logits(
        logits, labels, temperature=temperature, chunk_size=chunk
    )
    log_probs = (logits / temperature).log_softmax(-1)
    want_lp = log_probs.gather(-1, labels[:, None]).squeeze(-1)
    want_ent = -(log_probs.exp() * log_probs).sum(-1)
    torch.testing.assert_close(lp, want_lp, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ent, want_ent, rtol=1e-10, atol=1e-10)
    (got,) = torch.autograd.grad((lp * g_lp + ent * g_ent).sum(), logits)
    (want,) = torch.autograd.grad((want_lp * g_lp + want_ent * g_ent).sum(), logits)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_from_logits_hand_computed_row():
    # logits [0, ln 3] -> p = [1/4, 3/4]; label 0: log p = ln(1/4) = -1.3862944.
    logits = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64)
    lp, ent = logprobs_and_entropy_from_logits(logits, torch.tensor([0]))
    assert lp.item() == pytest.approx(math.log(0.25), abs=1e-12)
    assert ent.item() == pytest.approx(0.5623351446188083, abs=1e-12)


def test_from_logits_masked_vocabulary_is_finite():
    # Row 0: logits [0, 0, -inf] -> p = [1/2, 1/2, 0]: H = ln 2, log p(0) = -ln 2.
    # Row 1: every logit -inf (no distribution): H = 0, label log-prob -inf, no NaN.
    logits = torch.tensor(
        [[0.0, 0.0, -math.inf], [-math.inf, -math.inf, -math.inf]], requires_grad=True
    )
    lp, ent = logprobs_and_entropy_from_logits(logits, torch.tensor([0, 1]))
    assert lp[0].item() == pytest.approx(-math.log(2), abs=1e-6)
    assert ent[0].item() == pytest.approx(math.log(2), abs=1e-6)
    assert ent[1].item() == 0.0 and lp[1].item() == -math.inf
    (grad,) = torch.autograd.grad(lp[0] + ent.sum(), logits)
    assert torch.isfinite(grad).all()
    # d log p(0)/dz = onehot - p = [1/2, -1/2, 0]; dH/dz = -p (log p + H) = [0, 0, 0].
    torch.testing.assert_close(grad[0], torch.tensor([0.5, -0.5, 0.0]))


def test_from_logits_rejects_bad_labels():
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        logprobs_and_entropy_from_logits(torch.zeros(2, 3), torch.tensor([0, 3]))


def test_non_contiguous_hidden_view_gives_same_values_and_grads():
    # hidden = every other column block of a wider tensor: rows have stride 2H.
    gen = torch.Generator().manual_seed(11)
    wide = torch.randn(9, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 4, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 13, (9,), generator=gen)
    lp, ent = token_logprobs_and_entropy(wide[:, :4], weight, labels, chunk_size=4)
    (got,) = torch.autograd.grad(lp.sum() + ent.sum(), wide)
    want_lp, want_ent = _naive(wide[:, :4], weight, labels, 1.0)
    (want,) = torch.autograd.grad(want_lp.sum() + want_ent.sum(), wide)
    torch.testing.assert_close(lp, want_lp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_masked_logits_give_finite_gradients_equal_to_the_unmasked_vocabulary():
    # A -inf logit is not in the distribution: the statistics and their gradients are those
    # of the vocabulary without it, and its own gradient is 0, also for an entropy
    # gradient larger than 1 (which once overflowed the floor of log p to inf * 0 = NaN).
    torch.manual_seed(0)
    kept = (torch.randn(5, 6) * 4).requires_grad_(True)
    masked = torch.cat([kept.detach(), torch.full((5, 3), float("-inf"))], dim=1)
    masked.requires_grad_(True)
    labels = torch.tensor([0, 1, 2, 3, 5])
    g_logp, g_entropy = torch.randn(5) * 10, torch.randn(5) * 10
    for logits in (kept, masked):
        log_p, entropy = logprobs_and_entropy_from_logits(logits, labels)
        ((log_p * g_logp).sum() + (entropy * g_entropy).sum()).backward()
    assert torch.isfinite(masked.grad).all()
    assert torch.equal(masked.grad[:, 6:], torch.zeros(5, 3))
    torch.testing.assert_close(masked.grad[:, :6], kept.grad)
