// Reductions: sum, mean, prod, amax/amin, argmax/argmin, max/min (full and per dim), var/std
// (and var_mean/std_mean), trace, and linalg_vector_norm (what clip_grad_norm_ and F.normalize
// call).
#include "common.h"
#include "complex.h"

#include <ATen/native/Resize.h>
#include <torch/library.h>

namespace dft {
namespace {

std::vector<int64_t> dims_of(at::OptionalIntArrayRef dim) {
  return dim ? dim->vec() : std::vector<int64_t>{};
}

// A sum or product asked for as bool (`x.prod(dtype=torch.bool)`) is CPU's any/all: the
// runtime's sums and products of bools are int64, so it folds in int64 and compares.
at::Tensor bool_fold(const at::Tensor& x, uint32_t op, std::vector<int64_t> dims, bool keepdim) {
  return reduce(cast(cast(x, at::kBool), at::kLong), op, dims, keepdim).ne(0);
}

// A complex64 sum or mean: of its (real, imaginary) float32 pairs, each part reduced over
// x's dims as a float32 tensor would be (CPU reduces complex values; the parts' sums are the
// same sums, within float32 rounding of their order). Fourier layers and spectral losses
// reduce complex tensors.
at::Tensor complex_reduce(const at::Tensor& x, at::OptionalIntArrayRef dim, bool keepdim,
                          uint32_t op) {
  if (x.dim() == 0) {
    if (dim) {
      for (auto d : *dim) c10::maybe_wrap_dim(d, 0);  // CPU's IndexError for a dim past it
    }
    return x.clone();  // the one value is its own sum and mean
  }
  std::vector<int64_t> dims;
  if (dim && !dim->empty()) {
    for (auto d : *dim) dims.push_back(c10::maybe_wrap_dim(d, x.dim()));
  } else {
    for (int64_t d = 0; d < x.dim(); ++d) dims.push_back(d);
  }
  return at::view_as_complex(reduce(pairs(x), op, dims, keepdim).contiguous());
}

at::Tensor sum(const at::Tensor& x, at::OptionalIntArrayRef dim, bool keepdim,
               std::optional<at::ScalarType> dtype) {
  if (x.scalar_type() == at::kComplexFloat && dtype.value_or(at::kComplexFloat) == at::kComplexFloat) {
    return complex_reduce(x, dim, keepdim, DFUSE_REDUCE_OP_SUM);
  }
  // PyTorch sums integers and bools as int64 unless told otherwise.
  at::ScalarType to = dtype.value_or(
      at::isIntegralType(x.scalar_type(), /*includeBool=*/true) ? at::kLong : x.scalar_type());
  if (to == at::kBool) return bool_fold(x, DFUSE_REDUCE_OP_SUM, dims_of(dim), keepdim);
  // The runtime folds narrower integers in int64: a dtype asked for (tensordot asks int32)
  // is the result's.
  return cast(reduce(cast(x, to), DFUSE_REDUCE_OP_SUM, dims_of(dim), keepdim), to);
}

// nansum: NaNs count as 0 (nanmean divides it by the count of the others).
at::Tensor nansum(const at::Tensor& x, at::OptionalIntArrayRef dim, bool keepdim,
                  std::optional<at::ScalarType> dtype) {
  auto zeroed = at::isFloatingType(x.scalar_type()) ? at::where(at::isnan(x), at::Scalar(0), x) : x;
  return dft::sum(zeroed, dim, keepdim, dtype);
}

// sum(out=): the result takes out's dtype unless one is given (logsumexp's CPU composite sums
// through here).
at::Tensor& sum_out(const at::Tensor& x, at::OptionalIntArrayRef dim, bool keepdim,
                    std::optional<at::ScalarType> dtype, at::Tensor& out) {
  auto r = dft::sum(x, dim, keepdim, dtype.value_or(out.scalar_type()));
  at::native::resize_output(out, r.sizes());
  run_into(DFUSE_OP_KIND_COPY, nullptr, Operands().t(r), out, "sum (out=)");
  return out;
}

at::Tensor mean(const at::Tensor& x, at::OptionalIntArrayRef dim, bool keepdim,
                std::optional<at::ScalarType> dtype) {
  at::ScalarType to = dtype.value_or(x.scalar_type());
  if (to == at::kComplexFloat && x.scalar_type() == at::kComplexFloat) {
    return complex_reduce(x, dim, keepdim, DFUSE_REDUCE_OP_MEAN);
  }
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(to) || at::isComplexType(to), "mean(): could not infer output dtype. Input dtype must be "
              "either a floating point or complex dtype. Got: ", to);
  return reduce(cast(x, to), DFUSE_REDUCE_OP_MEAN, dims_of(dim), keepdim);
}

at::Tensor prod_dim(const at::Tensor& x, int64_t dim, bool keepdim,
                    std::optional<at::ScalarType> dtype) {
  at::ScalarType to = dtype.value_or(
      at::isIntegralType(x.scalar_type(), true) ? at::kLong : x.scalar_type());
  if (to == at::kBool) return bool_fold(x, DFUSE_REDUCE_OP_PROD, {dim}, keepdim);
  return cast(reduce(cast(x, to), DFUSE_REDUCE_OP_PROD, {dim}, keepdim), to);
}

at::Tensor prod(const at::Tensor& x, std::optional<at::ScalarType> dtype) {
  at::ScalarType to = dtype.value_or(
      at::isIntegralType(x.scalar_type(), true) ? at::kLong : x.scalar_type());
  if (to == at::kBool) return bool_fold(x, DFUSE_REDUCE_OP_PROD, {}, false);
  return cast(reduce(cast(x, to), DFUSE_REDUCE_OP_PROD, {}, false), to);
}

void check_nonempty(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.numel() > 0, op, "(): Expected reduction dim to be specified for input.numel() "
              "== 0. Specify the reduction dim with the 'dim' argument.");
}

