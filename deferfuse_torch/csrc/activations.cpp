// Backward formulas of the activations (what autograd calls for relu, gelu, tanh, sigmoid,
// silu), written as recorded elementwise ops so they fuse with their neighbours in defer mode.
// They call ATen operators on tpu tensors: those dispatch straight to this device's kernels
// (autograd is already below us here), so no op reaches the CPU fallback.
#include "common.h"

#include <cmath>
#include <torch/library.h>

namespace dft {
namespace {

at::Tensor threshold_backward(const at::Tensor& grad, const at::Tensor& self,
                              const at::Scalar& threshold) {
  // PyTorch: grad where self > threshold, else 0.
  return run(DFUSE_OP_KIND_WHERE, nullptr,
             Operands().t(binary(self, threshold, DFUSE_BINARY_OP_LE)).s(at::Scalar(0)).t(grad),
             "threshold_backward");
}

at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& x,
                         c10::string_view approximate) {
  if (approximate == "tanh") {
    const double kBeta = M_SQRT2 * M_2_SQRTPI * 0.5, kKappa = 0.044715;
    auto x_sq = x * x;
    auto inner = (x + x_sq * x * kKappa) * kBeta;
    auto t = at::tanh(inner);
    auto left = x * 0.5;
    auto right = t + 1.0;
    auto left_d = right * 0.5;
    auto right_d = (1.0 - t * t) * ((x_sq * (3.0 * kKappa) + 1.0) * kBeta);
    return grad * (left_d + left * right_d);
  }
  TORCH_CHECK(approximate == "none", "tpu: gelu approximate must be 'none' or 'tanh', got '",
              approximate, "'");
  const double kAlpha = M_SQRT1_2, kBeta = M_2_SQRTPI * M_SQRT1_2 * 0.5;
  auto cdf = (at::erf(x * kAlpha) + 1.0) * 0.5;
  auto pdf = at::exp(x * x * -0.5) * kBeta;
  return grad * (cdf + x * pdf);
}

at::Tensor tanh_backward(const at::Tensor& grad, const at::Tensor& out) {
  return grad * (1.0 - out * out);
}

at::Tensor sigmoid_backward(const at::Tensor& grad, const at::Tensor& out) {
  return grad * ((1.0 - out) * out);
}

at::Tensor silu_backward(const at::Tensor& grad, const at::Tensor& x) {
  auto s = at::sigmoid(x);
  return grad * (s * (1.0 + x * (1.0 - s)));
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("threshold_backward", TORCH_FN(dft::threshold_backward));
  m.impl("gelu_backward", TORCH_FN(dft::gelu_backward));
  m.impl("tanh_backward", TORCH_FN(dft::tanh_backward));
  m.impl("sigmoid_backward", TORCH_FN(dft::sigmoid_backward));
  m.impl("silu_backward", TORCH_FN(dft::silu_backward));
}
