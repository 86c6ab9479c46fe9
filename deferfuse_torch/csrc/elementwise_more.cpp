// More elementwise kernels, each one runtime op: bitwise and/or/xor/not, division with rounding
// modes (floor_divide, div(rounding_mode=...)), fmod, atan2, trunc, log2, log10, sinh, cosh,
// tan, asin, acos, atan, asinh, acosh, atanh (autograd's formulas for them use ops that have
// kernels too), and the compositions nan_to_num, logical_xor, logit (+ backward), frac,
// logaddexp, logaddexp2, hypot, exp2, sinc, heaviside, fmax/fmin, threshold, special.xlog1py,
// special.entr, take/put_, bit shifts, hardshrink and softshrink (+ backward), each in
// PyTorch's CPU formula.
// Functional, in-place and out= variants: structured ops reach the out= kernel from PyTorch's
// composite functional forms too.
#include "elementwise_ops.h"

#include <ATen/ExpandUtils.h>
#include <torch/library.h>

#include <limits>

namespace dft {
namespace {

using namespace ew;

at::Tensor& resized(const at::Tensor& like, at::Tensor& out) {
  at::native::resize_output(out, like.sizes());
  return out;
}

// The functional result `r` written into `out` (resized to it), for the out= forms.
at::Tensor& into(const at::Tensor& r, at::Tensor& out, const char* name) {
  resized(r, out);
  run_into(DFUSE_OP_KIND_COPY, nullptr, Operands().t(r), out, name);
  return out;
}

uint32_t div_op(std::optional<c10::string_view> mode) {
  if (!mode) return DFUSE_BINARY_OP_DIV;
  if (*mode == "floor") return DFUSE_BINARY_OP_FLOOR_DIVIDE;
  TORCH_CHECK(*mode == "trunc", "div expected rounding_mode to be one of None, 'trunc', or "
              "'floor' but found '", *mode, "'");
  return DFUSE_BINARY_OP_TRUNC_DIVIDE;
}

at::Tensor div_mode(const at::Tensor& x, const at::Tensor& y,
                    std::optional<c10::string_view> mode) {
  if (mode) ew::check_integer_divisor(x, y);
  auto a = attrs_sub(div_op(mode));
  return run(DFUSE_OP_KIND_BINARY, &a, Operands().t(x).t(y), "div");
}

at::Tensor& div_mode_(at::Tensor& x, const at::Tensor& y, std::optional<c10::string_view> mode) {
  if (mode) ew::check_integer_divisor(x, y);
  auto a = attrs_sub(div_op(mode));
  run_into(DFUSE_OP_KIND_BINARY, &a, Operands().t(x).t(y), x, "div_");
  return x;
}

at::Tensor& div_mode_out(const at::Tensor& x, const at::Tensor& y,
                         std::optional<c10::string_view> mode, at::Tensor& out) {
  if (mode) ew::check_integer_divisor(x, y);
  prepare_out(x, y, out);
  auto a = attrs_sub(div_op(mode));
  run_into(DFUSE_OP_KIND_BINARY, &a, Operands().t(x).t(y), out, "div (out=)");
  return out;
}

at::Tensor div_scalar_mode(const at::Tensor& x, const at::Scalar& y,
                           std::optional<c10::string_view> mode) {
  if (mode) ew::check_integer_divisor(x, y);
  return binary(x, y, div_op(mode));
}

// nan -> nan (default 0), +inf -> posinf (default the dtype's largest), -inf -> neginf (default
// its lowest); integer and bool tensors have none of them and come back as a copy.
at::Tensor tpu_nan_to_num(const at::Tensor& x, std::optional<double> nan, std::optional<double> pos,
                      std::optional<double> neg) {
  if (!at::isFloatingType(x.scalar_type())) return x.clone();
  double hi = 0.0, lo = 0.0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "nan_to_num", [&] {
    hi = static_cast<double>(std::numeric_limits<scalar_t>::max());
    lo = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
  });
  auto inf = std::numeric_limits<double>::infinity();
  auto r = at::where(x.eq(inf), at::Scalar(pos.value_or(hi)), x);
  r = at::where(x.eq(-inf), at::Scalar(neg.value_or(lo)), r);
  return at::where(x.isnan(), at::Scalar(nan.value_or(0.0)), r);
}

at::Tensor& nan_to_num_out(const at::Tensor& x, std::optional<double> nan,
                           std::optional<double> pos, std::optional<double> neg,
                           at::Tensor& out) {
  return into(tpu_nan_to_num(x, nan, pos, neg), out, "nan_to_num (out=)");
}

// logit(x) = log(x / (1 - x)), x first clamped to [eps, 1 - eps] when eps >= 0 is given
// (PyTorch's CPU formula, so x = 1 gives inf). The clamp is CPU's `x < lo ? lo : x > hi ? hi
// : x`, which, unlike at::clamp, gives lo when eps > 0.5 makes lo > hi.
at::Tensor tpu_logit(const at::Tensor& x0, std::optional<double> eps) {
  // Integers and bools are computed in the default float dtype, as on CPU.
  auto x = cast(x0, float_dtype(x0));
  auto z = x;
  if (eps && *eps >= 0) {
    double lo = *eps, hi = 1.0 - *eps;
    z = at::where(x.lt(lo), at::Scalar(lo), at::where(x.gt(hi), at::Scalar(hi), x));
  }
  return at::log(z / (1 - z));
}

// d logit / dx = 1 / (x (1 - x)); outside [0, 1] it is NaN, or 0 outside [eps, 1 - eps] when
// eps >= 0 (the clamp's flat part), as on CPU.
at::Tensor tpu_logit_backward(const at::Tensor& grad, const at::Tensor& x,
                              std::optional<double> eps) {
  auto d = grad / (x * (1 - x));
  bool clamped = eps && *eps >= 0;
  double lo = clamped ? *eps : 0.0, hi = clamped ? 1.0 - *eps : 1.0;
  auto fill = clamped ? 0.0 : std::numeric_limits<double>::quiet_NaN();
  return at::where(x.lt(lo).logical_or(x.gt(hi)), at::Scalar(fill), d);
}

// frac(x) = x - trunc(x): the sign of x, NaN for infinities (CPU's formula).
at::Tensor tpu_frac(const at::Tensor& x) {
  // CPU has no integer frac ("frac_cpu" not implemented for 'Long'); trunc is the identity there.
  if (!at::isFloatingType(x.scalar_type())) at::frac(host_empty(x));
  return x - at::trunc(x);
}
at::Tensor& frac_(at::Tensor& x) { return x.copy_(tpu_frac(x)); }
at::Tensor& frac_out(const at::Tensor& x, at::Tensor& out) {
  return into(tpu_frac(x), out, "frac (out=)");
}

// logaddexp(a, b) = max + log1p(exp(-|a - b|)), and a itself when both are the same infinity
// (CPU's formula: inf - inf would give NaN).
at::Tensor tpu_logaddexp(const at::Tensor& a, const at::Tensor& b) {
  auto same_inf = at::isinf(a).logical_and(a.eq(b));
  auto r = at::maximum(a, b) + at::log1p(at::exp(-at::abs(a - b)));
  return at::where(same_inf, a.to(r.scalar_type()), r);
}
at::Tensor& logaddexp_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return into(tpu_logaddexp(a, b), out, "logaddexp (out=)");
}

