// Elementwise kernels: unary, binary (tensor or scalar operands), where, clamp, and the fused
// update ops optimizers use (lerp, addcmul, addcdiv). Each maps to one or two dfuse_op calls;
// in-place variants pass the destination as the op's `out`, so every alias sees the write.
#include "elementwise_ops.h"
#include "indexed_grad.h"

#include <ATen/Dispatch.h>
#include <ATen/ExpandUtils.h>
#include <ATen/ScalarOps.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/TypeProperties.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace dft {
namespace {

using namespace ew;

uint32_t gelu_op(c10::string_view approximate) {
  if (approximate == "none") return DFUSE_UNARY_OP_GELU_ERF;
  TORCH_CHECK(approximate == "tanh", "tpu: gelu approximate must be 'none' or 'tanh', got '",
              approximate, "'");
  return DFUSE_UNARY_OP_GELU_TANH;
}

// torch.sgn: sign for real tensors, x / |x| for complex64 (torch.sign refuses complex).
at::Tensor sgn(const at::Tensor& x) {
  return x.is_complex() ? complex_sgn(x) : u<DFUSE_UNARY_OP_SIGN>(x);
}

at::Tensor& sgn_(at::Tensor& x) {
  return x.is_complex() ? x.copy_(complex_sgn(x)) : u_<DFUSE_UNARY_OP_SIGN>(x);
}

at::Tensor gelu(const at::Tensor& x, c10::string_view approximate) {
  return unary(x, gelu_op(approximate));
}

at::Tensor& gelu_(at::Tensor& x, c10::string_view approximate) {
  auto a = attrs_sub(gelu_op(approximate));
  run_into(DFUSE_OP_KIND_UNARY, &a, Operands().t(x), x, "gelu_");
  return x;
}

bool is_wrapped(const at::Tensor& t) {
  return t.device().is_cpu() && t.unsafeGetTensorImpl()->is_wrapped_number();
}

// `other * alpha` for add/sub's alpha, in the dtype x and other promote to, where CPU computes
// `x + alpha * other`: a bfloat16 gradient added into a float32 parameter is widened before
// its product, not rounded to bfloat16 after it, and an int32 `other` of an int64 `x` is
// multiplied in int64. PyTorch's alpha checks first (no float alpha for integers). A
// Python-scalar `other` stays a scalar (so type promotion still sees a scalar).
at::Tensor scaled(const at::Tensor& x, const at::Tensor& other, const at::Scalar& alpha) {
  // An integer 1 (every plain `x + y`) passes alpha_check for any dtype: no promotion asked.
  if (alpha.isIntegral(false) && alpha.equal(1)) return other;
  auto common = at::result_type(x, other);
  at::native::alpha_check(common, alpha);
  if (alpha.equal(1)) return other;
  if (is_wrapped(other)) {
    at::Scalar v = other.item();
    at::Scalar prod = v.isComplex() || alpha.isComplex()
                          ? at::Scalar(v.toComplexDouble() * alpha.toComplexDouble())
                      : v.isBoolean() && alpha.isBoolean()
                          ? at::Scalar(v.toBool() && alpha.toBool())
                      : v.isIntegral(true) && alpha.isIntegral(true)
                          ? at::Scalar(v.toLong() * alpha.toLong())
                          : at::Scalar(v.toDouble() * alpha.toDouble());
    auto t = at::scalar_to_tensor(prod);
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
    return t;
  }
  // A bool result: alpha is a bool too (alpha_check), and `other` counts when it is true.
  if (common == at::kBool) return alpha.toBool() ? other : at::zeros_like(other);
  // Complex: alpha times `other` as CPU's complex multiply, a real `other` taking part as
  // (x, 0) (SGD's `p.add_(grad, alpha=-lr)` on complex parameters raised).
  if (at::isComplexType(common)) {
    return complex_binary(DFUSE_BINARY_OP_MUL, other.is_complex() ? other : other.to(common),
                          alpha);
  }
  bool widen = other.scalar_type() != common && !at::isComplexType(common);
  return binary(widen ? cast(other, common) : other, alpha, DFUSE_BINARY_OP_MUL);
}

// float16/bfloat16 with alpha != 1: CPU rounds alpha to the half type, computes x + alpha * y
// in float32 and rounds once (the product rounded to the half type first was an ulp off in a
// quarter of the elements). A Python-scalar operand is rounded to the half type first, as
// TensorIterator casts it.
bool alpha_in_float(const at::Tensor& x, const at::Tensor& y, const at::Scalar& alpha) {
  return !alpha.equal(1) && is_reduced_float(at::result_type(x, y));
}

at::Tensor in_float(const at::Tensor& t, at::ScalarType half, const at::TensorOptions& device) {
  if (!is_wrapped(t)) return opmath(t);
  return cast(at::scalar_tensor(t.item(), device.dtype(half)), at::kFloat);
}

template <uint32_t OP>
at::Tensor b_alpha_pieces(const at::Tensor& x, const at::Tensor& y, const at::Scalar& alpha) {
  if (alpha_in_float(x, y, alpha)) {
    auto half = at::result_type(x, y);
    auto xf = in_float(x, half, x.options()), yf = in_float(y, half, x.options());
    float a = float(alpha.toDouble());
    at::Scalar alpha_h(half == at::kBFloat16 ? double(float(c10::BFloat16(a)))
                                             : double(float(c10::Half(a))));
    return cast(b<OP>(xf, scaled(xf, yf, alpha_h)), half);
  }
  return b<OP>(x, scaled(x, y, alpha));
}

template <uint32_t OP>
at::Tensor& b_alpha_pieces_(at::Tensor& x, const at::Tensor& y, const at::Scalar& alpha) {
  if (alpha_in_float(x, y, alpha)) return x.copy_(b_alpha_pieces<OP>(x, y, alpha));
  return b_<OP>(x, scaled(x, y, alpha));
}

// A tensor `other` scaled by alpha != 1 is two recorded ops (a multiply, then OP): in strict
// mode they run as one op group, as PyTorch's one kernel; the usual alpha == 1 stays one op.
bool scales_a_tensor(const at::Tensor& other, const at::Scalar& alpha) {
  return !alpha.equal(1) && (!is_wrapped(other) || is_reduced_float(other.scalar_type()));
}

template <uint32_t OP>
at::Tensor b_alpha(const at::Tensor& x, const at::Tensor& y, const at::Scalar& alpha) {
  ew::refuse_as_cpu<OP>(x, y);
  if constexpr (OP == DFUSE_BINARY_OP_ADD) {
    if (auto sum = add_indexed_grad(x, y, alpha)) return *std::move(sum);
  }
  if (!scales_a_tensor(y, alpha)) return b_alpha_pieces<OP>(x, y, alpha);
  return Grouped<decltype(&b_alpha_pieces<OP>), &b_alpha_pieces<OP>>::call(x, y, alpha);
}

template <uint32_t OP>
at::Tensor& b_alpha_(at::Tensor& x, const at::Tensor& y, const at::Scalar& alpha) {
  ew::refuse_as_cpu<OP>(x, y);
  ew::check_in_place_shape(x, y);
  if (y.scalar_type() != x.scalar_type()) ew::check_in_place_cast(x, at::result_type(x, y));
  if constexpr (OP == DFUSE_BINARY_OP_ADD) {
    if (add_indexed_grad_(x, y, alpha)) return x;
  }
  if (!scales_a_tensor(y, alpha)) return b_alpha_pieces_<OP>(x, y, alpha);
  return Grouped<decltype(&b_alpha_pieces_<OP>), &b_alpha_pieces_<OP>>::call(x, y, alpha);
}

template <uint32_t OP>
at::Tensor& b_alpha_out(const at::Tensor& x, const at::Tensor& y, const at::Scalar& alpha,
                        at::Tensor& out) {
  ew::refuse_as_cpu<OP>(x, y);
  ew::prepare_out(x, y, out);  // before scaling: y itself may be the out
  return b_out<OP>(x, scaled(x, y, alpha), out);
}

// rsub(self, other, alpha) = other - alpha * self
at::Tensor rsub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return b<DFUSE_BINARY_OP_SUB>(other, scaled(other, self, alpha));
}