// The runtime's max/min/arg reductions take numbers; CPU orders bool as false < true, which
// is uint8's 0 < 1 (an attention mask's max()).
// CPU's checks with CPU's exceptions (the runtime's own would raise RuntimeError): a dim out
// of range, and a max/min over an empty dim, raise IndexError.
void check_ordered_dims(const at::Tensor& x, at::IntArrayRef dims, const char* name) {
  if (dims.empty()) return check_nonempty(x, name);
  for (auto d : dims) {
    int64_t w = at::maybe_wrap_dim(d, x.dim());
    // amax/amin name the dim as given, max/min/argmax/argmin as wrapped (CPU's messages).
    bool as_given = name[0] == 'a' && name[1] == 'm';
    TORCH_CHECK_INDEX(x.dim() == 0 || x.size(w) > 0, name, "(): Expected reduction dim ",
                      as_given ? d : w, " to have non-zero size.");
  }
}

at::Tensor ordered_reduce(const at::Tensor& x, uint32_t op, at::IntArrayRef dims, bool keepdim,
                          const char* name) {
  check_ordered_dims(x, dims, name);
  if (x.scalar_type() != at::kBool) return reduce(x, op, dims, keepdim);
  auto r = reduce(cast(x, at::kByte), op, dims, keepdim);
  return (op == DFUSE_REDUCE_OP_AMAX || op == DFUSE_REDUCE_OP_AMIN) ? cast(r, at::kBool) : r;
}

at::Tensor amax(const at::Tensor& x, at::IntArrayRef dim, bool keepdim) {
  return ordered_reduce(x, DFUSE_REDUCE_OP_AMAX, dim, keepdim, "amax");
}

at::Tensor amin(const at::Tensor& x, at::IntArrayRef dim, bool keepdim) {
  return ordered_reduce(x, DFUSE_REDUCE_OP_AMIN, dim, keepdim, "amin");
}

// aminmax: both at once (two reductions; defer fuses them over one read of x).
std::tuple<at::Tensor, at::Tensor> aminmax(const at::Tensor& x, std::optional<int64_t> dim,
                                           bool keepdim) {
  std::vector<int64_t> dims;
  if (dim) dims.push_back(*dim);
  TORCH_CHECK(dim || x.numel() > 0, "aminmax(): cannot compute aminmax over an empty dimension "
              "as the operation has no identity.");
  // Without a dim, keepdim still keeps every dim as a 1 (CPU's [1, 1, 1] for a 3-d input).
  return {dft::amin(x, dims, keepdim), dft::amax(x, dims, keepdim)};
}

