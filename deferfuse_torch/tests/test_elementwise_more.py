"""Bitwise ops, division rounding modes, fmod, atan2, trunc, log2, log10, nan_to_num,
logical_xor and addcmul/addcdiv's type promotion on tpu against CPU in every eager mode, with
no CPU fallback."""

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


def tpu(t):
    return t.to("tpu")


INTS = torch.tensor([[-7, -3, 0, 5], [12, -1, 9, 4]])
BOOLS = torch.tensor([[True, False, True, False], [False, False, True, True]])


@pytest.mark.parametrize("op", ["bitwise_and", "bitwise_or", "bitwise_xor"])
def test_bitwise_binary_on_ints_and_bools(mode, op):
    f = getattr(torch, op)
    other = torch.tensor([[3, 6, -1, 4], [5, 5, 2, -8]])
    check(f(tpu(INTS), tpu(other)), f(INTS, other))
    check(f(tpu(BOOLS), tpu(BOOLS.flip(1))), f(BOOLS, BOOLS.flip(1)))
    check(f(tpu(INTS), 6), f(INTS, 6))


def test_bitwise_not_and_operators(mode):
    check(~tpu(INTS), ~INTS)
    check(~tpu(BOOLS), ~BOOLS)
    check(tpu(BOOLS) & tpu(BOOLS.flip(0)), BOOLS & BOOLS.flip(0))
    check(tpu(BOOLS) | tpu(BOOLS.flip(0)), BOOLS | BOOLS.flip(0))


def test_division_rounding_modes(mode):
    a = torch.tensor([-7.5, -3.0, 2.5, 7.0, 0.0])
    b = torch.tensor([2.0, -2.0, -0.5, 3.0, 4.0])
    for rm in ("floor", "trunc"):
        check(torch.div(tpu(a), tpu(b), rounding_mode=rm), torch.div(a, b, rounding_mode=rm))
        check(torch.div(tpu(INTS), 4, rounding_mode=rm), torch.div(INTS, 4, rounding_mode=rm))
    check(torch.floor_divide(tpu(INTS), 3), torch.floor_divide(INTS, 3))
    check(tpu(INTS) // tpu(INTS.abs() + 1), INTS // (INTS.abs() + 1))


def test_fmod_atan2_trunc_log2_log10(mode):
    a = torch.tensor([-7.5, -3.0, 2.5, 7.0, 0.25])
    b = torch.tensor([2.0, -2.0, -0.75, 3.0, 4.0])
    check(torch.fmod(tpu(a), tpu(b)), torch.fmod(a, b))
    check(torch.fmod(tpu(INTS), 4), torch.fmod(INTS, 4))
    check(torch.atan2(tpu(a), tpu(b)), torch.atan2(a, b))
    check(torch.trunc(tpu(a)), torch.trunc(a))
    check(torch.log2(tpu(a.abs())), torch.log2(a.abs()))
    check(torch.log10(tpu(a.abs())), torch.log10(a.abs()))


def test_nan_to_num_and_logical_xor(mode):
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.5])
    check(torch.nan_to_num(tpu(x)), torch.nan_to_num(x))
    check(torch.nan_to_num(tpu(x), nan=2.0, posinf=9.0, neginf=-9.0),
          torch.nan_to_num(x, nan=2.0, posinf=9.0, neginf=-9.0))
    check(torch.logical_xor(tpu(INTS), tpu(BOOLS)), torch.logical_xor(INTS, BOOLS))


def test_bitwise_ops_on_floats_raise_like_cpu(mode):
    with pytest.raises(RuntimeError, match="bitwise"):
        torch.bitwise_and(tpu(torch.ones(2)), tpu(torch.ones(2))).cpu()


@pytest.mark.parametrize("eps", [None, 0.2, 0.6])
def test_logit_clamps_as_cpu_even_when_eps_is_past_one_half(mode, eps):
    # CPU clamps with `x < eps ? eps : x > 1 - eps ? 1 - eps : x`: with eps > 0.5 (lo > hi) a
    # small x becomes eps, where at::clamp would give 1 - eps.
    x = torch.tensor([0.0, 0.03, 0.3, 0.5, 0.7, 0.97, 1.0, float("nan")])
    check(torch.logit(x.to("tpu"), eps), torch.logit(x, eps))