at::Tensor pow_scalar_base(const at::Scalar& base, const at::Tensor& exp) {
  auto r = binary(base, exp, DFUSE_BINARY_OP_POW);
  // A float base promotes an integer exponent to the default dtype (ew::promoted_past_default).
  if (ew::promoted_past_default(r, !at::isFloatingType(exp.scalar_type()))) {
    return binary(base, ew::to_default_dtype(exp), DFUSE_BINARY_OP_POW);
  }
  return r;
}

// pow(x, exponent) with a Python-scalar exponent, computed as PyTorch's CPU kernel computes it
// for float tensors (ATen/native/cpu/PowKernel.cpp): it special-cases 2, 3 and -2 (x*x, x*x*x,
// 1/(x*x)), 0.5, -0.5 and -1 (sqrt, rsqrt, reciprocal), and other exponents call pow. Recording
// the same ops gives CPU's bits (x*x*x rounds twice, where pow would round once) and runs them
// as vector code that fuses with its neighbours, where the general pow is a libm call per lane
// (~20 ns per element: RMSNorm's x.pow(2) and its backward's pow(3) were the slowest regions
// of a Llama step). An exponent of 1 (pow(2)'s backward) is an exact multiply by one.
bool pow_has_cpu_special_cases(const at::Tensor& x, const at::Scalar& e) {
  bool float_base = x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble;
  return float_base && !e.isComplex() && !e.isBoolean();
}

