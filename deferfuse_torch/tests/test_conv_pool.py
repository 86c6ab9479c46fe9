"""Convolution and pooling on tpu match CPU in forward and backward (gradients through autograd)
in every eager mode, with zero CPU-fallback ops."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import deferfuse_torch

from conftest import assert_same, check


CONVS = {
    "conv2d_padding": ((2, 3, 7, 6), (4, 3, 3, 3), dict(padding=1)),
    "conv2d_depthwise_stride": ((2, 4, 9, 8), (4, 1, 3, 3), dict(stride=2, padding=1, groups=4)),
    # Depthwise: the forward and the stride-1 input gradient as a sum over the kernel taps.
    "conv2d_depthwise_7x7": ((2, 6, 9, 8), (6, 1, 7, 7), dict(padding=3, groups=6)),
    "conv2d_depthwise_dilated": ((2, 4, 9, 8), (4, 1, 3, 3),
                                 dict(padding=(2, 0), dilation=(2, 1), groups=4)),
    "conv2d_depthwise_multiplier": ((2, 3, 7, 6), (6, 1, 3, 3), dict(padding=1, groups=3)),
    "conv1d_depthwise_short_padding": ((2, 3, 10), (3, 1, 5), dict(padding=1, groups=3)),
    "conv3d_depthwise": ((1, 2, 5, 5, 4), (2, 1, 3, 3, 3), dict(padding=1, groups=2)),
    # 75 taps: past the tap sums' bound, the product path.
    "conv3d_depthwise_large_kernel": ((1, 2, 6, 6, 4), (2, 1, 5, 5, 3),
                                      dict(padding=(2, 2, 1), groups=2)),
    "conv2d_groups_dilation": ((2, 4, 9, 8), (6, 2, 2, 3),
                               dict(stride=(2, 1), padding=(0, 2), dilation=(2, 1), groups=2)),
    "conv2d_1x1": ((2, 5, 4, 4), (3, 5, 1, 1), dict()),
    # A 1x1 kernel's input gradient is the product itself (per sample here; folded above);
    # padded, its windows go through add_windows.
    "conv2d_1x1_per_sample": ((2, 5, 16, 16), (3, 5, 1, 1), dict()),
    "conv2d_1x1_padded": ((2, 3, 5, 5), (2, 3, 1, 1), dict(padding=1)),
    # 272 output positions a sample: a GEMM per sample (the cases above fold the batch).
    "conv2d_gemm_per_sample": ((2, 3, 17, 16), (4, 3, 3, 3), dict(padding=1)),
    "conv2d_uncovered_tail": ((1, 2, 8, 8), (2, 2, 3, 3), dict(stride=3)),
    # One window that reaches no further than twice the padding (here over the left padding and
    # the one input position): the runtime's col2im refuses it, add_windows sums it.
    "conv1d_one_window_within_twice_the_padding": ((1, 2, 1), (3, 2, 2), dict(stride=2, padding=1)),
    "conv2d_one_window_within_twice_the_padding": ((1, 2, 1, 1), (3, 2, 2, 2),
                                                   dict(stride=3, padding=1)),
    "conv1d": ((2, 3, 10), (5, 3, 3), dict(padding=2, stride=3)),
    "conv3d": ((1, 2, 5, 5, 4), (3, 2, 2, 2, 2), dict(padding=1)),
    # Stride 1, one group, 256+ positions a sample: the input gradient is the runtime's
    # stride-1 convolution of the gradient by the mirrored weight (conv.cpp's
    # input_grad_as_conv); with a padding past the kernel's span or a smaller map, the product
    # and add_windows.
    "conv2d_stride1_small_map": ((2, 3, 15, 15), (4, 3, 3, 3), dict(padding=1)),
    "conv2d_stride1_dilated": ((2, 4, 20, 18), (6, 4, 3, 3), dict(padding=2, dilation=2)),
    "conv2d_stride1_unpadded": ((2, 3, 40, 40), (4, 3, 3, 3), dict()),
    "conv2d_stride1_uneven_padding": ((1, 3, 40, 36), (2, 3, 3, 5), dict(padding=(1, 0))),
    "conv2d_stride1_padding_past_the_span": ((2, 3, 9, 8), (4, 3, 3, 3), dict(padding=3)),
    "conv1d_stride1": ((2, 3, 300), (5, 3, 3), dict(padding=1)),
    "conv3d_stride1_dilated": ((1, 2, 9, 8, 6), (3, 2, 2, 3, 2),
                               dict(padding=(1, 2, 0), dilation=(2, 1, 2))),
    # Strided, 256+ positions a sample and 4+ column values per input value: the forward and
    # the weight gradient on the runtime's convolution op (the input split by phase), the
    # input gradient the product and add_windows; below 4 (the k3 stride-2 one), im2col.
    "conv2d_strided_stem": ((2, 3, 40, 38), (8, 3, 7, 7), dict(stride=2, padding=3)),
    "conv1d_strided_on_the_op": ((2, 3, 600), (4, 3, 10), dict(stride=2, padding=1)),
    "conv1d_strided_im2col": ((2, 4, 1100), (5, 4, 3), dict(stride=2)),
    "conv3d_strided_on_the_op": ((1, 2, 12, 12, 10), (3, 2, 3, 3, 3),
                                 dict(stride=(1, 2, 2), padding=1)),
    "conv2d_strided_dilated_on_the_op": ((1, 2, 45, 41), (3, 2, 5, 3),
                                         dict(stride=(2, 1), padding=(2, 1), dilation=(1, 2))),
}


@pytest.mark.parametrize("case", sorted(CONVS))
def test_convolution_matches_cpu_forward_and_backward(mode, case):
    shape, wshape, kw = CONVS[case]
    torch.manual_seed(0)
    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(shape)]
    x, w, b = torch.randn(shape), torch.randn(wshape), torch.randn(wshape[0])
    # The weight and bias gradients sum over every sample and position, in another order than
    # CPU's: their rounding grows with that count (~3,000 terms here: up to 6e-5 apart).
    terms = shape[0] * math.prod(shape[2:])
    assert_same(lambda x, w, b: conv(x, w, b, **kw), x, w, b, atol=2e-5 if terms < 1000 else 1e-4)


@pytest.mark.parametrize("stride", [1, 2])
def test_a_depthwise_convolution_runs_one_kernel_per_part_and_no_product(stride):
    # The forward, the input gradient and the weight gradient are each one depthwise kernel
    # program; im2col (a copy and a batched product) or a sum of shifted views is not used.
    torch.manual_seed(0)
    x = torch.randn(2, 16, 9, 9, device="tpu", requires_grad=True)
    w = torch.randn(16, 1, 5, 5, device="tpu", requires_grad=True)
    g = torch.randn(2, 16, (9 + 4 - 5) // stride + 1, (9 + 4 - 5) // stride + 1, device="tpu")
    runs, fallbacks = _programs_of_a_conv_step(
        lambda x, w: F.conv2d(x, w, padding=2, stride=stride, groups=16), x, w, g)
    assert runs.count("depthwise_conv") == 3, runs
    assert not any(r.startswith("matmul") for r in runs), runs
    assert not fallbacks


def _programs_of_a_conv_step(conv, x, w, g):
    """The names of the programs one strict step of conv(x, w) and its input and weight
    gradients runs (after one step to warm up), and the step's CPU fallbacks."""
    import deferfuse_torch

    def step():
        gx, gw = torch.autograd.grad(conv(x, w), (x, w), g)
        return gx.sum().item() + gw.sum().item()

    with deferfuse_torch.mode("strict"):
        step()
        report = deferfuse_torch.explain(step)
    runs = [e["name"] for e in report.timeline["traceEvents"] if e.get("cat") == "run"]
    return runs, report.fallbacks