at::Tensor argmax(const at::Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  // CPU's message, as an IndexError (for max() and amax() it is a RuntimeError).
  TORCH_CHECK_INDEX(dim || x.numel() > 0, "argmax(): Expected reduction dim to be specified for "
                    "input.numel() == 0.");
  TORCH_CHECK_NOT_IMPLEMENTED(x.scalar_type() != at::kBool,
                              "argmax(): does not support bool input");
  return ordered_reduce(x, DFUSE_REDUCE_OP_ARGMAX,
                        dim ? std::vector<int64_t>{*dim} : std::vector<int64_t>{},
                        keepdim, "argmax");
}

at::Tensor argmin(const at::Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  // CPU's message, as an IndexError (for max() and amax() it is a RuntimeError).
  TORCH_CHECK_INDEX(dim || x.numel() > 0, "argmin(): Expected reduction dim to be specified for "
                    "input.numel() == 0.");
  TORCH_CHECK_NOT_IMPLEMENTED(x.scalar_type() != at::kBool,
                              "argmin(): does not support bool input");
  return ordered_reduce(x, DFUSE_REDUCE_OP_ARGMIN,
                        dim ? std::vector<int64_t>{*dim} : std::vector<int64_t>{},
                        keepdim, "argmin");
}

at::Tensor max_all(const at::Tensor& x) {
  check_nonempty(x, "max");
  return ordered_reduce(x, DFUSE_REDUCE_OP_AMAX, {}, false, "max");
}

at::Tensor min_all(const at::Tensor& x) {
  check_nonempty(x, "min");
  return ordered_reduce(x, DFUSE_REDUCE_OP_AMIN, {}, false, "min");
}

std::tuple<at::Tensor, at::Tensor> max_dim(const at::Tensor& x, int64_t dim, bool keepdim) {
  return {ordered_reduce(x, DFUSE_REDUCE_OP_AMAX, {dim}, keepdim, "max"),
          ordered_reduce(x, DFUSE_REDUCE_OP_ARGMAX, {dim}, keepdim, "max")};
}

std::tuple<at::Tensor, at::Tensor> min_dim(const at::Tensor& x, int64_t dim, bool keepdim) {
  return {ordered_reduce(x, DFUSE_REDUCE_OP_AMIN, {dim}, keepdim, "min"),
          ordered_reduce(x, DFUSE_REDUCE_OP_ARGMIN, {dim}, keepdim, "min")};
}

// var = sum((x - mean)^2) / (n - correction), the two-pass formula PyTorch's CPU kernel matches;
// returned with the mean it subtracted (in var's shape), which var_mean and std_mean return too.
// `op` names the caller in CPU's warning when no degree of freedom is left.
std::pair<at::Tensor, at::Tensor> var_and_mean(const at::Tensor& x, at::OptionalIntArrayRef dim,
                                               const std::optional<at::Scalar>& correction,
                                               bool keepdim, const char* op) {
  // CPU's error and exception class (NotImplementedError) for an integer input.
  if (!at::isFloatingType(x.scalar_type())) at::var(at::empty({0}, x.options().device(at::kCPU)));
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "tpu: var/std need a floating point input, got ",
              x.scalar_type());
  auto dims = dims_of(dim);
  int64_t n = 1;
  if (dims.empty()) {
    n = x.numel();
  } else {
    // A 0-dim tensor's dim 0 (or -1) is the tensor itself: one element per result.
    for (auto d : dims) n *= x.dim() == 0 ? 1 : x.size(d);
  }
  double c = correction ? correction->toDouble() : 1.0;
  // PyTorch's warn_invalid_degrees_of_freedom: elements per result (0 for an empty input).
  if (double(x.numel() == 0 ? 0 : n) - c <= 0) {
    TORCH_WARN(op, "(): degrees of freedom is <= 0. Correction should be strictly less than the "
               "reduction factor (input numel divided by output numel).");
  }
  auto m = reduce(x, DFUSE_REDUCE_OP_MEAN, dims, true);
  auto d = x - m;
  auto s = reduce(d * d, DFUSE_REDUCE_OP_SUM, dims, keepdim);
  auto var = s / std::max(double(n) - c, 0.0);
  return {var, keepdim ? m : m.view(var.sizes())};
}

at::Tensor var_corr(const at::Tensor& x, at::OptionalIntArrayRef dim,
                    const std::optional<at::Scalar>& correction, bool keepdim) {
  return var_and_mean(x, dim, correction, keepdim, "var").first;
}