// hardshrink: 0 for -lambd <= x <= lambd, else x (NaN stays NaN); its gradient likewise.
at::Tensor shrunk(const at::Tensor& x, const at::Scalar& lambd) {
  return x.ge(-lambd.toDouble()).logical_and(x.le(lambd));
}
at::Tensor tpu_hardshrink(const at::Tensor& x, const at::Scalar& lambd) {
  return at::where(shrunk(x, lambd), at::zeros({}, x.options()), x);
}
at::Tensor& hardshrink_out(const at::Tensor& x, const at::Scalar& lambd, at::Tensor& out) {
  return into(tpu_hardshrink(x, lambd), out, "hardshrink (out=)");
}
at::Tensor tpu_hardshrink_backward(const at::Tensor& grad, const at::Tensor& x,
                                   const at::Scalar& lambd) {
  return at::where(shrunk(x, lambd), at::zeros({}, grad.options()), grad);
}
at::Tensor& hardshrink_backward_out(const at::Tensor& grad, const at::Tensor& x,
                                    const at::Scalar& lambd, at::Tensor& out) {
  return into(tpu_hardshrink_backward(grad, x, lambd), out, "hardshrink_backward (out=)");
}

// The dtype a float-valued binary op computes in: integers and bools promote to the default
// float dtype, as TensorIterator's "promote integer inputs to float" ops do on CPU.
at::ScalarType float_result(const at::Tensor& a, const at::Tensor& b) {
  auto t = at::result_type(a, b);
  return at::isFloatingType(t) ? t : at::get_default_dtype_as_scalartype();
}

