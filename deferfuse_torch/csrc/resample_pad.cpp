// Nearest upsampling (1-D, 2-D; "nearest" and "nearest-exact") and reflect/replicate padding
// (1-D, 2-D), forward and backward. Each is an index_select per resized dim with a source-index
// table computed on the host from the shapes alone (as PyTorch's CPU kernels compute it), and
// each backward is an index_add per dim with the same tables, so both run on the device.
#include "kernel_ops.h"

#include <torch/library.h>

#include <cmath>

namespace dft {
namespace {

using Table = std::vector<int64_t>;

at::Tensor upload(const Table& t, const at::Tensor& like) {
  return at::tensor(t, at::TensorOptions().dtype(at::kLong)).to(like.device());
}

// out = x with dim d[k] replaced by x.select(d[k], table[k][i]) for each output index i.
at::Tensor pick(at::Tensor x, const std::vector<int64_t>& dims, const std::vector<Table>& tables) {
  for (size_t k = 0; k < dims.size(); ++k) x = at::index_select(x, dims[k], upload(tables[k], x));
  return x;
}

// The adjoint of pick: every output element's gradient added to the input element it came from.
at::Tensor unpick(at::Tensor g, at::IntArrayRef in_sizes, const std::vector<int64_t>& dims,
                  const std::vector<Table>& tables) {
  for (size_t k = dims.size(); k-- > 0;) {
    auto sizes = g.sizes().vec();
    sizes[dims[k]] = in_sizes[dims[k]];
    g = at::zeros(sizes, g.options()).index_add(dims[k], upload(tables[k], g), g);
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

at::Tensor upsample_nearest1d(const at::Tensor& x, c10::SymIntArrayRef out,
                              std::optional<double> s) {
  auto o = ints(out);
  return pick(x, last_dims(x.dim(), 1), nearest_tables(x.sizes(), o, {s}, false));
}

at::Tensor upsample_nearest1d_backward(const at::Tensor& g, c10::SymIntArrayRef out,
                                       c10::SymIntArrayRef in, std::optional<double> s) {
  auto i = ints(in), o = ints(out);
  return unpick(g, i, last_dims(g.dim(), 1), nearest_tables(i, o, {s}, false));
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

template <bool REFLECT>
at::Tensor pad(const at::Tensor& x, c10::SymIntArrayRef padding) {
  const char* op = REFLECT ? "reflection_pad" : "replication_pad";
  size_t n = padding.size() / 2;
  return pick(x, last_dims(x.dim(), n), pad_tables(x.sizes(), padding, REFLECT, op));
}

template <bool REFLECT>
at::Tensor pad_backward(const at::Tensor& g, const at::Tensor& self, c10::SymIntArrayRef padding) {
  const char* op = REFLECT ? "reflection_pad_backward" : "replication_pad_backward";
  size_t n = padding.size() / 2;
  return unpick(g, self.sizes(), last_dims(g.dim(), n),
                pad_tables(self.sizes(), padding, REFLECT, op));
}

at::Tensor xlogy(const at::Tensor& x, const at::Tensor& y) {
  // 0 where x == 0 (even for y == 0), NaN where y is NaN, else x * log(y), as on CPU.
  auto r = at::where(x.eq(0), at::zeros({}, x.options()), x * at::log(y));
  return at::where(y.isnan(), y, r);
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("upsample_nearest2d", TORCH_FN(dft::upsample_nearest2d));
  m.impl("upsample_nearest2d_backward", TORCH_FN(dft::upsample_nearest2d_backward));
  m.impl("_upsample_nearest_exact2d", TORCH_FN(dft::upsample_nearest_exact2d));
  m.impl("_upsample_nearest_exact2d_backward", TORCH_FN(dft::upsample_nearest_exact2d_backward));
  m.impl("upsample_nearest1d", TORCH_FN(dft::upsample_nearest1d));
  m.impl("upsample_nearest1d_backward", TORCH_FN(dft::upsample_nearest1d_backward));
  m.impl("reflection_pad1d", TORCH_FN(dft::pad<true>));
  m.impl("reflection_pad2d", TORCH_FN(dft::pad<true>));
  m.impl("replication_pad1d", TORCH_FN(dft::pad<false>));
  m.impl("replication_pad2d", TORCH_FN(dft::pad<false>));
  m.impl("reflection_pad1d_backward", TORCH_FN(dft::pad_backward<true>));
  m.impl("reflection_pad2d_backward", TORCH_FN(dft::pad_backward<true>));
  m.impl("replication_pad1d_backward", TORCH_FN(dft::pad_backward<false>));
  m.impl("replication_pad2d_backward", TORCH_FN(dft::pad_backward<false>));
  m.impl("xlogy.Tensor", TORCH_FN(dft::xlogy));
}
