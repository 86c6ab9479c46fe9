"""Elementwise ops on tpu against torch on CPU, in every eager mode."""
import pytest
import torch

import deferfuse_torch

from conftest import check

torch.manual_seed(0)
X = torch.randn(33, 17)
Y = torch.randn(33, 17)
POS = torch.rand(33, 17) + 0.1

UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "relu": torch.relu, "sin": torch.sin, "cos": torch.cos,
    "erf": torch.erf, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round,
    "sign": torch.sign, "silu": torch.nn.functional.silu, "expm1": torch.expm1,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
}
POSITIVE = {"log": torch.log, "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
            "reciprocal": torch.reciprocal}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(mode, name):
    f = UNARY[name]
    check(f(X.to("tpu")), f(X), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(POSITIVE))
def test_unary_positive_domain(mode, name):
    f = POSITIVE[name]
    check(f(POS.to("tpu")), f(POS), atol=1e-5, rtol=1e-5)


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=-0.5),
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=3),
    "rsub": lambda a, b: torch.rsub(a, b),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_tensor_tensor(mode, name):
    f = BINARY[name]
    check(f(X.to("tpu"), Y.to("tpu")), f(X, Y))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_binary_broadcast(mode, name):
    f = BINARY[name]
    row = Y[0]
    check(f(X.to("tpu"), row.to("tpu")), f(X, row))


SCALAR_EXPRS = {
    "add": lambda t, s: t + s, "mul": lambda t, s: t * s, "rsub": lambda t, s: s - t,
    "div": lambda t, s: t / s, "pow": lambda t, s: t ** 2, "max": lambda t, s: t.clamp(max=s),
}


@pytest.mark.parametrize("scalar", [2, -1.5])
@pytest.mark.parametrize("name", sorted(SCALAR_EXPRS))
def test_binary_python_scalar(mode, name, scalar):
    f = SCALAR_EXPRS[name]
    check(f(X.to("tpu"), scalar), f(X, scalar))


def test_scalar_base_pow(mode):
    check(2.5 ** POS.to("tpu"), 2.5 ** POS)


def test_int_tensor_with_float_scalar_promotes(mode):
    i = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    check(i.to("tpu") * 0.5, i * 0.5)
    check(i.to("tpu") + 1, i + 1)


# CPU's pow special-cases these exponents (x*x, x*x*x, 1/(x*x), reciprocal, and 1); tpu
# records the same ops, so the bits match, including x*x*x's two roundings where one pow call
# rounds once. Signed zeros, infinities and NaN included.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("exponent", [2, 3, -2, -1, 1, 2.0, 3.0, 0])
def test_pow_special_exponents_match_cpu_bit_for_bit(mode, exponent, dtype):
    x = torch.cat([X.flatten() * 3, torch.tensor([0.0, -0.0, float("inf"), -float("inf"),
                                                  float("nan"), 1e-20, 3e15])]).to(dtype)
    want = x.pow(exponent)
    got = x.to("tpu").pow(exponent)
    assert got.dtype == want.dtype
    assert torch.equal(got.cpu().nan_to_num(7.0), want.nan_to_num(7.0))
    in_place = x.to("tpu")
    in_place.pow_(exponent)
    assert torch.equal(in_place.cpu().nan_to_num(7.0), want.nan_to_num(7.0))


@pytest.mark.parametrize("exponent", [0.5, -0.5, 2.5, -3, True])
def test_pow_other_scalar_exponents(mode, exponent):
    check(POS.to("tpu").pow(exponent), POS.pow(exponent))


