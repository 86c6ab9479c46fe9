"""Nearest upsampling and reflect/replicate padding on tpu against CPU, forward and backward,
in every eager mode, with no CPU fallback; and xlogy (kl_div's op)."""

import gc

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


@pytest.mark.parametrize("scale", [2, (2, 3), (1, 4)])
def test_integer_factor_nearest_upsampling_gives_cpus_values_bit_for_bit(mode, scale):
    # A broadcast copy, not a gather: each value is its source's, for floats and uint8 images.
    x = torch.randn(2, 3, 4, 6)
    out = F.interpolate(x.to("tpu"), scale_factor=scale, mode="nearest")
    assert torch.equal(out.cpu(), F.interpolate(x, scale_factor=scale, mode="nearest"))
    u = torch.randint(0, 256, (1, 3, 5, 4), dtype=torch.uint8)
    out = F.interpolate(u.to("tpu"), scale_factor=scale, mode="nearest-exact")
    assert torch.equal(out.cpu(), F.interpolate(u, scale_factor=scale, mode="nearest-exact"))


def test_nearest_upsampling_gradient_sums_one_dims_copies_in_cpus_order(mode):
    # Along one dim the copies of an input are added in CPU's order: the same bits.
    x = torch.randn(2, 3, 5)
    xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    g = torch.randn(2, 3, 15) * torch.tensor([1.0, 1e8, -1e8] * 5)
    F.interpolate(xc, scale_factor=3, mode="nearest").backward(g)
    F.interpolate(xt, scale_factor=3, mode="nearest").backward(g.to("tpu"))
    assert torch.equal(xt.grad.cpu(), xc.grad)


def test_nearest_upsampling_gradient_of_negative_zeros_is_positive_zero_as_on_cpu(mode):
    # CPU adds each copy onto zeros, so an input whose copies all got -0.0 gets +0.0.
    x = torch.randn(1, 2, 3, 3)
    xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    g = torch.full((1, 2, 6, 6), -0.0)
    F.interpolate(xc, scale_factor=2, mode="nearest").backward(g)
    F.interpolate(xt, scale_factor=2, mode="nearest").backward(g.to("tpu"))
    assert torch.equal(torch.signbit(xt.grad.cpu()), torch.signbit(xc.grad))
    assert not torch.signbit(xc.grad).any()


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


def _allocated():
    """Bytes of live tpu storage, once the work recorded so far has run."""
    gc.collect()
    torch.tpu.synchronize()
    return torch.tpu.memory_allocated()


def test_a_repeated_resize_uploads_its_tables_once(mode):
    # The source-index and weight tables depend only on the geometry: the first resize of a
    # new geometry keeps them on the device, a second one of the same geometry adds only its
    # result.
    x = torch.randn(2, 3, 5, 7).to("tpu")
    torch.tpu.empty_cache()  # tables an earlier test kept
    before = _allocated()
    y1 = F.interpolate(x, size=(11, 13), mode="bilinear", align_corners=False)
    first = _allocated() - before
    y2 = F.interpolate(x, size=(11, 13), mode="bilinear", align_corners=False)
    second = _allocated() - before - first
    assert second == y2.nbytes
    assert first > y1.nbytes


def test_a_kept_table_is_not_changed_by_writing_into_a_result(mode):
    x = torch.randn(1, 2, 4, 4)
    fn = lambda t: F.interpolate(t, scale_factor=2, mode="bilinear")  # noqa: E731
    fn(x.to("tpu")).mul_(0).add_(7)
    check(fn(x.to("tpu")), fn(x))
    p = lambda t: F.adaptive_avg_pool2d(t, 3)  # noqa: E731
    p(x.to("tpu")).zero_()
    check(p(x.to("tpu")), p(x))


