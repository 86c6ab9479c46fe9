// Special functions with no runtime op of their own: erfinv, erfc, lgamma, digamma, polygamma.
// Each is a fixed sequence of the device's elementwise ops (a polynomial, series or continued
// fraction plus a few `where`s for the domain's edges), so it runs on the device and fuses
// with its neighbours in defer mode.
// Their backwards are PyTorch's formulas over these same ops (erfinv: exp(erfinv^2); lgamma:
// digamma; digamma and polygamma: polygamma(n + 1)).
//
// Accuracy: a few float ulps against PyTorch's CPU kernels; for double about 1e-13 relative
// (the series are cut where their next term is that small at the point they are used from).
#include "common.h"

#include <ATen/native/Resize.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

namespace dft {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Arguments below this are first shifted up by it with the recurrence, so the asymptotic
// series below only ever sees z >= kShift.
constexpr int kShift = 10;

// Bernoulli numbers B_2 .. B_14, the coefficients of the asymptotic series.
constexpr double kBernoulli[] = {1.0 / 6,   -1.0 / 30,    1.0 / 42,  -1.0 / 30,
                                 5.0 / 66,  -691.0 / 2730, 7.0 / 6};

at::Tensor poly(const at::Tensor& x, std::initializer_list<double> coeffs_high_first) {
  at::Tensor p;
  for (double c : coeffs_high_first) p = p.defined() ? p * x + c : at::full_like(x, c);
  return p;
}

// The dtype a function's result has (integers give the default float dtype) and the one it is
// computed in (half and bfloat16 in float, rounded once at the end, as on CPU).
template <typename Math>
at::Tensor in_opmath(const at::Tensor& self, Math math) {
  auto rt = float_dtype(self);
  auto ct = is_reduced_float(rt) ? at::kFloat : rt;
  auto r = math(self.scalar_type() == ct ? self : self.to(ct));
  return r.scalar_type() == rt ? r : r.to(rt);
}

// `math` on x in float64 whatever x's float dtype, rounded once to it: for the functions whose
// float32 form would lose digits (erfc's cancellation near 1 - erf, erfinv's Newton steps).
template <typename Math>
at::Tensor in_float64(const at::Tensor& self, Math math) {
  return cast(math(cast(self, at::kDouble)), float_dtype(self));
}

// Giles' single-precision approximation ("Approximating the erfinv function", 2010) refined by
// two Newton steps on erf, which bring float and double to their last few ulps.
at::Tensor erfinv_math(const at::Tensor& x) {
  auto w = -at::log((1 - x) * (1 + x));
  auto central = poly(w - 2.5, {2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                                0.00021858087, -0.00125372503, -0.00417768164, 0.246640727,
                                1.50140941});
  auto tail = poly(at::sqrt(w) - 3.0, {-0.000200214257, 0.000100950558, 0.00134934322,
                                       -0.00367342844, 0.00573950773, -0.0076224613,
                                       0.00943887047, 1.00167406, 2.83297682});
  auto y = at::where(w.lt(5.0), central, tail) * x;
  for (int step = 0; step < 2; ++step) {
    y = y - (at::erf(y) - x) / (2.0 / std::sqrt(kPi) * at::exp(-y * y));
  }
  auto a = x.abs();
  y = at::where(a.eq(1.0), x * kInf, y);
  return at::where(a.gt(1.0), at::Scalar(kNaN), y);
}

// The recurrence's shift: z = x + kShift where x < kShift (else x), and the terms
// f(x), f(x + 1), ..., f(x + kShift - 1) summed where shifted (else 0).
template <typename Term>
std::pair<at::Tensor, at::Tensor> shifted(const at::Tensor& x, Term term, int shift = kShift) {
  auto small = x.lt(double(shift));
  at::Tensor sum = term(x);
  for (int k = 1; k < shift; ++k) sum = sum + term(x + double(k));
  return {at::where(small, x + double(shift), x),
          at::where(small, sum, at::zeros({}, x.options()))};
}

// lgamma for x >= 0.5: Stirling's series at z >= kShift less log(x (x + 1) ... (x + kShift - 1)).
at::Tensor lgamma_right(const at::Tensor& x) {
  auto [z, log_prod] = shifted(x, [](const at::Tensor& t) { return at::log(t); });
  auto r = at::reciprocal(z), r2 = r * r;
  at::Tensor series = at::zeros_like(z);
  for (int k = 6; k >= 1; --k) {
    // B_2k / (2k (2k - 1) z^(2k - 1)), summed by Horner in 1/z^2 from the smallest term.
    series = (series + kBernoulli[k - 1] / (2.0 * k * (2.0 * k - 1))) * (k > 1 ? r2 : r);
  }
  return (z - 0.5) * at::log(z) - z + 0.5 * std::log(2 * kPi) + series - log_prod;
}

// The distance from x to its nearest integer, so sin(pi x) and tan(pi x) lose no accuracy for
// large |x| (both have period 1 in |value|).
at::Tensor frac_to_nearest(const at::Tensor& x) { return x - at::round(x); }

at::Tensor nonpositive_int(const at::Tensor& x) { return x.le(0).logical_and(x.eq(at::floor(x))); }

// lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x) below 0.5; inf at the poles and at +-inf.
at::Tensor lgamma_math(const at::Tensor& x) {
  auto left = x.lt(0.5);
  auto right = lgamma_right(at::where(left, 1 - x, x));
  auto reflected = std::log(kPi) - at::log(at::sin(kPi * frac_to_nearest(x)).abs()) - right;
  auto r = at::where(left, reflected, right);
  // Exactly 0 at 1 and 2 (0! and 1!), as CPU's lgamma: the series leaves ~4e-15 there.
  r = at::where(x.eq(1).logical_or(x.eq(2)), at::Scalar(0.0), r);
  return at::where(nonpositive_int(x).logical_or(x.isinf()), at::Scalar(kInf), r);
}

// polygamma(n, x) for n >= 1 and digamma (n = 0) at x >= kShift - 1 after the shift:
// the asymptotic series of psi^(n), in PyTorch's sign convention.
at::Tensor psi_series(int64_t n, const at::Tensor& z) {
  auto r = at::reciprocal(z), r2 = r * r;
  at::Tensor series = at::zeros_like(z);
  // sum_k B_2k (2k + n - 1)! / (2k)! / z^(2k + n), Horner in 1/z^2 from the smallest term.
  for (int k = 7; k >= 1; --k) {
    // B_2k (2k + n - 1)! / (2k)!, which for digamma is B_2k / 2k.
    double c = kBernoulli[k - 1];
    if (n == 0) c /= 2 * k;
    for (int j = 2 * k + int(n) - 1; j > 2 * k; --j) c *= j;
    series = (series + c) * r2;
  }
  if (n == 0) return at::log(z) - 0.5 * r - series;
  double fact = std::tgamma(double(n));  // (n - 1)!
  auto zn = at::pow(r, double(n));
  auto v = zn * (fact + 0.5 * fact * double(n) * r + series);
  return n % 2 == 1 ? v : -v;
}

// psi^(n)(x) = psi^(n)(x + shift) + (-1)^(n+1) n! sum_k 1 / (x + k)^(n+1) (digamma: less
// sum_k 1 / (x + k)). The series is accurate at z >= kShift: x >= 0 with the default shift.
at::Tensor psi_shifted(int64_t n, const at::Tensor& x, int shift = kShift) {
  double fact = std::tgamma(double(n) + 1);
  auto [z, sum] = shifted(
      x,
      [&](const at::Tensor& t) {
        return n == 0 ? at::reciprocal(t) : at::pow(at::reciprocal(t), double(n + 1));
      },
      shift);
  auto series = psi_series(n, z);
  if (n == 0) return series - sum;
  return series + (n % 2 == 1 ? fact : -fact) * sum;
}

// digamma(x) = digamma(1 - x) - pi / tan(pi x) below 0.5; -inf at 0 (+inf at -0, as CPU's
// copysign), NaN at the negative integers.
at::Tensor digamma_math(const at::Tensor& x) {
  auto left = x.lt(0.5);
  auto right = psi_shifted(0, at::where(left, 1 - x, x));
  auto r = at::where(left, right - kPi / at::tan(kPi * frac_to_nearest(x)), right);
  r = at::where(nonpositive_int(x), at::Scalar(kNaN), r);
  auto zero = at::where(at::reciprocal(x).lt(0), at::Scalar(kInf), at::Scalar(-kInf));
  return at::where(x.eq(0), zero.to(r.scalar_type()), r);
}

// trigamma (n = 1) reflects below 0.5 as CPU does: pi^2 / sin^2(pi x) - trigamma(1 - x); for
// n >= 2 CPU sums the Hurwitz zeta series at x itself (no reflection), which a shift of
// 2 kShift does accurately for x > -kShift (a shift of kShift left z = x + 10 near 1 for
// x near -9, and the series 0.4% off).
// At the poles and infinities the values are CPU's: for n >= 2 its zeta(n + 1, x) is inf at
// 0, the negative integers and -inf (so +-n! inf) and NaN at +inf; trigamma's reflection
// takes sin(pi x), NaN at -inf.
at::Tensor polygamma_math(int64_t n, const at::Tensor& x) {
  if (n == 0) return digamma_math(x);
  if (n >= 2) {
    auto r = psi_shifted(n, x, 2 * kShift);
    auto pole = nonpositive_int(x).logical_or(x.eq(-kInf));
    r = at::where(pole, at::Scalar(n % 2 == 1 ? kInf : -kInf), r);
    return at::where(x.eq(kInf), at::Scalar(kNaN), r);
  }
  auto left = x.lt(0.5);
  auto right = psi_shifted(1, at::where(left, 1 - x, x));
  auto s = at::sin(kPi * frac_to_nearest(x));
  auto r = at::where(left, kPi * kPi / (s * s) - right, right);
  r = at::where(nonpositive_int(x), at::Scalar(kInf), r);
  return at::where(x.eq(-kInf), at::Scalar(kNaN), r);
}

// erfc(x) in float64: 1 - erf(x) below 1.5 (erfc >= 0.034 there, so the subtraction keeps
// the digits), above it Laplace's continued fraction exp(-x^2) / sqrt(pi) / (x + 1/2 / (x +
// 1 / (x + 3/2 / ...))), 100 terms: within an ulp of float64 for x >= 1.5, where 1 - erf loses
// digits and then everything (erfc(10) = 2e-45). Measured against CPU over [-6, 9]: float64
// within 2e-14 relative, float32 within one ulp (CPU's erfcf is itself up to ~1 ulp off).
at::Tensor erfc_math(const at::Tensor& x) {
  constexpr double kTail = 1.5;
  auto tail_x = at::where(x.ge(kTail), x, at::full({}, kTail, x.options()));
  auto k = at::zeros_like(tail_x);
  for (int n = 100; n >= 1; --n) k = (n / 2.0) / (tail_x + k);
  auto tail = at::exp(-tail_x * tail_x) * (1.0 / std::sqrt(kPi)) / (tail_x + k);
  return at::where(x.ge(kTail), tail, 1 - at::erf(x));
}

at::Tensor tpu_erfc(const at::Tensor& self) { return in_float64(self, erfc_math); }

// In float64 too: near +-1 a Newton step on erf multiplies erf's error by 1 / erf'(y) (~1.4e5
// at erfinv(0.999999) = 3.46), so in float32 it would hand back erf's last ulp (an erf one ulp
// off there moved erfinv(0.999999) by 8e-3).
at::Tensor tpu_erfinv(const at::Tensor& self) { return in_float64(self, erfinv_math); }
// In float64 too: near its zeros (1 and 2) lgamma is Stirling's series less the log of the
// shift's product, two numbers near 10 whose float32 difference kept ~1e-6 of error where the
// value is 0 (a Poisson log-likelihood's lgamma(k + 1) summed over a million counts).
at::Tensor tpu_lgamma(const at::Tensor& self) { return in_float64(self, lgamma_math); }
at::Tensor tpu_digamma(const at::Tensor& self) { return in_opmath(self, digamma_math); }

at::Tensor tpu_polygamma(int64_t n, const at::Tensor& self) {
  TORCH_CHECK(n >= 0, "polygamma(n, x): n must be non-negative, got ", n);
  return in_opmath(self, [n](const at::Tensor& x) { return polygamma_math(n, x); });
}

// In-place and out= forms write the functional result through the destination's handle; an
// out= of another shape is resized as PyTorch resizes it (warning when it had elements).
at::Tensor& into(const at::Tensor& value, at::Tensor& out) {
  TORCH_CHECK(at::canCast(value.scalar_type(), out.scalar_type()), "result type ",
              value.scalar_type(), " can't be cast to the desired output type ",
              out.scalar_type());
  at::native::resize_output(out, value.sizes());
  run_into(DFUSE_OP_KIND_COPY, nullptr, Operands().t(cast(value, out.scalar_type())), out,
           "special function result");
  return out;
}

template <at::Tensor (*F)(const at::Tensor&)>
at::Tensor& in_place(at::Tensor& self) {
  return into(F(self), self);
}

template <at::Tensor (*F)(const at::Tensor&)>
at::Tensor& out_form(const at::Tensor& self, at::Tensor& out) {
  return into(F(self), out);
}

at::Tensor& polygamma_out(int64_t n, const at::Tensor& self, at::Tensor& out) {
  return into(tpu_polygamma(n, self), out);
}

at::Tensor& polygamma_(at::Tensor& self, int64_t n) { return into(tpu_polygamma(n, self), self); }

}  // namespace
}  // namespace dft

#define DF_SPECIAL(name)                                              \
  m.impl(#name, TORCH_FN(dft::tpu_##name));                           \
  m.impl(#name "_", TORCH_FN(dft::in_place<dft::tpu_##name>));        \
  m.impl(#name ".out", TORCH_FN(dft::out_form<dft::tpu_##name>));

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  DF_SPECIAL(erfinv)
  // One fused program per call in every mode: the continued fraction is ~200 ops.
  m.impl("erfc", DFT_GROUPED(dft::tpu_erfc));
  m.impl("erfc_", TORCH_FN(dft::in_place<dft::tpu_erfc>));
  m.impl("erfc.out", TORCH_FN(dft::out_form<dft::tpu_erfc>));
  DF_SPECIAL(lgamma)
  DF_SPECIAL(digamma)
  m.impl("polygamma", DFT_GROUPED(dft::tpu_polygamma));
  m.impl("polygamma.out", TORCH_FN(dft::polygamma_out));
  m.impl("polygamma_", TORCH_FN(dft::polygamma_));
}
