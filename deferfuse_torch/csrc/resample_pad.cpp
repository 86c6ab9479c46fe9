// Upsampling (nearest and nearest-exact 1-D/2-D, nearest 3-D, linear 1-D, bilinear and bicubic
// 2-D, trilinear 3-D) and reflect/replicate padding (1-D, 2-D), forward and backward. Each is separable: per resized dim
// an index_select (or, for linear and cubic, a weighted sum of two or four index_selects) with
// source-index and weight tables computed on the host from the shapes alone (as PyTorch's CPU
// kernels compute them), and each backward is the adjoint: index_adds per dim with the same
// tables, so both run on the device.
#include "kernel_ops.h"
#include "tables.h"

#include <ATen/core/grad_mode.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <optional>
#include <utility>

namespace dft {
namespace {

using Table = std::vector<int64_t>;

// A source-index table on the device (kept by content: see tables.h).
at::Tensor upload(const Table& t) {
  return upload_table(t, {int64_t(t.size())});
}

// Most copies of one input index a repeat table may make for pick and unpick to take it as a
// broadcast: the adjoint adds that many strided slices, one program each in strict mode.
constexpr int64_t kMaxRepeat = 8;

// The ratio r of each table that repeats every input index r times in order (t[o] == o / r,
// as nearest upsampling by an integer factor makes), or nothing when a table is another kind
// (or repeats more than kMaxRepeat times), or when every ratio is 1 (an identity).
std::vector<int64_t> repeat_ratios(const std::vector<Table>& tables, at::IntArrayRef in_sizes,
                                   const std::vector<int64_t>& dims) {
  std::vector<int64_t> ratios;
  bool grows = false;
  for (size_t k = 0; k < tables.size(); ++k) {
    const auto& t = tables[k];
    int64_t in = in_sizes[dims[k]];
    if (in <= 0 || int64_t(t.size()) % in != 0) return {};
    int64_t r = int64_t(t.size()) / in;
    if (r > kMaxRepeat) return {};
    for (size_t o = 0; o < t.size(); ++o) {
      if (t[o] != int64_t(o) / r) return {};
    }
    grows |= r > 1;
    ratios.push_back(r);
  }
  if (!grows) return {};
  return ratios;
}

// out = x with dim d[k] replaced by x.select(d[k], table[k][i]) for each output index i. Where
// every table repeats its indexes (nearest upsampling by integer factors), one broadcast copy:
// x with a stride-0 dim of size r after each picked dim, made contiguous, viewed at the output
// sizes (a [16, 64, 16, 16] doubling 3.1 -> 0.7-1.6 ms, CPU eager 1.3-5; an index_select per
// dim ran element by element).
at::Tensor pick(at::Tensor x, const std::vector<int64_t>& dims, const std::vector<Table>& tables) {
  auto ratios = repeat_ratios(tables, x.sizes(), dims);
  if (!ratios.empty()) {
    auto out = x.sizes().vec();
    auto v = x;
    for (size_t k = dims.size(); k-- > 0;) {  // from the last, so earlier dims keep their place
      v = v.unsqueeze(dims[k] + 1);
      out[dims[k]] *= ratios[k];
    }
    auto wide = v.sizes().vec();
    for (size_t k = 0; k < dims.size(); ++k) wide[dims[k] + 1 + k] = ratios[k];
    return v.expand(wide).contiguous().view(out);
  }
  for (size_t k = 0; k < dims.size(); ++k) x = at::index_select(x, dims[k], upload(tables[k]));
  return x;
}

// The adjoint of pick: every output element's gradient added to the input element it came from.
// For repeat tables, per dim from the last, the r slices of each input index added in order;
// the index_add path adds them in the same order onto zeros, and the closing + 0.0 gives its
// zero sign too (0 + -0 is +0), so both give the same bits ([16, 64, 32, 32] 3.7 -> 0.3 ms).
at::Tensor unpick(at::Tensor g, at::IntArrayRef in_sizes, const std::vector<int64_t>& dims,
                  const std::vector<Table>& tables) {
  auto ratios = repeat_ratios(tables, in_sizes, dims);
  if (!ratios.empty()) {
    for (size_t k = dims.size(); k-- > 0;) {
      int64_t d = dims[k], r = ratios[k];
      if (r == 1) continue;
      auto sizes = g.sizes().vec();
      sizes[d] /= r;
      sizes.insert(sizes.begin() + d + 1, r);
      auto v = g.reshape(sizes);
      g = v.select(d + 1, 0);
      for (int64_t i = 1; i < r; ++i) g = g + v.select(d + 1, i);
    }
    return g + 0.0;
  }
  for (size_t k = dims.size(); k-- > 0;) {
    auto sizes = g.sizes().vec();
    sizes[dims[k]] = in_sizes[dims[k]];
    g = at::zeros(sizes, g.options()).index_add(dims[k], upload(tables[k]), g);
  }
  return g;
}

// PyTorch's nearest source index (UpSample.h): scale = 1 / scale_factor when given, else
// in / out, in float; "exact" rounds half up around pixel centres.
Table nearest_table(int64_t in, int64_t out, std::optional<double> scale, bool exact) {
  float s = (scale && *scale > 0) ? float(1.0 / *scale) : float(in) / float(out);
  Table t(out);
  for (int64_t o = 0; o < out; ++o) {
    int64_t i = exact ? int64_t(std::floor((float(o) + 0.5f) * s)) : int64_t(std::floor(float(o) * s));
    if (out == in) i = o;
    t[o] = std::min(i, in - 1);
  }
  return t;
}

std::vector<Table> nearest_tables(at::IntArrayRef in, at::IntArrayRef out,
                                  std::vector<std::optional<double>> scales, bool exact) {
  std::vector<Table> t;
  for (size_t k = 0; k < out.size(); ++k) {
    t.push_back(nearest_table(in[in.size() - out.size() + k], out[k], scales[k], exact));
  }
  return t;
}

std::vector<int64_t> last_dims(int64_t rank, size_t n) {
  std::vector<int64_t> d;
  for (size_t k = 0; k < n; ++k) d.push_back(rank - int64_t(n) + int64_t(k));
  return d;
}

std::vector<int64_t> ints(c10::SymIntArrayRef s) {
  std::vector<int64_t> v;
  for (const auto& x : s) v.push_back(x.expect_int());
  return v;
}

at::Tensor up2d(const at::Tensor& x, c10::SymIntArrayRef out, std::optional<double> sh,
                std::optional<double> sw, bool exact) {
  auto o = ints(out);
  return pick(x, last_dims(x.dim(), 2), nearest_tables(x.sizes(), o, {sh, sw}, exact));
}

at::Tensor up2d_back(const at::Tensor& g, c10::SymIntArrayRef out, c10::SymIntArrayRef in,
                     std::optional<double> sh, std::optional<double> sw, bool exact) {
  auto i = ints(in), o = ints(out);
  return unpick(g, i, last_dims(g.dim(), 2), nearest_tables(i, o, {sh, sw}, exact));
}

at::Tensor upsample_nearest2d(const at::Tensor& x, c10::SymIntArrayRef out,
                              std::optional<double> sh, std::optional<double> sw) {
  return up2d(x, out, sh, sw, false);
}

at::Tensor upsample_nearest2d_backward(const at::Tensor& g, c10::SymIntArrayRef out,
                                       c10::SymIntArrayRef in, std::optional<double> sh,
                                       std::optional<double> sw) {
  return up2d_back(g, out, in, sh, sw, false);
}

at::Tensor upsample_nearest_exact2d(const at::Tensor& x, c10::SymIntArrayRef out,
                                    std::optional<double> sh, std::optional<double> sw) {
  return up2d(x, out, sh, sw, true);
}

at::Tensor upsample_nearest_exact2d_backward(const at::Tensor& g, c10::SymIntArrayRef out,
                                             c10::SymIntArrayRef in, std::optional<double> sh,
                                             std::optional<double> sw) {
  return up2d_back(g, out, in, sh, sw, true);
}

// `exact`: nearest-exact (pixel centres, as PIL's nearest), else PyTorch's legacy nearest.
template <bool exact>
at::Tensor upsample_nearest1d(const at::Tensor& x, c10::SymIntArrayRef out,
                              std::optional<double> s) {
  auto o = ints(out);
  return pick(x, last_dims(x.dim(), 1), nearest_tables(x.sizes(), o, {s}, exact));
}

template <bool exact>
at::Tensor upsample_nearest1d_backward(const at::Tensor& g, c10::SymIntArrayRef out,
                                       c10::SymIntArrayRef in, std::optional<double> s) {
  auto i = ints(in), o = ints(out);
  return unpick(g, i, last_dims(g.dim(), 1), nearest_tables(i, o, {s}, exact));
}

// One resized dim of a linear or cubic interpolation: output i is sum_k w[k][i] * x[idx[k][i]]
// (k over the two or four taps), in PyTorch's order of summation.
struct Taps {
  std::vector<Table> idx;
  std::vector<std::vector<double>> w;
};

// The weights as a tensor of x's dtype shaped to broadcast along `dim` of a rank-`rank` tensor.
at::Tensor weights(const std::vector<double>& w, int64_t dim, int64_t rank,
                   const at::Tensor& like) {
  std::vector<int64_t> shape(rank - dim, 1);
  shape[0] = int64_t(w.size());
  return upload_table(w, shape, like.scalar_type());
}

// Last dim first, as PyTorch's kernel interpolates the innermost dim inside the outer ones.
// Half and bfloat16 are interpolated in float and rounded once, as PyTorch's CPU kernels do.
at::Tensor interpolate(at::Tensor x, const std::vector<int64_t>& dims,
                       const std::vector<Taps>& taps) {
  auto dtype = x.scalar_type();
  if (is_reduced_float(dtype)) x = x.to(at::kFloat);
  for (size_t k = dims.size(); k-- > 0;) {
    at::Tensor acc;
    for (size_t j = 0; j < taps[k].idx.size(); ++j) {
      auto term = at::index_select(x, dims[k], upload(taps[k].idx[j])) *
                  weights(taps[k].w[j], dims[k], x.dim(), x);
      acc = j == 0 ? term : acc + term;
    }
    x = acc;
  }
  return x.to(dtype);
}

// The adjoint of interpolate: each output's gradient, weighted, added to its source elements.
at::Tensor uninterpolate(at::Tensor g, at::IntArrayRef in_sizes, const std::vector<int64_t>& dims,
                         const std::vector<Taps>& taps) {
  auto dtype = g.scalar_type();
  if (is_reduced_float(dtype)) g = g.to(at::kFloat);
  for (size_t k = 0; k < dims.size(); ++k) {
    auto sizes = g.sizes().vec();
    sizes[dims[k]] = in_sizes[dims[k]];
    auto acc = at::zeros(sizes, g.options());
    for (size_t j = 0; j < taps[k].idx.size(); ++j) {
      auto w = weights(taps[k].w[j], dims[k], g.dim(), g);
      acc.index_add_(dims[k], upload(taps[k].idx[j]), g * w);
    }
    g = acc;
  }
  return g.to(dtype);
}

// PyTorch's area_pixel_compute_scale and area_pixel_compute_source_index (UpSample.h), in the
// kernel's opmath type T (float for float inputs, double for double).
template <typename T>
T source_scale(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  if (align_corners) return out > 1 ? T(in - 1) / T(out - 1) : T(0);
  return (scale && *scale > 0) ? T(1.0 / *scale) : T(in) / T(out);
}

template <typename T>
T source_index(T scale, int64_t o, bool align_corners, bool cubic) {
  if (align_corners) return scale * T(o);
  T s = scale * (T(o) + T(0.5)) - T(0.5);
  return (!cubic && s < T(0)) ? T(0) : s;
}

// PyTorch's guard_index_and_lambda: the tap below the source position and its fraction.
template <typename T>
std::pair<int64_t, T> floor_and_fraction(T real, int64_t in) {
  int64_t i = std::min(int64_t(std::floor(real)), in - 1);
  return {i, std::min(std::max(real - T(i), T(0)), T(1))};
}

template <typename T>
Taps linear_taps(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  Taps t{{Table(out), Table(out)}, {std::vector<double>(out), std::vector<double>(out)}};
  T s = source_scale<T>(in, out, align_corners, scale);
  for (int64_t o = 0; o < out; ++o) {
    auto [i, l1] = floor_and_fraction<T>(source_index<T>(s, o, align_corners, false), in);
    t.idx[0][o] = i;
    t.idx[1][o] = i + (i < in - 1 ? 1 : 0);
    t.w[0][o] = double(T(1) - l1);
    t.w[1][o] = double(l1);
  }
  return t;
}

// Keys' cubic convolution with A = -0.75 (PyTorch's get_cubic_upsample_coefficients); taps
// outside the input read its edge element.
// The four tap weights at fraction t, for a host scalar (S = float or double) or a tensor of
// fractions (V = at::Tensor, S = double), with PyTorch's operation order.
template <typename S, typename V>
std::array<V, 4> cubic_weights(const V& t) {
  const S A = S(-0.75);
  auto near = [&](const V& x) { return ((A + S(2)) * x - (A + S(3))) * x * x + S(1); };
  auto far = [&](const V& x) { return ((A * x - S(5) * A) * x + S(8) * A) * x - S(4) * A; };
  V u = S(1) - t;
  return {far(t + S(1)), near(t), near(u), far(u + S(1))};
}

template <typename T>
Taps cubic_taps(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  Taps t{std::vector<Table>(4, Table(out)),
         std::vector<std::vector<double>>(4, std::vector<double>(out))};
  T s = source_scale<T>(in, out, align_corners, scale);
  for (int64_t o = 0; o < out; ++o) {
    auto [i, l] = floor_and_fraction<T>(source_index<T>(s, o, align_corners, true), in);
    auto w = cubic_weights<T, T>(l);
    for (int k = 0; k < 4; ++k) {
      t.idx[k][o] = std::min(std::max<int64_t>(i - 1 + k, 0), in - 1);
      t.w[k][o] = double(w[k]);
    }
  }
  return t;
}

// The taps of every resized (trailing) dim of `in` resized to `out`.
std::vector<Taps> all_taps(at::IntArrayRef in, const std::vector<int64_t>& out, bool cubic,
                           bool align_corners, std::vector<std::optional<double>> scales,
                           at::ScalarType dtype) {
  std::vector<Taps> t;
  for (size_t k = 0; k < out.size(); ++k) {
    int64_t n = in[in.size() - out.size() + k];
    bool dbl = dtype == at::kDouble;
    t.push_back(cubic ? (dbl ? cubic_taps<double>(n, out[k], align_corners, scales[k])
                             : cubic_taps<float>(n, out[k], align_corners, scales[k]))
                      : (dbl ? linear_taps<double>(n, out[k], align_corners, scales[k])
                             : linear_taps<float>(n, out[k], align_corners, scales[k])));
  }
  return t;
}

// Nearest resizing only picks elements, so it takes uint8 images as CPU does; the smooth
// modes take floats here (CPU's uint8 bilinear/bicubic rounds in its own fixed-point way).
void check_resize(const char* op, const at::Tensor& x, int64_t rank,
                  const std::vector<int64_t>& out, bool picks_only = false) {
  TORCH_CHECK(x.dim() == rank, op, ": expected a ", rank, "-D input (batch, channels, spatial), "
              "got a ", x.dim(), "-D one of shape ", x.sizes());
  TORCH_CHECK(x.is_floating_point() || (picks_only && x.scalar_type() == at::kByte), op,
              ": expected a floating input, got ", x.scalar_type());
  for (auto o : out) TORCH_CHECK(o > 0, op, ": output sizes must be positive, got ", out);
  for (int64_t d = 2; d < rank; ++d) {
    TORCH_CHECK(x.size(d) > 0, op, ": input spatial sizes must be positive, got ", x.sizes());
  }
}

template <bool CUBIC>
at::Tensor up2d_smooth(const at::Tensor& x, c10::SymIntArrayRef out, bool align_corners,
                       std::optional<double> sh, std::optional<double> sw) {
  auto o = ints(out);
  check_resize(CUBIC ? "upsample_bicubic2d" : "upsample_bilinear2d", x, 4, o);
  return interpolate(x, last_dims(4, 2),
                     all_taps(x.sizes(), o, CUBIC, align_corners, {sh, sw}, x.scalar_type()));
}

template <bool CUBIC>
at::Tensor up2d_smooth_back(const at::Tensor& g, c10::SymIntArrayRef out, c10::SymIntArrayRef in,
                            bool align_corners, std::optional<double> sh,
                            std::optional<double> sw) {
  auto i = ints(in), o = ints(out);
  return uninterpolate(g, i, last_dims(4, 2),
                       all_taps(i, o, CUBIC, align_corners, {sh, sw}, g.scalar_type()));
}

at::Tensor upsample_linear1d(const at::Tensor& x, c10::SymIntArrayRef out, bool align_corners,
                             std::optional<double> s) {
  auto o = ints(out);
  check_resize("upsample_linear1d", x, 3, o);
  return interpolate(x, last_dims(3, 1),
                     all_taps(x.sizes(), o, false, align_corners, {s}, x.scalar_type()));
}

at::Tensor upsample_linear1d_backward(const at::Tensor& g, c10::SymIntArrayRef out,
                                      c10::SymIntArrayRef in, bool align_corners,
                                      std::optional<double> s) {
  auto i = ints(in), o = ints(out);
  return uninterpolate(g, i, last_dims(3, 1),
                       all_taps(i, o, false, align_corners, {s}, g.scalar_type()));
}

// 3-D (volumetric) resizing: the same separable tables over the three trailing dims.
template <bool exact>
at::Tensor upsample_nearest3d(const at::Tensor& x, c10::SymIntArrayRef out,
                              std::optional<double> sd, std::optional<double> sh,
                              std::optional<double> sw) {
  auto o = ints(out);
  check_resize(exact ? "_upsample_nearest_exact3d" : "upsample_nearest3d", x, 5, o,
               /*picks_only=*/true);
  return pick(x, last_dims(5, 3), nearest_tables(x.sizes(), o, {sd, sh, sw}, exact));
}

template <bool exact>
at::Tensor upsample_nearest3d_backward(const at::Tensor& g, c10::SymIntArrayRef out,
                                       c10::SymIntArrayRef in, std::optional<double> sd,
                                       std::optional<double> sh, std::optional<double> sw) {
  auto i = ints(in), o = ints(out);
  return unpick(g, i, last_dims(5, 3), nearest_tables(i, o, {sd, sh, sw}, exact));
}

at::Tensor upsample_trilinear3d(const at::Tensor& x, c10::SymIntArrayRef out, bool align_corners,
                                std::optional<double> sd, std::optional<double> sh,
                                std::optional<double> sw) {
  auto o = ints(out);
  check_resize("upsample_trilinear3d", x, 5, o);
  return interpolate(x, last_dims(5, 3),
                     all_taps(x.sizes(), o, false, align_corners, {sd, sh, sw}, x.scalar_type()));
}

at::Tensor upsample_trilinear3d_backward(const at::Tensor& g, c10::SymIntArrayRef out,
                                         c10::SymIntArrayRef in, bool align_corners,
                                         std::optional<double> sd, std::optional<double> sh,
                                         std::optional<double> sw) {
  auto i = ints(in), o = ints(out);
  return uninterpolate(g, i, last_dims(5, 3),
                       all_taps(i, o, false, align_corners, {sd, sh, sw}, g.scalar_type()));
}

// grid_sampler_2d (F.grid_sample on 4-D input): bilinear, nearest and bicubic; zeros, border
// and reflection padding. Built from the device's elementwise ops and gather with PyTorch's
// formulas (GridSamplerKernel.cpp), so it runs and fuses on the device. It is registered at the
// autograd key as well: autograd differentiates through those ops (the input's gradient is the
// gathers' scatter_add, the grid's comes from the weights), instead of calling
// grid_sampler_2d_backward, which would need a second kernel of the same formulas.
enum GridInterp : int64_t { kBilinear = 0, kNearest = 1, kBicubic = 2 };
enum GridPadding : int64_t { kZeros = 0, kBorder = 1, kReflection = 2 };

// Grid coordinate (-1 .. 1) to pixel position along a dim of `size`.
at::Tensor grid_unnormalize(const at::Tensor& c, int64_t size, bool align_corners) {
  return align_corners ? (c + 1) * (double(size - 1) / 2) : (c + 1) * (double(size) / 2) - 0.5;
}

// PyTorch's compute_coordinates: border clamps into the input, reflection mirrors around its
// edges (the pixel centres with align_corners, else the pixel borders) and then clamps.
at::Tensor grid_pad(at::Tensor x, int64_t size, int64_t padding, bool align_corners) {
  if (padding == kZeros) return x;
  if (padding == kReflection) {
    double low = align_corners ? 0.0 : -0.5, span = align_corners ? double(size - 1) : double(size);
    if (span <= 0) return at::zeros_like(x);
    auto a = (x - low).abs();
    auto extra = a - at::trunc(a / (2 * span)) * (2 * span);
    x = at::minimum(extra, 2 * span - extra) + low;
  }
  // A NaN coordinate (or an infinite one reflected, which the arithmetic above makes NaN)
  // clamps to 0, as CPU's clip does: a NaN read as outside gave NaN or 0 where CPU samples the
  // first pixel.
  x = at::where(at::isnan(x), at::zeros({}, x.options()), x);
  return at::clamp(x, 0.0, double(size - 1));
}

// input (N, C, H, W) gathered at integer positions (xs, ys) of shape (N, Ho, Wo), as (N, C, Ho,
// Wo), with which positions lie inside it; `value()` zeroes the others. A sampler gathers all
// its taps before it blends any: the blend is then one fused loop over the taps (gathered in
// turn with the blend between them, each tap's share was a loop of its own, a write and a
// read of the whole output per tap).
struct GridTap {
  at::Tensor inside, v;
  at::Tensor value() const {
    return at::where(inside.unsqueeze(1), v, at::zeros({}, v.options()));
  }
};

GridTap grid_gather(const at::Tensor& input, const at::Tensor& xs, const at::Tensor& ys) {
  int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  auto inside = xs.ge(0).logical_and(xs.le(W - 1)).logical_and(ys.ge(0)).logical_and(ys.le(H - 1));
  // Outside (NaN included) reads element 0 and is then zeroed: no index out of range is formed.
  auto zero = at::zeros({}, xs.options());
  auto flat = at::where(inside, ys * W + xs, zero).to(at::kLong);
  // Sizes spelled out: with an empty batch, -1 has no size to stand for (reshape raised).
  const int64_t taps = xs.size(1) * xs.size(2);
  auto idx = flat.reshape({N, 1, taps}).expand({N, C, taps});
  auto v = at::gather(input.reshape({N, C, H * W}), 2, idx).view({N, C, xs.size(1), xs.size(2)});
  return {inside, v};
}

// input read at (xs, ys); a position outside the input reads 0.
at::Tensor grid_read(const at::Tensor& input, const at::Tensor& xs, const at::Tensor& ys) {
  return grid_gather(input, xs, ys).value();
}

at::Tensor grid_sampler_2d(const at::Tensor& input, const at::Tensor& grid, int64_t interpolation,
                           int64_t padding, bool align_corners) {
  TORCH_CHECK(input.dim() == 4 && grid.dim() == 4 && grid.size(3) == 2,
              "grid_sampler_2d: expected a 4-D input and a grid of shape (N, H_out, W_out, 2), got "
              "input ", input.sizes(), " and grid ", grid.sizes());
  TORCH_CHECK(input.size(0) == grid.size(0), "grid_sampler_2d: expected grid and input to have "
              "the same batch size, got input ", input.sizes(), " and grid ", grid.sizes());
  TORCH_CHECK(interpolation >= kBilinear && interpolation <= kBicubic,
              "grid_sampler_2d: interpolation_mode must be 0 (bilinear), 1 (nearest) or 2 "
              "(bicubic), got ", interpolation);
  TORCH_CHECK(padding >= kZeros && padding <= kReflection, "grid_sampler_2d: padding_mode must "
              "be 0 (zeros), 1 (border) or 2 (reflection), got ", padding);
  int64_t H = input.size(2), W = input.size(3);
  auto ix = grid_unnormalize(grid.select(3, 0), W, align_corners);
  auto iy = grid_unnormalize(grid.select(3, 1), H, align_corners);
  if (interpolation == kBicubic) {
    // Each tap's integer position is padded on its own (its gradient is zero), as on CPU.
    auto x0 = at::floor(ix), y0 = at::floor(iy);
    auto wx = cubic_weights<double, at::Tensor>(ix - x0);
    auto wy = cubic_weights<double, at::Tensor>(iy - y0);
    std::vector<GridTap> taps;
    for (int i = 0; i < 4; ++i) {
      auto y = grid_pad(y0 + (i - 1), H, padding, align_corners);
      for (int j = 0; j < 4; ++j) {
        taps.push_back(grid_gather(input, grid_pad(x0 + (j - 1), W, padding, align_corners), y));
      }
    }
    at::Tensor out;
    for (int i = 0; i < 4; ++i) {
      at::Tensor row;
      for (int j = 0; j < 4; ++j) {
        auto term = taps[4 * i + j].value() * wx[j].unsqueeze(1);
        row = j == 0 ? term : row + term;
      }
      auto term = row * wy[i].unsqueeze(1);
      out = i == 0 ? term : out + term;
    }
    return out;
  }
  ix = grid_pad(ix, W, padding, align_corners);
  iy = grid_pad(iy, H, padding, align_corners);
  if (interpolation == kNearest) {
    auto rx = at::round(ix), ry = at::round(iy);
    auto out = grid_read(input, rx, ry);
    if (!at::GradMode::is_enabled() || !grid.requires_grad()) return out;
    // The rounded positions reach the output only as indexes, which autograd does not follow,
    // so the grid would be missing from the graph where CPU gives it a zero gradient. Minus an
    // exact +0 that depends on them (round's gradient is 0): the same bits, -0.0 included.
    auto zero = at::nan_to_num(rx - rx.detach() + (ry - ry.detach()), 0.0, 0.0, 0.0);
    return out - zero.unsqueeze(1);
  }
  auto x0 = at::floor(ix), y0 = at::floor(iy);
  auto tx = ix - x0, ty = iy - y0;  // the fractions towards the next pixel
  auto ux = 1 - tx, uy = 1 - ty;
  auto x1 = x0 + 1, y1 = y0 + 1;
  auto t00 = grid_gather(input, x0, y0), t10 = grid_gather(input, x1, y0);
  auto t01 = grid_gather(input, x0, y1), t11 = grid_gather(input, x1, y1);
  return t00.value() * (uy * ux).unsqueeze(1) + t10.value() * (uy * tx).unsqueeze(1) +
         t01.value() * (ty * ux).unsqueeze(1) + t11.value() * (ty * tx).unsqueeze(1);
}

// Source index of each padded position along one dim: reflect mirrors around the edge
// elements, replicate repeats them.
Table pad_table(int64_t in, int64_t before, int64_t after, bool reflect, const char* op) {
  TORCH_CHECK(in > 0, op, ": expected a non-empty dimension to pad");
  if (reflect) {
    TORCH_CHECK(before < in && after < in, op, ": padding size should be less than the "
                "corresponding input dimension, but got: padding (", before, ", ", after,
                ") at dimension of size ", in);
  }
  Table t;
  for (int64_t o = -before; o < in + after; ++o) {
    int64_t i = o;
    if (reflect) {
      if (i < 0) i = -i;
      if (i >= in) i = 2 * (in - 1) - i;
    } else {
      i = std::min(std::max<int64_t>(i, 0), in - 1);
    }
    t.push_back(i);
  }
  return t;
}

// padding is (last dim before, after, second-to-last before, after), as F.pad orders it.
std::vector<Table> pad_tables(at::IntArrayRef in, c10::SymIntArrayRef padding, bool reflect,
                              const char* op) {
  auto p = ints(padding);
  size_t n = p.size() / 2;
  TORCH_CHECK(in.size() >= n, op, ": the input has fewer dims than the padding covers");
  std::vector<Table> t(n);
  for (size_t k = 0; k < n; ++k) {
    // Table for dim (rank - n + k): its padding pair is the (n - 1 - k)-th.
    t[k] = pad_table(in[in.size() - n + k], p[2 * (n - 1 - k)], p[2 * (n - 1 - k) + 1], reflect, op);
  }
  return t;
}

// One padded dim's border widths: the table holds `before` positions, the input's, `after`.
struct Borders {
  int64_t before, after;
};

Borders borders(c10::SymIntArrayRef padding, size_t k, size_t n) {
  auto p = ints(padding);
  // A negative pad crops: its table has no border on that side (and skips input positions).
  return {std::max<int64_t>(p[2 * (n - 1 - k)], 0), std::max<int64_t>(p[2 * (n - 1 - k) + 1], 0)};
}

// The table entries [from, from + count) on the device.
at::Tensor upload_part(const Table& t, int64_t from, int64_t count) {
  return upload(Table(t.begin() + from, t.begin() + from + count));
}

// Border positions up to which each is a one-wide slice of the input (a view) rather than an
// index_select: with a few positions a side, the whole padded dim is one concatenation.
constexpr int64_t kSlicedBorder = 8;

// Appends to `parts` the border of `count` positions whose sources are table[from, from +
// count): one-wide slices of x when few, else one index_select.
void border(std::vector<at::Tensor>& parts, const at::Tensor& x, int64_t d, const Table& t,
            int64_t from, int64_t count) {
  if (count == 0) return;
  if (count > kSlicedBorder) {
    parts.push_back(at::index_select(x, d, upload_part(t, from, count)));
    return;
  }
  for (int64_t i = from; i < from + count; ++i) parts.push_back(x.narrow(d, t[i], 1));
}

// Padding along each dim as one concatenation: the input between its two borders, each border
// position a one-wide slice of the position it mirrors or repeats (an index_select when a
// border is wide). Gathering every position by the table went element by element along the
// last dim (a [8, 64, 32, 32] reflection pad 1.73 ms against CPU eager's 0.16-0.27;
// ResNet-style generators pad before every 3x3 convolution).
template <bool REFLECT>
at::Tensor pad(const at::Tensor& x0, c10::SymIntArrayRef padding) {
  const char* op = REFLECT ? "reflection_pad" : "replication_pad";
  size_t n = padding.size() / 2;
  auto dims = last_dims(x0.dim(), n);
  auto tables = pad_tables(x0.sizes(), padding, REFLECT, op);
  at::Tensor x = x0;
  for (size_t k = 0; k < n; ++k) {
    int64_t d = dims[k], in = x.size(d);
    auto [before, after] = borders(padding, k, n);
    if (int64_t(tables[k].size()) != before + in + after) {
      x = at::index_select(x, d, upload(tables[k]));  // a crop: the whole table
      continue;
    }
    if (before == 0 && after == 0) continue;
    std::vector<at::Tensor> parts;
    border(parts, x, d, tables[k], 0, before);
    parts.push_back(x);
    border(parts, x, d, tables[k], before + in, after);
    x = at::cat(parts, d);
  }
  return x.is_same(x0) ? x0.clone() : x;
}

// Adds into r the gradient of the border of `count` positions g[from, from + count) at their
// sources table[from, from + count), in position order: one-wide slice adds when few (an
// index_add scatters a row of one element at a time), else one index_add.
void add_border(at::Tensor& r, const at::Tensor& g, int64_t d, const Table& t, int64_t from,
                int64_t count) {
  if (count == 0) return;
  if (count > kSlicedBorder) {
    r.index_add_(d, upload_part(t, from, count), g.narrow(d, from, count));
    return;
  }
  for (int64_t i = from; i < from + count; ++i) r.narrow(d, t[i], 1).add_(g.narrow(d, i, 1));
}

// The adjoint, summing in the order CPU's kernel (and an index_add over the whole table)
// adds: zero, the left border's contributions, the interior, the right border's.
template <bool REFLECT>
at::Tensor pad_backward(const at::Tensor& g0, const at::Tensor& self, c10::SymIntArrayRef padding) {
  const char* op = REFLECT ? "reflection_pad_backward" : "replication_pad_backward";
  size_t n = padding.size() / 2;
  auto dims = last_dims(g0.dim(), n);
  auto tables = pad_tables(self.sizes(), padding, REFLECT, op);
  at::Tensor g = g0;
  for (size_t k = n; k-- > 0;) {
    int64_t d = dims[k], in = self.size(d);
    auto [before, after] = borders(padding, k, n);
    auto sizes = g.sizes().vec();
    sizes[d] = in;
    if (int64_t(tables[k].size()) != before + in + after) {
      g = at::zeros(sizes, g.options()).index_add(d, upload(tables[k]), g);
      continue;
    }
    if (before == 0 && after == 0) continue;
    auto r = at::zeros(sizes, g.options());
    add_border(r, g, d, tables[k], 0, before);
    r.add_(g.narrow(d, before, in));
    add_border(r, g, d, tables[k], before + in, after);
    g = r;
  }
  return g.is_same(g0) ? g0.clone() : g;
}

at::Tensor xlogy(const at::Tensor& x0, const at::Tensor& y0) {
  // In the dtype the two promote to, as a float op (integers to the default float dtype), as
  // CPU computes it: a bfloat16 y of a float32 x is widened before its log, a Python-scalar y
  // rounded to that dtype (1e300 stays finite in float64).
  auto common = at::result_type(x0, y0);
  if (!at::isFloatingType(common)) common = at::typeMetaToScalarType(at::get_default_dtype());
  auto device = x0.is_cpu() ? y0.device() : x0.device();
  auto x = x0.to(device, common), y = y0.to(device, common);
  // 0 where x == 0 (even for y == 0), NaN where y is NaN, else x * log(y), as on CPU.
  auto r = at::where(x.eq(0), at::zeros({}, x.options()), x * at::log(y));
  return at::where(y.isnan(), y, r);
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("upsample_nearest2d", DFT_GROUPED(dft::upsample_nearest2d));
  m.impl("upsample_nearest2d_backward", DFT_GROUPED(dft::upsample_nearest2d_backward));
  m.impl("_upsample_nearest_exact2d", DFT_GROUPED(dft::upsample_nearest_exact2d));
  m.impl("_upsample_nearest_exact2d_backward", DFT_GROUPED(dft::upsample_nearest_exact2d_backward));
  m.impl("upsample_nearest1d", DFT_GROUPED(dft::upsample_nearest1d<false>));
  m.impl("upsample_nearest1d_backward", DFT_GROUPED(dft::upsample_nearest1d_backward<false>));
  m.impl("_upsample_nearest_exact1d", DFT_GROUPED(dft::upsample_nearest1d<true>));
  m.impl("_upsample_nearest_exact1d_backward", DFT_GROUPED(dft::upsample_nearest1d_backward<true>));
  m.impl("reflection_pad1d", DFT_GROUPED(dft::pad<true>));
  m.impl("reflection_pad2d", DFT_GROUPED(dft::pad<true>));
  m.impl("replication_pad1d", DFT_GROUPED(dft::pad<false>));
  m.impl("replication_pad2d", DFT_GROUPED(dft::pad<false>));
  m.impl("reflection_pad1d_backward", DFT_GROUPED(dft::pad_backward<true>));
  m.impl("reflection_pad2d_backward", DFT_GROUPED(dft::pad_backward<true>));
  m.impl("replication_pad1d_backward", DFT_GROUPED(dft::pad_backward<false>));
  m.impl("replication_pad2d_backward", DFT_GROUPED(dft::pad_backward<false>));
  m.impl("upsample_bilinear2d", DFT_GROUPED(dft::up2d_smooth<false>));
  m.impl("upsample_bilinear2d_backward", DFT_GROUPED(dft::up2d_smooth_back<false>));
  m.impl("upsample_bicubic2d", DFT_GROUPED(dft::up2d_smooth<true>));
  m.impl("upsample_bicubic2d_backward", DFT_GROUPED(dft::up2d_smooth_back<true>));
  m.impl("upsample_linear1d", DFT_GROUPED(dft::upsample_linear1d));
  m.impl("upsample_linear1d_backward", DFT_GROUPED(dft::upsample_linear1d_backward));
  m.impl("upsample_nearest3d", DFT_GROUPED(dft::upsample_nearest3d<false>));
  m.impl("upsample_nearest3d_backward", DFT_GROUPED(dft::upsample_nearest3d_backward<false>));
  m.impl("_upsample_nearest_exact3d", DFT_GROUPED(dft::upsample_nearest3d<true>));
  m.impl("_upsample_nearest_exact3d_backward", DFT_GROUPED(dft::upsample_nearest3d_backward<true>));
  m.impl("upsample_trilinear3d", DFT_GROUPED(dft::upsample_trilinear3d));
  m.impl("upsample_trilinear3d_backward", DFT_GROUPED(dft::upsample_trilinear3d_backward));
  m.impl("grid_sampler_2d", TORCH_FN(dft::grid_sampler_2d));
  m.impl("xlogy.Tensor", DFT_GROUPED(dft::xlogy));
}

// grid_sampler_2d's gradient comes from autograd through its device ops (see above).
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("grid_sampler_2d", TORCH_FN(dft::grid_sampler_2d));
}
