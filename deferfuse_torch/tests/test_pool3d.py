"""3-D max and average pooling on tpu (csrc/pool3d.cpp): CPU's values, indices and gradients
with no CPU fallback, in every mode, and CPU's shape errors."""
import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same, check, raises_like_cpu

MAX = {
    "2": dict(kernel_size=2),
    "uneven, padded, ceil": dict(kernel_size=(2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0),
                                 ceil_mode=True),
    "dilated": dict(kernel_size=(2, 2, 3), stride=2, dilation=(1, 2, 1), padding=(0, 1, 1)),
}
AVG = {
    "2": dict(kernel_size=2),
    "padded, count_include_pad": dict(kernel_size=3, stride=2, padding=1),
    "padded, real elements only, ceil": dict(kernel_size=(3, 2, 3), stride=2, padding=1,
                                             count_include_pad=False, ceil_mode=True),
    "divisor_override": dict(kernel_size=2, stride=(1, 2, 2), divisor_override=3),
}


@pytest.mark.parametrize("case", sorted(MAX))
def test_max_pool3d_matches_cpu_values_indices_and_gradients(mode, case):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 7, 6)
    assert_same(lambda t: F.max_pool3d(t, **MAX[case]) * 2, x)
    got = F.max_pool3d(x.to("tpu"), return_indices=True, **MAX[case])[1]
    want = F.max_pool3d(x, return_indices=True, **MAX[case])[1]
    assert torch.equal(got.cpu(), want)


def test_max_pool3d_takes_the_first_of_tied_maxima_and_a_nan_as_cpu_does(mode):
    # Each window position a strided view, compared in window order (pooling.h): a value
    # replaces the running maximum when greater or NaN, as CPU's kernel does.
    x = torch.zeros(1, 2, 4, 4, 4)
    x[0, 1, 1, 1, 1] = float("nan")
    x[0, 1, 2, 2, 2] = 5.0
    x[0, 1, 3, 3, 3] = 5.0
    for kw in [dict(kernel_size=2), dict(kernel_size=3, stride=1, padding=1)]:
        got = F.max_pool3d(x.to("tpu"), return_indices=True, **kw)
        want = F.max_pool3d(x, return_indices=True, **kw)
        assert torch.equal(got[1].cpu(), want[1])
        torch.testing.assert_close(got[0].cpu(), want[0], equal_nan=True)


@pytest.mark.parametrize("case", sorted(AVG))
def test_avg_pool3d_matches_cpu_values_and_gradients(mode, case):
    torch.manual_seed(0)
    assert_same(lambda t: F.avg_pool3d(t, **AVG[case]) * 2, torch.randn(2, 3, 5, 7, 6))


def test_unbatched_input_pools_as_on_cpu(mode):
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5, 6)
    assert_same(lambda t: F.max_pool3d(t, 2, padding=1), x)
    assert_same(lambda t: F.avg_pool3d(t, 2), x)


@pytest.mark.parametrize("call", [
    lambda x: F.avg_pool3d(x, 7),  # the input is smaller than the kernel
    lambda x: F.max_pool3d(x, 2, padding=2),  # padding above half the kernel
    lambda x: F.max_pool3d(x.flatten(0, 2), 2),  # 3-D input
])
def test_bad_pooling_raises_cpus_errors(call):
    x = torch.randn(1, 2, 4, 5, 6)
    raises_like_cpu(call, x)


@pytest.mark.parametrize("size", [(2, 3, 4), (5, 1, 6), (3, 7, 2)])
def test_adaptive_avg_pool3d_matches_cpu_with_uneven_windows(mode, size):
    torch.manual_seed(0)
    assert_same(lambda t: F.adaptive_avg_pool3d(t, size) * 2, torch.randn(2, 3, 5, 7, 6))
    assert_same(lambda t: F.adaptive_avg_pool3d(t, size), torch.randn(3, 5, 7, 6))


@pytest.mark.parametrize("size", [(2, 3, 4), (5, 1, 6), (3, 7, 2)])
def test_adaptive_max_pool3d_matches_cpu_values_indices_and_gradients(mode, size):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 7, 6)
    assert_same(lambda t: F.adaptive_max_pool3d(t, size) * 2, x)
    got = F.adaptive_max_pool3d(x.to("tpu"), size, return_indices=True)[1]
    assert torch.equal(got.cpu(), F.adaptive_max_pool3d(x, size, return_indices=True)[1])


@pytest.mark.parametrize("call", [
    lambda x: F.adaptive_avg_pool3d(x.flatten(0, 2), 2),
    lambda x: F.adaptive_max_pool3d(x[:, :, :0], 2),
])
def test_bad_adaptive_pooling_raises_cpus_errors(call):
    x = torch.randn(1, 2, 4, 5, 6)
    raises_like_cpu(call, x)


# Their tables are uploaded in eager calls; while torch.compile traces they are computed by
# tensor ops (a fake tensor has no memory to upload into).
COMPILED_POOLS = {
    "avg": lambda t: F.avg_pool3d(t, 3, stride=2, padding=1),
    "avg_ceil_no_pad_count": lambda t: F.avg_pool3d(t, 2, stride=2, padding=1, ceil_mode=True,
                                                     count_include_pad=False),
    "avg_divisor_override": lambda t: F.avg_pool3d(t, (2, 3, 2), divisor_override=5),
    "adaptive_avg_uneven": lambda t: F.adaptive_avg_pool3d(t, (3, 4, 2)),
    "adaptive_max_uneven": lambda t: F.adaptive_max_pool3d(t, (3, 4, 2)),
}


@pytest.mark.parametrize("name", sorted(COMPILED_POOLS))
def test_compiled_3d_pooling_matches_cpu_forward_and_backward(name):
    f = COMPILED_POOLS[name]
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 7, 6)
    want = f(x.clone().requires_grad_())
    dx = x.to("tpu").requires_grad_()
    got = torch.compile(f, backend="tpu")(dx)
    check(got, want.detach(), atol=1e-5)
    cx = x.clone().requires_grad_()
    f(cx).square().sum().backward()
    got.square().sum().backward()
    check(dx.grad, cx.grad, atol=1e-5)