@pytest.mark.parametrize("stride, programs, col2im", [(2, 2, 1), (1, 3, 0)])
def test_a_strided_stem_convolution_runs_its_forward_and_weight_gradient_as_conv_programs(
        stride, programs, col2im):
    # A 7x7 stride-2 stem: the forward and the weight gradient are each one conv program, with
    # no im2col copy for either (the input gradient, strided, is a product and one col2im
    # program); at stride 1 all three are conv programs.
    torch.manual_seed(0)
    x = torch.randn(2, 3, 40, 40, device="tpu", requires_grad=True)
    w = torch.randn(8, 3, 7, 7, device="tpu", requires_grad=True)
    out = (40 + 6 - 7) // stride + 1
    g = torch.randn(2, 8, out, out, device="tpu")
    runs, fallbacks = _programs_of_a_conv_step(
        lambda x, w: F.conv2d(x, w, padding=3, stride=stride), x, w, g)
    assert runs.count("conv") == programs, runs
    assert runs.count("col2im") == col2im, runs
    assert not fallbacks


@pytest.mark.parametrize("channels, on_conv_op", [(32, True), (128, False)])
def test_a_small_map_runs_on_the_conv_op_when_its_weight_is_small(channels, on_conv_op):
    # 8x8 = 64 positions a sample: a 32 -> 32 3x3 weight (36 KB) stays in cache, so the
    # forward and both gradients are conv programs (no im2col copy, no col2im); a 128 -> 128
    # one (576 KB) folds the batch into products.
    torch.manual_seed(0)
    x = torch.randn(4, channels, 8, 8, device="tpu", requires_grad=True)
    w = torch.randn(channels, channels, 3, 3, device="tpu", requires_grad=True)
    g = torch.randn(4, channels, 8, 8, device="tpu")
    runs, fallbacks = _programs_of_a_conv_step(lambda x, w: F.conv2d(x, w, padding=1), x, w, g)
    assert (runs.count("conv") == 3) == on_conv_op, runs
    assert any(r.startswith("matmul") for r in runs) != on_conv_op, runs
    assert not fallbacks


@pytest.mark.parametrize("shape, weight", [((2, 15, 166), (32, 15, 1)),
                                           ((3, 8, 10, 10), (4, 8, 1, 1))])
def test_a_pointwise_convolution_s_input_gradient_is_contiguous_as_on_cpu(mode, shape, weight):
    # Folded into one product, the gradient comes out [C, N, L]; CPU's is contiguous, and
    # `.view()` of a permuted one raises.
    grads = []
    for dev in ("cpu", "tpu"):
        torch.manual_seed(0)
        x = torch.randn(shape).to(dev).requires_grad_()
        w = torch.randn(weight).to(dev)
        y = F.conv1d(x, w) if len(shape) == 3 else F.conv2d(x, w)
        gx, = torch.autograd.grad(y, x, torch.ones_like(y))
        grads.append(gx)
    assert grads[1].stride() == grads[0].stride()
    check(grads[1].view(-1), grads[0].view(-1))


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_a_non_finite_input_value_reaches_only_the_weight_gradient_taps_that_read_it(mode, bad):
    # A valid 3-tap conv1d over 40 positions (run as a 2-D conv of one row, on the conv op):
    # the last input value is read by the last tap only, so the other taps' gradients stay
    # finite, as on CPU. The op's wide positions past the row's output read it too, with a zero
    # gradient, and 0 * inf is NaN: they are skipped.
    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 40), torch.randn(4, 3, 3)
    x[:, :, 39] = bad
    grads = []
    for dev in ("cpu", "tpu"):
        wd = w.clone().to(dev).requires_grad_()
        F.conv1d(x.to(dev), wd).sum().backward()
        grads.append(wd.grad.cpu())
    assert torch.isfinite(grads[1][:, :, :2]).all()
    torch.testing.assert_close(grads[1], grads[0], equal_nan=True)


@pytest.mark.parametrize("conv, x_shape, w_shape, kw", [
    (F.conv1d, (1, 1, 40), (2, 1, 2), {}),
    (F.conv2d, (2, 3, 12, 12), (4, 3, 3, 3), dict(padding=1)),
])
def test_an_infinite_weight_multiplies_no_padding_in_the_forward_or_input_gradient(
        mode, conv, x_shape, w_shape, kw):
    # On the conv op the products read a zero-padded grid: zero times an infinite tap is NaN
    # where CPU, which never reads padding, gives a number at the border.
    torch.manual_seed(0)
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    w.view(-1)[0] = math.inf
    outs = []
    for dev in ("cpu", "tpu"):
        xd = x.clone().to(dev).requires_grad_()
        y = conv(xd, w.to(dev), **kw)
        gx, = torch.autograd.grad(y, xd, torch.ones_like(y))
        outs.append((y.detach().cpu(), gx.cpu()))
    for got, want in zip(outs[1], outs[0]):
        assert torch.isfinite(want).any()
        torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("dtype, col2im", [(torch.float32, 1), (torch.float64, 0)])
