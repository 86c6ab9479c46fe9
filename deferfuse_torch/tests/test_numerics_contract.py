"""Numerics that must match PyTorch on CPU exactly (issue: the device keeps PyTorch's contract,
item 10): how a scalar operand is rounded for float16/bfloat16 ops, and in-place writes whose
destination partially overlaps an input, which PyTorch refuses."""
import pytest
import torch

from conftest import check

HALVES = [torch.float16, torch.bfloat16]
OVERLAP = "some elements of the input tensor and the written-to tensor refer to a single memory"


def bits_equal(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.cpu(), want
    assert torch.equal(g.view(torch.int16), w.view(torch.int16)), \
        f"{int((g != w).sum())} of {w.numel()} elements differ"


def halves(dtype):
    torch.manual_seed(0)
    return (torch.randn(4096) * 3).to(dtype)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("op", ["add", "sub", "rsub"])
def test_a_python_scalar_is_rounded_to_the_half_dtype_before_add_and_sub(mode, dtype, op):
    x = halves(dtype)
    f = {"add": lambda t: t + 0.1, "sub": lambda t: t - 1.182, "rsub": lambda t: 3.3333 - t}[op]
    bits_equal(f(x.to("tpu")), f(x))


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("op", ["mul", "div"])
def test_mul_and_div_keep_a_python_scalar_in_float32(mode, dtype, op):
    x = halves(dtype)
    f = (lambda t: t * 0.1) if op == "mul" else (lambda t: t / 3.3333)
    bits_equal(f(x.to("tpu")), f(x))


@pytest.mark.parametrize("dtype", HALVES)
def test_mul_and_div_keep_a_zero_dim_float32_tensor_in_float32(mode, dtype):
    x, s = halves(dtype), torch.tensor(0.1)
    bits_equal(x.to("tpu") * s.to("tpu"), x * s)
    bits_equal(x.to("tpu") / s.to("tpu"), x / s)
    bits_equal(x.to("tpu") * s, x * s)


@pytest.mark.parametrize("dtype", HALVES)
def test_a_zero_dim_first_operand_of_mul_is_rounded_to_the_half_dtype(mode, dtype):
    x, s = halves(dtype), torch.tensor(0.1)
    bits_equal(s.to("tpu") * x.to("tpu"), s * x)


def test_a_fused_chain_with_half_scalars_matches_cpu(mode):
    x = halves(torch.float16)
    f = lambda t: ((t + 0.1) * 0.3 - 0.7) / 1.3  # noqa: E731
    bits_equal(f(x.to("tpu")), f(x))


def test_out_as_the_transpose_of_an_input_is_refused_as_on_cpu(mode):
    a = torch.arange(16.0, device="tpu").reshape(4, 4)
    with pytest.raises(RuntimeError, match=OVERLAP):
        torch.mul(a, 2, out=a.t())
    assert torch.equal(a.cpu(), torch.arange(16.0).reshape(4, 4)), "nothing was written"


def test_in_place_on_a_transposed_view_of_its_own_input_is_refused(mode):
    a = torch.arange(16.0, device="tpu").reshape(4, 4)
    with pytest.raises(RuntimeError, match=OVERLAP):
        a.t().add_(a)


def test_out_shifted_over_its_input_is_refused(mode):
    a = torch.arange(16.0, device="tpu").reshape(4, 4)
    with pytest.raises(RuntimeError, match=OVERLAP):
        torch.add(a[0:2], 1, out=a[1:3])


def test_a_copy_between_overlapping_windows_is_refused(mode):
    a = torch.arange(8.0, device="tpu")
    with pytest.raises(RuntimeError, match=OVERLAP):
        a[1:].copy_(a[:-1])


def test_full_overlap_and_disjoint_views_of_one_storage_are_allowed(mode):
    a = torch.arange(16.0).reshape(4, 4)
    d = a.to("tpu")
    d.add_(d)
    torch.add(d[0], d[1], out=d[2])
    a.add_(a)
    torch.add(a[0], a[1], out=a[2])
    assert torch.equal(d.cpu(), a)


INTEGER_DIVISIONS = {
    "remainder": torch.remainder, "fmod": torch.fmod, "floor_divide": torch.floor_divide,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor")}


@pytest.mark.parametrize("op", list(INTEGER_DIVISIONS))
def test_integer_division_by_a_zero_in_a_tpu_tensor_gives_zero_in_strict_and_defer(mode, op):
    # A stated difference (README, "Where tpu differs from PyTorch on CPU"): checking a device
    # divisor would need a data-dependent error like the index checks; CPU raises
    # ZeroDivisionError, and so does debug mode, whose ops wait anyway.
    f = INTEGER_DIVISIONS[op]
    a, b = torch.tensor([7, -7, 5]), torch.tensor([0, 0, 2])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(a, b)
    if mode == "debug":
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            f(a.to("tpu"), b.to("tpu"))
        return
    assert f(a.to("tpu"), b.to("tpu")).cpu().tolist() == [0, 0, f(a[2:], b[2:]).item()]


@pytest.mark.parametrize("op", list(INTEGER_DIVISIONS))
def test_integer_division_by_a_zero_the_host_holds_raises_as_cpu_in_every_mode(mode, op):
    # A Python number or a CPU scalar divisor is known at the call: CPU's error there.
    f = INTEGER_DIVISIONS[op]
    a = torch.tensor([7, -7]).to("tpu")
    for zero in (0, torch.tensor(0)):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            f(a, zero)
    assert f(a, 2).cpu().tolist() == f(torch.tensor([7, -7]), 2).tolist()


def test_nans_from_infinities_through_matmul_and_row_kernels_sit_where_cpus_do(mode):
    # A NaN's sign and payload are not compared (README): CPU itself gives NaNs of both signs
    # here, and the fused and unfused paths may differ in them.
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    x[0, 0], x[1, 1] = float("inf"), float("-inf")

    def f(a, b):
        y = a @ b
        return [torch.softmax(y, -1), torch.log_softmax(y, -1), y.sum(-1)]

    for got, want in zip(f(x.to("tpu"), w.to("tpu")), f(x, w)):
        assert torch.equal(got.cpu().isnan(), want.isnan())
        torch.testing.assert_close(got.cpu(), want, equal_nan=True, atol=1e-5, rtol=1e-5)


def test_multinomial_draws_without_checking_the_probabilities_where_cpu_raises(mode):
    """CPU raises on a negative, non-finite or all-zero probability row; checking the values
    would cost a sync point per call, so the device draws indices in range instead."""
    bad = torch.tensor([0.5, -1.0, 2.0])
    with pytest.raises(RuntimeError, match="invalid multinomial distribution"):
        torch.multinomial(bad, 4, True)
    got = torch.multinomial(bad.to("tpu"), 4, True).cpu()
    assert got.dtype == torch.int64 and ((got >= 0) & (got < 3)).all()


def test_bernoulli_with_a_tensor_probability_out_of_range_draws_where_cpu_raises(mode):
    """CPU raises on a probability outside [0, 1] or NaN; checking would read p back every
    call, so the device draws: 1 where p >= 1, 0 where p <= 0 or NaN."""
    p = torch.tensor([2.0, -1.0, float("nan")])
    with pytest.raises(RuntimeError, match="p_in >= 0"):
        torch.bernoulli(p)
    assert torch.bernoulli(p.to("tpu")).cpu().tolist() == [1.0, 0.0, 0.0]


def test_normal_with_a_tensor_std_draws_without_checking_its_sign_where_cpu_raises(mode):
    """CPU raises on a negative element of a tensor std; checking would read std back every
    call, so the device draws mean + std * z instead. A float std is checked as on CPU."""
    mean, std = torch.zeros(3), -torch.ones(3)
    with pytest.raises(RuntimeError, match="std >= 0.0"):
        torch.normal(mean, std)
    assert torch.normal(mean.to("tpu"), std.to("tpu")).cpu().isfinite().all()
    with pytest.raises(RuntimeError, match="std >= 0.0"):
        torch.normal(mean.to("tpu"), -1.0)


def test_normal_with_tensor_mean_and_std_has_their_moments_and_broadcast_shape(mode):
    # It ran on the CPU fallback.
    import deferfuse_torch
    deferfuse_torch.reset_fallback_counts()
    torch.manual_seed(0)
    mean = torch.full((100_000,), 3.0, device="tpu")
    for r in (torch.normal(mean, torch.full_like(mean, 2.0)), torch.normal(mean, 2.0),
              torch.normal(3.0, torch.full_like(mean, 2.0))):
        assert abs(r.mean().item() - 3.0) < 0.05 and abs(r.std().item() - 2.0) < 0.05
    assert torch.normal(torch.zeros(2, 3, device="tpu"), torch.ones(3, device="tpu")).shape == (2, 3)
    assert deferfuse_torch.fallback_counts() == {}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_polygamma_at_poles_and_infinities_is_cpus(mode, n):
    # n >= 2 gave NaN at 0 and the negative integers, where CPU's zeta gives +-inf. Trigamma
    # at a negative integer is a stated difference (CPU: pi^2 / sinf(pi x)^2, huge but finite
    # from sin's rounding; tpu: inf), so n = 1 checks 0 and the infinities only.
    pts = [0.0, -0.0, float("inf"), -float("inf"), 1.0] + ([] if n == 1 else [-1.0, -2.0, -7.0])
    x = torch.tensor(pts)
    check(torch.polygamma(n, x.to("tpu")), torch.polygamma(n, x), atol=1e-5, rtol=1e-5)


def test_polygamma_of_order_two_and_up_differs_from_cpu_below_minus_fifteen(mode):
    """The shift-then-series kernel shifts x by 20 before its asymptotic series: it matches CPU
    for x > -15 only (CPU sums the Hurwitz zeta series at x itself). A shift of 10 was 0.4% off
    in float32 at x = -8.5, where the series started near 1."""
    x = torch.tensor([-4.3, 2.5, -8.478, -9.5, -12.3, -25.3], dtype=torch.float64)
    got = torch.polygamma(2, x.to("tpu")).cpu()
    want = torch.polygamma(2, x)
    torch.testing.assert_close(got[:5], want[:5], rtol=1e-9, atol=1e-9)
    assert not torch.isclose(got[5], want[5], rtol=1e-3)
    # float32: within its rounding, 1.3e-4 relative at worst next to the function's zeros
    # between poles (x = -9.5: terms of +-8 cancel to -0.034).
    x32 = torch.linspace(-9.99, 30, 4001)
    x32 = x32[(x32 - x32.round()).abs() > 1e-3]
    for n in (2, 3, 4):
        torch.testing.assert_close(torch.polygamma(n, x32.to("tpu")).cpu(),
                                   torch.polygamma(n, x32), rtol=2e-4, atol=1e-6)



MATMUL_INTO_OWN_OPERAND = {
    # name: (what it runs on `a` and `w`, writing into a, the product it means)
    "addmm_ into mat1": (lambda a, w: a.addmm_(a, w), lambda a, w: a + a @ w),
    "addmm_ into mat2": (lambda a, w: a.addmm_(w, a), lambda a, w: a + w @ a),
    "addmm_ into both factors": (lambda a, w: a.addmm_(a, a), lambda a, w: a + a @ a),
    "addmm_ into mat1, mat2 transposed": (lambda a, w: a.addmm_(a, w.t()),
                                          lambda a, w: a + a @ w.t()),
    "addmm_ into mat1's transpose": (lambda a, w: a.addmm_(a.t(), w), lambda a, w: a + a.t() @ w),
    "baddbmm_ into batch1": (lambda a, w: a.unsqueeze(0).baddbmm_(a.unsqueeze(0), w.unsqueeze(0)),
                             lambda a, w: a + a @ w),
    "mm out= mat1": (lambda a, w: torch.mm(a, w, out=a), lambda a, w: a @ w),
    "mv out= the vector": (lambda a, w: torch.mv(w, a[0], out=a[0]),
                           lambda a, w: torch.cat([(w @ a[0])[None], a[1:]])),
}


@pytest.mark.parametrize("case", sorted(MATMUL_INTO_OWN_OPERAND))
def test_a_matmul_written_into_its_own_operand_gives_the_product_of_the_old_values(mode, case):
    # CPU's kernels may write the output while they still read it as a factor, and what they
    # give then depends on the kernel and the thread count (`torch.mm(a, w, out=a)`: zeros);
    # tpu computes from the operands' values before the op. The README's table of differences
    # states it. 96 x 96 spans several of the GEMM's blocks.
    run, product = MATMUL_INTO_OWN_OPERAND[case]
    torch.manual_seed(0)
    a, w = torch.randn(96, 96), torch.randn(96, 96) / 96 ** 0.5
    on_tpu = a.to("tpu")
    run(on_tpu, w.to("tpu"))
    torch.testing.assert_close(on_tpu.cpu(), product(a, w), rtol=1e-4, atol=1e-4)


def test_equal_values_keep_their_index_order_in_unstable_sort_topk_and_kthvalue(mode):
    """The device sorts stably always: among equal values the lower index comes first, where
    CPU's unstable sort, topk and kthvalue may pick any (their documented freedom). Values
    are CPU's."""
    x = torch.tensor([3, 1, 3, 2, 1, 3, 2, 1])
    xt = x.to("tpu")
    values, indices = torch.sort(xt, stable=False)
    assert torch.equal(values.cpu(), torch.sort(x).values)
    assert indices.cpu().tolist() == [1, 4, 7, 3, 6, 0, 2, 5]
    values, indices = torch.topk(xt, 4)
    assert torch.equal(values.cpu(), torch.topk(x, 4).values)
    assert indices.cpu().tolist() == [0, 2, 5, 3]
    value, index = torch.kthvalue(xt, 2)
    assert value.item() == torch.kthvalue(x, 2).values.item() and index.item() == 4


@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 2.4e-7), (torch.float64, 1e-13)])
def test_erfc_keeps_its_relative_accuracy_into_the_far_tail(mode, dtype, rtol):
    # It ran on the CPU fallback. 1 - erf(x) would lose every digit past x ~ 4 (erfc(9) is
    # 4e-37); the continued fraction keeps them. Float32 within one ulp of CPU's erfcf (which
    # is itself up to ~1 ulp from the exact value), float64 within 1e-13.
    x = torch.cat([torch.linspace(-6, 9, 3001), torch.tensor([0.0, 1.5, 3.0])]).to(dtype)
    torch.testing.assert_close(torch.erfc(x.to("tpu")).cpu(), torch.erfc(x), rtol=rtol, atol=0)
    special = torch.tensor([float("inf"), -float("inf"), float("nan")], dtype=dtype)
    torch.testing.assert_close(torch.erfc(special.to("tpu")).cpu(), torch.erfc(special),
                               equal_nan=True)


def test_gelu_of_infinity_is_infinity_where_cpus_float32_kernel_gives_nan(mode):
    # CPU's vectorized float32 GELU gives NaN at both infinities (its float64 and tanh forms
    # give +inf at +inf); ours gives the limits' +inf at +inf, NaN at -inf (-inf * 0).
    x = torch.tensor([float("inf"), float("-inf"), 3.0])
    cpu = torch.nn.functional.gelu(x)
    got = torch.nn.functional.gelu(x.to("tpu")).cpu()
    assert torch.isnan(cpu[0]) and got[0] == float("inf")
    assert torch.isnan(cpu[1]) and torch.isnan(got[1])
    assert torch.allclose(got[2], cpu[2])
