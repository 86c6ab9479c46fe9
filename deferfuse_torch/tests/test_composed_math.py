"""Math a model's losses and layers call that PyTorch has only CPU and CUDA kernels for, composed
from the device's ops (so the backward is autograd through them), against CPU in every eager
mode with no CPU fallback: cdist (its direct path, every p) and pdist with their gradients,
frac, logaddexp, hardshrink (+ backward), var_mean/std_mean, trace, torch.equal,
channel_shuffle and linalg.cross."""

import pytest
import torch
import torch.nn.functional as F

import deferfuse_torch
from conftest import assert_same, check

torch.manual_seed(3)
X1 = torch.randn(2, 7, 5)
X2 = torch.randn(2, 6, 5)


@pytest.fixture(autouse=True)
def no_fallback():
    deferfuse_torch.reset_fallback_counts()
    yield
    assert deferfuse_torch.fallback_counts() == {}


@pytest.mark.parametrize("p", [2.0, 1.0, 0.5, 3.0, 0.0])
def test_cdist_matches_cpu_forward_and_backward(mode, p):
    assert_same(lambda a, b: torch.cdist(a, b, p=p), X1, X2, atol=1e-4, rtol=1e-4)


def test_cdist_of_a_set_with_itself_has_zero_gradient_on_the_diagonal(mode):
    # sqrt's gradient at 0 is infinite; _cdist_backward's (and vector_norm's) is 0.
    x = X1[0]
    assert_same(lambda a: torch.cdist(a, a, compute_mode="donot_use_mm_for_euclid_dist"), x,
                atol=1e-4, rtol=1e-4)


def test_cdist_of_many_rows_takes_pytorchs_matrix_product_path(mode):
    a, b = torch.randn(40, 8), torch.randn(30, 8)
    assert_same(lambda a, b: torch.cdist(a, b), a, b, atol=1e-4, rtol=1e-4)


def test_cdist_broadcasts_batch_dims_and_keeps_float64(mode):
    a, b = torch.randn(3, 1, 4, 5, dtype=torch.float64), torch.randn(2, 6, 5, dtype=torch.float64)
    check(torch.cdist(a.to("tpu"), b.to("tpu"), p=1.0), torch.cdist(a, b, p=1.0), atol=1e-12,
          rtol=1e-12)


def test_cdist_shape_errors_are_cpus():
    a, b = torch.randn(4, 5), torch.randn(3, 6)
    with pytest.raises(RuntimeError, match="same number of columns"):
        torch.cdist(a.to("tpu"), b.to("tpu"))


@pytest.mark.parametrize("p", [2.0, 1.0, float("inf"), 0.0])
def test_pdist_matches_cpu_forward_and_backward(mode, p):
    assert_same(lambda x: F.pdist(x, p), torch.randn(6, 4), atol=1e-4, rtol=1e-4)


def test_pdist_of_one_row_is_empty(mode):
    check(F.pdist(torch.randn(1, 4).to("tpu")), F.pdist(torch.randn(1, 4)))


def test_pdist_of_one_row_stays_in_the_graph_with_a_zero_gradient(mode):
    # CPU's empty result still has x's grad_fn: summing it into a loss gives x a zero gradient.
    x = torch.randn(1, 4).to("tpu").requires_grad_()
    d = F.pdist(x)
    assert d.requires_grad
    d.sum().backward()
    check(x.grad, torch.zeros(1, 4))


SPECIALS = torch.tensor([-2.5, -1.0, -0.3, 0.0, 0.4, 1.75, 30.0, float("inf"), -float("inf"),
                         float("nan")])


def test_frac_matches_cpu_specials_included(mode):
    check(torch.frac(SPECIALS.to("tpu")), torch.frac(SPECIALS))
    x = SPECIALS.clone()
    got = x.to("tpu")
    got.frac_()
    check(got, x.frac_())
    assert_same(torch.frac, torch.randn(9) * 3)


def test_logaddexp_matches_cpu_with_equal_infinities(mode):
    other = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.4, -3.0, 29.0, float("inf"), -float("inf"),
                          0.0])
    check(torch.logaddexp(SPECIALS.to("tpu"), other.to("tpu")), torch.logaddexp(SPECIALS, other))
    assert_same(torch.logaddexp, torch.randn(7), torch.randn(7))


def test_hardshrink_matches_cpu_forward_and_backward(mode):
    x = torch.tensor([-0.6, -0.5, 0.2, 0.5, 0.51, 2.0])
    assert_same(lambda t: F.hardshrink(t, 0.5), x)
    check(F.hardshrink(SPECIALS.to("tpu"), 1.0), F.hardshrink(SPECIALS, 1.0))


@pytest.mark.parametrize("fn", [torch.var_mean, torch.std_mean])
def test_var_mean_and_std_mean_match_cpu(mode, fn):
    assert_same(lambda x: fn(x, dim=1, correction=0, keepdim=True), X1)
    got, want = fn(X1.to("tpu")), fn(X1)
    check(got[0], want[0])
    check(got[1], want[1])


def test_trace_matches_cpu_for_floats_and_ints(mode):
    assert_same(torch.trace, torch.randn(4, 6))
    i = torch.arange(12).view(3, 4)
    check(torch.trace(i.to("tpu")), torch.trace(i))


