"""PPO's clipped value loss."""

import pytest
import torch

import algorithms
from algorithms.reference import value_loss_loops as loops
from algorithms.value_loss import clipped_value_loss
from rlkit.registry import VALUE_LOSSES, UnknownNameError


def tensors():
    # (v, R, V_old), c = 0.5, band V ± 0.5 = [0.5, 1.5]:
    #  (1, 1.5, 1): v inside            max(0.25, 0.25) = 0.25        dL/dv ∝ 2(v − R) = −1
    #  (2, 1,   1): clip(v) = 1.5       max(1, 0.25)    = 1           ∝ 2(v − R) = 2
    #  (2, 3,   1): clip(v) = 1.5       max(1, 2.25)    = 2.25 (clipped term wins, grad 0)
    v = torch.tensor([[1.0, 2.0, 2.0, 9.0]], dtype=torch.float64, requires_grad=True)
    returns = torch.tensor([[1.5, 1.0, 3.0, 0.0]], dtype=torch.float64)
    values = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])  # the 4th token is padding
    return v, returns, values, mask


def test_clipped_value_loss_by_hand():
    v, returns, values, mask = tensors()
    loss, metrics = algorithms.value_loss(v, returns, values, mask, cliprange_value=0.5)
    # 0.5 · (0.25 + 1 + 2.25) / 3 = 0.583333
    assert loss.item() == pytest.approx(0.5 * 3.5 / 3, rel=1e-12)
    (grad,) = torch.autograd.grad(loss, v)
    # 0.5 · (1/3) · (−1, 2, 0, 0)
    expected = torch.tensor([[-1 / 6, 1 / 3, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected)
    assert metrics["vf_clipfrac"].item() == pytest.approx(1 / 3)
    assert metrics["vpred_mean"].item() == pytest.approx(5 / 3)
    assert not any(m.requires_grad for m in metrics.values())


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "token-sum"])
def test_value_loss_matches_the_loop_reference(mode):
    gen = torch.Generator().manual_seed(0)
    v, returns, values = (torch.randn(3, 5, generator=gen, dtype=torch.float64) for _ in range(3))
    v.requires_grad_()
    mask = torch.rand(3, 5, generator=gen) > 0.3
    loss, metrics = clipped_value_loss(
        v, returns, values, mask, cliprange_value=0.2, loss_agg_mode=mode
    )
    ref, ref_metrics = loops.value_loss(v, returns, values, mask, clip=0.2, mode=mode)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    assert metrics["vf_clipfrac"].item() == pytest.approx(ref_metrics["vf_clipfrac"])


def test_global_normalisers_are_forwarded():
    v, returns, values, mask = tensors()
    loss, _ = algorithms.value_loss(v, returns, values, mask, cliprange_value=0.5, num_tokens=7)
    assert loss.item() == pytest.approx(0.5 * 3.5 / 7, rel=1e-12)


def test_registry_and_errors():
    assert VALUE_LOSSES.get("clipped") is clipped_value_loss
    v, returns, values, mask = tensors()
    with pytest.raises(UnknownNameError):
        algorithms.value_loss(v, returns, values, mask, kind="huber")
    with pytest.raises(ValueError, match="cliprange_value"):
        algorithms.value_loss(v, returns, values, mask, cliprange_value=-1.0)
    with pytest.raises(ValueError, match="one \\(B, T\\) shape"):
        algorithms.value_loss(v, returns[:, :2], values, mask)


def test_empty_batch_gives_zero_not_nan():
    empty = torch.zeros(0, 3, dtype=torch.float64)
    loss, metrics = algorithms.value_loss(empty, empty, empty, empty.bool())
    assert loss.item() == 0.0 and all(torch.isfinite(m) for m in metrics.values())