def test_a_strided_transposed_convolution_adds_its_columns_back_by_col2im_in_float32(
        dtype, col2im):
    # A DCGAN's 4x4 stride-2 upsampling: the forward is W^T @ x and col2im (one program,
    # float32 only; float64 keeps the strided adds), its values CPU's autograd's.
    torch.manual_seed(0)
    x = torch.randn(2, 8, 4, 4, dtype=dtype)
    w = torch.randn(8, 3, 4, 4, dtype=dtype)
    g = torch.randn(2, 3, 8, 8, dtype=dtype)
    conv = lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1)
    want = torch.autograd.grad(conv(x.requires_grad_(), w.requires_grad_()), (x, w), g)
    xt, wt = (t.detach().to("tpu").requires_grad_() for t in (x, w))
    got = torch.autograd.grad(conv(xt, wt), (xt, wt), g.to("tpu"))
    for a, b in zip(got, want):
        check(a, b, atol=1e-4, rtol=1e-5)
    runs, fallbacks = _programs_of_a_conv_step(conv, xt, wt, g.to("tpu"))
    assert runs.count("col2im") == col2im, runs
    assert not fallbacks


def test_a_depthwise_convolution_with_an_infinite_weight_matches_cpu_at_the_border(mode):
    # PyTorch's CPU kernel never multiplies the padding in the forward and the input gradient
    # (an infinite weight leaves border outputs finite), but does in the weight gradient (an
    # infinite gradient makes every tap NaN).
    torch.manual_seed(0)
    x, w = torch.randn(1, 8, 4, 4), torch.randn(8, 1, 3, 3)
    w[0, 0, 0, 0] = float("inf")
    w[3, 0, 2, 1] = float("-inf")
    g = torch.randn(1, 8, 4, 4)
    g[0, 5, 1, 2] = float("inf")

    def run(device):
        xd = x.to(device).requires_grad_()
        wd = w.to(device).requires_grad_()
        y = F.conv2d(xd, wd, padding=1, groups=8)
        gx, gw = torch.autograd.grad(y, (xd, wd), g.to(device))
        return [t.cpu() for t in (y, gx, gw)]

    for got, want in zip(run("tpu"), run("cpu")):
        torch.testing.assert_close(got, want, equal_nan=True, atol=2e-5, rtol=1e-5)


def test_convolution_without_bias_matches_cpu(mode):
    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    assert_same(lambda x, w: F.conv2d(x, w, padding="same"), x, w, atol=2e-5)


def test_convolution_of_a_non_contiguous_input_matches_cpu(mode):
    torch.manual_seed(0)
    x, w = torch.randn(2, 6, 6, 3), torch.randn(4, 3, 3, 3)
    assert_same(lambda x, w: F.conv2d(x.permute(0, 3, 1, 2), w, padding=1), x, w, atol=2e-5)


# The weight gradient reuses the columns the forward built from the same input (same tensor,
# version and geometry); these cases would read another forward's columns if that match were
# looser.
# The second convolution of one input: another geometry (its own columns), or the same one
# (one set of columns serves both forwards, and each backward must still find them).
SECOND_CONVOLUTION = {"other_geometry": ((5, 3, 1, 1), dict(stride=2)),
                      "same_geometry": ((5, 3, 3, 3), dict(padding=1))}


@pytest.mark.parametrize("second", sorted(SECOND_CONVOLUTION))
def test_weight_gradients_match_cpu_when_one_input_feeds_two_convolutions(mode, second):
    torch.manual_seed(0)
    ws, kw = SECOND_CONVOLUTION[second]
    x, w1, w2 = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(ws)

    def two(x, w1, w2):
        a, b = F.conv2d(x, w1, padding=1), F.conv2d(x, w2, **kw)
        return torch.cat([a.flatten(), b.flatten()])
    assert_same(two, x, w1, w2, atol=2e-5)


def test_weight_gradient_matches_cpu_after_forwards_whose_backward_never_ran(mode):
    torch.manual_seed(0)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    for _ in range(3):  # their inputs die; another tensor may get the same address
        F.conv2d(torch.randn(2, 3, 6, 6, device="tpu"), w.detach().to("tpu").requires_grad_())
    x = torch.randn(2, 3, 6, 6)
    assert_same(lambda x, w: F.conv2d(x, w, padding=1), x, w, atol=2e-5)


def test_weight_gradient_matches_cpu_for_the_second_of_two_forwards_of_one_input(mode):
    torch.manual_seed(0)
    x, w, grad = torch.randn(2, 3, 4, 4), torch.randn(4, 3, 3, 3), torch.randn(2, 4, 4, 4)
    dx, dw = x.to("tpu"), w.to("tpu").requires_grad_()
    F.conv2d(dx, dw, padding=1)  # its backward never runs
    F.conv2d(dx, dw, padding=1).backward(grad.to("tpu"))
    cw = w.clone().requires_grad_()
    F.conv2d(x, cw, padding=1).backward(grad)
    check(dw.grad, cw.grad, atol=2e-5)


@pytest.mark.parametrize("refilled", [False, True], ids=["same_values", "refilled_in_place"])
def test_repeated_forwards_of_one_input_keep_only_its_current_columns(mode, refilled):
    # Each forward keeps x's columns for its backward; forwards of the same x share them, and
    # those of a version written since are dropped, so forwards whose backward never runs (an
    # evaluation under grad mode, a buffer refilled before each forward) do not pile up copies.
    x = torch.randn(8, 16, 4, 4, device="tpu")
    w = torch.randn(16, 16, 3, 3, device="tpu", requires_grad=True)
    F.conv2d(x, w, padding=1)
    torch.tpu.synchronize()
    after_one = torch.tpu.memory_allocated()
    for _ in range(5):
        if refilled:
            x.copy_(torch.randn(8, 16, 4, 4))
        F.conv2d(x, w, padding=1)
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == after_one


def test_a_forward_and_its_gradient_see_data_written_without_a_version_bump(mode):
    # `x.data.copy_(batch)` (an old-style buffer refill) changes x without bumping its version:
    # the next forward must read the new values, and the weight gradient the columns of them,
    # not the columns an earlier forward of x kept.
    torch.manual_seed(0)
    first, second, grad = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4), torch.randn(2, 4, 4, 4)
    w = torch.randn(4, 3, 3, 3)
    x, dw = first.to("tpu"), w.to("tpu").requires_grad_()
    F.conv2d(x, dw, padding=1)  # an evaluation under grad mode: its backward never runs
    x.data.copy_(second.to("tpu"))
    out = F.conv2d(x, dw, padding=1)
    cw = w.clone().requires_grad_()
    want = F.conv2d(second, cw, padding=1)
    check(out, want.detach(), atol=2e-5)
    out.backward(grad.to("tpu"))
    want.backward(grad)
    check(dw.grad, cw.grad, atol=2e-5)