def test_pow_tensor_tensor(mode):
    check(torch.pow(POS.to("tpu"), Y.to("tpu")), torch.pow(POS, Y), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons(mode, op):
    a = torch.randint(0, 3, (5, 6)).float()
    b = torch.randint(0, 3, (5, 6)).float()
    f = getattr(torch, op)
    check(f(a.to("tpu"), b.to("tpu")), f(a, b))
    check(f(a.to("tpu"), 1.0), f(a, 1.0))


def test_logical_ops(mode):
    a, b = X > 0, Y > 0
    check(torch.logical_and(a.to("tpu"), b.to("tpu")), torch.logical_and(a, b))
    check(torch.logical_or(a.to("tpu"), b.to("tpu")), torch.logical_or(a, b))
    check(torch.logical_not(a.to("tpu")), torch.logical_not(a))


def test_isnan(mode):
    t = torch.tensor([1.0, float("nan"), -2.0])
    check(torch.isnan(t.to("tpu")), torch.isnan(t))


def test_where(mode):
    c = X > 0
    check(torch.where(c.to("tpu"), X.to("tpu"), Y.to("tpu")), torch.where(c, X, Y))
    check(torch.where(c.to("tpu"), X.to("tpu"), 0.0), torch.where(c, X, 0.0))


def test_clamp(mode):
    check(X.to("tpu").clamp(-0.5, 0.5), X.clamp(-0.5, 0.5))
    check(X.to("tpu").clamp(min=0.1), X.clamp(min=0.1))
    check(X.to("tpu").clamp(max=0.2), X.clamp(max=0.2))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int64, torch.bool,
                                   torch.float16, torch.bfloat16])
def test_cast(mode, dtype):
    check(X.to("tpu").to(dtype), X.to(dtype))


def test_inplace_arithmetic(mode):
    a = X.clone()
    t = a.to("tpu")
    for f in (lambda v: v.add_(1.5), lambda v: v.mul_(Y.to(v.device)), lambda v: v.sub_(0.25),
              lambda v: v.div_(2.0), lambda v: v.relu_(), lambda v: v.exp_()):
        f(a)
        f(t)
    check(t, a)


def test_optimizer_update_ops(mode):
    a, b, c = X.clone(), Y.clone(), POS.clone()
    ta, tb, tc = a.to("tpu"), b.to("tpu"), c.to("tpu")
    for t1, t2, t3 in ((a, b, c), (ta, tb, tc)):
        t1.lerp_(t2, 0.1)
        t1.addcmul_(t2, t3, value=0.3)
        t1.addcdiv_(t2, t3, value=-0.2)
    check(ta, a)
    check(torch.lerp(tb, tc, 0.9), torch.lerp(b, c, 0.9))



@pytest.mark.parametrize("w", [0.1, 0.9, -0.7])
def test_in_place_lerp_is_its_formula_written_into_self_with_no_copy(mode, w):
    # Each formula's last op writes into self: three recorded ops, as many as the value
    # needs (a copy_ of a new result was a fourth, once per parameter per Adam step).
    a, e = X.clone(), Y.clone()
    ta, te = a.to("tpu"), e.to("tpu")
    alias = ta.view(-1)
    torch.tpu.synchronize()
    before = deferfuse_torch.stats()["ops_recorded"]
    ta.lerp_(te, w)
    assert deferfuse_torch.stats()["ops_recorded"] - before == 3
    check(ta, a.lerp_(e, w))
    check(alias, a.view(-1))

