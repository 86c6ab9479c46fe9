"""The CPU fallback (ops with no tpu kernel) writes back every argument the op mutates, as
PyTorch on CPU does: in-place self, out= (any layout, resized like PyTorch), lists of mutable
tensors, and arguments written without a schema annotation (batch norm's running statistics).
Each test checks that the op really went through the fallback (fallback_counts); i0 (a Bessel
function) stands for an op with no tpu kernel (op_survey.py lists the others)."""
import warnings

import pytest
import torch

import deferfuse_torch
from conftest import check


@pytest.fixture
def counts():
    deferfuse_torch.reset_fallback_counts()
    yield deferfuse_torch.fallback_counts


def test_in_place_op_writes_through_a_strided_view(mode, counts):
    base = torch.rand(4, 5) * 1.8 - 0.9
    dev = base.to("tpu")
    base.t()[1:].i0_()
    dev.t()[1:].i0_()
    check(dev, base)
    assert counts() == {"aten::i0.out": 1}


def test_out_argument_is_written(mode, counts):
    x = torch.rand(6) * 1.8 - 0.9
    out = torch.empty(6).to("tpu")
    got = torch.special.i0(x.to("tpu"), out=out)
    assert got is out
    check(out, torch.special.i0(x))
    assert "aten::i0.out" in counts()


def test_out_argument_that_is_a_strided_view_keeps_its_layout(mode, counts):
    x = torch.rand(3) * 1.8 - 0.9
    base = torch.zeros(3, 2)
    dev = base.to("tpu")
    torch.special.i0(x, out=base[:, 1])
    torch.special.i0(x.to("tpu"), out=dev[:, 1])
    check(dev, base)
    assert dev[:, 1].stride() == (2,)


def test_empty_out_is_resized_without_a_warning(mode, counts):
    out = torch.empty(0).to("tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.special.i0(torch.linspace(-0.9, 0.9, 4).to("tpu"), out=out)
    check(out, torch.special.i0(torch.linspace(-0.9, 0.9, 4)))


def test_wrong_shape_out_warns_and_is_resized_like_on_cpu(mode, counts):
    cpu_out, dev_out = torch.zeros(2), torch.zeros(2).to("tpu")
    with pytest.warns(UserWarning, match="was resized"):
        torch.special.i0(torch.linspace(-0.9, 0.9, 4), out=cpu_out)
    with pytest.warns(UserWarning, match="was resized"):
        torch.special.i0(torch.linspace(-0.9, 0.9, 4).to("tpu"), out=dev_out)
    check(dev_out, cpu_out)


def test_functional_loss_through_its_out_kernel_does_not_warn(mode, counts):
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = torch.nn.functional.smooth_l1_loss(a.to("tpu"), b.to("tpu"))
    check(got, torch.nn.functional.smooth_l1_loss(a, b))


# An op with a list of mutable tensors and only a CPU kernel (PyTorch's own such ops, the fused
# optimizer steps and the foreach ops, all run on the device now).
_LIB = torch.library.Library("dftest_fallback", "DEF")
_LIB.define("scale_and_shift_(Tensor(a!)[] xs, Tensor(b!)[] ys, float s) -> ()")


def _scale_and_shift_cpu(xs, ys, s):
    for x, y in zip(xs, ys):
        x.mul_(s)
        y.add_(x)


_LIB.impl("scale_and_shift_", _scale_and_shift_cpu, "CPU")


def test_mutable_tensor_lists_are_written(mode, counts):
    torch.manual_seed(0)
    xs = [torch.randn(3), torch.randn(2, 2)]
    ys = [torch.zeros(3), torch.ones(2, 2)]
    dev = [[t.to("tpu") for t in ts] for ts in (xs, ys)]
    torch.ops.dftest_fallback.scale_and_shift_(xs, ys, 2.0)
    torch.ops.dftest_fallback.scale_and_shift_(dev[0], dev[1], 2.0)
    for got, want in zip(dev[0] + dev[1], xs + ys):
        check(got, want)
    assert counts() == {"dftest_fallback::scale_and_shift_": 1}


def test_native_batch_norm_updates_running_statistics(mode, counts):
    torch.manual_seed(0)
    x = torch.randn(6, 3)
    mean, var = torch.zeros(3), torch.ones(3)
    dmean, dvar = mean.to("tpu"), var.to("tpu")
    want = torch.ops.aten.native_batch_norm(x, None, None, mean, var, True, 0.1, 1e-5)
    got = torch.ops.aten.native_batch_norm(x.to("tpu"), None, None, dmean, dvar, True, 0.1, 1e-5)
    check(got[0], want[0], atol=1e-5)
    check(dmean, mean)
    check(dvar, var)
    assert not torch.equal(mean, torch.zeros(3))


def test_native_batch_norm_in_eval_leaves_running_statistics(mode, counts):
    x = torch.randn(6, 3)
    dmean, dvar = torch.full((3,), 0.5).to("tpu"), torch.full((3,), 2.0).to("tpu")
    torch.ops.aten.native_batch_norm(x.to("tpu"), None, None, dmean, dvar, False, 0.1, 1e-5)
    check(dmean, torch.full((3,), 0.5))
    check(dvar, torch.full((3,), 2.0))


def test_batch_norm_update_stats_updates_running_statistics(mode, counts):
    torch.manual_seed(0)
    x = torch.randn(5, 4, 2)
    mean, var = torch.zeros(4), torch.ones(4)
    dmean, dvar = mean.to("tpu"), var.to("tpu")
    want = torch.ops.aten.batch_norm_update_stats(x, mean, var, 0.2)
    got = torch.ops.aten.batch_norm_update_stats(x.to("tpu"), dmean, dvar, 0.2)
    for g, w in zip(got, want):
        check(g, w)
    check(dmean, mean)
    check(dvar, var)
    assert counts() == {"aten::batch_norm_update_stats": 1}


def test_annotated_batch_norm_writes_running_statistics(mode, counts):
    torch.manual_seed(0)
    x = torch.randn(6, 3)
    mean, var = torch.zeros(3), torch.ones(3)
    dmean, dvar = mean.to("tpu"), var.to("tpu")
    want = torch.ops.aten._native_batch_norm_legit(x, None, None, mean, var, True, 0.1, 1e-5)
    got = torch.ops.aten._native_batch_norm_legit(x.to("tpu"), None, None, dmean, dvar, True,
                                                  0.1, 1e-5)
    check(got[0], want[0], atol=1e-5)
    check(dmean, mean)
    check(dvar, var)
