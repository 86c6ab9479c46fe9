// Max pooling over any number of spatial dims (pooling.cpp): nn.MaxPool2d's and nn.MaxPool3d's
// forward and backward, every window position a strided view of one padded buffer, so neither
// a window copy nor a gather or scatter runs.
#pragma once

#include "common.h"

#include <algorithm>
#include <vector>

namespace dft {

// One pooling's geometry, one entry per spatial dim: `after` is the padding behind each dim
// the buffer needs (see padding_after).
struct Pool {
  std::vector<int64_t> in, kernel, stride, padding, dilation, out, after;
};

// The padding behind a dim of `in` elements: `pad`, or more where ceil_mode pushes the last of
// the `out` windows past it (the buffer must hold it).
inline int64_t padding_after(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil,
                             int64_t out) {
  return std::max<int64_t>(pad, (out - 1) * stride + dil * (k - 1) + 1 - in - pad);
}

// Each window's maximum over x ([C, spatial...] or [N, C, spatial...]) and its flat input
// index, as PyTorch's CPU kernel picks them (the first maximum in window order, or the last
// NaN; a padding position never wins).
std::tuple<at::Tensor, at::Tensor> max_pool_forward(const at::Tensor& x, const Pool& p);

// The input's gradient: each output's gradient added at the element its index names.
at::Tensor max_pool_backward(const at::Tensor& grad, const at::Tensor& x,
                             const at::Tensor& indices, const Pool& p);

// Adaptive average and max pooling over x's last three dims ([C, D, H, W] or [N, C, D, H, W];
// pool3d.cpp): every window gathered through a table of its elements in PyTorch's order. The
// 2-D ones run their uneven windows through these at a depth of 1.
at::Tensor adaptive_avg_pool3d(const at::Tensor& x, at::IntArrayRef output_size);
std::tuple<at::Tensor, at::Tensor> adaptive_max_pool3d(const at::Tensor& x,
                                                       at::IntArrayRef output_size);

}  // namespace dft
