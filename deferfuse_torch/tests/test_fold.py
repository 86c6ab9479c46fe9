"""nn.Unfold / nn.Fold (F.unfold, F.fold: im2col and col2im) on tpu (csrc/fold.cpp): CPU's
values and gradients with no CPU fallback, in every mode, and CPU's shape errors."""
import pytest
import torch
import torch.nn.functional as F

import deferfuse_torch
from conftest import assert_same, raises_like_cpu

WINDOWS = {
    "3x3": dict(kernel_size=3),
    "2x3 stride 2 padding 1": dict(kernel_size=(2, 3), stride=2, padding=1),
    "dilated": dict(kernel_size=2, dilation=(2, 1), padding=(0, 2), stride=(1, 3)),
}


@pytest.mark.parametrize("case", sorted(WINDOWS))
def test_unfold_matches_cpu_forward_and_backward(mode, case):
    torch.manual_seed(0)
    w = WINDOWS[case]
    assert_same(lambda x: F.unfold(x, **w) * 2, torch.randn(2, 3, 7, 8))
    assert_same(lambda x: torch.ops.aten.im2col(x, **{  # unbatched: [C, H, W]
        "kernel_size": [3, 3], "dilation": [1, 1], "padding": [1, 1], "stride": [1, 1]}),
        torch.randn(2, 5, 6))


@pytest.mark.parametrize("case", sorted(WINDOWS))
def test_fold_sums_overlapping_windows_as_cpu_does(mode, case):
    torch.manual_seed(0)
    w = WINDOWS[case]
    blocks = F.unfold(torch.randn(2, 3, 7, 8), **w)  # the right shape for fold's input
    assert_same(lambda c: F.fold(c, (7, 8), **w) * 2, torch.randn(blocks.shape))


def test_fold_of_unfold_counts_each_pixel_once_per_window(mode):
    x = torch.ones(1, 1, 4, 4).to("tpu")
    deferfuse_torch.reset_fallback_counts()
    counts = F.fold(F.unfold(x, 2, stride=1), (4, 4), 2, stride=1)
    assert deferfuse_torch.fallback_counts() == {}
    want = F.fold(F.unfold(torch.ones(1, 1, 4, 4), 2, stride=1), (4, 4), 2, stride=1)
    assert torch.equal(counts.cpu(), want)
    assert counts.cpu()[0, 0, 1, 1] == 4 and counts.cpu()[0, 0, 0, 0] == 1


@pytest.mark.parametrize("call", [
    lambda x: F.unfold(x, kernel_size=0),
    lambda x: F.unfold(x, kernel_size=9),
    lambda x: F.fold(x.reshape(1, 6, 10), (4, 4), kernel_size=2),
])
def test_bad_windows_raise_cpus_errors(call):
    x = torch.randn(1, 3, 4, 5)
    raises_like_cpu(call, x)