def test_activation_backward(mode):
    for f in (torch.relu, torch.tanh, torch.sigmoid, torch.nn.functional.gelu,
              lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
              torch.nn.functional.silu):
        xc = X.clone().requires_grad_()
        xt = X.to("tpu").requires_grad_()
        f(xc).mul(Y).sum().backward()
        f(xt).mul(Y.to("tpu")).sum().backward()
        check(xt.grad, xc.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", [
    lambda a, b, c: torch.lerp(a, b, 0.1), lambda a, b, c: a.lerp_(b, 0.9),
    lambda a, b, c: torch.addcmul(a, b, c, value=0.3), lambda a, b, c: a.addcmul_(b, c, value=0.3),
    lambda a, b, c: torch.addcdiv(a, b, c, value=-0.2), lambda a, b, c: a.addcdiv_(b, c, value=-0.2),
], ids=["lerp", "lerp_", "addcmul", "addcmul_", "addcdiv", "addcdiv_"])
def test_half_optimizer_updates_compute_in_float32_and_round_once_as_cpu(mode, fn, dtype):
    # A model trained in bfloat16 with Adam runs these on its parameters every step; rounded
    # piece by piece in the half dtype, 12-30% of the elements differed from CPU's (up to
    # hundreds of ulps near 0). In float32, rounded once: at most a rare last-bit difference
    # (CPU's vector kernels fuse a multiply-add).
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 128, generator=g).to(dtype), torch.randn(64, 128, generator=g).to(dtype)
    c = (torch.rand(64, 128, generator=g) + 0.5).to(dtype)
    want = fn(a.clone(), b, c)
    got = fn(a.to("tpu"), b.to("tpu"), c.to("tpu")).cpu()
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    assert (got != want).float().mean().item() < 0.02


@pytest.mark.parametrize("scalar, values", [
    (1.5, [1.0, -2.0, 3.5]), (3, [2, -5, 7]), (2.5, [2, -5, 7]), (-7, [2.0, 3.0]),
])
def test_remainder_with_the_scalar_first_runs_on_the_device(mode, scalar, values):
    # torch.remainder(scalar, tensor) went to the CPU fallback; an int tensor with a float
    # scalar gives a float result, as on CPU.
    deferfuse_torch.reset_fallback_counts()
    t = torch.tensor(values)
    want = torch.remainder(scalar, t)
    got = torch.remainder(scalar, t.to("tpu"))
    assert got.dtype == want.dtype
    assert torch.equal(got.cpu(), want)
    assert deferfuse_torch.fallback_counts() == {}


@pytest.mark.parametrize("dtype, lo, hi", [
    (torch.uint8, -1, 3), (torch.uint8, -300, 300), (torch.uint8, None, 10**10),
    (torch.int32, -2**40, 3), (torch.int32, None, 2**40),
])
def test_clamp_of_an_integer_tensor_by_bounds_past_its_range_is_cpus(mode, dtype, lo, hi):
    # The runtime wrapped such a bound into the dtype (uint8's -1 became 255).
    t = torch.tensor([1, 5, 9, 0], dtype=dtype)
    want = t.clamp(lo, hi)
    got = t.to("tpu").clamp(lo, hi)
    assert got.dtype == want.dtype and torch.equal(got.cpu(), want)


@pytest.mark.parametrize("call", [
    # A float32 parameter plus a bfloat16 gradient (the product was rounded to bfloat16).
    lambda d: torch.tensor([1.1, 2.2], device=d).add_(
        torch.tensor([1.3, 2.7], dtype=torch.bfloat16, device=d), alpha=7),
    lambda d: torch.add(torch.tensor([1, 2], device=d),
                        torch.tensor([3, 4], dtype=torch.int32, device=d), alpha=2**40),
    lambda d: torch.add(torch.tensor([True, False], device=d),
                        torch.tensor([True, True], device=d), alpha=2),
    lambda d: torch.add(torch.tensor([1, 2], dtype=torch.int32, device=d), True, alpha=2),
    lambda d: torch.add(torch.tensor([True, False], device=d), True, alpha=True),
    lambda d: torch.sub(torch.tensor([1.0, 2.0], device=d), torch.tensor([3, 4], device=d),
                        alpha=3),
    lambda d: torch.rsub(torch.tensor([1.0, 2.0], dtype=torch.bfloat16, device=d),
                         torch.tensor([3.0, 4.0], device=d), alpha=3),
])
def test_add_and_sub_scale_by_alpha_in_the_promoted_dtype(mode, call):
    want = call("cpu")
    got = call("tpu")
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want, rtol=2e-7, atol=0)