def test_weight_gradient_matches_cpu_when_the_input_changed_in_place_since_an_earlier_forward(
        mode):
    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    grad = torch.randn(2, 4, 4, 4)
    dx, dw = x.to("tpu"), w.to("tpu").requires_grad_()
    F.conv2d(dx, dw)  # columns of x before the write below
    dx.add_(1.0)
    F.conv2d(dx, dw).backward(grad.to("tpu"))
    cw = w.clone().requires_grad_()
    F.conv2d(x + 1.0, cw).backward(grad)
    check(dw.grad, cw.grad, atol=2e-5)


TRANSPOSED = {
    "conv_transpose2d": ((2, 4, 5, 4), (4, 3, 3, 3), dict(padding=1)),
    # Stride 1: the forward is the plain convolution's input gradient as a stride-1
    # convolution; output_padding (allowed below the dilation) makes the output longer than
    # that convolution gives, which takes the product path.
    "conv_transpose2d_stride1_large": ((2, 4, 16, 16), (4, 3, 3, 3), dict(padding=1)),
    "conv_transpose2d_1x1": ((2, 4, 16, 16), (4, 3, 1, 1), dict()),
    # Strided, 4 column values per input value: its input gradient is the plain strided
    # convolution of the gradient, on the conv op.
    "conv_transpose2d_stride2_on_the_op": ((2, 4, 20, 20), (4, 3, 4, 4), dict(stride=2, padding=1)),
    "conv_transpose2d_stride1_output_padding": ((2, 3, 6, 5), (3, 2, 3, 3),
                                                dict(dilation=2, output_padding=1)),
    "conv_transpose2d_stride_output_padding": ((2, 4, 4, 5), (4, 2, 3, 2),
                                               dict(stride=2, padding=1, output_padding=1)),
    "conv_transpose2d_groups_dilation": ((1, 4, 4, 4), (4, 3, 2, 3),
                                         dict(stride=(1, 2), dilation=(2, 1), groups=2)),
    "conv_transpose1d": ((2, 3, 6), (3, 5, 4), dict(stride=3, padding=2)),
    "conv_transpose3d": ((1, 2, 3, 3, 2), (2, 3, 2, 2, 2), dict(stride=2)),
    # output_padding at least the stride (PyTorch allows it below the dilation): the output
    # has room for more windows than the input has positions.
    "conv_transpose2d_output_padding_past_stride": (
        (2, 2, 4, 4), (2, 2, 4, 5),
        dict(stride=(3, 2), padding=(1, 2), output_padding=(2, 3), groups=2, dilation=(4, 4))),
    "conv_transpose1d_output_padding_past_stride": ((2, 2, 5), (2, 3, 3),
                                                    dict(output_padding=1, dilation=2)),
    # A 1-tap kernel whose output_padding adds a position no window holds: not the pointwise
    # case (whose input gradient is the product as it stands).
    "conv_transpose1d_1x1_output_padding": ((1, 2, 4), (2, 3, 1),
                                            dict(output_padding=1, dilation=2)),
    "conv_transpose2d_1x1_output_padding": ((1, 2, 4, 3), (2, 3, 1, 1),
                                            dict(output_padding=(1, 0), dilation=2)),
}


@pytest.mark.parametrize("case", sorted(TRANSPOSED))
def test_transposed_convolution_matches_cpu_forward_and_backward(mode, case):
    shape, wshape, kw = TRANSPOSED[case]
    torch.manual_seed(0)
    conv = {3: F.conv_transpose1d, 4: F.conv_transpose2d, 5: F.conv_transpose3d}[len(shape)]
    groups = kw.get("groups", 1)
    x, w, b = torch.randn(shape), torch.randn(wshape), torch.randn(wshape[1] * groups)
    assert_same(lambda x, w, b: conv(x, w, b, **kw), x, w, b, atol=2e-5)


MAX_POOLS = {
    "k2": dict(kernel_size=2),
    "k3_s2_p1": dict(kernel_size=3, stride=2, padding=1),
    "k3_s2_ceil": dict(kernel_size=3, stride=2, ceil_mode=True),
    "k3_s1_overlapping_dilated": dict(kernel_size=(2, 3), stride=1, padding=(1, 1),
                                      dilation=(2, 1)),
}


@pytest.mark.parametrize("case", sorted(MAX_POOLS))
def test_max_pool2d_values_indices_and_gradient_match_cpu(mode, case):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 8)
    kw = MAX_POOLS[case]
    assert_same(lambda x: F.max_pool2d(x, return_indices=True, **kw), x)



@pytest.mark.parametrize("pool_fn", [
    lambda t: F.max_pool2d(t, 1, stride=1, return_indices=True),
    lambda t: F.max_pool2d(t, 1, stride=2, return_indices=True),
    lambda t: F.adaptive_max_pool2d(t, 4, return_indices=True),
], ids=["kernel1", "kernel1_stride2", "adaptive_to_same_size"])
@pytest.mark.parametrize("size", [(2, 3, 4, 4), (1, 1, 4, 4)])
def test_max_pool2d_with_one_window_position_returns_new_tensors(mode, pool_fn, size):
    # Neither its values (a view of the input, kernel 1 stride 1) nor its indices (a view of
    # the index table the device keeps for the geometry) may alias: writing into them must
    # leave the input, and the next pooling's indices, as they were, as on CPU.
    x = torch.randn(*size)
    xt = x.to("tpu")
    values, indices = pool_fn(xt)
    values.add_(1)
    indices.add_(100)
    assert torch.equal(xt.cpu(), x)
    want_values, want_indices = pool_fn(x)
    again_values, again_indices = pool_fn(xt)
    assert torch.equal(again_values.cpu(), want_values)
    assert torch.equal(again_indices.cpu(), want_indices)

def test_max_pool2d_of_an_unbatched_input_matches_cpu(mode):
    torch.manual_seed(0)
    assert_same(lambda x: F.max_pool2d(x, 2), torch.randn(3, 6, 6))


