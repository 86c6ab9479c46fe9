// softmax / log_softmax and layer_norm with their backward formulas, as recorded reductions and
// elementwise ops (defer mode turns each into a row kernel).
#include "common.h"

#include <torch/library.h>

namespace dft {
namespace {

// float16 and bfloat16 are computed in float32 (opmath) and rounded once at the end, as
// PyTorch's CPU kernels do: rounding every op in the half type put softmax up to 6 ulps, and
// layer_norm's outputs near 0 hundreds of ulps, off CPU's.

// The result of a half input in float32 (half_to_float) or rounded back to the input's dtype.
at::Tensor softmax_result(const at::Tensor& r, const at::Tensor& x0, bool half_to_float) {
  return half_to_float ? r : cast(r, x0.scalar_type());
}

// An empty input (its reduced dim may be the empty one, where amax has nothing to take the
// max of) gives an empty result, as on CPU.
at::Tensor empty_softmax(const at::Tensor& x0, bool half_to_float) {
  return at::empty(x0.sizes(), x0.options().dtype(half_to_float ? at::kFloat : x0.scalar_type()));
}

// Over a dim that is not innermost (segmentation's classes in [N, C, H, W], a channel
// softmax), a row of the reduction is C elements a plane apart: the row kernel loaded them one
// lane at a time and ran each short row's sweeps on its own (log_softmax over dim 1 of [8, 21,
// 128, 128]: 18 ms, CPU eager 3). CPU's kernel instead walks the classes with vectors across
// neighbouring positions. So does this path: the dim's slices (each a contiguous plane) are
// combined by elementwise ops, class after class (CPU's order), which the planner fuses into
// loops over the positions. Measured against the row kernel (one thread, [16, C, P]):
// rows of 64+ elements are gathered into contiguous rows first (the backend's columns.rs) and
// stay faster there; shorter rows are faster sliced once a plane holds 512+ positions (its
// rows' elements then sit in other pages: C 32 by 1,024 positions, fwd+bwd 6.6 -> 2.6 ms),
// and at up to 8 elements already from 16 positions (C 2 by 256: 0.64 -> 0.29; C 8 by 64
// even). Smaller planes keep their rows' lines in cache (C 48 by 256: 0.63 sliced would be
// 1.06; C 16 by 64: 0.41, sliced 0.55-0.77).
constexpr int64_t kMaxSlicedDim = 63;
constexpr int64_t kMinSlicedPlane = 512;
constexpr int64_t kMaxShortDim = 8;
constexpr int64_t kMinShortPlane = 16;

// Whether a softmax-family op over `dim` of x runs on the dim's slices (above).
bool sliced(const at::Tensor& x, int64_t dim) {
  if (dim >= x.dim() - 1) return false;  // the last dim, or a 0-d tensor's
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  int64_t n = x.size(dim);
  bool planes = inner >= kMinSlicedPlane || (n <= kMaxShortDim && inner >= kMinShortPlane);
  return n <= kMaxSlicedDim && planes && x.stride(-1) == 1 && x.stride(dim) >= inner;
}

// f(slice 0) combined with f(slice c) by `combine`, class after class.
template <typename F, typename G>
at::Tensor fold_slices(int64_t n, F f, G combine) {
  auto acc = f(0);
  for (int64_t c = 1; c < n; ++c) acc = combine(acc, f(c));
  return acc;
}

// The largest element along `dim` of every position, NaN if any is (amax's rule), kept as a
// dim of size 1.
at::Tensor sliced_max(const at::Tensor& x, int64_t dim) {
  return fold_slices(x.size(dim), [&](int64_t c) { return x.select(dim, c); },
                     [](const at::Tensor& a, const at::Tensor& b) { return at::maximum(a, b); })
      .unsqueeze(dim);
}

// The sum along `dim` of f(slice c), in order, kept as a dim of size 1.
template <typename F>
at::Tensor sliced_sum(const at::Tensor& x, int64_t dim, F f) {
  return fold_slices(x.size(dim), f,
                     [](const at::Tensor& a, const at::Tensor& b) { return a + b; })
      .unsqueeze(dim);
}

// CPU's NotImplementedError for an integer or bool input (its kernels' dtype dispatch, whose
// name says which kernel): the same call on an uninitialized host tensor of that shape raises
// it. Only such an input pays for that tensor.
template <typename F>
void refuse_non_float(const at::Tensor& x0, F cpu_call) {
  if (at::isFloatingType(x0.scalar_type())) return;
  cpu_call(at::empty(x0.sizes(), x0.options().device(at::kCPU)));
}

at::Tensor softmax(const at::Tensor& x0, int64_t dim, bool half_to_float) {
  if (x0.numel() == 0) return empty_softmax(x0, half_to_float);
  refuse_non_float(x0, [&](const at::Tensor& h) { at::_softmax(h, dim, half_to_float); });
  auto x = opmath(x0);
  dim = at::maybe_wrap_dim(dim, std::max<int64_t>(x.dim(), 1));
  if (sliced(x, dim)) {
    auto m = sliced_max(x, dim);
    auto m0 = m.squeeze(dim);
    auto sum = sliced_sum(x, dim, [&](int64_t c) { return at::exp(x.select(dim, c) - m0); });
    // The exponentials again rather than kept: one pass over the input instead of a write and
    // a read of a tensor of its size. The same values (exp is exact to itself).
    return softmax_result(at::exp(x - m) * at::reciprocal(sum), x0, half_to_float);
  }
  auto m = reduce(x, DFUSE_REDUCE_OP_AMAX, {dim}, true);
  auto e = at::exp(x - m);
  // e * (1 / sum), as CPU's kernel computes it (_vec_softmax_lastdim), not e / sum: one
  // division per row, not per element (a divide costs several multiplies' time).
  auto r = at::reciprocal(reduce(e, DFUSE_REDUCE_OP_SUM, {dim}, true));
  return softmax_result(e * r, x0, half_to_float);
}

at::Tensor log_softmax(const at::Tensor& x0, int64_t dim, bool half_to_float) {
  if (x0.numel() == 0) return empty_softmax(x0, half_to_float);
  refuse_non_float(x0, [&](const at::Tensor& h) { at::_log_softmax(h, dim, half_to_float); });
  auto x = opmath(x0);
  dim = at::maybe_wrap_dim(dim, std::max<int64_t>(x.dim(), 1));
  if (sliced(x, dim)) {
    auto m = sliced_max(x, dim);
    auto m0 = m.squeeze(dim);
    auto sum = sliced_sum(x, dim, [&](int64_t c) { return at::exp(x.select(dim, c) - m0); });
    return softmax_result((x - m) - at::log(sum), x0, half_to_float);
  }
  auto m = reduce(x, DFUSE_REDUCE_OP_AMAX, {dim}, true);
  auto shifted = x - m;
  auto r = shifted - at::log(reduce(at::exp(shifted), DFUSE_REDUCE_OP_SUM, {dim}, true));
  return softmax_result(r, x0, half_to_float);
}

at::Tensor softmax_backward(const at::Tensor& grad0, const at::Tensor& out0, int64_t dim,
                            at::ScalarType input_dtype) {
  auto grad = opmath(grad0), out = opmath(out0);
  dim = at::maybe_wrap_dim(dim, std::max<int64_t>(grad.dim(), 1));
  auto dot = sliced(grad, dim) && sliced(out, dim)
      ? sliced_sum(grad, dim, [&](int64_t c) { return grad.select(dim, c) * out.select(dim, c); })
      : reduce(grad * out, DFUSE_REDUCE_OP_SUM, {dim}, true);
  return cast(out * (grad - dot), input_dtype);
}

at::Tensor log_softmax_backward(const at::Tensor& grad0, const at::Tensor& out0, int64_t dim,
                                at::ScalarType input_dtype) {
  auto grad = opmath(grad0), out = opmath(out0);
  dim = at::maybe_wrap_dim(dim, std::max<int64_t>(grad.dim(), 1));
  auto s = sliced(grad, dim) ? sliced_sum(grad, dim, [&](int64_t c) { return grad.select(dim, c); })
                             : reduce(grad, DFUSE_REDUCE_OP_SUM, {dim}, true);
  return cast(grad - at::exp(out) * s, input_dtype);
}

std::vector<int64_t> norm_dims(const at::Tensor& x, at::IntArrayRef normalized_shape) {
  int64_t axis = x.dim() - static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK(axis >= 0 && x.sizes().slice(axis).equals(normalized_shape),
              "tpu: layer_norm: normalized_shape ", normalized_shape,
              " does not match the trailing dims of an input of shape ", x.sizes());
  std::vector<int64_t> dims;
  for (int64_t d = axis; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm(
    const at::Tensor& x0, at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps) {
  auto dims = norm_dims(x0, normalized_shape);
  auto x = opmath(x0);
  auto mean = reduce(x, DFUSE_REDUCE_OP_MEAN, dims, true);
  auto xc = x - mean;
  auto var = reduce(xc * xc, DFUSE_REDUCE_OP_MEAN, dims, true);
  auto rstd = at::rsqrt(var + eps);
  auto out = xc * rstd;
  bool has_weight = weight && weight->defined();
  if (has_weight) out = out * opmath(*weight);
  if (bias && bias->defined()) out = out + opmath(*bias);
  // CPU's statistics are float32 when a half input has float32 parameters, else the input's.
  auto xt = x0.scalar_type();
  auto stats = has_weight && weight->scalar_type() != xt ? weight->scalar_type() : xt;
  return {cast(out, xt), cast(mean, stats), cast(rstd, stats)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
    const at::Tensor& grad0, const at::Tensor& x0, at::IntArrayRef normalized_shape,
    const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, std::array<bool, 3> mask) {
  auto dims = norm_dims(x0, normalized_shape);
  auto grad = opmath(grad0), x = opmath(x0);
  auto xhat = (x - opmath(mean)) * opmath(rstd);
  std::vector<int64_t> batch;
  for (int64_t d = 0; d < dims.front(); ++d) batch.push_back(d);
  // A reduction over no dims means "all dims" to the runtime; over no batch dims it is identity.
  auto sum_batch = [&](const at::Tensor& t) {
    return batch.empty() ? t : reduce(t, DFUSE_REDUCE_OP_SUM, batch, false);
  };
  at::Tensor dx, dw, db;
  if (mask[0]) {
    auto g = (weight && weight->defined()) ? grad * opmath(*weight) : grad;
    auto g_mean = reduce(g, DFUSE_REDUCE_OP_MEAN, dims, true);
    auto gx_mean = reduce(g * xhat, DFUSE_REDUCE_OP_MEAN, dims, true);
    dx = cast((g - g_mean - xhat * gx_mean) * opmath(rstd), x0.scalar_type());
  }
  if (mask[1] && weight && weight->defined()) {
    dw = cast(sum_batch(grad * xhat), weight->scalar_type());
  }
  if (mask[2] && bias && bias->defined()) db = cast(sum_batch(grad), bias->scalar_type());
  return {dx, dw, db};
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_softmax", DFT_GROUPED(dft::softmax));
  m.impl("_log_softmax", DFT_GROUPED(dft::log_softmax));
  m.impl("_softmax_backward_data", DFT_GROUPED(dft::softmax_backward));
  m.impl("_log_softmax_backward_data", DFT_GROUPED(dft::log_softmax_backward));
  m.impl("native_layer_norm", DFT_GROUPED(dft::layer_norm));
  m.impl("native_layer_norm_backward", DFT_GROUPED(dft::layer_norm_backward));
}
