// 2-D pooling: max (with PyTorch's flat h * W + w indices), average (count_include_pad,
// ceil_mode, divisor_override) and adaptive average / max (even and uneven windows), forward
// and backward.
//
// Every window is read through window_view of a padded buffer (-inf for max, 0 for average);
// backward adds each window's contribution back with add_windows. What depends only on the
// geometry (each window position's flat input index, each window's divisor, the adaptive
// averaging matrices) is computed on the host and uploaded, so no op needs a gather or scatter
// (the host gather and scatter kernels walk one element a row here: resnet18's max pool took
// 2-3x longer through them).
#include "pooling.h"
#include "windows.h"

#include <cmath>
#include <limits>
#include <torch/library.h>

namespace dft {
namespace {

// Which windows' averages are summed by elementwise adds of their positions' views (one fused
// loop reading K strided views, CPU's order): those of at most kMaxSummedWindow positions, and
// those of at most kMaxSummedManyWindow when a plane has at least that many windows. A few
// large windows, such as a global 7x7 average, sum rows in a reduction instead: K loads per
// output of a 4-lane loop cost more there than the rows (measured, one thread: [64, 512, 7, 7]
// k 7, 0.66 ms as adds against 0.11 as rows; [16, 64, 56, 56] k 5, 1.1 against 2.4).
constexpr int64_t kMaxSummedWindow = 16;
constexpr int64_t kMaxSummedManyWindow = 64;


// PyTorch's pooling_output_shape: ceil_mode may add a last window, which must start inside the
// input or left padding.
int64_t pooled_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil) {
  int64_t num = in + 2 * pad - dil * (k - 1) - 1 + (ceil ? stride - 1 : 0);
  int64_t o = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  if (ceil && (o - 1) * stride >= in + pad) --o;
  return o;
}

Pool pool_geometry(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                   at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                   const char* op) {
  TORCH_CHECK(x.dim() == 3 || x.dim() == 4, op, ": expected a 3-D [C, H, W] or 4-D [N, C, H, W] "
              "input, got shape ", x.sizes());
  Pool p;
  p.kernel = expand_param(kernel, 2, op, "kernel_size");
  p.stride = stride.empty() ? p.kernel : expand_param(stride, 2, op, "stride");
  p.padding = expand_param(padding, 2, op, "padding");
  p.dilation = expand_param(dilation, 2, op, "dilation");
  for (int64_t i = 0; i < 2; ++i) {
    int64_t in = x.size(x.dim() - 2 + i), k = p.kernel[i], s = p.stride[i], pad = p.padding[i],
            dil = p.dilation[i];
    TORCH_CHECK(k > 0 && s > 0 && dil > 0, op, ": kernel_size, stride and dilation must be "
                "positive, got ", p.kernel, ", ", p.stride, ", ", p.dilation);
    TORCH_CHECK(pad >= 0 && pad <= ((k - 1) * dil + 1) / 2, op, ": pad should be at most half of "
                "effective kernel size, but got pad=", pad, ", kernel_size=", k, " and dilation=",
                dil);
    int64_t o = pooled_size(in, k, pad, s, dil, ceil_mode);
    TORCH_CHECK(o > 0, op, ": the output size is too small: input ", x.sizes(), ", kernel ",
                p.kernel, ", padding ", p.padding);
    p.in.push_back(in);
    p.out.push_back(o);
    p.after.push_back(padding_after(in, k, pad, s, dil, o));
  }
  return p;
}

std::vector<int64_t> buffer_sizes(const Pool& p) {
  std::vector<int64_t> b;
  for (size_t i = 0; i < p.in.size(); ++i) b.push_back(p.in[i] + p.padding[i] + p.after[i]);
  return b;
}

// x with a batch dim: an unbatched input has one dim more than its `d` spatial ones.
at::Tensor batched(const at::Tensor& x, int64_t d = 2) {
  return x.dim() == d + 1 ? x.unsqueeze(0) : x;
}
at::Tensor like_input(const at::Tensor& r, const at::Tensor& x, int64_t d = 2) {
  return x.dim() == d + 1 ? r.squeeze(0) : r;
}

// [K, out...]: the flat input index (row-major over the spatial dims: h * W + w in 2-D) each
// window position reads. A position in the padding gets the window's first real element, the
// index PyTorch's CPU kernel starts from and keeps when no element beats it (a window of -inf
// values). Window position k's indices are one contiguous plane of the outputs, so the loops
// that read them load whole vectors: laid out [out..., K], each plane was strided by K and its
// loads went element by element (resnet18's and SqueezeNet's 3x3 max pools, forward and
// backward, ran 1.5x longer).
at::Tensor flat_index_table(const Pool& p, at::ScalarType dtype = at::kLong) {
  int64_t d = int64_t(p.kernel.size()), K = 1, O = 1;
  for (int64_t i = 0; i < d; ++i) {
    K *= p.kernel[i];
    O *= p.out[i];
  }
  std::vector<double> t(K * O);
  std::vector<int64_t> o(d), k(d), start(d);
  auto first_inside = [](int64_t start, int64_t dil) {
    return start >= 0 ? start : start + ((-start + dil - 1) / dil) * dil;
  };
  for (int64_t oi = 0; oi < O; ++oi) {
    int64_t rest = oi;
    for (int64_t i = d - 1; i >= 0; --i) {
      o[i] = rest % p.out[i];
      rest /= p.out[i];
    }
    int64_t first = 0;
    for (int64_t i = 0; i < d; ++i) {
      start[i] = o[i] * p.stride[i] - p.padding[i];
      first = first * p.in[i] + first_inside(start[i], p.dilation[i]);
    }
    for (int64_t ki = 0; ki < K; ++ki) {
      int64_t r = ki;
      for (int64_t i = d - 1; i >= 0; --i) {
        k[i] = r % p.kernel[i];
        r /= p.kernel[i];
      }
      bool inside = true;
      int64_t flat = 0;
      for (int64_t i = 0; i < d; ++i) {
        int64_t at = start[i] + k[i] * p.dilation[i];
        inside = inside && at >= 0 && at < p.in[i];
        flat = flat * p.in[i] + at;
      }
      t[ki * O + oi] = double(inside ? flat : first);
    }
  }
  std::vector<int64_t> shape{K};
  shape.insert(shape.end(), p.out.begin(), p.out.end());
  return upload_table(t, shape, dtype);
}

// What max pooling pads with, so a padding position never wins: -inf for floats, the dtype's
// minimum for integers (0 put a window of negative int32 values at 0).
at::Scalar lowest_value(at::ScalarType t) {
  if (at::isFloatingType(t)) return -std::numeric_limits<double>::infinity();
  switch (t) {
    case at::kInt: return std::numeric_limits<int32_t>::lowest();
    case at::kByte: return 0;
    case at::kBool: return false;
    default: return std::numeric_limits<int64_t>::lowest();
  }
}

// Window position k (row-major over the kernel) of every output: a strided view [N, C, out...]
// of window_view's [N, C, kernel..., out...]. Its kernel dims do not merge into one (kh's
// stride is a row, kw's an element), so flattening them copied all K views (9x the output for
// a 3x3 window, 5 ms of a [8, 64, 112, 112] max pool's 11).
at::Tensor window_slice(const at::Tensor& win, const Pool& p, int64_t k) {
  int64_t d = int64_t(p.kernel.size());
  std::vector<int64_t> at(d);
  for (int64_t i = d - 1; i >= 0; --i) {
    at[i] = k % p.kernel[i];
    k /= p.kernel[i];
  }
  auto v = win;
  for (int64_t i = 0; i < d; ++i) v = v.select(2, at[i]);
  return v;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> max_pool_forward(const at::Tensor& x0, const Pool& p) {
  int64_t d = int64_t(p.kernel.size());
  auto x = batched(x0, d);
  int64_t K = 1;
  for (auto k : p.kernel) K *= k;
  auto xp = pad_spatial(x, p.padding, p.after, lowest_value(x.scalar_type()));
  auto win = window_view(xp, p.kernel, p.stride, p.dilation, p.out);
  // The running index in int32 where the plane's positions fit (one 4-lane register a step in
  // the fused loop, not two of int64), widened once at the end: [8, 64, 32, 32] 3x3 stride 2,
  // 1.39 -> 1.07 ms float32, 2.45 -> 1.83 bfloat16 (CPU eager 2.8-3.1).
  int64_t plane = 1;
  for (auto n : p.in) plane *= n;
  bool narrow = plane < (int64_t(1) << 31);
  auto table = flat_index_table(p, narrow ? at::kInt : at::kLong);  // [K, OH, OW]
  // PyTorch's CPU kernel, one window position at a time for every output at once: a value
  // replaces the running maximum when it is greater or NaN, so the first maximum (or the last
  // NaN) wins, and a padding position (-inf) never does. Elementwise ops over strided views,
  // which the planner fuses into one loop: a row reduction over windows of 9 ran ~35 ns a row.
  auto values = window_slice(win, p, 0);
  auto indices = table.select(0, 0).expand_as(values);
  for (int64_t k = 1; k < K; ++k) {
    auto v = window_slice(win, p, k);
    auto take = at::logical_or(v.gt(values), v.ne(v));
    values = at::where(take, v, values);
    indices = at::where(take, table.select(0, k), indices);
  }
  // With one window position no where() made new tensors: values would be a view of the input
  // (kernel 1, stride 1) and indices one of the kept table (tables.h), where PyTorch returns
  // new tensors a caller may write into.
  if (K == 1) {
    values = values.clone(at::MemoryFormat::Contiguous);
    indices = indices.clone(at::MemoryFormat::Contiguous);
  }
  if (narrow) indices = indices.to(at::kLong);
  return {like_input(values.contiguous(), x0, d), like_input(indices.contiguous(), x0, d)};
}

at::Tensor max_pool_backward(const at::Tensor& grad0, const at::Tensor& x0,
                             const at::Tensor& indices0, const Pool& p) {
  int64_t d = int64_t(p.kernel.size());
  auto grad = batched(grad0, d), indices = batched(indices0, d);
  for (int64_t i = 0; i < d; ++i) {
    grad = grad.unsqueeze(2);
    indices = indices.unsqueeze(2);
  }
  // [N, C, kernel..., out...]: each output's gradient at the window position it took its max
  // from. A padding position whose table entry repeats the window's first real element gets it
  // too, but adds into the padding, which is cut off.
  std::vector<int64_t> shape(p.kernel);
  shape.insert(shape.end(), p.out.begin(), p.out.end());
  auto table = flat_index_table(p).view(shape);
  auto contrib = dft::where(indices.eq(table), grad, 0);
  auto buf = add_windows(contrib, buffer_sizes(p), p.kernel, p.stride, p.dilation);
  return like_input(unpad_spatial(buf, p.padding, p.in).contiguous(), x0, d);
}

namespace {

std::tuple<at::Tensor, at::Tensor> max_pool2d_with_indices(
    const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef padding,
    at::IntArrayRef dilation, bool ceil_mode) {
  return max_pool_forward(
      x, pool_geometry(x, kernel, stride, padding, dilation, ceil_mode, "max_pool2d"));
}

at::Tensor max_pool2d_with_indices_backward(const at::Tensor& grad, const at::Tensor& x,
                                            at::IntArrayRef kernel, at::IntArrayRef stride,
                                            at::IntArrayRef padding, at::IntArrayRef dilation,
                                            bool ceil_mode, const at::Tensor& indices) {
  auto p = pool_geometry(x, kernel, stride, padding, dilation, ceil_mode, "max_pool2d_backward");
  return max_pool_backward(grad, x, indices, p);
}

// [OH, OW]: what PyTorch's CPU kernel divides each window's sum by.
at::Tensor avg_divisors(const Pool& p, bool count_include_pad,
                        std::optional<int64_t> divisor_override, at::ScalarType dtype) {
  std::vector<double> t;
  for (int64_t oh = 0; oh < p.out[0]; ++oh)
    for (int64_t ow = 0; ow < p.out[1]; ++ow) {
      int64_t hs = oh * p.stride[0] - p.padding[0], ws = ow * p.stride[1] - p.padding[1];
      int64_t he = std::min(hs + p.kernel[0], p.in[0] + p.padding[0]);
      int64_t we = std::min(ws + p.kernel[1], p.in[1] + p.padding[1]);
      int64_t pool_size = (he - hs) * (we - ws);
      hs = std::max<int64_t>(hs, 0);
      ws = std::max<int64_t>(ws, 0);
      he = std::min(he, p.in[0]);
      we = std::min(we, p.in[1]);
      int64_t inside = (he - hs) * (we - ws);
      // A window wholly in the padding sums to 0; any divisor keeps it 0.
      double d = divisor_override ? double(*divisor_override)
                 : count_include_pad ? double(pool_size) : double(inside);
      t.push_back(he <= hs || we <= ws ? 1.0 : d);
    }
  return upload_table(t, {p.out[0], p.out[1]}, dtype);
}

Pool avg_geometry(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                  at::IntArrayRef padding, bool ceil_mode, std::optional<int64_t> divisor,
                  const char* op) {
  TORCH_CHECK(!divisor || *divisor != 0, op, ": divisor must be not zero");
  std::vector<int64_t> one{1};
  return pool_geometry(x, kernel, stride, padding, one, ceil_mode, op);
}

at::Tensor avg_pool2d(const at::Tensor& x0, at::IntArrayRef kernel, at::IntArrayRef stride,
                      at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                      std::optional<int64_t> divisor) {
  auto p = avg_geometry(x0, kernel, stride, padding, ceil_mode, divisor, "avg_pool2d");
  return rounded_once(x0, [&](const at::Tensor& x) {
    auto xp = pad_spatial(batched(x), p.padding, p.after, 0);
    auto win = window_view(xp, p.kernel, p.stride, p.dilation, p.out);
    int64_t K = p.kernel[0] * p.kernel[1];
    at::Tensor sums;
    bool many = p.out[0] * p.out[1] >= kMaxSummedWindow && K <= kMaxSummedManyWindow;
    if (K <= kMaxSummedWindow || many) {
      // CPU's kernel: `sum = 0`, then each window position added in row-major order. As
      // elementwise adds of the window's strided views the planner fuses them into one loop;
      // a sum over the window dims had to copy the windows into rows first (a 2x2 pool of
      // [16, 128, 56, 56]: 13 ms of copy for 1.6 ms of sums). The leading 0 keeps CPU's sign
      // of zero: a window of -0.0 sums to +0.0 there.
      sums = window_slice(win, p, 0) + 0;
      for (int64_t k = 1; k < K; ++k) sums = sums + window_slice(win, p, k);
    } else {
      // Rows summed in vector order: within rounding of CPU's sum, not bit for bit.
      sums = reduce(win, DFUSE_REDUCE_OP_SUM, {2, 3}, false);
    }
    auto divisors = avg_divisors(p, count_include_pad, divisor, x.scalar_type());
    return like_input(window_mean(sums, divisors), x);
  });
}

at::Tensor avg_pool2d_backward(const at::Tensor& grad0, const at::Tensor& x0,
                               at::IntArrayRef kernel, at::IntArrayRef stride,
                               at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                               std::optional<int64_t> divisor) {
  auto p = avg_geometry(x0, kernel, stride, padding, ceil_mode, divisor, "avg_pool2d_backward");
  auto share = batched(grad0) / avg_divisors(p, count_include_pad, divisor, x0.scalar_type());
  auto s = share.sizes();
  auto contrib = share.unsqueeze(2).unsqueeze(3).expand({s[0], s[1], p.kernel[0], p.kernel[1],
                                                         s[2], s[3]});
  auto buf = add_windows(contrib, buffer_sizes(p), p.kernel, p.stride, p.dilation);
  return like_input(unpad_spatial(buf, p.padding, p.in).contiguous(), x0);
}

// [out, in]: row o averages PyTorch's adaptive window [floor(o*in/out), ceil((o+1)*in/out)).
at::Tensor adaptive_matrix(int64_t in, int64_t out, at::ScalarType dtype) {
  std::vector<double> m(out * in, 0.0);
  for (int64_t o = 0; o < out; ++o) {
    int64_t s = (o * in) / out, e = ((o + 1) * in + out - 1) / out;
    for (int64_t i = s; i < e; ++i) m[o * in + i] = 1.0 / double(e - s);
  }
  return upload_table(m, {out, in}, dtype);
}

void check_adaptive(const at::Tensor& x, at::IntArrayRef out, const char* op) {
  TORCH_CHECK(x.dim() == 3 || x.dim() == 4, op, ": expected a 3-D or 4-D input, got shape ",
              x.sizes());
  TORCH_CHECK(out.size() == 2 && out[0] > 0 && out[1] > 0, op,
              ": output_size must be two positive sizes, got ", out);
}

// The kernel (= stride) when the output divides the input: then adaptive pooling is plain
// pooling, which (unlike the averaging matrices) keeps an inf or NaN in its own window.
std::optional<std::vector<int64_t>> even_windows(const at::Tensor& x, at::IntArrayRef out) {
  int64_t H = x.size(-2), W = x.size(-1);
  if (H % out[0] != 0 || W % out[1] != 0) return std::nullopt;
  return std::vector<int64_t>{H / out[0], W / out[1]};
}

// Uneven windows: the 3-D adaptive average over a depth of 1 (pool3d.cpp), which gathers
// each window's elements (the rest of the window an appended zero), sums them in PyTorch's
// row-major order and divides by the window's size. (As averaging matrices applied along each
// dim, A_h @ x @ A_w^T, their zeros multiplied every element: an inf in the input made NaNs in
// windows that do not hold it.)
at::Tensor adaptive_avg_uneven(const at::Tensor& x, at::IntArrayRef out) {
  return dft::adaptive_avg_pool3d(x.unsqueeze(-3), std::vector<int64_t>{1, out[0], out[1]})
      .squeeze(-3);
}

at::Tensor adaptive_avg_pool2d(const at::Tensor& x0, at::IntArrayRef out) {
  check_adaptive(x0, out, "adaptive_avg_pool2d");
  return rounded_once(x0, [&](const at::Tensor& x) {
    std::vector<int64_t> zero{0, 0};
    if (auto k = even_windows(x, out)) {
      return dft::avg_pool2d(x, *k, *k, zero, false, true, std::nullopt);
    }
    return adaptive_avg_uneven(x, out);
  });
}

at::Tensor adaptive_avg_pool2d_backward(const at::Tensor& grad0, const at::Tensor& x) {
  std::vector<int64_t> out{grad0.size(-2), grad0.size(-1)}, zero{0, 0};
  return rounded_once(grad0, [&](const at::Tensor& grad) {
    if (auto k = even_windows(x, out)) {
      return dft::avg_pool2d_backward(grad, opmath(x), *k, *k, zero, false, true, std::nullopt);
    }
    auto rows = adaptive_matrix(x.size(-2), out[0], grad.scalar_type());
    auto cols = adaptive_matrix(x.size(-1), out[1], grad.scalar_type());
    return batched_matmul(rows.t(), batched_matmul(grad, cols));
  });
}

// Uneven windows: the 3-D adaptive max over a depth of 1 (pool3d.cpp): each window gathered,
// its first maximum or its last NaN, as PyTorch's CPU kernel picks them; the flat indices are
// h * W + w.
std::tuple<at::Tensor, at::Tensor> adaptive_max_uneven(const at::Tensor& x, at::IntArrayRef out) {
  auto [values, indices] =
      dft::adaptive_max_pool3d(x.unsqueeze(-3), std::vector<int64_t>{1, out[0], out[1]});
  return {values.squeeze(-3), indices.squeeze(-3)};
}

std::tuple<at::Tensor, at::Tensor> adaptive_max_pool2d(const at::Tensor& x, at::IntArrayRef out) {
  check_adaptive(x, out, "adaptive_max_pool2d");
  auto k = even_windows(x, out);
  if (!k) return adaptive_max_uneven(x, out);
  std::vector<int64_t> zero{0, 0}, one{1, 1};
  return max_pool_forward(x, pool_geometry(x, *k, *k, zero, one, false, "adaptive_max_pool2d"));
}

// Every output's gradient added at the input element its max came from (indices are flat
// h * W + w), as PyTorch's CPU kernel does for even and uneven windows alike.
at::Tensor adaptive_max_pool2d_backward(const at::Tensor& grad, const at::Tensor& x,
                                        const at::Tensor& indices) {
  auto g = batched(grad), i = batched(indices), xb = batched(x);
  int64_t N = xb.size(0), C = xb.size(1), H = xb.size(2), W = xb.size(3);
  // Sizes spelled out: with an empty batch, -1 has no size to stand for (reshape raised).
  const int64_t outs = i.size(-2) * i.size(-1);
  auto flat = at::zeros({N, C, H * W}, grad.options())
                  .scatter_add(2, i.reshape({N, C, outs}), g.reshape({N, C, outs}));
  return like_input(flat.view({N, C, H, W}), x);
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("max_pool2d_with_indices", DFT_GROUPED(dft::max_pool2d_with_indices));
  m.impl("max_pool2d_with_indices_backward", DFT_GROUPED(dft::max_pool2d_with_indices_backward));
  m.impl("avg_pool2d", DFT_GROUPED(dft::avg_pool2d));
  m.impl("avg_pool2d_backward", DFT_GROUPED(dft::avg_pool2d_backward));
  m.impl("_adaptive_avg_pool2d", DFT_GROUPED(dft::adaptive_avg_pool2d));
  m.impl("_adaptive_avg_pool2d_backward", DFT_GROUPED(dft::adaptive_avg_pool2d_backward));
  m.impl("adaptive_max_pool2d", DFT_GROUPED(dft::adaptive_max_pool2d));
  m.impl("adaptive_max_pool2d_backward", DFT_GROUPED(dft::adaptive_max_pool2d_backward));
}
