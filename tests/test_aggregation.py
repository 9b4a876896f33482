"""Loss aggregation modes, normalisers and ``global_normalizers`` (hand-computed)."""

import math

import pytest
import torch

import algorithms
from algorithms.aggregation import aggregate_sequence_loss
from rlkit.registry import AGGREGATIONS, UnknownNameError

NAN = math.nan
# Row 1 is fully masked; NaN sits only on padding and must not leak.
LOSS = [[1.0, 2.0, NAN], [NAN, NAN, NAN], [7.0, 8.0, 9.0]]
MASK = [[1, 1, 0], [0, 0, 0], [1, 1, 1]]


def loss_and_mask(requires_grad=False):
    loss = torch.tensor(LOSS, dtype=torch.float64, requires_grad=requires_grad)
    return loss, torch.tensor(MASK, dtype=torch.bool)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-sum", 27.0),  # 1 + 2 + 7 + 8 + 9
        ("token-mean", 27.0 / 5),  # 5 valid tokens
        ("seq-mean-token-sum", (3.0 + 24.0) / 2),  # 2 non-empty rows
        ("seq-mean-token-mean", (3.0 / 2 + 24.0 / 3) / 2),  # (1.5 + 8) / 2 = 4.75
        ("seq-mean-token-sum-norm", (3.0 + 24.0) / 2 / 3),  # / padded width T = 3
    ],
)
def test_each_mode_by_hand_with_local_normalisers(mode, expected):
    loss, mask = loss_and_mask()
    # rel 1e-8: seq-mean-token-mean divides by n_b + 1e-8, as verl does
    assert algorithms.aggregate_loss(loss, mask, mode).item() == pytest.approx(expected, rel=1e-8)


@pytest.mark.parametrize(
    "mode, normalisers, expected",
    [
        ("token-mean", {"num_tokens": 10}, 2.7),  # 27 / 10
        ("seq-mean-token-sum", {"num_seqs": 4}, 6.75),  # 27 / 4
        ("seq-mean-token-mean", {"num_seqs": 4}, 9.5 / 4),  # (1.5 + 8) / 4
        ("seq-mean-token-sum-norm", {"num_seqs": 4, "norm_length": 10}, 0.675),  # 27/4/10
        ("token-sum", {"num_tokens": 10, "num_seqs": 4}, 27.0),  # no normaliser
    ],
)
def test_global_normalisers_replace_the_local_counts(mode, normalisers, expected):
    loss, mask = loss_and_mask()
    value = algorithms.aggregate_loss(loss, mask, mode, **normalisers)
    assert value.item() == pytest.approx(expected, rel=1e-8)
    tensors = {k: torch.tensor(float(v)) for k, v in normalisers.items()}
    assert algorithms.aggregate_loss(loss, mask, mode, **tensors).item() == value.item()


@pytest.mark.parametrize("mode", AGGREGATIONS.names())
def test_padding_gets_zero_gradient_even_when_it_holds_nan(mode):
    loss, mask = loss_and_mask(requires_grad=True)
    (grad,) = torch.autograd.grad(algorithms.aggregate_loss(loss, mask, mode), loss)
    assert bool(torch.isfinite(grad).all())
    assert bool((grad[~mask] == 0).all())


def test_fractional_masks_weight_tokens():
    # weights (0.5, 1) on a row [2, 4]: token-sum = 1 + 4 = 5, token-mean = 5 / 1.5
    loss = torch.tensor([[2.0, 4.0]], dtype=torch.float64)
    weights = torch.tensor([[0.5, 1.0]], dtype=torch.float64)
    assert algorithms.aggregate_loss(loss, weights, "token-sum").item() == 5.0
    assert algorithms.aggregate_loss(loss, weights).item() == pytest.approx(5 / 1.5)


@pytest.mark.parametrize("mode", AGGREGATIONS.names())
@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (2, 3)])
def test_empty_and_all_masked_batches_aggregate_to_zero(mode, shape):
    loss = torch.randn(shape, dtype=torch.float64)
    value = algorithms.aggregate_loss(loss, torch.zeros(shape, dtype=torch.bool), mode)
    assert value.item() == 0.0


def test_unknown_mode_gives_the_registry_error():
    loss, mask = loss_and_mask()
    with pytest.raises(UnknownNameError, match="unknown loss aggregation 'token_means'.*Did you"):
        algorithms.aggregate_loss(loss, mask, "token_means")


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"num_tokens": -1}, ValueError),
        ({"num_seqs": torch.ones(2)}, ValueError),
        ({"norm_length": "4096"}, TypeError),
    ],
)
def test_bad_normalisers_raise(kwargs, error):
    loss, mask = loss_and_mask()
    with pytest.raises(error):
        algorithms.aggregate_loss(loss, mask, "seq-mean-token-sum-norm", **kwargs)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        algorithms.aggregate_loss(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))


def test_global_normalizers_count_tokens_rows_and_width():
    # MASK: 5 tokens, 2 non-empty rows, width 3
    norms = algorithms.global_normalizers(torch.tensor(MASK, dtype=torch.bool))
    assert {k: v.item() for k, v in norms.items()} == {
        "num_tokens": 5.0,
        "num_seqs": 2.0,
        "norm_length": 3.0,
    }


def test_global_normalizers_over_micro_batches_of_different_widths():
    # (2 tokens, 1 row, width 2) + (4 tokens, 2 rows, width 5) -> 6, 3, 5
    masks = [torch.tensor([[1, 1]]), torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])]
    norms = algorithms.global_normalizers(masks)
    assert [norms[k].item() for k in ("num_tokens", "num_seqs", "norm_length")] == [6, 3, 5]


def test_global_normalizers_apply_the_data_parallel_reductions():
    # Two ranks holding identical masks: the sums double, the width stays.
    norms = algorithms.global_normalizers(
        torch.tensor(MASK), reduce_sum=lambda t: 2 * t, reduce_max=lambda t: t
    )
    assert norms["num_tokens"].item() == 10 and norms["num_seqs"].item() == 4


@pytest.mark.parametrize(
    "slices", [[slice(0, 2)], [slice(0, 2), slice(1, 3)], [slice(0, 1), slice(2, 3)]]
)
def test_micro_batch_slices_must_cover_every_row_once(slices):
    with pytest.raises(ValueError, match="exactly once"):
        algorithms.global_normalizers(torch.tensor(MASK), slices)


def test_micro_batch_slices_that_partition_the_rows_are_accepted():
    norms = algorithms.global_normalizers(torch.tensor(MASK), [slice(0, 1), slice(1, 3)])
    assert norms["num_tokens"].item() == 5


@pytest.mark.parametrize("mode", AGGREGATIONS.names())
def test_sequence_losses_aggregate_like_their_broadcast(mode):
    # seq_loss (B,) = (−1, 5, 2) on MASK, each valid token of row b carrying L_b.
    seq_loss = torch.tensor([-1.0, 5.0, 2.0], dtype=torch.float64)
    mask = torch.tensor(MASK, dtype=torch.bool)
    value = aggregate_sequence_loss(seq_loss, mask, mode)
    broadcast = algorithms.aggregate_loss(seq_loss[:, None].expand(3, 3), mask, mode)
    assert value.item() == pytest.approx(broadcast.item(), rel=1e-8)
    if mode == "seq-mean-token-mean":
        assert value.item() == (-1.0 + 2.0) / 2  # exact: the empty row does not count