def test_clamp_of_bools_by_tensor_bounds_is_cpus(mode):
    # CPU orders false < true; the runtime's clamp refused bools.
    b = torch.tensor([[True, False], [True, True]])
    lo, hi = torch.tensor(True), torch.tensor([True, False])
    for f in (lambda t, l, h: torch.clamp_min(t, l), lambda t, l, h: torch.clamp_max(t, h),
              lambda t, l, h: t.clone().clamp_max_(h)):
        check(f(tpu(b), tpu(lo), tpu(hi)), f(b, lo, hi))
    # CPU's clamp kernel itself refuses them.
    for t in (b, tpu(b)):
        with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
            torch.clamp(t, lo.to(t.device), hi.to(t.device))


@pytest.mark.parametrize("x", [torch.tensor([True, False]), torch.tensor([0, 1, 2])],
                         ids=["bool", "int64"])
def test_logit_of_bools_and_integers_is_computed_in_float_as_on_cpu(mode, x):
    check(torch.logit(tpu(x)), torch.logit(x))


def test_hardtanh_and_baddbmm_of_integers_keep_int64_as_on_cpu(mode):
    # Both returned float; CPU's baddbmm also truncates alpha and beta to integers.
    x = torch.tensor([[-7, -3, 0, 5, 12, -1]])
    check(F.hardtanh(tpu(x)), F.hardtanh(x))
    check(F.hardtanh(tpu(x), -2.5, 4.5), F.hardtanh(x, -2.5, 4.5))
    g = torch.Generator().manual_seed(0)
    c, a, b = (torch.randint(-5, 5, s, generator=g) for s in [(2, 3, 2), (2, 3, 4), (2, 4, 2)])
    for beta, alpha in [(1, 1), (0.2, 0.6), (1.7, 2.6)]:
        check(torch.baddbmm(tpu(c), tpu(a), tpu(b), beta=beta, alpha=alpha),
              torch.baddbmm(c, a, b, beta=beta, alpha=alpha))