at::Tensor pow_tensor_scalar(const at::Tensor& x, const at::Scalar& e) {
  if (!pow_has_cpu_special_cases(x, e)) return binary(x, e, DFUSE_BINARY_OP_POW);
  double v = e.toDouble();
  auto square = [&] { return b<DFUSE_BINARY_OP_MUL>(x, x); };
  if (v == 2.0) return square();
  if (v == 3.0) return b<DFUSE_BINARY_OP_MUL>(square(), x);
  if (v == -2.0) return unary(square(), DFUSE_UNARY_OP_RECIPROCAL);
  if (v == 1.0) return binary(x, at::Scalar(1.0), DFUSE_BINARY_OP_MUL);
  if (v == 0.5) return unary(x, DFUSE_UNARY_OP_SQRT);
  if (v == -0.5) return unary(x, DFUSE_UNARY_OP_RSQRT);
  if (v == -1.0) return unary(x, DFUSE_UNARY_OP_RECIPROCAL);
  return binary(x, e, DFUSE_BINARY_OP_POW);
}

// x**3 and x**-2 record two ops (CPU rounds twice): one op group in strict mode. The other
// exponents record one op and stay on the strict path (a group of one op only costs more).
// PyTorch's check (numpy's rule), before any work: `int_tensor ** -1` raises.
void check_integer_power(const at::Tensor& x, const at::Scalar& e) {
  TORCH_CHECK(!(at::isIntegralType(x.scalar_type(), true) && e.isIntegral(true) && e.toLong() < 0),
              "Integers to negative integer powers are not allowed.");
}

at::Tensor pow_tensor_scalar_entry(const at::Tensor& x, const at::Scalar& e) {
  check_integer_power(x, e);
  // An integer base with a float exponent is promoted to the default dtype (see
  // ew::promoted_past_default), which the runtime takes for float32.
  if (!at::isFloatingType(x.scalar_type()) && e.isFloatingPoint() &&
      at::typeMetaToScalarType(at::get_default_dtype()) != at::kFloat) {
    return pow_tensor_scalar_entry(ew::to_default_dtype(x), e);
  }
  bool two_ops = pow_has_cpu_special_cases(x, e) && (e.toDouble() == 3.0 || e.toDouble() == -2.0);
  if (!two_ops) return pow_tensor_scalar(x, e);
  return Grouped<decltype(&pow_tensor_scalar), &pow_tensor_scalar>::call(x, e);
}

// In place, the specialised value is written back through `x`'s handle like any in-place op.
at::Tensor& pow_tensor_scalar_(at::Tensor& x, const at::Scalar& e) {
  check_integer_power(x, e);
  if (!pow_has_cpu_special_cases(x, e)) return bs_<DFUSE_BINARY_OP_POW>(x, e);
  return x.copy_(pow_tensor_scalar(x, e));
}

at::Tensor where_self(const at::Tensor& c, const at::Tensor& x, const at::Tensor& y) {
  if (x.is_complex() || y.is_complex()) return complex_where(c, x, y);
  return run(DFUSE_OP_KIND_WHERE, nullptr, Operands().t(where_condition(c)).t(x).t(y), "where");
}

// CPU's clamp bound. For an integer tensor and an integer bound: one past the dtype's range on its
// own side bounds nothing (uint8 `clamp(-1, 3)` keeps the 0s, where the runtime would wrap -1
// to 255), one past it on the other side raises. A float32/float16/bfloat16 tensor's bound
// past its dtype's range raises (float32 `clamp(max=1e300)`).
at::Scalar clamp_bound(const at::Tensor& x, const at::Scalar& b, bool is_min) {
  auto t = x.scalar_type();
  // A floating tensor's bound must fit its dtype (inf does), as CPU converts it.
  if (t == at::kFloat || t == at::kHalf || t == at::kBFloat16) {
    double v = b.toDouble();
    double max = t == at::kFloat  ? double(std::numeric_limits<float>::max())
                 : t == at::kHalf ? double(std::numeric_limits<c10::Half>::max())
                                  : double(std::numeric_limits<c10::BFloat16>::max());
    TORCH_CHECK(!std::isfinite(v) || std::abs(v) <= max, "value cannot be converted to type ",
                t == at::kFloat ? "float" : t == at::kHalf ? "c10::Half" : "c10::BFloat16",
                " without overflow");
    return b;
  }
  if (!at::isIntegralType(t, /*includeBool=*/false) || !b.isIntegral(false)) return b;
  int64_t lo = 0, hi = 0;
  AT_DISPATCH_INTEGRAL_TYPES(t, "clamp bound", [&] {
    lo = int64_t(std::numeric_limits<scalar_t>::lowest());
    hi = int64_t(std::numeric_limits<scalar_t>::max());
  });
  int64_t v = b.toLong();
  TORCH_CHECK(is_min ? v <= hi : v >= lo, "Clamp ", is_min ? "min" : "max", " value ",
              double(v), " is outside the representable range of ", at::toString(t));
  return at::Scalar(std::min(std::max(v, lo), hi));
}

