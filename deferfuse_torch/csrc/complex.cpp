// complex64 tensors on "tpu": what a model's rotary embeddings need when written with complex
// numbers (Meta's LLaMA reference code: torch.polar, view_as_complex, a complex multiply,
// view_as_real), and their gradients.
//
// The runtime has no complex dtype; a complex64 tensor's storage is float32 pairs (real,
// imaginary), so view_as_real and view_as_complex are views of one storage, and every complex
// op here is computed by the device's float ops on those pairs, in the order CPU's complex
// kernels use: a product is (ac - bd, ad + bc), each product rounded, no fused multiply-add,
// as CPU's vectorized complex multiply; a real operand takes part as (x, 0), as CPU promotes
// it. Copies (to and from the host, within the device, clone, casts), fill_ and zero_ move the
// pairs; sums, means, cat and flip reduce or move the pairs, matrix products are four real
// products of the parts (complex_bilinear), and division, exp and sgn follow CPU's vectorized
// formulas. Other ops the device implements refuse complex64 operands with an error naming
// what complex64 supports (kComplex64Supports); ops it has no kernel for (torch.fft) take them
// through the CPU fallback like any dtype. complex128 is refused everywhere.
#include "complex.h"

#include <ATen/ops/polar_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <torch/library.h>

namespace dft {

namespace {

// The (real, imaginary) float32 parts of an operand; a real one's imaginary part is zeros.
struct Parts {
  at::Tensor re, im;
};

Parts parts_of(const at::Tensor& t) {
  if (t.is_complex()) {
    auto p = pairs(t);
    return {p.select(-1, 0), p.select(-1, 1)};
  }
  auto re = t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
  return {re, at::zeros_like(re)};
}

// A complex64 tensor made of its parts (one stack: the pairs' storage is the result's).
at::Tensor from_parts(const at::Tensor& re, const at::Tensor& im) {
  return at::view_as_complex(at::stack({re, im}, -1));
}

const char* op_name(uint32_t op) {
  switch (op) {
    case DFUSE_BINARY_OP_ADD: return "add";
    case DFUSE_BINARY_OP_SUB: return "sub";
    case DFUSE_BINARY_OP_MUL: return "mul";
    case DFUSE_BINARY_OP_DIV: return "div";
    case DFUSE_BINARY_OP_EQ: return "eq";
    case DFUSE_BINARY_OP_NE: return "ne";
    default: return "this binary op";
  }
}

bool is_comparison(uint32_t op) { return op == DFUSE_BINARY_OP_EQ || op == DFUSE_BINARY_OP_NE; }

void check_complex64(uint32_t op, at::ScalarType result) {
  TORCH_CHECK(op == DFUSE_BINARY_OP_ADD || op == DFUSE_BINARY_OP_SUB ||
                  op == DFUSE_BINARY_OP_MUL || op == DFUSE_BINARY_OP_DIV || is_comparison(op),
              "tpu: ", op_name(op), " does not take complex tensors on tpu (",
              kComplex64Supports, "); compute it on the CPU");
  TORCH_CHECK(result == at::kComplexFloat, "tpu: ", op_name(op), " would give ", result,
              "; complex64 is the only complex dtype tpu holds");
}

Parts combine(uint32_t op, const Parts& a, const Parts& b) {
  switch (op) {
    case DFUSE_BINARY_OP_ADD: return {a.re + b.re, a.im + b.im};
    case DFUSE_BINARY_OP_SUB: return {a.re - b.re, a.im - b.im};
    case DFUSE_BINARY_OP_DIV: {
      // (a + bi) / (c + di) with both scaled by max(|c|, |d|) first, as CPU's vectorized
      // division scales them, so that c^2 + d^2 neither overflows nor underflows: ((ac + bd) +
      // (bc - ad) i) / (c^2 + d^2) of the scaled parts (within float32 rounding of CPU's,
      // which scales by an approximate reciprocal).
      // A zero divisor gives CPU's (a / 0, b / 0): infinities, NaN where a part is 0.
      auto scale = at::maximum(b.re.abs(), b.im.abs());
      auto ar = a.re / scale, ai = a.im / scale, br = b.re / scale, bi = b.im / scale;
      auto denom = br * br + bi * bi;
      auto zero = scale.eq(0);
      return {at::where(zero, ar, (ar * br + ai * bi) / denom),
              at::where(zero, ai, (ai * br - ar * bi) / denom)};
    }
    default: return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
  }
}

}  // namespace

at::Tensor pairs(const at::Tensor& t) {
  if (!t.is_conj()) return at::view_as_real(t);
  // A conjugate view: its stored pairs (t.conj() clears the bit) with the imaginary part
  // negated, as a new tensor (resolve_conj would clone, and clone comes back here).
  auto stored = at::view_as_real(t.conj());
  return at::stack({stored.select(-1, 0), stored.select(-1, 1).neg()}, -1);
}

// x == y (or !=) of complex values: both parts equal.
at::Tensor compare(uint32_t op, const Parts& a, const Parts& b) {
  auto equal = a.re.eq(b.re).logical_and(a.im.eq(b.im));
  return op == DFUSE_BINARY_OP_EQ ? equal : equal.logical_not();
}

at::Tensor complex_binary(uint32_t op, const at::Tensor& x, const at::Tensor& y) {
  check_complex64(op, at::result_type(x, y));
  if (is_comparison(op)) return compare(op, parts_of(x), parts_of(y));
  auto r = combine(op, parts_of(x), parts_of(y));
  return from_parts(r.re, r.im);
}

at::Tensor complex_binary(uint32_t op, const at::Tensor& x, const at::Scalar& y) {
  check_complex64(op, at::result_type(x, y));
  auto v = y.toComplexDouble();
  auto part = [&](double p) { return at::scalar_tensor(p, x.options().dtype(at::kFloat)); };
  if (is_comparison(op)) return compare(op, parts_of(x), {part(v.real()), part(v.imag())});
  auto r = combine(op, parts_of(x), {part(v.real()), part(v.imag())});
  return from_parts(r.re, r.im);
}

at::Tensor complex_where(const at::Tensor& c, const at::Tensor& x, const at::Tensor& y) {
  TORCH_CHECK(at::result_type(x, y) == at::kComplexFloat, "tpu: where would give ",
              at::result_type(x, y), "; complex64 is the only complex dtype tpu holds");
  auto a = parts_of(x), b = parts_of(y);
  return from_parts(at::where(c, a.re, b.re), at::where(c, a.im, b.im));
}

at::Tensor complex_bilinear(const at::Tensor& x, const at::Tensor& y,
                            at::Tensor (*product)(const at::Tensor&, const at::Tensor&)) {
  TORCH_CHECK(at::result_type(x, y) == at::kComplexFloat, "tpu: a product of ", x.scalar_type(),
              " and ", y.scalar_type(), " would not be complex64, the only complex dtype tpu "
              "holds; compute it on the CPU");
  auto a = parts_of(x), b = parts_of(y);
  return from_parts(product(a.re, b.re) - product(a.im, b.im),
                    product(a.re, b.im) + product(a.im, b.re));
}

namespace {

// |z|: sqrt(re * re + im * im), as CPU's vectorized complex abs (its scalar tail's hypot may
// differ in the last place); past 2^60 or below 2^-60 the squares overflow or underflow, so
// there the parts are scaled by the larger first, as hypot does (1e30 + 1e30i gave inf, and
// 1e-30 gave 0, so sgn and abs's gradient 0).
at::Tensor magnitude(const Parts& p) {
  auto naive = (p.re * p.re + p.im * p.im).sqrt();
  auto s = at::maximum(p.re.abs(), p.im.abs());
  auto extreme = s.gt(std::ldexp(1.0, 60)).logical_or(s.lt(std::ldexp(1.0, -60)));
  auto safe = at::where(s.eq(0), 1.0, s);
  auto a = p.re / safe, b = p.im / safe;
  auto scaled = at::where(s.isinf(), s, s * (a * a + b * b).sqrt());
  return at::where(extreme, scaled, naive);
}

}  // namespace

at::Tensor complex_unary(uint32_t op, const at::Tensor& x) {
  TORCH_CHECK(op != DFUSE_UNARY_OP_SIGN, "Unlike NumPy, torch.sign is not intended to support "
              "complex numbers. Please use torch.sgn instead.");
  TORCH_CHECK((op == DFUSE_UNARY_OP_NEG || op == DFUSE_UNARY_OP_ABS ||
               op == DFUSE_UNARY_OP_EXP) &&
                  x.scalar_type() == at::kComplexFloat,
              "tpu: this op does not take ", x.scalar_type(), " tensors on tpu (",
              kComplex64Supports, "); compute it on the CPU");
  auto p = parts_of(x);
  switch (op) {
    case DFUSE_UNARY_OP_ABS: return magnitude(p);
    // exp(a + bi) = exp(a) (cos b + i sin b), as CPU's vectorized complex exp; a zero b keeps
    // its zero imaginary part (exp(inf + 0i) is inf + 0i, not inf * 0).
    case DFUSE_UNARY_OP_EXP: {
      auto e = p.re.exp();
      return from_parts(e * p.im.cos(), at::where(p.im.eq(0), p.im, e * p.im.sin()));
    }
    default: return from_parts(-p.re, -p.im);
  }
}

at::Tensor complex_sgn(const at::Tensor& x) {
  auto p = parts_of(x);
  auto abs = magnitude(p);
  auto zero = abs.eq(0);
  return from_parts(at::where(zero, 0.0, p.re / abs), at::where(zero, 0.0, p.im / abs));
}

namespace {

// conj_physical: (re, -im).
at::Tensor conj_physical(const at::Tensor& self) {
  if (!self.is_complex()) return self.clone();
  auto p = parts_of(self);
  return from_parts(p.re.clone(), -p.im);
}

at::Tensor& conj_physical_(at::Tensor& self) {
  if (self.is_complex()) pairs(self).select(-1, 1).neg_();
  return self;
}

// polar(abs, angle) = (abs * cos(angle), abs * sin(angle)), as c10::polar.
at::Tensor polar_of(const at::Tensor& abs, const at::Tensor& angle) {
  TORCH_CHECK(abs.scalar_type() == at::kFloat && angle.scalar_type() == at::kFloat,
              "tpu: polar takes float32 abs and angle (complex64 is the only complex dtype tpu "
              "holds), got ", abs.scalar_type(), " and ", angle.scalar_type());
  return from_parts(abs * angle.cos(), abs * angle.sin());
}

// torch.complex(real, imag): the pairs themselves (broadcast together).
at::Tensor complex_of(const at::Tensor& real, const at::Tensor& imag) {
  TORCH_CHECK(real.scalar_type() == at::kFloat && imag.scalar_type() == at::kFloat,
              "tpu: complex takes float32 real and imag parts (complex64 is the only complex "
              "dtype tpu holds), got ", real.scalar_type(), " and ", imag.scalar_type());
  auto both = at::broadcast_tensors({real, imag});
  return from_parts(both[0], both[1]);
}

at::Tensor& resized_copy(const at::Tensor& r, at::Tensor& out) {
  at::native::resize_output(out, r.sizes());
  out.copy_(r);
  return out;
}

at::Tensor& polar_out(const at::Tensor& abs, const at::Tensor& angle, at::Tensor& out) {
  return resized_copy(polar_of(abs, angle), out);
}

at::Tensor& complex_out(const at::Tensor& real, const at::Tensor& imag, at::Tensor& out) {
  return resized_copy(complex_of(real, imag), out);
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // The views between a complex64 tensor and its pairs: PyTorch's own (metadata only), which
  // it registers per backend.
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("_conj_physical", TORCH_FN(dft::conj_physical));
  m.impl("conj_physical_", TORCH_FN(dft::conj_physical_));
  m.impl("polar", TORCH_FN(dft::polar_of));
  m.impl("polar.out", TORCH_FN(dft::polar_out));
  m.impl("complex", TORCH_FN(dft::complex_of));
  m.impl("complex.out", TORCH_FN(dft::complex_out));
}
