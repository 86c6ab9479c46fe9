// 3-D max, average and adaptive pooling (nn.MaxPool3d, nn.AvgPool3d, nn.AdaptiveAvgPool3d,
// nn.AdaptiveMaxPool3d) on "tpu".
//
// Max pooling is the 2-D one's over three dims (pooling.h, since session 46): every window
// position a strided view of one padded buffer, forward and backward through PyTorch's own
// derivative (max_pool3d_with_indices_backward). Average and adaptive pooling read a window by
// a table of flat input positions, as fold.cpp reads im2col's: entry (o, k) is where kernel
// offset k of output position o reads in the [D * H * W] volume, gathered with one
// index_select into [N, C, O, K] and reduced along K. A position outside the input reads a
// zero appended after the volume (average) or the window's first real element (adaptive max,
// which is the index CPU's kernel starts from, so its indices and the element its gradient goes
// to are CPU's). Those are registered for autograd as well: their backward is autograd through
// the gather (an index_add). Shape errors are CPU's (PoolingChecks.h).
#include "pooling.h"
#include "windows.h"

#include <ATen/native/Pool.h>
#include <ATen/native/PoolingChecks.h>
#include <torch/library.h>

#include <array>

namespace dft {
namespace {

struct Pool3d {
  std::array<int64_t, 3> in, k, s, p, d, out;
};

// `v` (one value or three) as three values.
std::array<int64_t, 3> triple(at::IntArrayRef v, const char* op, const char* what) {
  auto e = expand_param(v, 3, op, what);
  return {e[0], e[1], e[2]};
}

// `op` names the module in argument errors ("max_pool3d"), `fn` the kernel in shape errors
// ("max_pool3d_with_indices()"), as CPU's messages do.
Pool3d geometry(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode, bool average,
                const char* op, const char* fn) {
  Pool3d g;
  g.k = triple(kernel, op, "kernel_size");
  g.s = stride.empty() ? g.k : triple(stride, op, "stride");
  g.p = triple(padding, op, "padding");
  g.d = dilation.empty() ? std::array<int64_t, 3>{1, 1, 1} : triple(dilation, op, "dilation");
  TORCH_CHECK(x.dim() == 4 || x.dim() == 5,
              "non-empty 4D or 5D (batch mode) tensor expected for input");
  for (int i = 0; i < 3; ++i) {
    g.in[i] = x.size(x.dim() - 3 + i);
    g.out[i] = at::native::pooling_output_shape<int64_t>(g.in[i], g.k[i], g.p[i], g.s[i], g.d[i],
                                                         ceil_mode);
  }
  at::native::pool3d_shape_check(x, x.size(x.dim() - 4), g.k[0], g.k[1], g.k[2], g.s[0], g.s[1],
                                 g.s[2], g.p[0], g.p[1], g.p[2], g.d[0], g.d[1], g.d[2], g.in[0],
                                 g.in[1], g.in[2], g.out[0], g.out[1], g.out[2], fn, average);
  return g;
}

int64_t volume(const std::array<int64_t, 3>& v) { return v[0] * v[1] * v[2]; }

// [O * K] flat input positions, output positions then kernel offsets in row-major order. An
// outside position reads `outside` (a zero slot), or with outside < 0 the window's first real
// element.
at::Tensor window_table(const Pool3d& g, int64_t outside) {
  std::vector<double> t;
  t.reserve(volume(g.out) * volume(g.k));
  std::array<int64_t, 3> o{}, kk{};
  for (o[0] = 0; o[0] < g.out[0]; ++o[0])
    for (o[1] = 0; o[1] < g.out[1]; ++o[1])
      for (o[2] = 0; o[2] < g.out[2]; ++o[2]) {
        std::array<int64_t, 3> start, first;
        for (int i = 0; i < 3; ++i) {
          start[i] = o[i] * g.s[i] - g.p[i];
          // The first in-range position of the window along dim i (dilation steps from start).
          first[i] = start[i] >= 0 ? start[i]
                                   : start[i] + ((-start[i] + g.d[i] - 1) / g.d[i]) * g.d[i];
        }
        int64_t first_flat = (first[0] * g.in[1] + first[1]) * g.in[2] + first[2];
        for (kk[0] = 0; kk[0] < g.k[0]; ++kk[0])
          for (kk[1] = 0; kk[1] < g.k[1]; ++kk[1])
            for (kk[2] = 0; kk[2] < g.k[2]; ++kk[2]) {
              bool inside = true;
              int64_t flat = 0;
              for (int i = 0; i < 3; ++i) {
                int64_t at = start[i] + kk[i] * g.d[i];
                inside = inside && at >= 0 && at < g.in[i];
                flat = flat * g.in[i] + at;
              }
              t.push_back(double(inside ? flat : (outside >= 0 ? outside : first_flat)));
            }
      }
  return upload_table(t, {int64_t(t.size())}, at::kLong);
}

// While torch.compile traces (a fake or functional input), tables are computed by tensor ops
// on the input's device with the same entries: an upload writes host memory into a tensor, and
// a fake one has none (avg_pool3d and the adaptive pools, so torchvision's video models,
// failed to trace).

// window_table's entries from each dim's window starts `start[i]` ([out_i] along axis i of 6)
// and positions `at[i]` (start plus kernel offsets, [out_i, k_i] along axes i and 3 + i),
// `inside[i]` where a position reads the input: `outside`, or with outside < 0 the window's
// first in-range element (`first[i]`, along axis i).
at::Tensor traced_table(const Pool3d& g, const std::array<at::Tensor, 3>& at_,
                        const std::array<at::Tensor, 3>& inside,
                        const std::array<at::Tensor, 3>& first, int64_t outside,
                        const at::Tensor& like) {
  auto flat = at_[0], in = inside[0], first_flat = first[0];
  for (int i = 1; i < 3; ++i) {
    flat = flat * g.in[i] + at_[i];
    in = in.logical_and(inside[i]);
    first_flat = first_flat * g.in[i] + first[i];
  }
  auto other = outside >= 0 ? at::full({}, outside, like.options().dtype(at::kLong)) : first_flat;
  return at::where(in, flat, other).reshape({-1});
}

at::Tensor window_table_traced(const Pool3d& g, int64_t outside, const at::Tensor& like) {
  std::array<at::Tensor, 3> at_, inside, first;
  for (int i = 0; i < 3; ++i) {
    auto start = table_axis(like, g.out[i], i, 6) * g.s[i] - g.p[i];
    at_[i] = start + table_axis(like, g.k[i], 3 + i, 6) * g.d[i];
    inside[i] = at_[i].ge(0).logical_and(at_[i].lt(g.in[i]));
    first[i] = at::where(start.ge(0), start,
                         start + at::div(-start + (g.d[i] - 1), g.d[i], "floor") * g.d[i]);
  }
  return traced_table(g, at_, inside, first, outside, like);
}

// The windows of x as [N, C, O, K], x padded with one zero after its volume when the table
// reads it.
at::Tensor windows(const at::Tensor& x5, const Pool3d& g, const at::Tensor& table, bool zero_slot) {
  int64_t n = x5.size(0), c = x5.size(1);
  auto flat = x5.reshape({n, c, volume(g.in)});
  if (zero_slot) flat = at::constant_pad_nd(flat, {0, 1}, 0);
  return flat.index_select(2, table).view({n, c, volume(g.out), volume(g.k)});
}

at::Tensor shaped(const at::Tensor& r, const at::Tensor& x, const Pool3d& g) {
  int64_t n = r.size(0), c = r.size(1);
  auto out = r.view({n, c, g.out[0], g.out[1], g.out[2]});
  return x.dim() == 4 ? out.squeeze(0) : out;
}

// Each window's maximum (the first, in window order) and its flat input index, gathered from
// the windows `table` reads. With `inside` ([windows, K], which table entries lie in their
// window), a window holding NaN takes its last NaN inside it, as CPU's adaptive max does (its
// scan takes every NaN it meets).
std::tuple<at::Tensor, at::Tensor> max_over(const at::Tensor& x, const Pool3d& g,
                                            const at::Tensor& table,
                                            const at::Tensor& inside = at::Tensor()) {
  auto x5 = x.dim() == 4 ? x.unsqueeze(0) : x;
  auto win = windows(x5, g, table, false);
  auto pos = win.argmax(-1, /*keepdim=*/true);
  if (inside.defined()) {
    auto nans = at::isnan(win).logical_and(inside).to(at::kFloat);
    auto last_nan = (volume(g.k) - 1) - nans.flip({-1}).argmax(-1, /*keepdim=*/true);
    pos = at::where(nans.amax(-1, /*keepdim=*/true).gt(0), last_nan, pos);
  }
  auto values = win.gather(-1, pos).squeeze(-1);
  auto indices = table.view({volume(g.out), volume(g.k)})
                     .unsqueeze(0).unsqueeze(0)
                     .expand({x5.size(0), x5.size(1), volume(g.out), volume(g.k)})
                     .gather(-1, pos).squeeze(-1);
  return {shaped(values, x, g), shaped(indices, x, g)};
}

// The geometry as the 2-D and 3-D max pools share it (pooling.h).
Pool as_pool(const Pool3d& g) {
  Pool p;
  for (int i = 0; i < 3; ++i) {
    p.in.push_back(g.in[i]);
    p.kernel.push_back(g.k[i]);
    p.stride.push_back(g.s[i]);
    p.padding.push_back(g.p[i]);
    p.dilation.push_back(g.d[i]);
    p.out.push_back(g.out[i]);
    p.after.push_back(padding_after(g.in[i], g.k[i], g.p[i], g.s[i], g.d[i], g.out[i]));
  }
  return p;
}

// Every window position a strided view of one padded buffer, as the 2-D max pool reads them:
// through a table and a gather ([N, C, O, K], then an argmax over rows of K) a C3D network's
// two max pools took ~7 ms of its ~30 ms training step.
std::tuple<at::Tensor, at::Tensor> max_pool3d_with_indices(
    const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef padding,
    at::IntArrayRef dilation, bool ceil_mode) {
  auto g = geometry(x, kernel, stride, padding, dilation, ceil_mode, false, "max_pool3d",
                    "max_pool3d_with_indices()");
  return max_pool_forward(x, as_pool(g));
}

at::Tensor max_pool3d_with_indices_backward(const at::Tensor& grad, const at::Tensor& x,
                                            at::IntArrayRef kernel, at::IntArrayRef stride,
                                            at::IntArrayRef padding, at::IntArrayRef dilation,
                                            bool ceil_mode, const at::Tensor& indices) {
  auto g = geometry(x, kernel, stride, padding, dilation, ceil_mode, false, "max_pool3d",
                    "max_pool3d_with_indices_backward()");
  return max_pool_backward(grad, x, indices, as_pool(g));
}

// Each window's divisor, as CPU's kernel counts it: the window cut at the padded end (with
// count_include_pad) or at the input (without), or the override; `sums`' dtype and device.
at::Tensor avg_divisors(const Pool3d& g, bool count_include_pad,
                        std::optional<int64_t> divisor_override, const at::Tensor& sums,
                        bool traced) {
  if (traced) {
    if (divisor_override) return at::full({volume(g.out)}, *divisor_override, sums.options());
    at::Tensor div;
    for (int i = 0; i < 3; ++i) {
      auto start = table_axis(sums, g.out[i], i, 3) * g.s[i] - g.p[i];
      auto end = at::clamp_max(start + g.k[i], g.in[i] + g.p[i]);
      auto n = count_include_pad ? end - start
                                 : at::clamp_max(end, g.in[i]) - at::clamp_min(start, 0);
      div = i == 0 ? n : div * n;
    }
    return div.reshape({-1}).to(sums.scalar_type());
  }
  std::vector<double> div;
  std::array<int64_t, 3> o{};
  for (o[0] = 0; o[0] < g.out[0]; ++o[0])
    for (o[1] = 0; o[1] < g.out[1]; ++o[1])
      for (o[2] = 0; o[2] < g.out[2]; ++o[2]) {
        int64_t padded = 1, real = 1;
        for (int i = 0; i < 3; ++i) {
          int64_t start = o[i] * g.s[i] - g.p[i];
          int64_t end = std::min(start + g.k[i], g.in[i] + g.p[i]);
          padded *= end - start;
          real *= std::min(end, g.in[i]) - std::max<int64_t>(start, 0);
        }
        div.push_back(double(divisor_override ? *divisor_override
                             : count_include_pad ? padded
                                                 : real));
      }
  return upload_table(div, {volume(g.out)}, sums.scalar_type());
}

at::Tensor avg_pool3d(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                      at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                      std::optional<int64_t> divisor_override) {
  TORCH_CHECK(!divisor_override || *divisor_override != 0, "divisor must be not zero");
  auto g = geometry(x, kernel, stride, padding, {}, ceil_mode, true, "avg_pool3d", "avg_pool3d()");
  auto x5 = x.dim() == 4 ? x.unsqueeze(0) : x;
  bool traced = !recordable(x);
  auto table = traced ? window_table_traced(g, volume(g.in), x) : window_table(g, volume(g.in));
  auto sums = windows(x5, g, table, true).sum(-1);
  auto out = window_mean(sums, avg_divisors(g, count_include_pad, divisor_override, sums, traced));
  return shaped(out, x, g);
}


// Adaptive pooling's windows: output position o along a dim covers input
// [floor(o * in / out), ceil((o + 1) * in / out)), as CPU's kernels do. The table's windows are
// the longest one's size; a shorter window's extra entries read `outside` (the zero slot), or
// with outside < 0 its first element. `sizes` receives each window's element count (x's dtype).
at::Tensor adaptive_table(Pool3d& g, const at::Tensor& x, at::IntArrayRef output_size,
                          int64_t outside, at::Tensor* sizes, const char* op) {
  TORCH_CHECK(output_size.size() == 3, op, ": output_size must be 3");
  TORCH_CHECK(x.dim() == 4 || x.dim() == 5, op, "(): Expected 4D or 5D tensor, but got ",
              x.sizes());
  for (int64_t i = x.dim() - 4; i < x.dim(); ++i) {
    TORCH_CHECK(x.size(i) > 0, op, "(): Expected input to have non-zero size for non-batch "
                "dimensions, but input has sizes ", x.sizes(), " with dimension ", i,
                " being empty");
  }
  std::array<std::vector<int64_t>, 3> starts, ends;
  for (int i = 0; i < 3; ++i) {
    g.in[i] = x.size(x.dim() - 3 + i);
    g.out[i] = output_size[i];
    g.k[i] = 0;
    for (int64_t o = 0; o < g.out[i]; ++o) {
      starts[i].push_back(o * g.in[i] / g.out[i]);
      ends[i].push_back(((o + 1) * g.in[i] + g.out[i] - 1) / g.out[i]);
      g.k[i] = std::max(g.k[i], ends[i].back() - starts[i].back());
    }
  }
  if (!recordable(x)) {
    std::array<at::Tensor, 3> at_, inside, first;
    at::Tensor count;
    for (int i = 0; i < 3; ++i) {
      auto o = table_axis(x, g.out[i], i, 6);
      auto start = at::div(o * g.in[i], g.out[i], "floor");
      auto end = at::div((o + 1) * g.in[i] + (g.out[i] - 1), g.out[i], "floor");
      at_[i] = start + table_axis(x, g.k[i], 3 + i, 6);
      inside[i] = at_[i].lt(end);
      first[i] = start;
      count = i == 0 ? end - start : count * (end - start);
    }
    if (sizes) *sizes = count.reshape({-1}).to(x.scalar_type());
    return traced_table(g, at_, inside, first, outside, x);
  }
  std::vector<double> t, counts;
  auto flat = [&](int64_t d, int64_t h, int64_t w) { return (d * g.in[1] + h) * g.in[2] + w; };
  for (int64_t a = 0; a < g.out[0]; ++a)
    for (int64_t b = 0; b < g.out[1]; ++b)
      for (int64_t c = 0; c < g.out[2]; ++c) {
        std::array<int64_t, 3> s0{starts[0][a], starts[1][b], starts[2][c]};
        std::array<int64_t, 3> e0{ends[0][a], ends[1][b], ends[2][c]};
        counts.push_back(double((e0[0] - s0[0]) * (e0[1] - s0[1]) * (e0[2] - s0[2])));
        for (int64_t i = 0; i < g.k[0]; ++i)
          for (int64_t j = 0; j < g.k[1]; ++j)
            for (int64_t l = 0; l < g.k[2]; ++l) {
              bool inside = s0[0] + i < e0[0] && s0[1] + j < e0[1] && s0[2] + l < e0[2];
              t.push_back(double(inside         ? flat(s0[0] + i, s0[1] + j, s0[2] + l)
                                 : outside >= 0 ? outside
                                                : flat(s0[0], s0[1], s0[2])));
            }
      }
  if (sizes) *sizes = upload_table(counts, {volume(g.out)}, x.scalar_type());
  return upload_table(t, {int64_t(t.size())}, at::kLong);
}

}  // namespace

at::Tensor adaptive_avg_pool3d(const at::Tensor& x, at::IntArrayRef output_size) {
  Pool3d g;
  at::Tensor sizes;
  int64_t zero_slot = x.dim() >= 4 ? x.size(-1) * x.size(-2) * x.size(-3) : 0;
  auto table = adaptive_table(g, x, output_size, zero_slot, &sizes, "adaptive_avg_pool3d");
  auto x5 = x.dim() == 4 ? x.unsqueeze(0) : x;
  auto sums = windows(x5, g, table, true).sum(-1);
  return shaped(sums / sizes, x, g);
}

// Adaptive max pooling: as max_pool3d over the adaptive windows, a shorter window's extra
// entries repeating its first element (CPU's starting index); a window's last NaN wins, as
// on CPU (the first did).
std::tuple<at::Tensor, at::Tensor> adaptive_max_pool3d(const at::Tensor& x,
                                                       at::IntArrayRef output_size) {
  Pool3d g;
  auto table = adaptive_table(g, x, output_size, -1, nullptr, "adaptive_max_pool3d");
  // The same windows with the entries past a shorter window pointing one past the input.
  const int64_t past = volume(g.in);
  auto marked = adaptive_table(g, x, output_size, past, nullptr, "adaptive_max_pool3d");
  return max_over(x, g, table, marked.lt(past).view({volume(g.out), volume(g.k)}));
}

}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("max_pool3d_with_indices", DFT_GROUPED(dft::max_pool3d_with_indices));
  m.impl("max_pool3d_with_indices_backward", DFT_GROUPED(dft::max_pool3d_with_indices_backward));
  m.impl("avg_pool3d", DFT_GROUPED(dft::avg_pool3d));
  m.impl("_adaptive_avg_pool3d", DFT_GROUPED(dft::adaptive_avg_pool3d));
  m.impl("adaptive_max_pool3d", DFT_GROUPED(dft::adaptive_max_pool3d));
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("avg_pool3d", DFT_GROUPED(dft::avg_pool3d));
  m.impl("_adaptive_avg_pool3d", DFT_GROUPED(dft::adaptive_avg_pool3d));
  m.impl("adaptive_max_pool3d", DFT_GROUPED(dft::adaptive_max_pool3d));
}