Operands clamp_operands(const at::Tensor& x, const std::optional<at::Scalar>& lo,
                        const std::optional<at::Scalar>& hi) {
  TORCH_CHECK(lo || hi, "torch.clamp: At least one of 'min' or 'max' must not be None");
  Operands o;
  o.t(x);
  if (lo) o.s(clamp_bound(x, *lo, true)); else o.absent();
  if (hi) o.s(clamp_bound(x, *hi, false)); else o.absent();
  return o;
}

// The dtype CPU clamps a bool tensor in: promoted with its bounds (`clamp(min=2)` is int64).
// Bool bounds are CPU's error (its kernel refuses bool), raised by CPU's op on no elements.
at::ScalarType bool_clamp_dtype(const at::Tensor& x, const std::optional<at::Scalar>& lo,
                                const std::optional<at::Scalar>& hi) {
  auto host = ew::host_empty(x);
  auto r = lo ? at::result_type(host, *lo) : at::kBool;
  if (hi) r = at::result_type(host.to(r), *hi);
  if (r == at::kBool) at::clamp(host, lo, hi);
  return r;
}

at::Tensor clamp_s(const at::Tensor& x, const std::optional<at::Scalar>& lo,
                 const std::optional<at::Scalar>& hi) {
  if (x.scalar_type() == at::kBool && (lo || hi)) {
    return clamp_s(x.to(bool_clamp_dtype(x, lo, hi)), lo, hi);
  }
  auto r = run(DFUSE_OP_KIND_CLAMP, nullptr, clamp_operands(x, lo, hi), "clamp");
  // A float bound promotes an integer tensor to the default dtype (ew::promoted_past_default).
  if (ew::promoted_past_default(r, !at::isFloatingType(x.scalar_type()))) {
    return clamp_s(ew::to_default_dtype(x), lo, hi);
  }
  return r;
}

at::Tensor& clamp_s_(at::Tensor& x, const std::optional<at::Scalar>& lo,
                   const std::optional<at::Scalar>& hi) {
  if (x.scalar_type() == at::kBool && (lo || hi)) {
    auto r = bool_clamp_dtype(x, lo, hi);
    // clamp_'s own wording (TypeMeta's "bool"), not TensorIterator's ("Bool").
    TORCH_CHECK(at::canCast(r, at::kBool), "result type ", r,
                " can't be cast to the desired output type ", x.dtype());
  }
  run_into(DFUSE_OP_KIND_CLAMP, nullptr, clamp_operands(x, lo, hi), x, "clamp_");
  return x;
}

Operands clamp_t_operands(const at::Tensor& x, const std::optional<at::Tensor>& lo,
                          const std::optional<at::Tensor>& hi) {
  bool has_lo = lo && lo->defined(), has_hi = hi && hi->defined();
  TORCH_CHECK(has_lo || has_hi, "torch.clamp: At least one of 'min' or 'max' must not be None");
  Operands o;
  o.t(x);
  if (has_lo) o.t(*lo); else o.absent();
  if (has_hi) o.t(*hi); else o.absent();
  return o;
}

// CPU's clamp_min/clamp_max take bools with tensor bounds (false < true): max with lo is
// `or`, min with hi `and`; its clamp kernel refuses them. The runtime's clamp takes numbers.
bool all_bool(const at::Tensor& x, const std::optional<at::Tensor>& lo,
              const std::optional<at::Tensor>& hi) {
  auto is_bool = [](const std::optional<at::Tensor>& t) {
    return !t || !t->defined() || t->scalar_type() == at::kBool;
  };
  return x.scalar_type() == at::kBool && is_bool(lo) && is_bool(hi);
}

at::Tensor clamp_bool(const at::Tensor& x, const std::optional<at::Tensor>& lo,
                      const std::optional<at::Tensor>& hi) {
  clamp_t_operands(x, lo, hi);  // its check that a bound is given
  auto r = x;
  if (lo && lo->defined()) r = r.logical_or(*lo);
  if (hi && hi->defined()) r = r.logical_and(*hi);
  return r;
}

at::Tensor clamp_t(const at::Tensor& x, const std::optional<at::Tensor>& lo,
                   const std::optional<at::Tensor>& hi) {
  TORCH_CHECK_NOT_IMPLEMENTED(!all_bool(x, lo, hi), "\"clamp_cpu\" not implemented for 'Bool'");
  return run(DFUSE_OP_KIND_CLAMP, nullptr, clamp_t_operands(x, lo, hi), "clamp");
}

at::Tensor& clamp_t_(at::Tensor& x, const std::optional<at::Tensor>& lo,
                     const std::optional<at::Tensor>& hi) {
  TORCH_CHECK_NOT_IMPLEMENTED(!all_bool(x, lo, hi), "\"clamp_cpu\" not implemented for 'Bool'");
  run_into(DFUSE_OP_KIND_CLAMP, nullptr, clamp_t_operands(x, lo, hi), x, "clamp_");
  return x;
}