@pytest.mark.parametrize("dilation", [1, 2])
def test_max_pool2d_of_a_window_of_only_minus_inf_takes_its_first_real_element(mode, dilation):
    # PyTorch starts each window's index at its first element inside the input and keeps it
    # when nothing beats -inf; the padding before it must not be picked.
    torch.manual_seed(0)
    x = torch.randn(1, 2, 7, 7)
    x[:, :, :4, :4] = float("-inf")
    assert_same(lambda x: F.max_pool2d(x, 3, stride=2, padding=1, dilation=dilation,
                                       return_indices=True), x)


def test_max_pool2d_takes_the_first_of_equal_maxima_as_cpu_does(mode):
    # Few distinct values: most windows hold their maximum more than once.
    torch.manual_seed(0)
    x = torch.randint(0, 3, (2, 3, 7, 7)).float()
    assert_same(lambda x: F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True), x)


def test_max_pool2d_of_a_window_with_nans_gives_nan_at_the_last_nan_as_cpu_does(mode):
    x = torch.arange(49.0).view(1, 1, 7, 7).repeat(1, 2, 1, 1)
    x[0, 0, 1, 1] = x[0, 0, 2, 2] = x[0, 1, 6, 6] = float("nan")
    want_v, want_i = F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True)
    got_v, got_i = F.max_pool2d(x.to("tpu"), 3, stride=2, padding=1, return_indices=True)
    torch.testing.assert_close(got_v.cpu(), want_v, equal_nan=True)
    assert torch.equal(got_i.cpu(), want_i)


def test_max_pool2d_gradient_accumulates_over_overlapping_windows(mode):
    # A constant-free ramp makes one element the max of several windows.
    x = torch.arange(36.0).view(1, 1, 6, 6)
    assert_same(lambda x: F.max_pool2d(x, 3, stride=1), x)


AVG_POOLS = {
    "k2": dict(kernel_size=2),
    "k3_s2_p1_include_pad": dict(kernel_size=3, stride=2, padding=1),
    "k3_s2_p1_exclude_pad": dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    "k3_s2_ceil_exclude_pad": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True,
                                   count_include_pad=False),
    "k3_s2_ceil_include_pad": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    "divisor_override": dict(kernel_size=(2, 3), stride=(1, 2), divisor_override=5),
}


@pytest.mark.parametrize("case", sorted(AVG_POOLS))
def test_avg_pool2d_matches_cpu_forward_and_backward(mode, case):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 8)
    assert_same(lambda x: F.avg_pool2d(x, **AVG_POOLS[case]), x)


def _order_sensitive_windows(k, windows):
    """[1, 1, k, k * windows]: in every k x k window 1e8 first, -1e8 third, ones elsewhere, so
    a sum in CPU's order (1e8 + 1 rounds to 1e8) differs from any other order's."""
    x = torch.ones(1, 1, k, k * windows)
    x[..., 0, 0::k] = 1e8
    x[..., 0, 2::k] = -1e8
    return x


@pytest.mark.parametrize("k,windows", [(2, 3), (3, 3), (4, 2), (5, 4), (8, 2)])
def test_avg_pool2d_sums_each_window_in_cpus_order_bit_for_bit(mode, k, windows):
    # Up to 16 positions, or up to 64 with 16+ windows a plane: elementwise adds in CPU's order.
    x = _order_sensitive_windows(k, windows) if k <= 4 else _order_sensitive_windows(k, 16)
    got = F.avg_pool2d(x.to("tpu"), k).cpu()
    assert torch.equal(got, F.avg_pool2d(x, k))


def test_avg_pool2d_of_few_large_windows_is_within_rounding_of_cpu(mode):
    # A global 7x7 average sums its rows in vector order (README: Session 44), not CPU's.
    torch.manual_seed(0)
    x = torch.randn(4, 8, 7, 7) * 100
    check(F.avg_pool2d(x.to("tpu"), 7), F.avg_pool2d(x, 7), atol=1e-4, rtol=1e-5)


def test_avg_pool2d_of_a_window_of_negative_zeros_is_positive_zero_as_on_cpu(mode):
    # CPU starts each sum at +0.0, and +0.0 + -0.0 is +0.0.
    x = torch.full((1, 2, 4, 6), -0.0)
    got = F.avg_pool2d(x.to("tpu"), 2).cpu()
    want = F.avg_pool2d(x, 2)
    assert not torch.signbit(want).any()
    assert torch.equal(torch.signbit(got), torch.signbit(want))


@pytest.mark.parametrize("out", [(1, 1), (2, 4), (3, 5), (7, 8)])
def test_adaptive_avg_pool2d_matches_cpu_forward_and_backward(mode, out):
    torch.manual_seed(0)
    assert_same(lambda x: F.adaptive_avg_pool2d(x, out), torch.randn(2, 3, 7, 8))


def test_adaptive_max_pool2d_matches_cpu_when_the_output_divides_the_input(mode):
    torch.manual_seed(0)
    assert_same(lambda x: F.adaptive_max_pool2d(x, (2, 4), return_indices=True),
                torch.randn(2, 3, 6, 8))


@pytest.mark.parametrize("out", [(3, 3), (5, 3), (1, 6)])
def test_adaptive_max_pool2d_with_uneven_windows_matches_cpu(mode, out):
    # A random permutation: no ties, so the max's index is CPU's.
    x = (torch.randperm(2 * 3 * 7 * 8).float() / 100).view(2, 3, 7, 8)
    assert_same(lambda x: F.adaptive_max_pool2d(x, out, return_indices=True), x)


def test_adaptive_avg_pool2d_keeps_an_inf_in_its_own_window_when_sizes_divide(mode):
    x = torch.ones(1, 1, 4, 4)
    x[0, 0, 0, 0] = float("inf")
    check(F.adaptive_avg_pool2d(x.to("tpu"), 2), F.adaptive_avg_pool2d(x, 2))


@pytest.mark.parametrize("pool,shape", [(F.avg_pool1d, (1, 2, 9)), (F.avg_pool2d, (1, 2, 5, 5)),
                                        (F.avg_pool3d, (1, 2, 3, 4, 4))],
                         ids=["1d", "2d", "3d"])