at::Tensor std_(const at::Tensor& x, at::OptionalIntArrayRef dim,
                const std::optional<at::Scalar>& correction, bool keepdim) {
  return unary(var_and_mean(x, dim, correction, keepdim, "std").first, DFUSE_UNARY_OP_SQRT);
}

// var_mean / std_mean: one mean serves both results (autograd's formula combines their
// gradients).
std::tuple<at::Tensor, at::Tensor> var_mean(const at::Tensor& x, at::OptionalIntArrayRef dim,
                                            const std::optional<at::Scalar>& correction,
                                            bool keepdim) {
  auto [var, mean] = var_and_mean(x, dim, correction, keepdim, "var_mean");
  return {var, mean};
}
std::tuple<at::Tensor, at::Tensor> std_mean(const at::Tensor& x, at::OptionalIntArrayRef dim,
                                            const std::optional<at::Scalar>& correction,
                                            bool keepdim) {
  auto [var, mean] = var_and_mean(x, dim, correction, keepdim, "std_mean");
  return {unary(var, DFUSE_UNARY_OP_SQRT), mean};
}

// trace: the sum of the main diagonal (a view), integers summed as int64 like sum.
at::Tensor trace(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "trace: expected a matrix, but got tensor with dim ", x.dim());
  return dft::sum(x.diagonal(), std::nullopt, false, std::nullopt);
}

// ||x||_p over dims: sqrt(sum x^2), sum |x|, max |x| (inf), min |x| (-inf), the count of
// non-zeros (0), else (sum |x|^p)^(1/p).
// The p-norm of x over dims, in x's own dtype.
at::Tensor vector_norm_of(const at::Tensor& x, double p, const std::vector<int64_t>& dims,
                          bool keepdim) {
  if (p == 2.0) return at::sqrt(reduce(x * x, DFUSE_REDUCE_OP_SUM, dims, keepdim));
  if (p == 0.0) {
    return reduce(cast(x.ne(0), x.scalar_type()), DFUSE_REDUCE_OP_SUM, dims, keepdim);
  }
  auto a = at::abs(x);
  if (std::isinf(p)) {
    TORCH_CHECK(x.numel() > 0 || !dims.empty(), "linalg.vector_norm cannot compute the ", p,
                " norm on an empty tensor because the operation does not have an identity");
    return reduce(a, p > 0 ? DFUSE_REDUCE_OP_AMAX : DFUSE_REDUCE_OP_AMIN, dims, keepdim);
  }
  if (p == 1.0) return reduce(a, DFUSE_REDUCE_OP_SUM, dims, keepdim);
  return at::pow(reduce(at::pow(a, p), DFUSE_REDUCE_OP_SUM, dims, keepdim), 1.0 / p);
}

at::Tensor vector_norm(const at::Tensor& x0, const at::Scalar& ord, at::OptionalIntArrayRef dim,
                       bool keepdim, std::optional<at::ScalarType> dtype) {
  // CPU's checks on the input's own dtype, before any cast to `dtype`: an integer input is
  // refused even with a float dtype, and `dtype` may not narrow it (float32 to float16).
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(x0.scalar_type()),
              "linalg.vector_norm: Expected a floating point "
              "or complex tensor as input. Got ", x0.scalar_type());
  TORCH_CHECK(!dtype || at::promoteTypes(x0.scalar_type(), *dtype) == *dtype,
              "linalg.vector_norm: the dtype of the input (", x0.scalar_type(),
              ") should be convertible without narrowing to the specified dtype (", *dtype, ")");
  auto x = dtype ? cast(x0, *dtype) : x0;
  auto dims = dims_of(dim);
  double p = ord.toDouble();
  // Half inputs in float32, rounded once, as CPU's norm kernel: |x|^p rounded to bfloat16
  // before the sum put ord=6 of 8.5 at 8.5625 (and clip_grad_norm_'s squares lost bits).
  return rounded_once(x, [&](const at::Tensor& x) { return vector_norm_of(x, p, dims, keepdim); });
}

// The legacy norm (torch.norm's C++ form, which F.pairwise_distance and triplet_margin_loss
// call): linalg_vector_norm with p defaulting to 2.
at::Tensor norm_dim(const at::Tensor& x, const std::optional<at::Scalar>& p, at::IntArrayRef dim,
                    bool keepdim) {
  return vector_norm(x, p.value_or(2.0), dim, keepdim, std::nullopt);
}