at::Tensor clamp_min(const at::Tensor& x, const at::Scalar& lo) {
  return clamp_s(x, lo, std::nullopt);
}
at::Tensor clamp_max(const at::Tensor& x, const at::Scalar& hi) {
  return clamp_s(x, std::nullopt, hi);
}
at::Tensor& clamp_min_(at::Tensor& x, const at::Scalar& lo) {
  return clamp_s_(x, lo, std::nullopt);
}
at::Tensor& clamp_max_(at::Tensor& x, const at::Scalar& hi) {
  return clamp_s_(x, std::nullopt, hi);
}
// The tensor-bound forms (cosine_similarity clamps its norms with a tensor bound).
at::Tensor clamp_min_t(const at::Tensor& x, const at::Tensor& lo) {
  if (all_bool(x, lo, std::nullopt)) return clamp_bool(x, lo, std::nullopt);
  return clamp_t(x, lo, std::nullopt);
}
at::Tensor clamp_max_t(const at::Tensor& x, const at::Tensor& hi) {
  if (all_bool(x, std::nullopt, hi)) return clamp_bool(x, std::nullopt, hi);
  return clamp_t(x, std::nullopt, hi);
}
at::Tensor& clamp_min_t_(at::Tensor& x, const at::Tensor& lo) {
  if (all_bool(x, lo, std::nullopt)) return x.copy_(clamp_bool(x, lo, std::nullopt));
  return clamp_t_(x, lo, std::nullopt);
}
at::Tensor& clamp_max_t_(at::Tensor& x, const at::Tensor& hi) {
  if (all_bool(x, std::nullopt, hi)) return x.copy_(clamp_bool(x, std::nullopt, hi));
  return clamp_t_(x, std::nullopt, hi);
}

// float16/bfloat16 operands of the optimizers' update ops (lerp, addcmul, addcdiv: a model
// trained in bfloat16 with Adam) are computed in float32 and rounded once, as PyTorch's CPU
// kernels do; rounding each piece in the half dtype drifted from CPU's parameters step by step.
bool is_half(const at::Tensor& t) { return is_reduced_float(t.scalar_type()); }

// lerp: self + weight * (end - self), PyTorch's formula for |weight| < 0.5 (the optimizers'
// case: 1 - beta1); for larger weights PyTorch uses end - (end - self) * (1 - weight).
at::Tensor lerp_value(const at::Tensor& self, const at::Tensor& end, const at::Scalar& w) {
  auto diff = b<DFUSE_BINARY_OP_SUB>(end, self);
  double wd = w.toDouble();
  if (std::abs(wd) < 0.5) {
    return b<DFUSE_BINARY_OP_ADD>(self, binary(diff, w, DFUSE_BINARY_OP_MUL));
  }
  return b<DFUSE_BINARY_OP_SUB>(end, binary(diff, at::Scalar(1.0 - wd), DFUSE_BINARY_OP_MUL));
}

// The same per element for a tensor weight: the formula is chosen by each weight.
// CPU's check that lerp never promotes `end` (a float64 `end` of a float32 self raises).
void check_lerp_end(const at::Tensor& self, const at::Tensor& end) {
  TORCH_CHECK(self.dtype() == end.dtype(), "expected dtype ", self.dtype(),
              " for `end` but got dtype ", end.dtype());
}

// That, and CPU's scalar-weight kernel takes floating and complex dtypes only.
void check_lerp_dtypes(const at::Tensor& self, const at::Tensor& end) {
  check_lerp_end(self, end);
  check_float_kernel(self.scalar_type(), "lerp_kernel_scalar");
}

at::Tensor lerp(const at::Tensor& self, const at::Tensor& end, const at::Scalar& w);

// CPU takes a 0-dim weight of any dtype (its value, as the scalar form would), and computes a
// half self in float32, rounded once.
at::Tensor lerp_tensor(const at::Tensor& self, const at::Tensor& end, const at::Tensor& w) {
  check_lerp_end(self, end);
  TORCH_CHECK(self.dtype() == w.dtype() || w.dim() == 0, "expected dtype ", self.dtype(),
              " for `weight` but got dtype ", w.dtype());
  // CPU's kernel runs in the common dtype: a 0-dim float weight promotes an integer self.
  auto common = at::result_type(self, w);
  check_float_kernel(common, "lerp_kernel_tensor");
  if (common != self.scalar_type()) return lerp_tensor(cast(self, common), cast(end, common), w);
  // A 0-dim weight of another dtype is first rounded to self's, as CPU's common dtype has it.
  if (w.dim() == 0 && w.device().type() != c10::DeviceType::PrivateUse1) {
    return dft::lerp(self, end, w.to(self.scalar_type()).item());
  }
  if (is_half(self)) {
    auto wide = lerp_tensor(opmath(self), opmath(end), cast(cast(w, self.scalar_type()), at::kFloat));
    return cast(wide, self.scalar_type());
  }
  auto weight = w.scalar_type() == self.scalar_type() ? w : cast(w, self.scalar_type());
  auto diff = end - self;
  return at::where(weight.abs().lt(0.5), self + weight * diff, end - diff * (1 - weight));
}