// hypot(a, b) = sqrt(a^2 + b^2) without overflow: computed in float64 for narrower floats
// (where it rounds once, as glibc's hypotf), scaled by the larger magnitude in float64; inf
// when either is infinite, even against NaN (C's rule).
at::Tensor tpu_hypot(const at::Tensor& a0, const at::Tensor& b0) {
  auto t = float_result(a0, b0);
  at::Tensor r;
  if (t != at::kDouble) {
    auto a = cast(a0, at::kDouble), b = cast(b0, at::kDouble);
    r = cast(at::sqrt(a * a + b * b), t);
  } else {
    auto a = at::abs(a0), b = at::abs(b0);
    auto hi = at::maximum(a, b), lo = at::minimum(a, b);
    auto q = lo / at::where(hi.eq(0), at::Scalar(1.0), hi);
    r = hi * at::sqrt(1 + q * q);
  }
  return at::where(at::isinf(a0).logical_or(at::isinf(b0)), at::Scalar(INFINITY), r);
}
at::Tensor& hypot_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return into(tpu_hypot(a, b), out, "hypot (out=)");
}

// logaddexp2(a, b) = max + log1p(2^-|a - b|) / ln 2, and a itself when both are the same
// infinity (CPU's formula).
at::Tensor tpu_logaddexp2(const at::Tensor& a0, const at::Tensor& b0) {
  auto t = float_result(a0, b0);
  // Half dtypes in float32, rounded once.
  auto ct = is_reduced_float(t) ? at::kFloat : t;
  auto a = cast(a0, ct), b = cast(b0, ct);
  auto same_inf = at::isinf(a).logical_and(a.eq(b));
  auto r = at::maximum(a, b) + at::log1p(at::exp(-at::abs(a - b) * M_LN2)) * (1.0 / M_LN2);
  return cast(at::where(same_inf, a, r), t);
}
at::Tensor& logaddexp2_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return into(tpu_logaddexp2(a, b), out, "logaddexp2 (out=)");
}