def test_empty_cache_gives_back_the_kept_tables(mode):
    x = torch.randn(1, 1, 6, 6).to("tpu")
    torch.tpu.empty_cache()
    before = _allocated()
    y = F.interpolate(x, size=(17, 19), mode="bicubic")
    del y
    assert _allocated() > before
    torch.tpu.empty_cache()
    assert _allocated() == before


def test_nearest_3d_resizing_takes_uint8_volumes_as_cpu(mode):
    # It refused them ("expected a floating input"); nearest only picks elements.
    x = torch.randint(0, 256, (1, 2, 3, 4, 5), dtype=torch.uint8)
    check(F.interpolate(x.to("tpu"), scale_factor=2, mode="nearest"),
          F.interpolate(x, scale_factor=2, mode="nearest"))


@pytest.mark.parametrize("pad_mode", ["reflect", "replicate"])
@pytest.mark.parametrize("pads", [(3, 2, 1, 4), (0, 2, 2, 0), (1, 2, 0, 0), (0, 0, 2, 1), (1, 1), (4, 0),
                                  (10, 9)])
def test_padding_gives_cpus_bits_and_a_1d_backward_too(mode, pad_mode, pads):
    # The borders are gathered apart from the interior; the backward sums a position's
    # contributions in CPU's order along a dim (zero, left border, interior, right border), so
    # even replicate's wide borders, which pile up on the edge, give CPU's bits in 1-D. In 2-D
    # the dims are summed one after the other (the last first), where CPU adds a corner's four
    # contributions in output order: the last bits may differ there.
    torch.manual_seed(3)
    # (10, 9): borders wider than a few positions are gathered and scattered by table.
    x = torch.randn(2, 3, 7, 9) if len(pads) == 4 else torch.randn(2, 3, 12)
    xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    yc, yt = F.pad(xc, pads, mode=pad_mode), F.pad(xt, pads, mode=pad_mode)
    g = torch.randn(yc.shape)
    yc.backward(g)
    yt.backward(g.to("tpu"))
    assert torch.equal(yt.detach().cpu(), yc.detach())
    if len(pads) == 2:
        assert torch.equal(xt.grad.cpu(), xc.grad)
    else:
        check(xt.grad, xc.grad)


def test_negative_padding_crops_like_cpu(mode):
    both(lambda t: F.pad(t, (-1, 2, 1, -2), mode="replicate"), torch.randn(2, 3, 6, 7))


@pytest.mark.parametrize("padding_mode", ["zeros", "border"])
def test_nearest_grid_sample_gives_the_grid_a_zero_gradient_as_cpu(mode, padding_mode):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 6)
    x[0, 0, 0, 0] = -0.0
    theta = torch.tensor([[[0.9, 0.1, 0.05], [-0.1, 1.1, 0.0]]] * 2)
    outs = {}
    for dev in ("cpu", "tpu"):
        t = theta.to(dev).requires_grad_()
        grid = F.affine_grid(t, (2, 3, 4, 4), align_corners=False)
        y = F.grid_sample(x.to(dev), grid, mode="nearest", padding_mode=padding_mode,
                          align_corners=False)
        (gt,) = torch.autograd.grad(y.sum(), [t])
        outs[dev] = (y.detach().cpu(), gt.cpu())
    assert torch.equal(outs["tpu"][0], outs["cpu"][0])
    assert torch.equal(outs["tpu"][0].signbit(), outs["cpu"][0].signbit())
    assert torch.equal(outs["tpu"][1], torch.zeros(2, 2, 3)) and torch.equal(outs["cpu"][1], outs["tpu"][1])