INF, NAN = float("inf"), float("nan")
SPECIAL_PAIRS = (torch.tensor([0.0, -0.0, 1.5, -2.0, 3e20, INF, -INF, NAN, 1e-30, 0.3]),
                 torch.tensor([0.0, 2.0, -1.5, 4.0, 3e20, NAN, -INF, 1.0, 1e-30, -0.7]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("fn", [torch.hypot, torch.logaddexp2, lambda a, b: torch.sinc(a),
                                torch.heaviside, lambda a, b: torch.nansum(a.reshape(2, 5), 1),
                                lambda a, b: torch.nanmean(a[:5])],
                         ids=["hypot", "logaddexp2", "sinc", "heaviside", "nansum", "nanmean"])
def test_hypot_logaddexp2_sinc_heaviside_and_nansum_run_on_the_device_as_cpu(mode, fn, dtype):
    # They ran on the CPU fallback (the autouse fixture checks there is none now); hypot does
    # not overflow at 3e20 and is inf against NaN, as C's.
    a, b = (t.to(dtype) for t in SPECIAL_PAIRS)
    check(fn(tpu(a), tpu(b)), fn(a, b), atol=0, rtol=1e-6 if dtype != torch.bfloat16 else 2 ** -8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", [torch.fmax, torch.fmin, lambda a, b: F.threshold(a, 0.3, -7.0),
                                lambda a, b: F.softshrink(a, 0.5), torch.special.xlog1py,
                                lambda a, b: torch.special.entr(a),
                                lambda a, b: torch.aminmax(a.reshape(2, 5), dim=1),
                                lambda a, b: torch.aminmax(b[:5])],
                         ids=["fmax", "fmin", "threshold", "softshrink", "xlog1py", "entr",
                              "aminmax_dim", "aminmax"])
def test_fmax_fmin_threshold_softshrink_xlog1py_entr_and_aminmax_run_on_the_device(mode, fn, dtype):
    # They ran on the CPU fallback (the autouse fixture checks there is none now).
    a, b = (t.to(dtype) for t in SPECIAL_PAIRS)
    want, got = fn(a, b), fn(tpu(a), tpu(b))
    as_list = lambda r: list(r) if isinstance(r, tuple) else [r]  # noqa: E731
    for w, g in zip(as_list(want), as_list(got)):
        check(g, w, atol=0, rtol=1e-6 if dtype != torch.bfloat16 else 2 ** -8)


def test_softshrink_gradient_passes_outside_the_band(mode):
    x = torch.tensor([-1.0, -0.5, 0.2, 0.5, 0.7, float("nan")])
    assert_same(lambda t: F.softshrink(t, 0.5), x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_baddbmm_rounds_once_as_cpu(mode, dtype):
    # The product was rounded before its scaling and sum: a quarter of the elements differed.
    # Now within one rounding (the float32 sums' order may cross a rounding boundary).
    g = torch.Generator().manual_seed(0)
    shapes = [(2, 16, 32), (2, 16, 64), (2, 64, 32)]
    c, a, b = (torch.randn(s, generator=g).to(dtype) for s in shapes)
    one_ulp = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
    check(torch.baddbmm(tpu(c), tpu(a), tpu(b), beta=0.5, alpha=1.5),
          torch.baddbmm(c, a, b, beta=0.5, alpha=1.5), atol=0, rtol=one_ulp)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_addbmm_rounds_batch_by_batch_as_cpu(mode, dtype):
    # CPU sums the batches by one addmm_ each, rounding each to the dtype; one float32 sum
    # rounded once was up to 16 ulps away from it.
    g = torch.Generator().manual_seed(0)
    c, a, b = (torch.randn(s, generator=g).to(dtype) for s in [(16, 32), (5, 16, 8), (5, 8, 32)])
    one_ulp = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
    check(torch.addbmm(tpu(c), tpu(a), tpu(b), beta=0.5, alpha=1.5),
          torch.addbmm(c, a, b, beta=0.5, alpha=1.5), atol=0, rtol=one_ulp)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_exp2_take_put_and_logspace_run_on_the_device_as_cpu(mode, dtype):
    # They ran on the CPU fallback.
    x = torch.tensor([[-3.5, 0.0, 1.0], [10.25, -126.0, 127.5]], dtype=dtype)
    tol = dict(atol=0, rtol=2 ** -7 if dtype == torch.bfloat16 else 1e-6)
    check(torch.exp2(tpu(x)), torch.exp2(x), **tol)
    idx = torch.tensor([[5, -1], [0, 2]])
    check(torch.take(tpu(x), tpu(idx)), torch.take(x, idx))
    for accumulate in (False, True):
        src = torch.tensor([1.5, 2.5, -4.0], dtype=dtype)
        want = x.t().clone().put_(torch.tensor([4, 0, -1]), src, accumulate=accumulate)
        idx = torch.tensor([4, 0, -1])
        got = tpu(x).t().clone().put_(tpu(idx), tpu(src), accumulate=accumulate)
        check(got, want)
    check(torch.logspace(-2, 3, 7, base=2.0, dtype=dtype, device="tpu"),
          torch.logspace(-2, 3, 7, base=2.0, dtype=dtype), **tol)


def test_rrelu_in_evaluation_is_cpus_and_in_training_draws_a_slope_per_negative_element(mode):
    x = torch.tensor([-2.0, -0.5, 0.0, 1.5, -7.0, 3.0])
    check(F.rrelu(tpu(x), 0.1, 0.3, training=False), F.rrelu(x, 0.1, 0.3, training=False))
    xt = tpu(x).requires_grad_()
    y = F.rrelu(xt, 0.1, 0.3, training=True)
    y.sum().backward()
    slopes = (y.detach() / xt.detach()).cpu()
    neg = x < 0
    assert torch.equal(y.detach().cpu()[~neg], x[~neg])
    assert ((slopes[neg] >= 0.1) & (slopes[neg] <= 0.3)).all()
    torch.testing.assert_close(xt.grad.cpu()[neg], slopes[neg])
    assert torch.equal(xt.grad.cpu()[~neg], torch.ones(int((~neg).sum())))


def test_sign_and_sgn_in_a_graph_give_cpus_gradients_on_the_device(mode):
    # Their zero gradient is an "efficient zero tensor", which took the CPU fallback.
    x = torch.tensor([-1.5, 0.0, 2.0, -0.25])
    assert_same(lambda t: torch.sgn(t) * t + torch.sign(t), x)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64])
def test_bit_shifts_are_cpus_including_out_of_range_amounts(mode, dtype):
    # They ran on the CPU fallback. A negative amount or one of the type's width or more gives
    # 0 (left) or the sign (right).
    info = torch.iinfo(dtype)
    signed = dtype != torch.uint8
    a = torch.tensor([info.min, -7 if signed else 7, 0, 1, 5, info.max, 123,
                      -123 if signed else 200], dtype=dtype)
    b = torch.tensor([0, 1, 3, 7, 8, 31 if signed else 9, 63 if dtype == torch.int64 else 2,
                      -1 if signed else 130], dtype=dtype)
    check(tpu(a) << tpu(b), a << b)
    check(tpu(a) >> tpu(b), a >> b)
    check(tpu(a) << 3, a << 3)
    check(torch.bitwise_right_shift(tpu(a), 2), torch.bitwise_right_shift(a, 2))
    got, want = tpu(a), a.clone()
    got <<= tpu(b)
    want <<= b
    check(got, want)
    with pytest.raises(NotImplementedError, match="not implemented for 'Float'"):
        tpu(torch.randn(3)) << 1