at::Tensor& lerp_tensor_(at::Tensor& self, const at::Tensor& end, const at::Tensor& w) {
  // A result self cannot hold (an integer self, a 0-dim float weight) raises as on CPU; a
  // mismatched `end` or `weight` dtype is left to lerp_tensor's own message.
  auto common = at::result_type(self, w);
  bool dtypes_ok = self.dtype() == end.dtype() && (self.dtype() == w.dtype() || w.dim() == 0);
  TORCH_CHECK(!dtypes_ok || at::canCast(common, self.scalar_type()), "result type ", common,
              " can't be cast to the desired output type ", self.scalar_type());
  return self.copy_(lerp_tensor(self, end, w));
}

at::Tensor lerp(const at::Tensor& self, const at::Tensor& end, const at::Scalar& w) {
  check_lerp_dtypes(self, end);
  if (is_half(self)) return cast(lerp_value(opmath(self), opmath(end), w), self.scalar_type());
  return lerp_value(self, end, w);
}

// The formula's last op writes straight into self: copying a new result into self was one
// more recorded op per parameter in every Adam/AdamW step (its exp_avg update).
at::Tensor& lerp_(at::Tensor& self, const at::Tensor& end, const at::Scalar& w) {
  check_lerp_dtypes(self, end);
  if (is_half(self)) return self.copy_(lerp_value(opmath(self), opmath(end), w));
  auto diff = b<DFUSE_BINARY_OP_SUB>(end, self);
  double wd = w.toDouble();
  if (std::abs(wd) < 0.5) {
    return b_<DFUSE_BINARY_OP_ADD>(self, binary(diff, w, DFUSE_BINARY_OP_MUL));
  }
  auto a = attrs_sub(DFUSE_BINARY_OP_SUB);
  run_into(DFUSE_OP_KIND_BINARY, &a,
           Operands().t(end).t(binary(diff, at::Scalar(1.0 - wd), DFUSE_BINARY_OP_MUL)), self,
           "lerp_");
  return self;
}

// addcmul: self + value * t1 * t2; addcdiv: self + value * t1 / t2 (PyTorch's order).
at::Tensor addcmul(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                   const at::Scalar& value);
at::Tensor addcdiv(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                   const at::Scalar& value);

// The dtype addcmul/addcdiv compute in: all three operands promoted together, as CPU's one
// TensorIterator over them does (a 0-dim operand's dtype counts only within its category:
// pairwise promotion made `addcmul(f32, f64 0-dim, i32)` float64, and multiplied two uint8s
// into a wrapped uint8 before adding them to an int64). CPU's refusals come with it: bool
// products, and integer division.
at::ScalarType addc_dtype(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                          bool division) {
  at::native::ResultTypeState state;
  for (const at::Tensor* t : {&self, &t1, &t2}) {
    state = at::native::update_result_type_state(*t, state);
  }
  auto rt = at::native::result_type(state);
  if (division) {
    TORCH_CHECK(!(at::isIntegralType(t1.scalar_type(), true) &&
                  at::isIntegralType(t2.scalar_type(), true)),
                "Integer division with addcdiv is no longer supported, and in a future release "
                "addcdiv will perform a true division of tensor1 and tensor2. The historic "
                "addcdiv behavior can be implemented as (input + value * torch.trunc(tensor1 / "
                "tensor2)).to(input.dtype) for integer inputs and as (input + value * tensor1 / "
                "tensor2) for float inputs. The future addcdiv behavior is just the latter "
                "implementation: (input + value * tensor1 / tensor2), for all dtypes.");
  }
  TORCH_CHECK_NOT_IMPLEMENTED(rt != at::kBool, "\"", division ? "addcdiv" : "addcmul",
                              "_cpu_out\" not implemented for 'Bool'");
  return rt;
}

// self + value * (t1 OP t2), every operand in the common dtype `rt`; a half dtype computed in
// float32 and rounded once.
// `value` as CPU converts it to the common dtype: 2.5 is 2 for integer operands.
at::Scalar addc_value(const at::Scalar& value, at::ScalarType rt) {
  return at::isIntegralType(rt, false) && value.isFloatingPoint() ? at::Scalar(value.toLong())
                                                                   : value;
}

at::Tensor addc(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                const at::Scalar& given, uint32_t op, at::ScalarType rt) {
  const at::Scalar value = addc_value(given, rt);
  if (is_reduced_float(rt)) {
    // Each operand in rt first (an integer operand rounds, or overflows, as on CPU).
    auto in_rt = [&](const at::Tensor& t) { return opmath(cast(t, rt)); };
    return cast(addc(in_rt(self), in_rt(t1), in_rt(t2), value, op, at::kFloat), rt);
  }
  auto x = cast(t1, rt), y = cast(t2, rt);
  auto combined = op == DFUSE_BINARY_OP_MUL ? b<DFUSE_BINARY_OP_MUL>(x, y) : b<DFUSE_BINARY_OP_DIV>(x, y);
  return b<DFUSE_BINARY_OP_ADD>(cast(self, rt), binary(combined, value, DFUSE_BINARY_OP_MUL));
}