@pytest.mark.parametrize("a,b", [
    (torch.tensor([1, 2]), torch.tensor([1.0, 2.0])),
    (torch.tensor([float("nan")]), torch.tensor([float("nan")])),
    (torch.ones(2), torch.ones(1)),
    (torch.ones(2, 1), torch.ones(2)),
    (torch.zeros(0), torch.zeros(0)),
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])),
])
def test_equal_gives_cpus_answer(mode, a, b):
    assert torch.equal(a.to("tpu"), b.to("tpu")) == torch.equal(a, b)


def test_channel_shuffle_matches_cpu_forward_and_backward(mode):
    assert_same(lambda x: torch.nn.ChannelShuffle(3)(x), torch.randn(2, 6, 4, 5))
    with pytest.raises(RuntimeError, match="divisible by groups"):
        F.channel_shuffle(torch.randn(2, 6, 3).to("tpu"), 4)


def test_cdist_inf_splits_the_gradient_between_tied_columns_where_cpu_gives_each_all_of_it():
    # The README's differences table: amax's gradient rule, not _cdist_backward's.
    a = torch.tensor([[0.0, 0.0]], requires_grad=True)
    b = torch.tensor([[1.0, -1.0]])
    torch.cdist(a, b, p=float("inf")).sum().backward()
    assert a.grad.tolist() == [[-1.0, 1.0]]
    at = a.detach().to("tpu").requires_grad_()
    torch.cdist(at, b.to("tpu"), p=float("inf")).sum().backward()
    assert at.grad.cpu().tolist() == [[-0.5, 0.5]]


@pytest.mark.parametrize("shape,dim,size,step", [((10,), 0, 3, 1), ((10,), 0, 3, 3),
                                                  ((4, 9), 1, 4, 2), ((2, 3, 8), -1, 5, 5),
                                                  ((), 0, 1, 1)])
def test_tensor_unfold_backward_adds_each_windows_gradient_back(mode, shape, dim, size, step):
    # unfold_backward ran on the CPU fallback (framing a signal, cutting patches).
    assert_same(lambda x: x.unfold(dim, size, step), torch.randn(shape))


@pytest.mark.parametrize("dim", [1, -1])
def test_cross_product_and_its_gradient_match_cpu(mode, dim):
    g = torch.Generator().manual_seed(0)
    shape = (4, 3, 5) if dim == 1 else (4, 5, 3)
    a = torch.randn(*shape, generator=g)
    b = torch.randn(1, *shape[1:], generator=g)  # broadcast over the batch
    assert_same(lambda a, b: torch.linalg.cross(a, b, dim=dim), a, b, atol=1e-6, rtol=1e-5)
    assert_same(lambda a, b: torch.cross(a, b, dim=dim), a, b, atol=1e-6, rtol=1e-5)


def test_cross_product_of_a_dim_not_of_length_three_raises_cpus_error(mode):
    with pytest.raises(RuntimeError, match="inputs dimension -1 must have length 3. Got 3 and 4"):
        torch.linalg.cross(torch.randn(2, 3, device="tpu"), torch.randn(2, 4, device="tpu"))


@pytest.mark.parametrize("f", [
    lambda t: torch.logcumsumexp(t, 0),
    lambda t: torch.linalg.vector_norm(t),
    lambda t: torch.bincount(t.float()),
], ids=["logcumsumexp_int64", "vector_norm_int64", "bincount_float"])
def test_an_unsupported_input_dtype_raises_not_implemented_as_on_cpu(mode, f):
    with pytest.raises(NotImplementedError):
        f(torch.arange(4))
    with pytest.raises(NotImplementedError):
        f(torch.arange(4, device="tpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lgamma_is_accurate_near_its_zeros(mode, dtype):
    # Computed in float64 (float32's Stirling-minus-log-product kept ~1e-6 of error where the
    # value is 0: lgamma(1) read 9.5e-7); exactly 0 at 1 and 2, as CPU's.
    x = torch.tensor([1.0, 2.0, 0.9999, 2.0001, 1.5, 0.5, 10.5, 1e-3], dtype=dtype)
    got = torch.lgamma(x.to("tpu")).cpu()
    truth = torch.lgamma(x.double())
    assert got[0].item() == 0.0 and got[1].item() == 0.0
    # float32: relative (its rounding); float64: ~1e-14 absolute where the terms cancel.
    rel, floor = (1e-6, 1e-30) if dtype == torch.float32 else (1e-13, 1e-14)
    assert ((got.double() - truth).abs() <= rel * truth.abs() + floor).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name,f", [
    ("cdist", lambda x: torch.cdist(x[0, 0], x[0, 1])),
    ("pdist", lambda x: F.pdist(x[0, 0])),
    ("multi_margin_loss", lambda x: F.multi_margin_loss(
        x[0, 0], torch.tensor([0, 1, 2], device=x.device))),
    ("local_response_norm", lambda x: F.local_response_norm(x, 3)),
])
def test_half_precision_distances_margin_loss_and_lrn_compute_where_cpu_raises(mode, dtype, name,
                                                                               f):
    # A difference the README states: CPU has no half kernel for these.
    x = torch.randn(2, 4, 3, 3)
    with pytest.raises(NotImplementedError):
        f(x.to(dtype))
    got = f(x.to(dtype).to("tpu")).cpu()
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), f(x.to(dtype).float()), atol=2e-2, rtol=2e-2)