ADDC_CASES = [
    # (self, tensor1, tensor2): uint8 products into int64 (wrapped in uint8 before), 0-dim
    # operands that count only within their category, bool and half mixes.
    (torch.zeros(2, dtype=torch.int64), torch.tensor([100, 200], dtype=torch.uint8),
     torch.tensor([100, 200], dtype=torch.uint8)),
    (torch.zeros(2), torch.tensor([70000, 3], dtype=torch.int32),
     torch.tensor([70000, 3], dtype=torch.int32)),
    (torch.ones(2), torch.tensor(0.5, dtype=torch.float64), torch.tensor([3, 4], dtype=torch.int32)),
    (torch.tensor([1, 2], dtype=torch.int32), torch.tensor(3), torch.tensor([True, False])),
    (torch.tensor([1, 2], dtype=torch.int32), torch.tensor(2.0, dtype=torch.float16),
     torch.tensor([1.5, 2.5], dtype=torch.bfloat16)),
    (torch.tensor([70000, 3], dtype=torch.int64), torch.tensor(2.0, dtype=torch.float16),
     torch.tensor([1, 2], dtype=torch.int32)),  # 70000 overflows float16, as on CPU
]


@pytest.mark.parametrize("case", range(len(ADDC_CASES)))
@pytest.mark.parametrize("op", ["addcmul", "addcdiv"])
def test_addcmul_and_addcdiv_promote_all_three_operands_together_as_cpu(mode, op, case):
    a, b, c = ADDC_CASES[case]
    if op == "addcdiv":
        c = c.float() + 3 if not c.is_floating_point() else c + 3
    want = getattr(torch, op)(a, b, c, value=2)
    got = getattr(torch, op)(a.to("tpu"), b.to("tpu"), c.to("tpu"), value=2)
    check(got, want)


def test_addcmul_and_addcdiv_refuse_what_cpu_refuses(mode):
    t = lambda *v, dtype=None: torch.tensor(v, dtype=dtype, device="tpu")
    with pytest.raises(RuntimeError, match="Integer division with addcdiv is no longer supported"):
        torch.addcdiv(t(1.0, 2.0), t(1, 2), t(3, 4))
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        torch.addcmul(t(True), t(True), t(False))
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        t(1, 2).addcmul_(t(1.5, 2.5), t(2.0, 3.0))


@pytest.mark.parametrize("default", [torch.float64, torch.bfloat16])
def test_integers_promote_to_the_default_dtype_as_on_cpu(mode, default):
    # After torch.set_default_dtype, integer and bool operands promoted to a float take that
    # dtype (PINN and physics code run in float64); the runtime took float32.
    i, flags = torch.tensor([1, 3]), torch.tensor([True, False])
    calls = [lambda x, b: x / 2, lambda x, b: x * 1.5, lambda x, b: x.sqrt(), lambda x, b: x.exp(),
             lambda x, b: x / x, lambda x, b: b + 0.5, lambda x, b: x ** 0.5, lambda x, b: x - 0.5,
             lambda x, b: x + 1, lambda x, b: x * torch.ones(2, device=x.device),
             lambda x, b: 2.5 ** x, lambda x, b: x.clamp(min=1.5)]
    before = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        for call in calls:
            check(call(i.to("tpu"), flags.to("tpu")), call(i, flags), atol=1e-2, rtol=1e-2)
    finally:
        torch.set_default_dtype(before)


def test_addcmul_converts_a_float_value_to_integer_operands_dtype_as_cpu(mode):
    i = torch.ones(2, dtype=torch.int32)
    check(torch.addcmul(i.to("tpu"), i.to("tpu"), i.to("tpu"), value=2.5), torch.addcmul(i, i, i, value=2.5))
    three = torch.full((2,), 3, dtype=torch.int32)
    want = i.clone().addcmul_(three, i, value=2.5)
    got = i.to("tpu").addcmul_(three.to("tpu"), i.to("tpu"), value=2.5)
    check(got, want)


def test_integer_division_of_an_empty_tensor_by_zero_is_empty_and_a_scalar_dividend_is_checked():
    assert (torch.zeros(0, dtype=torch.int64, device="tpu") % 0).numel() == 0
    with deferfuse_torch.mode("debug"):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            torch.remainder(5, torch.tensor([0, 2], device="tpu"))