@pytest.mark.parametrize("call", [
    lambda d: torch.xlogy(torch.tensor([2.0], dtype=torch.float64, device=d), 1e300),
    lambda d: torch.xlogy(torch.tensor([4.36], device=d),
                          torch.tensor([5.71875], dtype=torch.bfloat16, device=d)),
    lambda d: torch.xlogy(torch.tensor([2.0], dtype=torch.float16, device=d),
                          torch.tensor([3], dtype=torch.int32, device=d)),
    lambda d: torch.xlogy(torch.tensor([2, 0], device=d), torch.tensor([3, 0], device=d)),
    lambda d: torch.xlogy(3.0, torch.tensor([2.0], device=d)),
])
def test_xlogy_computes_in_the_promoted_dtype(mode, call):
    want = call("cpu")
    got = call("tpu")
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=0)


def test_where_takes_a_uint8_condition_with_cpus_deprecation(mode):
    cond = torch.tensor([1, 0, 2], dtype=torch.uint8)
    want = torch.where(cond, torch.ones(3), 0.0)
    got = torch.where(cond.to("tpu"), torch.ones(3, device="tpu"), 0.0)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("call", [
    lambda x, y: x.clone().add_(y, alpha=3),
    lambda x, y: torch.sub(x, y, alpha=0.3),
    lambda x, y: torch.add(x, 3, alpha=0.1),
])
def test_half_add_with_alpha_rounds_once_from_float32_as_cpu(mode, dtype, call):
    # CPU computes x + alpha * y in float32 and rounds once (bf16 SGD's p.add_(g, alpha=-lr)).
    torch.manual_seed(0)
    x, y = torch.randn(4096).to(dtype), torch.randn(4096).to(dtype)
    want = call(x, y)
    got = call(x.to("tpu"), y.to("tpu"))
    assert (got.cpu() != want).sum() <= 2  # a float32 fused multiply-add's rare tie


@pytest.mark.parametrize("op", ["addcmul_", "addcdiv_"])
def test_an_in_place_addcmul_with_half_factors_computes_in_float32(mode, op):
    torch.manual_seed(0)
    s = torch.randn(256)
    a, b = torch.randn(256).half(), (torch.rand(256) + 0.5).half()
    want = getattr(s.clone(), op)(a, b, value=0.7)
    got = getattr(s.to("tpu"), op)(a.to("tpu"), b.to("tpu"), value=0.7)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)  # was ~1e-3 off


def test_where_with_out_takes_a_uint8_condition(mode):
    cond = torch.tensor([1, 0, 2], dtype=torch.uint8)
    want = torch.where(cond, torch.ones(3), -torch.ones(3), out=torch.empty(3))
    out = torch.empty(3, device="tpu")
    torch.where(cond.to("tpu"), torch.ones(3, device="tpu"), -torch.ones(3, device="tpu"), out=out)
    assert torch.equal(out.cpu(), want)


def test_float32_add_with_alpha_rounds_the_product_where_cpu_fuses_it():
    # README table: CPU's kernel is a fused multiply-add (one rounding); the runtime has no
    # fused multiply-add op, so alpha * y is rounded first: within one rounding of CPU's sum.
    torch.manual_seed(0)
    x, y = torch.randn(4096), torch.randn(4096)
    want = x.clone().add_(y, alpha=0.3)
    fused = (x.double() + torch.tensor(0.3).double() * y.double()).float()
    assert torch.equal(want, fused)
    got = x.to("tpu").add_(y.to("tpu"), alpha=0.3).cpu()
    assert torch.equal(got, x + torch.tensor(0.3) * y)
    assert ((got - want).abs() <= want.abs() * 2**-23 + 2**-24 * (0.3 * y).abs()).all()