def test_bilinear_grid_sample_gives_the_grid_cpus_gradient(mode):
    # grid_sampler_2d is composed above autograd (its gradient comes from its device ops):
    # its `1 - tx` weights must stay in the graph, so they take ATen's scalar-first operator,
    # not the one-op form the kernels below autograd use (csrc/common.h).
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 6)
    theta = torch.tensor([[[0.9, 0.1, 0.05], [-0.1, 1.1, 0.0]]] * 2)
    outs = {}
    for dev in ("cpu", "tpu"):
        t = theta.to(dev).requires_grad_()
        grid = F.affine_grid(t, (2, 3, 4, 4), align_corners=False)
        y = F.grid_sample(x.to(dev), grid, mode="bilinear", align_corners=False)
        (gt,) = torch.autograd.grad((y * y).sum(), [t])
        outs[dev] = gt.cpu()
    torch.testing.assert_close(outs["tpu"], outs["cpu"], rtol=1e-4, atol=1e-5)
    assert outs["cpu"].abs().sum() > 0


@pytest.mark.parametrize("shape, size", [
    ((2, 3, 7), 11), ((2, 3, 7), 4), ((1, 2, 3, 4, 5), (5, 3, 7)), ((1, 2, 3, 4, 5), (2, 9, 3)),
])
def test_nearest_exact_in_1d_and_3d_gives_cpus_values_and_gradients(mode, shape, size):
    # They ran on the CPU fallback (2-D ran on the device).
    deferfuse_torch.reset_fallback_counts()
    x = torch.randn(*shape)
    res = {}
    for d in ("cpu", "tpu"):
        xx = x.to(d).detach().clone().requires_grad_()
        y = F.interpolate(xx, size=size, mode="nearest-exact")
        (y * torch.arange(y.numel(), device=d, dtype=y.dtype).view(y.shape)).sum().backward()
        res[d] = (y.detach().cpu(), xx.grad.cpu())
    assert torch.equal(res["tpu"][0], res["cpu"][0])
    assert torch.equal(res["tpu"][1], res["cpu"][1])
    assert deferfuse_torch.fallback_counts() == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
def test_linspace_and_logspace_give_cpus_bits(mode, dtype):
    # CPU counts each vector of lanes up from its first lane, the first half from start and
    # the second from end: computed in float64 and rounded once, most float32 linspaces
    # differed from CPU's in an ulp somewhere.
    for a, b in ((-1.0, 1.0), (0.0, 1.0), (0.0, 6.283185307179586), (-3.0, 17.0)):
        for n in (0, 1, 2, 7, 24, 33, 100, 199):
            assert torch.equal(torch.linspace(a, b, n, dtype=dtype, device="tpu").cpu(),
                               torch.linspace(a, b, n, dtype=dtype)), (a, b, n)
    if dtype.is_floating_point:
        assert torch.equal(torch.logspace(-2, 2, 37, dtype=dtype, device="tpu").cpu(),
                           torch.logspace(-2, 2, 37, dtype=dtype))


@pytest.mark.parametrize("align_corners", [False, True])
def test_a_spatial_transformers_identity_grid_and_its_gradient_are_cpus(mode, align_corners):
    # Its identity grid lands on pixel centres, where grid_sample's gradient picks neighbours
    # by the grid's last bit: a grid an ulp off changed the sign of theta's gradient.
    torch.manual_seed(0)
    img = torch.randn(2, 3, 24, 24)
    theta = torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]).repeat(2, 1, 1)

    def grad_of(d):
        th = theta.to(d).detach().clone().requires_grad_()
        grid = F.affine_grid(th, (2, 3, 24, 24), align_corners=align_corners)
        out = F.grid_sample(img.to(d), grid, align_corners=align_corners)
        (out * out.detach().flip(-1)).sum().backward()
        return grid.detach().cpu(), th.grad.cpu()

    (grid_cpu, g_cpu), (grid_tpu, g_tpu) = grad_of("cpu"), grad_of("tpu")
    assert torch.equal(grid_tpu, grid_cpu)
    torch.testing.assert_close(g_tpu, g_cpu, atol=1e-3, rtol=1e-5)


def test_linspace_into_an_out_of_the_right_size_keeps_its_shape(mode):
    out = torch.empty(5, 5, device="tpu")
    torch.linspace(0, 1, 25, out=out)
    check(out, torch.linspace(0, 1, 25).view(5, 5))