// bitwise_left_shift / bitwise_right_shift on integers, as CPU's kernel: a shift by a negative
// amount or by the type's width or more gives 0 (left) or the sign (right: -1 or 0). Built
// from multiplications (which wrap) and floor divisions by powers of two, one per bit of the
// shift amount.
template <bool LEFT>
at::Tensor tpu_shift(const at::Tensor& a0, const at::Tensor& b0) {
  auto t = at::result_type(a0, b0);
  TORCH_CHECK_NOT_IMPLEMENTED(at::isIntegralType(t, /*includeBool=*/false),
                              LEFT ? "\"lshift_cpu\"" : "\"rshift_cpu\"",
                              " not implemented for '", t, "'");
  // A Python number (`torch.bitwise_right_shift(x, 2)`, `2 << x`) arrives as a 0-dim CPU tensor.
  auto dev = a0.device().is_cpu() ? b0.options() : a0.options();
  auto on_device = [&](const at::Tensor& v) {
    return v.device().is_cpu() ? at::scalar_tensor(v.item(), dev.dtype(t)) : cast(v, t);
  };
  auto a = on_device(a0), b = on_device(b0);
  int64_t bits = int64_t(c10::elementSize(t)) * 8;
  bool is_signed = t != at::kByte;
  int64_t max_shift = LEFT ? bits : bits - (is_signed ? 1 : 0);
  // A uint8 amount of 128 or more is negative as CPU's signed cast reads it: >= max_shift too.
  auto valid = b.ge(0).logical_and(b.lt(max_shift));
  auto s = at::where(valid, b, at::zeros({}, b.options()));
  auto r = a;
  for (int64_t k = 0; (int64_t(1) << k) < max_shift; ++k) {
    auto bit = at::bitwise_and(s, int64_t(1) << k).ne(0);
    // 2^(2^k); for uint8 and int32 the multiplier stays within the type (shifts < 8, < 32).
    int64_t f = int64_t(1) << (int64_t(1) << k);
    r = at::where(bit, LEFT ? r * f : at::floor_divide(r, f), r);
  }
  if (LEFT) return at::where(valid, r, at::zeros({}, r.options()));
  auto sign = is_signed ? cast(a.lt(0), t).neg() : at::zeros({}, a.options());
  return at::where(valid, r, sign);
}
template <bool LEFT>
at::Tensor& shift_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return into(tpu_shift<LEFT>(a, b), out, LEFT ? "bitwise_left_shift (out=)"
                                                : "bitwise_right_shift (out=)");
}
template <bool LEFT>
at::Tensor& shift_(at::Tensor& a, const at::Tensor& b) {
  ew::check_in_place_cast(a, at::result_type(a, b));
  return into(tpu_shift<LEFT>(a, b), a, LEFT ? "bitwise_left_shift_" : "bitwise_right_shift_");
}
// `x << 2`, `x >>= y`: Python's operators reach these forms. The amount is a wrapped number,
// which promotes as a Python scalar does: an int32 x stays int32, a bool x becomes int64
// (`bool_tensor << 2` is int64 on CPU; made x's own dtype, the amount was refused as bool), and
// a float amount makes the shift refuse as CPU's does.
at::Tensor shift_amount(const at::Tensor&, const at::Scalar& b) {
  auto t = at::scalar_to_tensor(b);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}
template <bool LEFT>
at::Tensor tpu_shift_scalar(const at::Tensor& a, const at::Scalar& b) {
  return tpu_shift<LEFT>(a, shift_amount(a, b));
}
template <bool LEFT>
at::Tensor& shift_scalar_(at::Tensor& a, const at::Scalar& b) {
  return shift_<LEFT>(a, shift_amount(a, b));
}

// exp2(x) = 2^x: float32 and the half dtypes through float64 (rounded once, as exp2f);
// float64 as exp(x ln 2). Integers and bools give the default float dtype.
at::Tensor tpu_exp2(const at::Tensor& x0) {
  return cast(at::exp(cast(x0, at::kDouble) * M_LN2), float_dtype(x0));
}
at::Tensor& exp2_(at::Tensor& x) { return into(tpu_exp2(x), x, "exp2_"); }
at::Tensor& exp2_out(const at::Tensor& x, at::Tensor& out) {
  return into(tpu_exp2(x), out, "exp2 (out=)");
}

