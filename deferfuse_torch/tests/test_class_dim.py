"""Ops over a middle dim of many positions: segmentation's classes in [N, C, H, W], a channel
softmax. softmax, log_softmax and their backward combine the dim's slices elementwise where
that is faster than the row kernel (softmax_norm.cpp's `sliced`), nll_loss2d picks and masks
along dim 1 in place (loss.cpp), and a gather along such a dim walks its positions
(gather.rs). CPU's results in every mode, on both sides of `sliced`'s bounds."""

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same, check


def tpu(t):
    return t.to("tpu")


# Shapes of the sliced path: up to 8 classes over 16+ positions a plane, up to 63 over 512+.
# Others keep the row reduction (`gathered_rows`, `few_positions`; test_norm_loss_act.py).
SHAPES = {"classes_21": (2, 21, 24, 24), "classes_4": (3, 4, 5, 7), "one_class": (2, 1, 4, 4),
          "three_dims": (2, 19, 520), "gathered_rows": (2, 64, 4, 5), "few_positions": (2, 16, 4, 4)}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_over_a_middle_dim_matches_cpu_forward_and_backward(mode, fn, shape):
    torch.manual_seed(0)
    assert_same(lambda x: fn(x * 4, 1), torch.randn(*SHAPES[shape]))


@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_over_a_middle_dim_keeps_cpus_nan_and_minus_inf(mode, fn):
    # A NaN anywhere along the dim makes its position's results NaN; a -inf class gets 0 (or
    # -inf) and leaves the others finite; a position all -inf is NaN, as on CPU.
    torch.manual_seed(0)
    x = torch.randn(2, 6, 4, 5)
    x[0, 3, 1, 2] = float("nan")
    x[1, :2, 0, 0] = float("-inf")
    x[1, :, 3, 4] = float("-inf")
    x[0, 5, 2, 2] = float("inf")
    want = fn(x, 1)
    got = fn(tpu(x), 1)
    check(got, want)
    assert torch.equal(torch.isnan(got.cpu()), torch.isnan(want))


def test_softmax_over_a_middle_dim_of_a_strided_input_matches_cpu(mode):
    # A channels-last input: the classes are contiguous, each plane strided.
    torch.manual_seed(0)
    x = torch.randn(2, 7, 6, 6).to(memory_format=torch.channels_last)
    check(torch.log_softmax(tpu(x), 1), torch.log_softmax(x, 1))
    # A slice whose planes are not the last dims' layout.
    y = torch.randn(3, 8, 5, 20)[:, :, :, ::2]
    check(torch.softmax(tpu(y), 1), torch.softmax(y, 1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_softmax_over_a_middle_dim_computes_in_float32_and_rounds_once(mode, dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 7, 6, 6).to(dtype)
    got, want = torch.log_softmax(tpu(x), 1), torch.log_softmax(x, 1)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want, rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_over_a_map_of_many_positions_matches_cpu(mode, reduction, weighted):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6, 8)
    t = torch.randint(0, 5, (2, 6, 8))
    t[0, 1, :3] = -100  # ignored
    w = torch.rand(5) if weighted else None
    assert_same(lambda x: F.cross_entropy(x, t.to(x.device), reduction=reduction,
                                          weight=None if w is None else w.to(x.device)), x)


def test_cross_entropy_over_a_map_with_a_masked_minus_inf_class_stays_finite_like_cpu(mode):
    torch.manual_seed(0)
    x = torch.randn(2, 4, 4, 8)
    x[:, 2] = float("-inf")
    t = torch.randint(0, 2, (2, 4, 8))
    want = F.cross_entropy(x, t)
    assert torch.isfinite(want)
    assert_same(lambda x: F.cross_entropy(x, t.to(x.device)), x)


def test_cross_entropy_over_a_map_with_a_class_out_of_range_raises(mode):
    x = tpu(torch.zeros(1, 3, 4, 4))
    t = torch.zeros(1, 4, 4, dtype=torch.long)
    t[0, 2, 1] = 3
    with pytest.raises(RuntimeError, match="out of bounds"):
        F.cross_entropy(x, tpu(t)).item()
    check(x + 1, torch.ones(1, 3, 4, 4))


def test_nll_loss_of_a_4d_input_raises_as_on_cpu():
    # The 4-D path is nll_loss2d's; nll_loss proper keeps CPU's 1-D or 2-D rule.
    x = torch.zeros(1, 3, 2, 2)
    t = torch.zeros(1, 2, 2, dtype=torch.long)
    with pytest.raises(RuntimeError):
        torch.ops.aten.nll_loss_forward(x, t, None, 1, -100)
    with pytest.raises(RuntimeError, match="1-D or 2-D"):
        torch.ops.aten.nll_loss_forward(tpu(x), tpu(t), None, 1, -100)


@pytest.mark.parametrize("index_shape", [(2, 1, 5, 6), (2, 3, 5, 6), (1, 2, 5, 4)])
def test_gather_along_a_middle_dim_matches_cpu_forward_and_backward(mode, index_shape):
    torch.manual_seed(0)
    i = torch.randint(0, 4, index_shape)
    assert_same(lambda x: torch.gather(x, 1, i.to(x.device)), torch.randn(2, 4, 5, 6))


def test_gather_along_a_middle_dim_of_strided_operands_matches_cpu(mode):
    torch.manual_seed(0)
    x = torch.randn(3, 6, 10).transpose(0, 2)  # [10, 6, 3]
    i = torch.randint(0, 6, (3, 2, 10)).transpose(0, 2)  # [10, 2, 3]
    check(torch.gather(tpu(x), 1, tpu(i)), torch.gather(x, 1, i))
    i32 = torch.randint(0, 6, (10, 1, 3)).expand(10, 4, 3)
    check(torch.gather(tpu(x), 1, tpu(i32)), torch.gather(x, 1, i32))


def test_gather_along_a_middle_dim_with_an_index_out_of_range_raises(mode):
    x = tpu(torch.randn(2, 4, 8))
    i = torch.zeros(2, 1, 8, dtype=torch.long)
    i[1, 0, 7] = 4
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.gather(x, 1, tpu(i)).cpu()
