// Convolution (1-D, 2-D, 3-D; stride, padding, dilation, groups, bias) forward and backward as
// im2col + batched matmul: the padded input's windows are a free as_strided view
// [N, C, k..., out...], copied once into columns [N, G, Cg*K, L] and multiplied by the weight
// viewed as [G, OCg, Cg*K]. Backward reuses the same pieces: grad_weight is one matmul of
// grad_output with the columns over the batch, grad_input is W^T @ grad_output scattered back by
// add_windows (K in-place strided adds, no scatter op needed).
#include "windows.h"

#include <torch/library.h>

namespace dft {
namespace {

struct Geometry {
  int64_t N, C, OC, G, Cg, OCg, K, L;
  std::vector<int64_t> in, kernel, stride, padding, dilation, out;
};

Geometry geometry(const at::Tensor& x, const at::Tensor& w, at::IntArrayRef stride,
                  at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  int64_t d = x.dim() - 2;
  TORCH_CHECK(d >= 1 && d <= 3, "tpu: convolution expects a 3-D, 4-D or 5-D input [N, C, ...], got "
              "shape ", x.sizes());
  TORCH_CHECK(w.dim() == x.dim(), "tpu: convolution weight of shape ", w.sizes(),
              " does not match an input of shape ", x.sizes());
  Geometry g;
  g.N = x.size(0);
  g.C = x.size(1);
  g.OC = w.size(0);
  g.G = groups;
  TORCH_CHECK(groups > 0 && g.C % groups == 0 && g.OC % groups == 0,
              "tpu: convolution groups=", groups, " must divide the input channels ", g.C,
              " and output channels ", g.OC);
  g.Cg = g.C / groups;
  g.OCg = g.OC / groups;
  TORCH_CHECK(w.size(1) == g.Cg, "tpu: convolution weight of shape ", w.sizes(), " expects ",
              w.size(1) * groups, " input channels, got ", g.C);
  g.stride = expand_param(stride, d, "convolution", "stride");
  g.padding = expand_param(padding, d, "convolution", "padding");
  g.dilation = expand_param(dilation, d, "convolution", "dilation");
  g.K = 1;
  g.L = 1;
  for (int64_t i = 0; i < d; ++i) {
    g.in.push_back(x.size(2 + i));
    g.kernel.push_back(w.size(2 + i));
    int64_t span = g.dilation[i] * (g.kernel[i] - 1) + 1;
    int64_t o = (g.in[i] + 2 * g.padding[i] - span) / g.stride[i] + 1;
    TORCH_CHECK(g.in[i] + 2 * g.padding[i] >= span && o > 0, "tpu: convolution kernel of size ",
                w.sizes().slice(2), " (dilation ", dilation, ") is larger than the padded input ",
                x.sizes().slice(2));
    g.out.push_back(o);
    g.K *= g.kernel[i];
    g.L *= o;
  }
  return g;
}

at::Tensor batched_matmul(const at::Tensor& a, const at::Tensor& b) {
  return run(DFUSE_OP_KIND_MATMUL, nullptr, Operands().t(a).t(b), "convolution matmul");
}

std::vector<int64_t> padded_sizes(const Geometry& g) {
  std::vector<int64_t> s;
  for (size_t i = 0; i < g.in.size(); ++i) s.push_back(g.in[i] + 2 * g.padding[i]);
  return s;
}

// The input's windows as columns [N, G, Cg*K, L].
at::Tensor im2col(const at::Tensor& x, const Geometry& g) {
  auto xp = pad_spatial(x, g.padding, g.padding, 0);
  return window_view(xp, g.kernel, g.stride, g.dilation, g.out).reshape({g.N, g.G, g.Cg * g.K, g.L});
}

at::Tensor convolution(const at::Tensor& x, const at::Tensor& w,
                       const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                       at::IntArrayRef output_padding, int64_t groups) {
  TORCH_CHECK_NOT_IMPLEMENTED(!transposed, "tpu: transposed convolution (conv_transpose1d/2d/3d) "
                              "is not supported by the tpu device yet");
  auto g = geometry(x, w, stride, padding, dilation, groups);
  auto out = batched_matmul(w.reshape({g.G, g.OCg, g.Cg * g.K}), im2col(x, g));  // [N, G, OCg, L]
  std::vector<int64_t> shape{g.N, g.OC};
  shape.insert(shape.end(), g.out.begin(), g.out.end());
  out = out.view(shape);
  if (bias && bias->defined()) {
    std::vector<int64_t> bshape(shape.size(), 1);
    bshape[1] = g.OC;
    out = out + bias->view(bshape);
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& w, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
    at::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> mask) {
  TORCH_CHECK_NOT_IMPLEMENTED(!transposed, "tpu: the backward of transposed convolution "
                              "(conv_transpose1d/2d/3d) is not supported by the tpu device yet");
  auto g = geometry(x, w, stride, padding, dilation, groups);
  auto go = grad.reshape({g.N, g.G, g.OCg, g.L});
  at::Tensor gx, gw, gb;
  if (mask[0]) {
    auto wt = w.reshape({g.G, g.OCg, g.Cg * g.K}).transpose(1, 2);
    std::vector<int64_t> shape{g.N, g.C};
    shape.insert(shape.end(), g.kernel.begin(), g.kernel.end());
    shape.insert(shape.end(), g.out.begin(), g.out.end());
    auto contrib = batched_matmul(wt, go).view(shape);  // [N, C, k..., out...]
    auto buf = add_windows(contrib, padded_sizes(g), g.kernel, g.stride, g.dilation);
    gx = buf.sizes().equals(x.sizes()) ? buf : unpad_spatial(buf, g.padding, g.in).contiguous();
  }
  if (mask[1]) {
    // One matmul over all (sample, position) pairs: [G, OCg, N*L] @ [G, N*L, Cg*K].
    auto gos = go.permute({1, 2, 0, 3}).reshape({g.G, g.OCg, g.N * g.L});
    auto cols = im2col(x, g).permute({1, 0, 3, 2}).reshape({g.G, g.N * g.L, g.Cg * g.K});
    gw = batched_matmul(gos, cols).view(w.sizes());
  }
  if (mask[2]) {
    std::vector<int64_t> dims{0};
    for (int64_t i = 2; i < grad.dim(); ++i) dims.push_back(i);
    gb = reduce(grad, DFUSE_REDUCE_OP_SUM, dims, false);
  }
  return {gx, gw, gb};
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN(dft::convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(dft::convolution_backward));
}