// take(x, index): x's elements in row-major order, negative indices from the end; put_
// writes (or adds) src there, through a contiguous copy when x is not one.
at::Tensor flat_index(const at::Tensor& x, const at::Tensor& index) {
  auto i = index.reshape({-1});
  return at::where(i.lt(0), i + x.numel(), i);
}
at::Tensor tpu_take(const at::Tensor& x, const at::Tensor& index) {
  TORCH_CHECK_INDEX(index.scalar_type() == at::kLong, "take(): Expected a long tensor for index, "
                    "but got ", index.scalar_type());
  if (index.numel() == 0) return at::empty(index.sizes(), x.options());
  return x.reshape({-1}).index_select(0, flat_index(x, index)).reshape(index.sizes());
}
at::Tensor& take_out(const at::Tensor& x, const at::Tensor& index, at::Tensor& out) {
  return into(tpu_take(x, index), out, "take (out=)");
}
at::Tensor& put_(at::Tensor& x, const at::Tensor& index, const at::Tensor& src, bool accumulate) {
  TORCH_CHECK_INDEX(index.scalar_type() == at::kLong, "put_(): Expected a long tensor for index, "
                    "but got ", index.scalar_type());
  TORCH_CHECK(index.numel() == src.numel(), "put_(): Expected source and index to have the same "
              "number of elements, but got source.numel() = ", src.numel(), ", index.numel() = ",
              index.numel());
  if (index.numel() == 0) return x;
  auto flat = x.is_contiguous() ? x.view({-1}) : x.contiguous().view({-1});
  auto i = flat_index(x, index);
  auto v = src.reshape({-1}).to(x.scalar_type());
  if (accumulate) flat.index_add_(0, i, v); else flat.index_copy_(0, i, v);
  if (!x.is_contiguous()) x.copy_(flat.view(x.sizes()));
  return x;
}

// sinc(x) = sin(pi x) / (pi x), 1 at 0 (CPU's formula, pi x in the computing dtype).
at::Tensor tpu_sinc(const at::Tensor& x0) {
  auto x = cast(x0, float_dtype(x0));
  return rounded_once(x, [](const at::Tensor& x) {
    auto px = x * M_PI;
    return at::where(x.eq(0), at::Scalar(1.0), at::sin(px) / px);
  });
}
at::Tensor& sinc_out(const at::Tensor& x, at::Tensor& out) {
  return into(tpu_sinc(x), out, "sinc (out=)");
}

// heaviside(x, values): values where x is 0, else 1 for x > 0 and 0 otherwise (NaN included),
// as CPU's kernel; like CPU it takes one dtype for both.
at::Tensor tpu_heaviside(const at::Tensor& x, const at::Tensor& values) {
  TORCH_CHECK(x.scalar_type() == values.scalar_type(),
              "heaviside is not yet implemented for tensors with different dtypes");
  return at::where(x.eq(0), values, cast(x.gt(0), x.scalar_type()));
}
at::Tensor& heaviside_out(const at::Tensor& x, const at::Tensor& values, at::Tensor& out) {
  return into(tpu_heaviside(x, values), out, "heaviside (out=)");
}

// fmax/fmin: the other operand where one is NaN (NaN only when both are), as C's fmax.
template <bool MAX>
at::Tensor tpu_fminmax(const at::Tensor& a, const at::Tensor& b) {
  auto m = MAX ? at::maximum(a, b) : at::minimum(a, b);
  if (!at::isFloatingType(m.scalar_type())) return m;
  auto ac = cast(a, m.scalar_type()), bc = cast(b, m.scalar_type());
  return at::where(ac.isnan(), bc, at::where(bc.isnan(), ac, m));
}
template <bool MAX>
at::Tensor& fminmax_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return into(tpu_fminmax<MAX>(a, b), out, MAX ? "fmax (out=)" : "fmin (out=)");
}

