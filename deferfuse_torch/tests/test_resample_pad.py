"""Nearest upsampling and reflect/replicate padding on tpu against CPU, forward and backward,
in every eager mode, with no CPU fallback; and xlogy (kl_div's op)."""

import pytest
import torch
import torch.nn.functional as F

import deferfuse_torch
from conftest import assert_same, check


@pytest.fixture(autouse=True)
def no_fallback():
    deferfuse_torch.reset_fallback_counts()
    yield
    assert deferfuse_torch.fallback_counts() == {}


def both(fn, x):
    """fn on CPU and on tpu, with the input gradient of a random upstream gradient."""
    xc = x.clone().requires_grad_()
    xt = x.to("tpu").requires_grad_()
    yc, yt = fn(xc), fn(xt)
    g = torch.randn(yc.shape)
    yc.backward(g)
    yt.backward(g.to("tpu"))
    check(yt.detach(), yc.detach())
    check(xt.grad, xc.grad)


@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(size=(7, 5)), dict(scale_factor=1.5),
                                dict(size=(3, 2))])
@pytest.mark.parametrize("mode_name", ["nearest", "nearest-exact"])
def test_nearest_upsample_2d(mode, kw, mode_name):
    both(lambda t: F.interpolate(t, mode=mode_name, **kw), torch.randn(2, 3, 4, 6))


def test_nearest_upsample_1d(mode):
    both(lambda t: F.interpolate(t, scale_factor=3, mode="nearest"), torch.randn(2, 3, 5))


@pytest.mark.parametrize("pad_mode", ["reflect", "replicate"])
def test_pad_2d_and_1d(mode, pad_mode):
    both(lambda t: F.pad(t, (1, 2, 3, 0), mode=pad_mode), torch.randn(2, 3, 5, 6))
    both(lambda t: F.pad(t, (2, 1), mode=pad_mode), torch.randn(2, 3, 5))


def test_xlogy_and_kl_div(mode):
    x = torch.tensor([0.0, 1.0, 2.0, 0.0])
    y = torch.tensor([0.0, 0.5, float("nan"), 3.0])
    check(torch.xlogy(x.to("tpu"), y.to("tpu")), torch.xlogy(x, y))
    p = torch.softmax(torch.randn(4, 5), -1)
    q = torch.log_softmax(torch.randn(4, 5), -1)
    check(F.kl_div(q.to("tpu"), p.to("tpu"), reduction="batchmean"),
          F.kl_div(q, p, reduction="batchmean"))


@pytest.mark.parametrize("how", [dict(scale_factor=2), dict(size=(7, 10, 9)),
                                 dict(scale_factor=1.5), dict(scale_factor=(1, 2, 0.5))])
def test_nearest_3d_upsampling_matches_cpu_forward_and_backward(mode, how):
    torch.manual_seed(0)
    assert_same(lambda t: F.interpolate(t, mode="nearest", **how) * 2, torch.randn(2, 3, 4, 5, 6))


@pytest.mark.parametrize("how", [dict(scale_factor=2), dict(size=(7, 10, 9)),
                                 dict(scale_factor=(1.5, 0.5, 2), align_corners=True),
                                 dict(size=(3, 3, 3), align_corners=False)])
def test_trilinear_3d_upsampling_matches_cpu_forward_and_backward(mode, how):
    torch.manual_seed(0)
    assert_same(lambda t: F.interpolate(t, mode="trilinear", **how) * 2,
                torch.randn(2, 3, 4, 5, 6))