at::Tensor addcmul(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                   const at::Scalar& value) {
  return addc(self, t1, t2, value, DFUSE_BINARY_OP_MUL, addc_dtype(self, t1, t2, false));
}

// An in-place addcmul_/addcdiv_ writes the common dtype into self, as CPU casts it.
at::ScalarType addc_dtype_into(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                               bool division) {
  auto rt = addc_dtype(self, t1, t2, division);
  TORCH_CHECK(at::canCast(rt, self.scalar_type()), "result type ", rt,
              " can't be cast to the desired output type ", self.scalar_type());
  return rt;
}

at::Tensor& addcmul_(at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                     const at::Scalar& value) {
  auto rt = addc_dtype_into(self, t1, t2, false);
  if (is_reduced_float(rt) || rt != self.scalar_type()) {
    return self.copy_(addc(self, t1, t2, value, DFUSE_BINARY_OP_MUL, rt));
  }
  const at::Scalar v = addc_value(value, rt);
  auto p = binary(b<DFUSE_BINARY_OP_MUL>(cast(t1, rt), cast(t2, rt)), v, DFUSE_BINARY_OP_MUL);
  return b_<DFUSE_BINARY_OP_ADD>(self, p);
}

at::Tensor addcdiv(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                   const at::Scalar& value) {
  return addc(self, t1, t2, value, DFUSE_BINARY_OP_DIV, addc_dtype(self, t1, t2, true));
}

at::Tensor& addcdiv_(at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                     const at::Scalar& value) {
  auto rt = addc_dtype_into(self, t1, t2, true);
  if (is_reduced_float(rt) || rt != self.scalar_type()) {
    return self.copy_(addc(self, t1, t2, value, DFUSE_BINARY_OP_DIV, rt));
  }
  const at::Scalar v = addc_value(value, rt);
  auto q = binary(b<DFUSE_BINARY_OP_DIV>(cast(t1, rt), cast(t2, rt)), v, DFUSE_BINARY_OP_MUL);
  return b_<DFUSE_BINARY_OP_ADD>(self, q);
}

// logical_and/or with out= (their in-place forms and clamp's backward reach it): the bool
// result copied into out, whose dtype PyTorch lets be anything.
template <uint32_t OP>
at::Tensor& logical_out(const at::Tensor& x, const at::Tensor& y, at::Tensor& out) {
  auto r = ew::b<OP>(x, y);
  at::native::resize_output(out, r.sizes());
  out.copy_(r);
  return out;
}

}  // namespace
}  // namespace dft