// threshold(x, th, value) = x <= th ? value : x, in x's dtype (CPU's kernel, which compares
// a half x with th in float32: th is not rounded to the half dtype first).
at::Tensor tpu_threshold(const at::Tensor& x, const at::Scalar& th, const at::Scalar& value) {
  return at::where(opmath(x).le(th), cast(at::scalar_tensor(value, x.options()), x.scalar_type()),
                   x);
}
at::Tensor& threshold_out(const at::Tensor& x, const at::Scalar& th, const at::Scalar& value,
                          at::Tensor& out) {
  return into(tpu_threshold(x, th, value), out, "threshold (out=)");
}

// softshrink: x - l above l, x + l below -l, else 0 (NaN stays NaN: CPU's `x * 0`); its
// gradient passes where |x| > l (and at NaN).
at::Tensor tpu_softshrink(const at::Tensor& x, const at::Scalar& l) {
  double v = l.toDouble();
  return at::where(x.gt(v), x - v, at::where(x.lt(-v), x + v, x * 0));
}
at::Tensor& softshrink_out(const at::Tensor& x, const at::Scalar& l, at::Tensor& out) {
  return into(tpu_softshrink(x, l), out, "softshrink (out=)");
}
at::Tensor tpu_softshrink_backward(const at::Tensor& grad, const at::Tensor& x,
                                   const at::Scalar& l) {
  double v = l.toDouble();
  return at::where(x.ge(-v).logical_and(x.le(v)), at::zeros({}, grad.options()), grad);
}
at::Tensor& softshrink_backward_out(const at::Tensor& grad, const at::Tensor& x,
                                    const at::Scalar& l, at::Tensor& out) {
  return into(tpu_softshrink_backward(grad, x, l), out, "softshrink_backward (out=)");
}

// special.xlog1py: 0 where x == 0, NaN where y is NaN, else x * log1p(y); special.entr:
// -x log x for x > 0, 0 at 0, -inf below, NaN stays (CPU's formulas).
at::Tensor tpu_xlog1py(const at::Tensor& x0, const at::Tensor& y0) {
  auto t = float_result(x0, y0);
  auto x = cast(x0, t), y = cast(y0, t);
  auto r = at::where(x.eq(0), at::zeros({}, x.options()), x * at::log1p(y));
  return at::where(y.isnan(), y, r);
}
at::Tensor& xlog1py_out(const at::Tensor& x, const at::Tensor& y, at::Tensor& out) {
  return into(tpu_xlog1py(x, y), out, "special_xlog1py (out=)");
}
at::Tensor tpu_entr(const at::Tensor& x0) {
  auto x = cast(x0, float_dtype(x0));
  return rounded_once(x, [](const at::Tensor& x) {
    auto edge = at::where(x.eq(0), at::zeros({}, x.options()),
                          at::full({}, -INFINITY, x.options()));
    return at::where(x.isnan(), x, at::where(x.gt(0), -x * at::log(x), edge));
  });
}
at::Tensor& entr_out(const at::Tensor& x, at::Tensor& out) {
  return into(tpu_entr(x), out, "special_entr (out=)");
}

at::Tensor tpu_logical_xor(const at::Tensor& x, const at::Tensor& y) {
  return b<DFUSE_BINARY_OP_NE>(cast(x, at::kBool), cast(y, at::kBool));
}

}  // namespace
}  // namespace dft