def test_average_pooling_of_integers_truncates_as_cpu(mode, pool, shape):
    # The result was float; CPU keeps int64 and divides each window's sum truncating.
    x = torch.arange(-40, -40 + math.prod(shape)).reshape(shape)
    check(pool(x.to("tpu"), 2, 2, 1), pool(x, 2, 2, 1))
    check(pool(x.to("tpu"), 3, 1, 1, count_include_pad=False),
          pool(x, 3, 1, 1, count_include_pad=False))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_max_pooling_of_negative_integers_never_picks_the_padding(mode, dtype):
    # Integer inputs were padded with 0, which beat a window of negative values.
    x = -torch.arange(1, 37, dtype=dtype).reshape(1, 2, 3, 6)
    want_v, want_i = F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True)
    got_v, got_i = F.max_pool2d(x.to("tpu"), 3, 2, 1, ceil_mode=True, return_indices=True)
    check(got_v, want_v)
    check(got_i, want_i)


@pytest.mark.parametrize("dims", [2, 3])
def test_max_unpool_gives_cpus_output_and_gradient_on_the_device(mode, dims):
    # nn.MaxUnpool2d/3d ran on the CPU fallback (SegNet-style decoders).
    deferfuse_torch.reset_fallback_counts()
    pool = (nn.MaxPool2d if dims == 2 else nn.MaxPool3d)(2, stride=2, return_indices=True)
    unpool = (nn.MaxUnpool2d if dims == 2 else nn.MaxUnpool3d)(2, stride=2)
    x = torch.randn(2, 3, *([6] * dims))
    res = {}
    for d in ("cpu", "tpu"):
        xx = x.to(d).detach().clone().requires_grad_()
        y, i = pool(xx)
        u = unpool(y, i, output_size=xx.shape)
        (u * torch.arange(u.numel(), device=d).view(u.shape)).sum().backward()
        res[d] = (u.detach().cpu(), xx.grad.cpu())
    assert torch.equal(res["tpu"][0], res["cpu"][0])
    assert torch.equal(res["tpu"][1], res["cpu"][1])
    assert deferfuse_torch.fallback_counts() == {}



def test_max_unpool_after_overlapping_windows_gives_cpus_output(mode):
    # Windows that overlap (kernel 3, stride 2) can pick one element twice: its position comes
    # twice, with the same value.
    pool = nn.MaxPool2d(3, stride=2, return_indices=True)
    unpool = nn.MaxUnpool2d(3, stride=2)
    x = torch.randn(2, 3, 9, 9)
    y, i = pool(x)
    want = unpool(y, i, output_size=x.shape)
    got = unpool(y.to("tpu"), i.to("tpu"), output_size=x.shape)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("geometry", [
    dict(stride=1), dict(stride=2),
    dict(groups=4, dilation=2, bias=True), dict(groups=8, stride=2, padding=1, bias=True),
], ids=["stride1", "stride2", "grouped_dilated_bias", "grouped_strided_bias"])
def test_a_half_precision_transposed_convolution_sums_its_windows_in_float32(mode, dtype,
                                                                             geometry):
    # Overlapping windows were added up in the half type, each add rounded: over 64 channels
    # the result was off by up to 0.17 of itself against CPU's 0.004 (both measured against
    # float64 on the same half inputs). Now within a couple of half-type roundings, as CPU;
    # a bias joins the float32 sums too (added after the rounding: 0.008-0.010 against 0.004).
    g = torch.Generator().manual_seed(0)
    geometry = dict(geometry)
    groups = geometry.get("groups", 1)
    x = torch.randn(2, 64, 6, 6, generator=g).to(dtype)
    w = torch.randn(64, 8 // groups if groups > 1 else 8, 3, 3, generator=g).to(dtype)
    b = torch.randn(w.shape[1] * groups, generator=g).to(dtype) if geometry.pop("bias", 0) else None
    f = lambda x, w, b: F.conv_transpose2d(x, w, b, **geometry)
    exact = f(x.double(), w.double(), None if b is None else b.double())
    scale = exact.abs().clamp_min(1.0)
    cpu_err = ((f(x, w, b).double() - exact).abs() / scale).max()
    got = f(x.to("tpu"), w.to("tpu"), None if b is None else b.to("tpu")).cpu()
    assert got.dtype == dtype
    err = ((got.double() - exact).abs() / scale).max()
    assert err <= 1.5 * cpu_err.item() + 1e-3, (err, cpu_err)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_convolutions_input_gradient_sums_its_windows_in_float32(mode, dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 64, 7, 7, generator=g).to(dtype)
    w = torch.randn(8, 64, 3, 3, generator=g).to(dtype)
    go = torch.randn(2, 8, 5, 5, generator=g).to(dtype)

    def input_grad(x, w, go):
        x = x.detach().clone().requires_grad_()
        F.conv2d(x, w).backward(go)
        return x.grad

    exact = input_grad(x.double(), w.double(), go.double())
    scale = exact.abs().clamp_min(1.0)
    cpu_err = ((input_grad(x, w, go).double() - exact).abs() / scale).max()
    got = input_grad(x.to("tpu"), w.to("tpu"), go.to("tpu")).cpu()
    err = ((got.double() - exact).abs() / scale).max()
    assert err <= 2 * max(cpu_err.item(), torch.finfo(dtype).eps), (err, cpu_err)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("geometry", [
    dict(stride=2), dict(stride=2, bias=True), dict(padding=1, bias=True),
    dict(stride=2, groups=2, bias=True),
], ids=["stride2", "stride2_bias", "stride1_bias", "grouped_strided_bias"])
def test_a_half_precision_conv1d_copies_its_columns_in_the_routine_with_cpus_values(
        mode, dtype, geometry):
    # A 1-D convolution's columns (an audio encoder's, under autocast) come from the runtime's
    # im2col routine, which copies the half type's bit patterns; with a bias the routine writes
    # the rows above the ones row in place (with groups, the forward keeps the window copy, a
    # copy per group: viewed as one copy, a grouped half-precision convolution with a bias
    # raised). The output and both gradients stay as close to float64 as CPU's.
    g = torch.Generator().manual_seed(2)
    geometry = dict(geometry)
    groups = geometry.get("groups", 1)
    x = torch.randn(2, 16, 300, generator=g).to(dtype)
    w = (torch.randn(24, 16 // groups, 3, generator=g) / 4).to(dtype)
    b = torch.randn(24, generator=g).to(dtype) if geometry.pop("bias", 0) else None
    out = (300 + 2 * geometry.get("padding", 0) - 3) // geometry.get("stride", 1) + 1
    go = torch.randn(2, 24, out, generator=g).to(dtype)

    def step(x, w, b):
        x, w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        y = F.conv1d(x, w, b, **geometry)
        y.backward(go.to(y.device))
        return y, x.grad, w.grad

    exact = step(x.double(), w.double(), None if b is None else b.double())
    cpu = step(x, w, b)
    got = step(x.to("tpu"), w.to("tpu"), None if b is None else b.to("tpu"))
    for name, e, c, t in zip(["output", "input grad", "weight grad"], exact, cpu, got):
        assert t.dtype == dtype, name
        scale = e.abs().clamp_min(1.0)
        cpu_err = ((c.double() - e).abs() / scale).max().item()
        err = ((t.cpu().double() - e).abs() / scale).max().item()
        assert err <= 2 * max(cpu_err, torch.finfo(dtype).eps), (name, err, cpu_err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_strided_conv1d_copies_its_columns_in_the_im2col_routine(dtype):
    # No JIT window copy: the forward's columns (with a bias, under the ones row) and the
    # weight gradient's come from the routine.
    torch.manual_seed(0)
    x = torch.randn(2, 8, 400, device="tpu", dtype=dtype, requires_grad=True)
    w = torch.randn(20, 8, 3, device="tpu", dtype=dtype, requires_grad=True)
    b = torch.randn(20, device="tpu", dtype=dtype)
    g = torch.randn(2, 20, 199, device="tpu", dtype=dtype)
    runs, fallbacks = _programs_of_a_conv_step(
        lambda x, w: F.conv1d(x, w, b, stride=2), x, w, g)
    assert runs.count("im2col") == 2, runs
    assert not fallbacks


# An input left on the CPU with a tpu weight (a forgotten .to("tpu")) takes PyTorch's native
# CPU kernels, which the dispatcher sends to tpu for the weight: they must refuse the mix as
# CUDA does, not compute on the CPU and fail only in backward.
MIXED_DEVICE_CONVOLUTIONS = {
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b), (1, 3, 8), (4, 3, 3)),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b), (1, 3, 5, 5), (4, 3, 3, 3)),
    "conv2d_strided": (lambda x, w, b: F.conv2d(x, w, b, stride=2), (1, 3, 5, 5), (4, 3, 3, 3)),
    "conv3d": (lambda x, w, b: F.conv3d(x, w, b), (1, 3, 4, 4, 4), (4, 3, 3, 3, 3)),
    "conv_transpose3d": (lambda x, w, b: F.conv_transpose3d(x, w, b), (1, 3, 4, 4, 4),
                         (3, 4, 2, 2, 2)),
}


