// Sliding-window plumbing (see windows.h).
#include "windows.h"

#include <algorithm>
#include <numeric>

namespace dft {

at::Tensor pad_spatial(const at::Tensor& x, at::IntArrayRef before, at::IntArrayRef after,
                       const at::Scalar& fill) {
  int64_t d = before.size(), lead = x.dim() - d;
  bool any = false;
  std::vector<int64_t> sizes = x.sizes().vec();
  for (int64_t i = 0; i < d; ++i) {
    sizes[lead + i] += before[i] + after[i];
    any = any || before[i] != 0 || after[i] != 0;
  }
  if (!any) return x;
  auto buf = at::full(sizes, fill, x.options());
  unpad_spatial(buf, before, x.sizes().slice(lead)).copy_(x);
  return buf;
}

at::Tensor unpad_spatial(const at::Tensor& buf, at::IntArrayRef before, at::IntArrayRef sizes) {
  int64_t lead = buf.dim() - static_cast<int64_t>(before.size());
  at::Tensor v = buf;
  for (size_t i = 0; i < before.size(); ++i) v = v.narrow(lead + i, before[i], sizes[i]);
  return v;
}

at::Tensor window_view(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                       at::IntArrayRef dilation, at::IntArrayRef out) {
  int64_t d = kernel.size(), lead = x.dim() - d;
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().begin() + lead);
  std::vector<int64_t> strides(x.strides().begin(), x.strides().begin() + lead);
  for (int64_t i = 0; i < d; ++i) {
    sizes.push_back(kernel[i]);
    strides.push_back(dilation[i] * x.stride(lead + i));
  }
  for (int64_t i = 0; i < d; ++i) {
    sizes.push_back(out[i]);
    strides.push_back(stride[i] * x.stride(lead + i));
  }
  return x.as_strided(sizes, strides, x.storage_offset());
}

// See walk_order: measured between layer 4's 4 positions and layer 3's 16.
constexpr int64_t kMinPositionsPerCall = 8;

std::vector<int64_t> walk_order(at::IntArrayRef sizes, int64_t lead, int64_t positions) {
  int64_t rank = sizes.size(), middle_end = rank - positions;
  std::vector<int64_t> order(rank);
  std::iota(order.begin(), order.end(), 0);
  auto span = [&](int64_t from, int64_t to) {
    return c10::multiply_integers(sizes.begin() + from, sizes.begin() + to);
  };
  if (span(middle_end, rank) >= kMinPositionsPerCall) return order;
  std::rotate(order.begin(), order.begin() + lead, order.end());
  return order;
}

void copy_windows(const at::Tensor& dst, const at::Tensor& src, int64_t d) {
  auto order = walk_order(src.sizes(), src.dim() - 2 * d, d);
  dst.permute(order).copy_(src.permute(order));
}

at::Tensor add_windows(const at::Tensor& contrib, at::IntArrayRef buf_spatial,
                       at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef dilation) {
  int64_t d = kernel.size(), lead = contrib.dim() - 2 * d;
  std::vector<int64_t> sizes(contrib.sizes().begin(), contrib.sizes().begin() + lead);
  sizes.insert(sizes.end(), buf_spatial.begin(), buf_spatial.end());
  auto buf = at::zeros(sizes, contrib.options());
  auto out = contrib.sizes().slice(lead + d);
  int64_t n = c10::multiply_integers(kernel);
  for (int64_t flat = 0; flat < n; ++flat) {
    // flat -> the kernel offset (k_0, ..., k_{d-1}), last dim fastest.
    std::vector<int64_t> k(d);
    for (int64_t i = d, rest = flat; i-- > 0; rest /= kernel[i]) k[i] = rest % kernel[i];
    std::vector<int64_t> vs(sizes.begin(), sizes.begin() + lead), vst(buf.strides().begin(),
                                                                      buf.strides().begin() + lead);
    int64_t offset = 0;
    at::Tensor part = contrib;
    for (int64_t i = 0; i < d; ++i) {
      vs.push_back(out[i]);
      vst.push_back(stride[i] * buf.stride(lead + i));
      offset += k[i] * dilation[i] * buf.stride(lead + i);
      part = part.select(lead, k[i]);
    }
    auto order = walk_order(part.sizes(), lead, d);
    buf.as_strided(vs, vst, offset).permute(order).add_(part.permute(order));
  }
  return buf;
}

at::Tensor batched_matmul(const at::Tensor& a, const at::Tensor& b) {
  return run(DFUSE_OP_KIND_MATMUL, nullptr, Operands().t(a).t(b), "matmul");
}

std::vector<int64_t> expand_param(at::IntArrayRef v, int64_t d, const char* op, const char* name) {
  TORCH_CHECK(v.size() == 1 || static_cast<int64_t>(v.size()) == d, op, ": expected ", name,
              " to have 1 or ", d, " values, got ", v);
  return v.size() == 1 ? std::vector<int64_t>(d, v[0]) : v.vec();
}

at::Tensor window_mean(const at::Tensor& sums, const at::Tensor& divisors) {
  if (at::isFloatingType(sums.scalar_type())) return sums / divisors;
  return at::div(sums, divisors, "trunc");
}

}  // namespace dft