@pytest.mark.parametrize("lo, hi", [(2, None), (None, 0), (0.5, 2)])
def test_a_bool_tensor_clamps_in_the_dtype_its_bounds_promote_it_to(mode, lo, hi):
    # bool.clamp(min=2) is int64 [2, 2] on CPU; the runtime refused bool tensors.
    b = torch.tensor([True, False])
    want = b.clamp(lo, hi)
    got = b.to("tpu").clamp(lo, hi)
    assert got.dtype == want.dtype and torch.equal(got.cpu(), want)


@pytest.mark.parametrize("call", [
    lambda d: torch.tensor([True, False], device=d) << 2,
    lambda d: torch.tensor([True, False], device=d) >> 1,
    lambda d: torch.tensor([1, 2], dtype=torch.int32, device=d) << True,
])
def test_a_shift_by_a_python_number_promotes_as_cpu(mode, call):
    # The amount is a Python scalar: a bool tensor shifts as int64 (the runtime refused it), a
    # bool amount is 1.
    want = call("cpu")
    got = call("tpu")
    assert got.dtype == want.dtype and torch.equal(got.cpu(), want)


@pytest.mark.parametrize("weight", [torch.tensor(0.3, dtype=torch.float64), torch.tensor(1),
                                    torch.tensor(0.7, dtype=torch.float16)])