#define DF_UNARY(name, OP)                          \
  m.impl(#name, TORCH_FN(dft::ew::u<DFUSE_UNARY_OP_##OP>)); \
  m.impl(#name "_", TORCH_FN(dft::ew::u_<DFUSE_UNARY_OP_##OP>));

#define DF_BINARY(name, OP)                                    \
  m.impl(#name ".Tensor", TORCH_FN(dft::ew::b<DFUSE_BINARY_OP_##OP>));   \
  m.impl(#name "_.Tensor", TORCH_FN(dft::ew::b_<DFUSE_BINARY_OP_##OP>));

#define DF_COMPARE(name, OP)                                    \
  m.impl(#name ".Tensor", TORCH_FN(dft::ew::b<DFUSE_BINARY_OP_##OP>));    \
  m.impl(#name ".Scalar", TORCH_FN(dft::ew::bs<DFUSE_BINARY_OP_##OP>));

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  DF_UNARY(neg, NEG) DF_UNARY(abs, ABS) DF_UNARY(exp, EXP) DF_UNARY(log, LOG)
  DF_UNARY(log1p, LOG1P) DF_UNARY(expm1, EXPM1) DF_UNARY(sqrt, SQRT) DF_UNARY(rsqrt, RSQRT)
  DF_UNARY(sin, SIN) DF_UNARY(cos, COS) DF_UNARY(tanh, TANH) DF_UNARY(sigmoid, SIGMOID)
  DF_UNARY(relu, RELU) DF_UNARY(silu, SILU) DF_UNARY(erf, ERF) DF_UNARY(floor, FLOOR)
  DF_UNARY(ceil, CEIL) DF_UNARY(round, ROUND) DF_UNARY(sign, SIGN)
  DF_UNARY(reciprocal, RECIPROCAL) DF_UNARY(logical_not, LOGICAL_NOT)
  // sgn is sign for real tensors, x / |x| for complex64; abs's backward calls it.
  m.impl("sgn", TORCH_FN(dft::sgn));
  m.impl("sgn_", TORCH_FN(dft::sgn_));
  m.impl("isnan", TORCH_FN(dft::ew::u<DFUSE_UNARY_OP_IS_NAN>));
  m.impl("gelu", TORCH_FN(dft::gelu));
  m.impl("gelu_", TORCH_FN(dft::gelu_));

  m.impl("add.Tensor", TORCH_FN(dft::b_alpha<DFUSE_BINARY_OP_ADD>));
  m.impl("add_.Tensor", TORCH_FN(dft::b_alpha_<DFUSE_BINARY_OP_ADD>));
  m.impl("sub.Tensor", TORCH_FN(dft::b_alpha<DFUSE_BINARY_OP_SUB>));
  m.impl("sub_.Tensor", TORCH_FN(dft::b_alpha_<DFUSE_BINARY_OP_SUB>));
  m.impl("rsub.Tensor", TORCH_FN(dft::rsub));
  DF_BINARY(mul, MUL) DF_BINARY(div, DIV)
  m.impl("add.out", TORCH_FN(dft::b_alpha_out<DFUSE_BINARY_OP_ADD>));
  m.impl("sub.out", TORCH_FN(dft::b_alpha_out<DFUSE_BINARY_OP_SUB>));
  m.impl("mul.out", TORCH_FN(dft::ew::b_out<DFUSE_BINARY_OP_MUL>));
  m.impl("div.out", TORCH_FN(dft::ew::b_out<DFUSE_BINARY_OP_DIV>));
  m.impl("pow.Tensor_Tensor", TORCH_FN(dft::ew::b<DFUSE_BINARY_OP_POW>));
  m.impl("pow_.Tensor", TORCH_FN(dft::ew::b_<DFUSE_BINARY_OP_POW>));
  m.impl("pow.Tensor_Scalar", TORCH_FN(dft::pow_tensor_scalar_entry));
  m.impl("pow_.Scalar", DFT_GROUPED(dft::pow_tensor_scalar_));
  m.impl("pow.Scalar", TORCH_FN(dft::pow_scalar_base));
  m.impl("maximum", TORCH_FN(dft::ew::b<DFUSE_BINARY_OP_MAXIMUM>));
  m.impl("minimum", TORCH_FN(dft::ew::b<DFUSE_BINARY_OP_MINIMUM>));
  DF_BINARY(remainder, REMAINDER)
  m.impl("remainder.Scalar_Tensor", TORCH_FN(dft::ew::sb<DFUSE_BINARY_OP_REMAINDER>));
  m.impl("logical_and", TORCH_FN(dft::ew::b<DFUSE_BINARY_OP_LOGICAL_AND>));
  m.impl("logical_or", TORCH_FN(dft::ew::b<DFUSE_BINARY_OP_LOGICAL_OR>));
  m.impl("logical_and.out", TORCH_FN(dft::logical_out<DFUSE_BINARY_OP_LOGICAL_AND>));
  m.impl("logical_or.out", TORCH_FN(dft::logical_out<DFUSE_BINARY_OP_LOGICAL_OR>));
  DF_COMPARE(eq, EQ) DF_COMPARE(ne, NE) DF_COMPARE(lt, LT) DF_COMPARE(le, LE)
  DF_COMPARE(gt, GT) DF_COMPARE(ge, GE)

  m.impl("where.self", TORCH_FN(dft::where_self));
  m.impl("clamp", TORCH_FN(dft::clamp_s));
  m.impl("clamp_", TORCH_FN(dft::clamp_s_));
  m.impl("clamp.Tensor", TORCH_FN(dft::clamp_t));
  m.impl("clamp_.Tensor", TORCH_FN(dft::clamp_t_));
  m.impl("clamp_min", TORCH_FN(dft::clamp_min));
  m.impl("clamp_max", TORCH_FN(dft::clamp_max));
  m.impl("clamp_min_", TORCH_FN(dft::clamp_min_));
  m.impl("clamp_max_", TORCH_FN(dft::clamp_max_));
  m.impl("clamp_min.Tensor", TORCH_FN(dft::clamp_min_t));
  m.impl("clamp_max.Tensor", TORCH_FN(dft::clamp_max_t));
  m.impl("clamp_min_.Tensor", TORCH_FN(dft::clamp_min_t_));
  m.impl("clamp_max_.Tensor", TORCH_FN(dft::clamp_max_t_));
  m.impl("lerp.Scalar", DFT_GROUPED(dft::lerp));
  m.impl("lerp_.Scalar", DFT_GROUPED(dft::lerp_));
  m.impl("lerp.Tensor", DFT_GROUPED(dft::lerp_tensor));
  m.impl("lerp_.Tensor", DFT_GROUPED(dft::lerp_tensor_));
  m.impl("addcmul", DFT_GROUPED(dft::addcmul));
  m.impl("addcmul_", DFT_GROUPED(dft::addcmul_));
  m.impl("addcdiv", DFT_GROUPED(dft::addcdiv));
  m.impl("addcdiv_", DFT_GROUPED(dft::addcdiv_));
}