#define DF_UNARY_ALL(name, OP)                                  \
  m.impl(#name, TORCH_FN(dft::ew::u<DFUSE_UNARY_OP_##OP>));        \
  m.impl(#name "_", TORCH_FN(dft::ew::u_<DFUSE_UNARY_OP_##OP>));   \
  m.impl(#name ".out", TORCH_FN(dft::ew::u_out<DFUSE_UNARY_OP_##OP>));

#define DF_BINARY_ALL(name, ovl, OP)                                         \
  m.impl(#name ovl, TORCH_FN(dft::ew::b<DFUSE_BINARY_OP_##OP>));               \
  m.impl(#name "_" ovl, TORCH_FN(dft::ew::b_<DFUSE_BINARY_OP_##OP>));          \
  m.impl(#name ovl "_out", TORCH_FN(dft::ew::b_out<DFUSE_BINARY_OP_##OP>));

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  DF_UNARY_ALL(bitwise_not, BITWISE_NOT)
  DF_UNARY_ALL(trunc, TRUNC)
  DF_UNARY_ALL(log2, LOG2)
  DF_UNARY_ALL(log10, LOG10)
  DF_UNARY_ALL(sinh, SINH)
  DF_UNARY_ALL(cosh, COSH)
  DF_UNARY_ALL(tan, TAN)
  DF_UNARY_ALL(asin, ASIN)
  DF_UNARY_ALL(acos, ACOS)
  DF_UNARY_ALL(atan, ATAN)
  DF_UNARY_ALL(asinh, ASINH)
  DF_UNARY_ALL(acosh, ACOSH)
  DF_UNARY_ALL(atanh, ATANH)
  DF_BINARY_ALL(bitwise_and, ".Tensor", BITWISE_AND)
  DF_BINARY_ALL(bitwise_or, ".Tensor", BITWISE_OR)
  DF_BINARY_ALL(bitwise_xor, ".Tensor", BITWISE_XOR)
  DF_BINARY_ALL(fmod, ".Tensor", FMOD)
  m.impl("fmod.Scalar", TORCH_FN(dft::ew::bs<DFUSE_BINARY_OP_FMOD>));
  m.impl("fmod_.Scalar", TORCH_FN(dft::ew::bs_<DFUSE_BINARY_OP_FMOD>));
  m.impl("atan2", TORCH_FN(dft::ew::b<DFUSE_BINARY_OP_ATAN2>));
  m.impl("atan2_", TORCH_FN(dft::ew::b_<DFUSE_BINARY_OP_ATAN2>));
  m.impl("atan2.out", TORCH_FN(dft::ew::b_out<DFUSE_BINARY_OP_ATAN2>));
  m.impl("floor_divide", TORCH_FN(dft::ew::b<DFUSE_BINARY_OP_FLOOR_DIVIDE>));
  m.impl("floor_divide_.Tensor", TORCH_FN(dft::ew::b_<DFUSE_BINARY_OP_FLOOR_DIVIDE>));
  m.impl("floor_divide.out", TORCH_FN(dft::ew::b_out<DFUSE_BINARY_OP_FLOOR_DIVIDE>));
  m.impl("floor_divide.Scalar", TORCH_FN(dft::ew::bs<DFUSE_BINARY_OP_FLOOR_DIVIDE>));
  m.impl("div.Tensor_mode", TORCH_FN(dft::div_mode));
  m.impl("div_.Tensor_mode", TORCH_FN(dft::div_mode_));
  m.impl("div.out_mode", TORCH_FN(dft::div_mode_out));
  m.impl("div.Scalar_mode", TORCH_FN(dft::div_scalar_mode));
  m.impl("nan_to_num", DFT_GROUPED(dft::tpu_nan_to_num));
  m.impl("nan_to_num.out", TORCH_FN(dft::nan_to_num_out));
  m.impl("logical_xor", DFT_GROUPED(dft::tpu_logical_xor));
  m.impl("logit", DFT_GROUPED(dft::tpu_logit));
  m.impl("logit_backward", DFT_GROUPED(dft::tpu_logit_backward));
  m.impl("frac", DFT_GROUPED(dft::tpu_frac));
  m.impl("frac_", TORCH_FN(dft::frac_));
  m.impl("frac.out", TORCH_FN(dft::frac_out));
  m.impl("logaddexp", DFT_GROUPED(dft::tpu_logaddexp));
  m.impl("logaddexp.out", TORCH_FN(dft::logaddexp_out));
  m.impl("hypot", DFT_GROUPED(dft::tpu_hypot));
  m.impl("hypot.out", TORCH_FN(dft::hypot_out));
  m.impl("logaddexp2", DFT_GROUPED(dft::tpu_logaddexp2));
  m.impl("logaddexp2.out", TORCH_FN(dft::logaddexp2_out));
  m.impl("bitwise_left_shift.Tensor", DFT_GROUPED(dft::tpu_shift<true>));
  m.impl("bitwise_left_shift.Tensor_out", TORCH_FN(dft::shift_out<true>));
  m.impl("bitwise_left_shift_.Tensor", TORCH_FN(dft::shift_<true>));
  m.impl("bitwise_right_shift.Tensor", DFT_GROUPED(dft::tpu_shift<false>));
  m.impl("bitwise_right_shift.Tensor_out", TORCH_FN(dft::shift_out<false>));
  m.impl("bitwise_right_shift_.Tensor", TORCH_FN(dft::shift_<false>));
  m.impl("__lshift__.Tensor", DFT_GROUPED(dft::tpu_shift<true>));
  m.impl("__lshift__.Scalar", DFT_GROUPED(dft::tpu_shift_scalar<true>));
  m.impl("__ilshift__.Tensor", TORCH_FN(dft::shift_<true>));
  m.impl("__ilshift__.Scalar", TORCH_FN(dft::shift_scalar_<true>));
  m.impl("__rshift__.Tensor", DFT_GROUPED(dft::tpu_shift<false>));
  m.impl("__rshift__.Scalar", DFT_GROUPED(dft::tpu_shift_scalar<false>));
  m.impl("__irshift__.Tensor", TORCH_FN(dft::shift_<false>));
  m.impl("__irshift__.Scalar", TORCH_FN(dft::shift_scalar_<false>));
  m.impl("exp2", DFT_GROUPED(dft::tpu_exp2));
  m.impl("exp2_", TORCH_FN(dft::exp2_));
  m.impl("exp2.out", TORCH_FN(dft::exp2_out));
  m.impl("take", DFT_GROUPED(dft::tpu_take));
  m.impl("take.out", TORCH_FN(dft::take_out));
  m.impl("put_", TORCH_FN(dft::put_));
  m.impl("sinc", DFT_GROUPED(dft::tpu_sinc));
  m.impl("sinc.out", TORCH_FN(dft::sinc_out));
  m.impl("heaviside", DFT_GROUPED(dft::tpu_heaviside));
  m.impl("heaviside.out", TORCH_FN(dft::heaviside_out));
  m.impl("fmax", DFT_GROUPED(dft::tpu_fminmax<true>));
  m.impl("fmax.out", TORCH_FN(dft::fminmax_out<true>));
  m.impl("fmin", DFT_GROUPED(dft::tpu_fminmax<false>));
  m.impl("fmin.out", TORCH_FN(dft::fminmax_out<false>));
  m.impl("threshold", DFT_GROUPED(dft::tpu_threshold));
  m.impl("threshold.out", TORCH_FN(dft::threshold_out));
  m.impl("softshrink", DFT_GROUPED(dft::tpu_softshrink));
  m.impl("softshrink.out", TORCH_FN(dft::softshrink_out));
  m.impl("softshrink_backward", DFT_GROUPED(dft::tpu_softshrink_backward));
  m.impl("softshrink_backward.grad_input", TORCH_FN(dft::softshrink_backward_out));
  m.impl("special_xlog1py", DFT_GROUPED(dft::tpu_xlog1py));
  m.impl("special_xlog1py.out", TORCH_FN(dft::xlog1py_out));
  m.impl("special_entr", DFT_GROUPED(dft::tpu_entr));
  m.impl("special_entr.out", TORCH_FN(dft::entr_out));
  m.impl("hardshrink", DFT_GROUPED(dft::tpu_hardshrink));
  m.impl("hardshrink.out", TORCH_FN(dft::hardshrink_out));
  m.impl("hardshrink_backward", DFT_GROUPED(dft::tpu_hardshrink_backward));
  m.impl("hardshrink_backward.grad_input", TORCH_FN(dft::hardshrink_backward_out));
}