@pytest.mark.parametrize("on", ["cpu", "tpu"])
def test_lerp_takes_a_0_dim_weight_of_any_dtype_as_cpu_does(mode, weight, on):
    x, y = torch.randn(64), torch.randn(64)
    got = torch.lerp(x.to("tpu"), y.to("tpu"), weight.to(on))
    check(got, torch.lerp(x, y, weight), atol=1e-6, rtol=1e-6)
    with pytest.raises(RuntimeError, match="expected dtype float for `weight` but got dtype double"):
        torch.lerp(x.to("tpu"), y.to("tpu"), torch.rand(64, dtype=torch.float64).to("tpu"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_lerp_with_a_tensor_weight_is_computed_in_float_and_rounded_once(mode, dtype):
    g = torch.Generator().manual_seed(3)
    x, y, w = (torch.randn(1000, generator=g).to(dtype) for _ in range(3))
    w = w.abs() % 1
    assert torch.equal(torch.lerp(x.to("tpu"), y.to("tpu"), w.to("tpu")).cpu(), torch.lerp(x, y, w))


@pytest.mark.parametrize("call", [
    lambda s, e: torch.lerp(s, e, 0.5),
    lambda s, e: torch.lerp(s, e, torch.ones_like(s)),
    lambda s, e: s.clone().lerp_(e, 0.5),
])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_lerp_of_a_non_float_dtype_raises_as_on_cpu(mode, call, dtype):
    s, e = torch.tensor([1, 2]).to(dtype), torch.tensor([3, 6]).to(dtype)
    with pytest.raises(NotImplementedError) as want:
        call(s, e)
    with pytest.raises(NotImplementedError) as got:
        call(s.to("tpu"), e.to("tpu"))
    assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0]


def test_abs_of_bool_raises_as_on_cpu(mode):
    with pytest.raises(NotImplementedError, match="abs_cpu.*Bool"):
        torch.tensor([True, False], device="tpu").abs()


def test_lerp_rounds_a_0_dim_weight_of_another_dtype_to_selfs_first(mode):
    s = torch.tensor([1., 2., 3.], dtype=torch.bfloat16)
    e = torch.tensor([4., -5., 6.1], dtype=torch.bfloat16)
    want = torch.lerp(s, e, torch.tensor(0.3))
    for w in (torch.tensor(0.3), torch.tensor(0.3, device="tpu")):
        assert torch.equal(torch.lerp(s.to("tpu"), e.to("tpu"), w).cpu(), want)


@pytest.mark.parametrize("args", [
    (1_700_000_000_000_000_000, 1_700_000_000_000_000_005),  # ns timestamps
    (2**53, 2**53 + 4),
    (-(2**53) - 3, -(2**53) + 3),
    (10**18, 10**18 + 10, 3),
    (10**18, 10**18 + 10.0, 3),  # a float bound: the length in doubles, as on CPU
    (2**62, 2**62 + 2**61, 2**59),
])
def test_an_int64_arange_past_2_pow_53_counts_in_integers(mode, args):
    # Computed in doubles, the first had no elements and the second repeated values.
    want = torch.arange(*args)
    got = torch.arange(*args, device="tpu").cpu()
    assert got.shape == want.shape and torch.equal(got, want), (got, want)


@pytest.mark.parametrize("args, dtype", [
    ((2**31 - 2, 2**31 + 2), torch.int32),  # wraps past INT_MAX
    ((2**40, 2**40 + 3), torch.int32),
    ((250, 260), torch.uint8),
    ((-3, 3), torch.uint8),
    ((1, 2.5, 0.5), torch.int64),  # the step truncated to 0: every value is the start
    ((0, 10, 0.3), torch.int32),
    ((1.5, 4.7, 1.1), torch.int64),
])
def test_an_integer_arange_wraps_and_truncates_as_on_cpu(mode, args, dtype):
    # CPU truncates start and step to int64, computes each value there and wraps it to the
    # dtype; in doubles an int32 saturated and a fractional step counted by its fraction.
    want = torch.arange(*args, dtype=dtype)
    got = torch.arange(*args, dtype=dtype, device="tpu").cpu()
    assert got.shape == want.shape and torch.equal(got, want), (got, want)


def test_arange_into_an_out_of_another_length_warns_as_on_cpu(mode):
    out = torch.empty(3, dtype=torch.long, device="tpu")
    with pytest.warns(UserWarning, match="does not match the computed number of elements 5"):
        torch.arange(0, 5, out=out)
    assert out.cpu().tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("make", [lambda d: torch.empty(5, 1, dtype=torch.long, device=d),
                                  lambda d: torch.empty(2, 3, dtype=torch.long, device=d).t()])
def test_arange_into_an_out_of_the_right_length_keeps_its_shape_as_on_cpu(mode, make):
    n = make("cpu").numel()
    want = torch.arange(n, out=make("cpu"))
    got = torch.arange(n, out=make("tpu"))
    assert got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("args, dtype", [((1e19, 1e19 + 1e4, 1e3), torch.int64),
                                         ((0, 10, 1e19), torch.int32)])
def test_an_integer_arange_refuses_a_bound_past_int64_as_on_cpu(mode, args, dtype):
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.arange(*args, dtype=dtype)
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.arange(*args, dtype=dtype, device="tpu")


@pytest.mark.parametrize("w", [torch.tensor(1.0), torch.tensor(0.25)])
def test_lerp_of_integers_with_a_0_dim_float_weight_promotes_as_on_cpu(mode, w):
    s, e = torch.tensor([1, 2, 0]), torch.tensor([3, 6, 1])
    want = torch.lerp(s, e, w)
    got = torch.lerp(s.to("tpu"), e.to("tpu"), w).cpu()
    assert got.dtype == want.dtype and torch.allclose(got, want)
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
        s.clone().lerp_(e, w)
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
        s.to("tpu").lerp_(e.to("tpu"), w)


@pytest.mark.parametrize("dtype, start", [(torch.bfloat16, 1 + 2**-8 + 2**-30),
                                          (torch.float16, 1 + 2**-11 + 2**-30),
                                          (torch.bfloat16, -3.0)])
def test_a_half_arange_computes_in_float32_as_on_cpu(mode, dtype, start):
    # CPU computes start + step * i in float32 (the half types' accumulation type), then rounds:
    # a start that float32 rounds to a half-precision tie gives CPU's value, not the double's
    # own correct rounding.
    want = torch.arange(start, start + 3, 1.0, dtype=dtype)
    got = torch.arange(start, start + 3, 1.0, dtype=dtype, device="tpu").cpu()
    assert torch.equal(got, want), (got, want)