at::Tensor norm_all(const at::Tensor& x, const at::Scalar& p) {
  return vector_norm(x, p, std::nullopt, false, std::nullopt);
}

// renorm: each slice along dim whose p-norm (over the other dims) is above maxnorm, scaled
// by maxnorm / (norm + 1e-7), as CPU's kernel; half types take their norms in float32 and
// round the factor to their own type before the product, as there. It ran on the CPU
// fallback.
at::Tensor tpu_renorm(const at::Tensor& self, const at::Scalar& p, int64_t dim,
                      const at::Scalar& maxnorm) {
  TORCH_CHECK(p.toDouble() > 0, "renorm: non-positive-norm not supported");
  TORCH_CHECK(maxnorm.toDouble() >= 0, "renorm: expected maxnorm to be >= 0 but got ",
              maxnorm.toDouble());
  TORCH_CHECK(self.dim() > 1, "renorm: input needs at least 2 dimensions, got ", self.dim(),
              " dimensions");
  dim = c10::maybe_wrap_dim(dim, self.dim());
  std::vector<int64_t> others;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (d != dim) others.push_back(d);
  }
  // A complex slice's norm is its magnitudes' (the runtime's norms take real tensors); the
  // factor is real and scales both parts.
  const auto dtype = self.is_complex() ? c10::toRealValueType(self.scalar_type())
                                       : self.scalar_type();
  const bool half = dtype == at::kHalf || dtype == at::kBFloat16;
  auto norm = vector_norm(self.is_complex() ? self.abs() : self, p, others, /*keepdim=*/true,
                          half ? std::optional<at::ScalarType>(at::kFloat) : std::nullopt);
  const double m = maxnorm.toDouble();
  auto factor = at::where(norm.gt(m), m / (norm + 1e-7), at::ones_like(norm));
  return self * factor.to(dtype);
}

at::Tensor& renorm_out(const at::Tensor& self, const at::Scalar& p, int64_t dim,
                       const at::Scalar& maxnorm, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "Expected out tensor to have dtype ",
              self.dtype(), ", but got ", out.dtype(), " instead");
  auto r = tpu_renorm(self, p, dim, maxnorm);
  at::native::resize_output(out, r.sizes());
  return out.copy_(r);
}

at::Tensor& renorm_(at::Tensor& self, const at::Scalar& p, int64_t dim,
                    const at::Scalar& maxnorm) {
  return self.copy_(tpu_renorm(self, p, dim, maxnorm));
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("renorm", TORCH_FN(dft::tpu_renorm));
  m.impl("renorm_", TORCH_FN(dft::renorm_));
  m.impl("renorm.out", TORCH_FN(dft::renorm_out));
  m.impl("sum.dim_IntList", TORCH_FN(dft::sum));
  m.impl("nansum", TORCH_FN(dft::nansum));
  m.impl("sum.IntList_out", TORCH_FN(dft::sum_out));
  m.impl("mean.dim", TORCH_FN(dft::mean));
  m.impl("prod.dim_int", TORCH_FN(dft::prod_dim));
  m.impl("prod", TORCH_FN(dft::prod));
  m.impl("amax", TORCH_FN(dft::amax));
  m.impl("amin", TORCH_FN(dft::amin));
  m.impl("aminmax", TORCH_FN(dft::aminmax));
  m.impl("argmax", TORCH_FN(dft::argmax));
  m.impl("argmin", TORCH_FN(dft::argmin));
  m.impl("max", TORCH_FN(dft::max_all));
  m.impl("min", TORCH_FN(dft::min_all));
  m.impl("max.dim", DFT_GROUPED(dft::max_dim));
  m.impl("min.dim", TORCH_FN(dft::min_dim));
  m.impl("var.correction", DFT_GROUPED(dft::var_corr));
  m.impl("std.correction", DFT_GROUPED(dft::std_));
  m.impl("var_mean.correction", DFT_GROUPED(dft::var_mean));
  m.impl("std_mean.correction", DFT_GROUPED(dft::std_mean));
  m.impl("trace", DFT_GROUPED(dft::trace));
  m.impl("linalg_vector_norm", DFT_GROUPED(dft::vector_norm));
  m.impl("norm.ScalarOpt_dim", DFT_GROUPED(dft::norm_dim));
  m.impl("norm.Scalar", DFT_GROUPED(dft::norm_all));
}