@pytest.mark.parametrize("case", sorted(MIXED_DEVICE_CONVOLUTIONS))
@pytest.mark.parametrize("on_tpu", ["weight", "bias"])
def test_a_convolution_of_a_cpu_input_with_a_tpu_parameter_raises_as_on_cuda(mode, case, on_tpu):
    f, xs, ws = MIXED_DEVICE_CONVOLUTIONS[case]
    x, w = torch.randn(xs), torch.randn(ws)
    b = torch.randn(ws[1] if case.startswith("conv_transpose") else ws[0])
    if on_tpu == "weight":
        w = w.to("tpu")
    else:
        b = b.to("tpu")
    with pytest.raises(RuntimeError, match=rf"Input type \(torch.FloatTensor\) and {on_tpu} type "
                                           r"\(tpuFloatType\) should be the same"):
        f(x, w, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_pool_indices_with_ties_are_cpus_int64_ones(mode, dtype):
    # The running index is int32 inside the loop where the plane fits and widened at the end:
    # the first maximum of each window wins, as on CPU, and the result is int64.
    torch.manual_seed(0)
    x = torch.randint(-3, 4, (2, 5, 17, 15)).to(dtype)
    want = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    got = F.max_pool2d(x.to("tpu"), 3, 2, 1, return_indices=True)
    assert got[1].dtype == torch.int64
    assert torch.equal(got[1].cpu(), want[1]) and torch.equal(got[0].cpu(), want[0])


# A probe of half-precision convolutions against CPU (session 55) found the cases below.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_depthwise_convolution_adds_its_bias_before_rounding(mode, dtype):
    # The sum 301.5 and the bias -301 cancel: rounded first, the sum was 302 and the result 1
    # unit of bf16 off (2.0 where CPU gives the exact 1.5).
    x = torch.tensor([[[100.0, 100.5, 101.0]]], dtype=dtype).repeat(1, 2, 1)
    w, b = torch.ones(2, 1, 3, dtype=dtype), torch.full((2,), -301.0, dtype=dtype)
    want = F.conv1d(x, w, b, groups=2)
    got = F.conv1d(x.to("tpu"), w.to("tpu"), b.to("tpu"), groups=2)
    assert torch.equal(got.cpu(), want), (got, want)


def test_a_bfloat16_1x1_transposed_convolution_adds_its_bias_before_rounding(mode):
    x = torch.tensor([[[[100.5]], [[200.5]]]], dtype=torch.bfloat16)
    w, b = torch.ones(2, 2, 1, 1, dtype=torch.bfloat16), torch.full((2,), -301.0, dtype=torch.bfloat16)
    want = F.conv_transpose2d(x, w, b)
    got = F.conv_transpose2d(x.to("tpu"), w.to("tpu"), b.to("tpu"))
    assert torch.equal(got.cpu(), want), (got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", [
    ((2, 4, 40), (4, 4, 2), dict(dilation=2, output_padding=1)),
    ((1, 4, 10, 10), (4, 4, 5, 5), dict(stride=2, dilation=3, output_padding=2)),
], ids=["1d", "2d_strided"])
def test_a_transposed_convolutions_input_gradient_with_output_padding_past_its_stride(
        mode, dtype, case):
    # An output_padding of at least the stride (allowed below the dilation) leaves room for
    # more windows than x has positions; the conv op's forward of the gradient computed them
    # too, and autograd raised on the longer input gradient.
    xs, ws, kw = case
    f = {3: F.conv_transpose1d, 4: F.conv_transpose2d}[len(xs)]
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(xs, generator=g).to(dtype), torch.randn(ws, generator=g).to(dtype)

    def grads(x, w):
        x, w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        y = f(x, w, **kw)
        y.backward(torch.ones_like(y))
        return x.grad, w.grad

    want = grads(x, w)
    got = grads(x.to("tpu"), w.to("tpu"))
    tol = 1e-4 if dtype == torch.float32 else 0.05
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a.cpu().float(), b.float(), rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("padding", [2, 3])
def test_a_transposed_convolution_with_no_output_positions_raises_cpus_error(mode, padding):
    x, w = torch.randn(1, 2, 4, device="tpu"), torch.randn(2, 2, 1, device="tpu")
    with pytest.raises(RuntimeError, match="Output size is too small"):
        F.conv_transpose1d(x, w, padding=padding)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_convolution_of_mixed_dtypes_raises_as_on_cpu(mode, transposed):
    f = F.conv_transpose2d if transposed else F.conv2d
    x = torch.randn(2, 8, 6, 6, device="tpu", dtype=torch.bfloat16)
    w = torch.randn(8, 8, 3, 3, device="tpu")
    with pytest.raises(RuntimeError, match=r"Input type .* and weight type .* should be the same"):
        f(x, w, padding=1)
    with pytest.raises(RuntimeError, match=r"Input type .* and bias type .* should be the same"):
        f(x, w.bfloat16(), torch.randn(8, device="tpu"), padding=1)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_zero_dilation_raises_as_on_cpu(mode, transposed):
    f = F.conv_transpose2d if transposed else F.conv2d
    x, w = torch.randn(1, 4, 6, 6, device="tpu"), torch.randn(4, 4, 3, 3, device="tpu")
    with pytest.raises(RuntimeError, match="dilation should be greater than zero"):
        f(x, w, dilation=(1, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_write_through_data_before_backward_reaches_the_weight_gradient(mode, dtype):
    # `.data` writes bump no version counter: the forward's kept columns were taken for the
    # weight gradient, which CPU computes from x's new values.
    g = torch.Generator().manual_seed(4)
    x0, w0, x1 = (torch.randn(s, generator=g).to(dtype) for s in [(2, 8, 12, 12), (8, 4, 3, 3),
                                                                     (2, 8, 12, 12)])

    def weight_grad(dev):
        x, w = x0.to(dev), w0.to(dev).requires_grad_()
        y = F.conv2d(x, w, padding=1, groups=2)
        x.data.copy_(x1)
        y.sum().backward()
        return w.grad.cpu().float()

    torch.testing.assert_close(weight_grad("tpu"), weight_grad("cpu"), rtol=1e-3, atol=1e-3)


# A probe of pooling, normalization and resampling against CPU (session 55) found these.
@pytest.mark.parametrize("dims", [1, 2])
def test_an_uneven_adaptive_average_keeps_an_inf_in_its_own_windows(mode, dims):
    # As averaging matrices applied along each dim, the zeros multiplied every element:
    # inf * 0 made NaN in windows that do not hold the inf.
    x = torch.tensor([[[1.0, float("inf"), 2.0, 3.0, 4.0], [1.0, 2.0, -float("inf"), 5.0, 6.0],
                       [0.5, 1.5, 2.5, float("nan"), 4.5], [7.0, 8.0, 9.0, 10.0, 11.0]]])
    if dims == 1:
        f = lambda t: F.adaptive_avg_pool1d(t, 3)
    else:
        f = lambda t: F.adaptive_avg_pool2d(t.unsqueeze(0), (3, 3))
    torch.testing.assert_close(f(x.to("tpu")).cpu(), f(x), equal_nan=True)


@pytest.mark.parametrize("dims", [2, 3])
def test_an_uneven_adaptive_max_points_at_its_windows_last_nan_as_cpu(mode, dims):
    x = torch.tensor([[[[1.0, float("nan"), float("nan"), 3.0, 4.0],
                        [float("nan"), 2.0, 5.0, float("nan"), 0.0]]]])
    if dims == 2:
        f = lambda t: F.adaptive_max_pool2d(t, (1, 2), return_indices=True)
    else:
        x = torch.stack([x, x.flip(-1)], 2)
        f = lambda t: F.adaptive_max_pool3d(t, (1, 1, 2), return_indices=True)
    want, got = f(x), f(x.to("tpu"))
    assert torch.equal(got[1].cpu(), want[1]), (got[1], want[1])
    torch.testing.assert_close(got[0].cpu(), want[0], equal_nan=True)


@pytest.mark.parametrize("padding_mode", ["border", "reflection"])
@pytest.mark.parametrize("interp", ["bilinear", "nearest"])
def test_grid_sample_clamps_a_nan_or_infinite_coordinate_as_cpu(mode, padding_mode, interp):
    x = torch.arange(12.0).reshape(1, 1, 3, 4)
    g = torch.tensor([[[[float("nan"), 0.0], [float("inf"), 0.0], [-float("inf"), 0.0],
                        [0.3, 0.2]]]])
    f = lambda x, g: F.grid_sample(x, g, mode=interp, padding_mode=padding_mode,
                                   align_corners=False)
    torch.testing.assert_close(f(x.to("tpu"), g.to("tpu")).cpu(), f(x, g), equal_nan=True)


def test_an_empty_batch_samples_and_pools_as_on_cpu(mode):
    x = torch.randn(0, 3, 4, 4, device="tpu")
    assert F.grid_sample(x, torch.zeros(0, 2, 2, 2, device="tpu"),
                         align_corners=False).shape == (0, 3, 2, 2)
    x = torch.randn(0, 3, 8, 8, device="tpu", requires_grad=True)
    F.adaptive_max_pool2d(x, 3).sum().backward()
    assert x.grad.shape == (0, 3, 8, 8)


def test_known_pooling_differences_from_cpu_are_pinned(mode):
    # README, *Where "tpu" differs from PyTorch on CPU*: each line below is a known difference.
    h = torch.randn(1, 1, 4, 4, 4, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="not implemented for 'BFloat16'"):
        F.avg_pool3d(h, 2)
    torch.testing.assert_close(F.avg_pool3d(h.to("tpu"), 2).cpu(),
                               F.avg_pool3d(h.float(), 2).bfloat16())
    assert F.max_pool2d(torch.randn(2, 0, 8, 8, device="tpu"), 2).shape == (2, 0, 4, 4)
    stats = (torch.zeros(3, device="tpu"), torch.ones(3, device="tpu"))
    half = torch.randn(2, 3, 4, device="tpu", dtype=torch.bfloat16)
    out = F.batch_norm(half, *stats, torch.ones(3, device="tpu", dtype=torch.bfloat16),
                       torch.zeros(3, device="tpu", dtype=torch.bfloat16), training=True)
    assert out.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="must be positive"):
        F.max_pool2d(torch.randn(1, 1, 4, 4, device="tpu"), 2, stride=0)
