// Backward formulas of the activations (what autograd calls for relu, gelu, tanh, sigmoid,
// silu), and the composite activations (softplus, leaky_relu, elu, hardtanh/relu6, hardswish,
// hardsigmoid, mish, log_sigmoid, prelu, glu) with theirs, written as recorded elementwise ops so they fuse
// with their neighbours in defer mode. Each follows PyTorch's CPU formula, branch for branch
// (which side of a boundary a point belongs to decides its gradient).
// They call ATen operators on tpu tensors: those dispatch straight to this device's kernels
// (autograd is already below us here), so no op reaches the CPU fallback.
#include "common.h"

#include <cmath>
#include <torch/library.h>

namespace dft {
namespace {

// float16 and bfloat16: PyTorch's CPU kernels compute the activations below (the composed
// ones and the backward formulas) in float32 and round once, so these run through
// rounded_once (common.h). Recorded op by op in the half type, every op rounded: a bf16 GELU
// backward differed from CPU's in half its elements (by up to hundreds of ulps where its two
// terms cancel), and each rounding cost the JIT ~10 instructions per four elements; the casts
// to and from float32 fuse into the same loop.

at::Tensor threshold_backward(const at::Tensor& grad, const at::Tensor& self,
                              const at::Scalar& threshold) {
  // PyTorch: grad where self > threshold, else 0.
  return run(DFUSE_OP_KIND_WHERE, nullptr,
             Operands().t(binary(self, threshold, DFUSE_BINARY_OP_LE)).s(at::Scalar(0)).t(grad),
             "threshold_backward");
}

at::Tensor gelu_backward_math(const at::Tensor& grad, const at::Tensor& x,
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

at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& x,
                         c10::string_view approximate) {
  return rounded_once(grad, x, [&](const at::Tensor& g, const at::Tensor& xf) {
    return gelu_backward_math(g, xf, approximate);
  });
}

at::Tensor tanh_backward(const at::Tensor& grad, const at::Tensor& out) {
  return rounded_once(grad, out, [](const at::Tensor& g, const at::Tensor& y) {
    return g * (1.0 - y * y);
  });
}

at::Tensor sigmoid_backward(const at::Tensor& grad, const at::Tensor& out) {
  // CPU's order, (g * (1 - y)) * y: the other association differs in the last bit.
  auto formula = [](const at::Tensor& g, const at::Tensor& y) { return g * (1.0 - y) * y; };
  // CPU computes float16 op by op in float16 (bfloat16 in float32, rounded once): rounded once,
  // a third of float16's elements differed in the last bit.
  if (out.scalar_type() == at::kHalf) return formula(grad, out);
  return rounded_once(grad, out, formula);
}

at::Tensor silu_backward(const at::Tensor& grad, const at::Tensor& x) {
  return rounded_once(grad, x, [](const at::Tensor& g, const at::Tensor& xf) {
    auto s = at::sigmoid(xf);
    return g * (s * (1.0 + xf * (1.0 - s)));
  });
}


at::Tensor softplus(const at::Tensor& x, const at::Scalar& beta, const at::Scalar& threshold) {
  return rounded_once(x, [&](const at::Tensor& xf) {
    auto xb = xf * beta;
    return at::where(xb > threshold, xf, at::log1p(at::exp(xb)) / beta);
  });
}

at::Tensor softplus_backward(const at::Tensor& grad, const at::Tensor& x, const at::Scalar& beta,
                             const at::Scalar& threshold) {
  return rounded_once(grad, x, [&](const at::Tensor& g, const at::Tensor& xf) {
    auto xb = xf * beta;
    auto z = at::exp(xb);
    return at::where(xb > threshold, g, g * z / (z + 1.0));
  });
}

at::Tensor leaky_relu(const at::Tensor& x, const at::Scalar& slope) {
  return at::where(x > 0, x, x * slope);
}

at::Tensor& leaky_relu_(at::Tensor& x, const at::Scalar& slope) {
  return x.copy_(dft::leaky_relu(x, slope));
}

at::Tensor leaky_relu_backward(const at::Tensor& grad, const at::Tensor& self,
                               const at::Scalar& slope, bool self_is_result) {
  TORCH_CHECK(!self_is_result || slope.toDouble() >= 0.0, "In-place leakyReLu backward "
              "calculation is triggered with a negative slope which is not supported.");
  return at::where(self > 0, grad, grad * slope);
}

// rrelu (nn.RReLU): in training each negative element's slope is drawn from U(lower, upper)
// and kept in `noise` (1 where x >= 0) for the backward; in evaluation the slope is
// (lower + upper) / 2, a leaky_relu (CPU's formulas; the draws are the device's stream).
at::Tensor& rrelu_with_noise_(at::Tensor& x, at::Tensor& noise, const at::Scalar& lower,
                              const at::Scalar& upper, bool training,
                              std::optional<at::Generator> gen) {
  double lo = lower.toDouble(), hi = upper.toDouble();
  if (!training) return dft::leaky_relu_(x, (lo + hi) / 2);
  auto slopes = at::empty_like(x).uniform_(lo, hi, gen);
  noise.copy_(at::where(x >= 0, at::ones({}, x.options()), slopes));
  return x.copy_(x * noise);
}

at::Tensor rrelu_with_noise(const at::Tensor& x, at::Tensor& noise, const at::Scalar& lower,
                            const at::Scalar& upper, bool training,
                            std::optional<at::Generator> gen) {
  // Dense whatever x's layout, as CPU's out-of-place rrelu writes it.
  auto r = x.clone(at::MemoryFormat::Contiguous);
  return dft::rrelu_with_noise_(r, noise, lower, upper, training, gen);
}

at::Tensor rrelu_with_noise_backward(const at::Tensor& grad, const at::Tensor& x,
                                     const at::Tensor& noise, const at::Scalar& lower,
                                     const at::Scalar& upper, bool training, bool self_is_result) {
  double lo = lower.toDouble(), hi = upper.toDouble();
  if (training && hi - lo > 1e-6) return grad * noise;
  return dft::leaky_relu_backward(grad, x, (lo + hi) / 2, self_is_result);
}

// elu: x * scale for x > 0, else expm1(x * input_scale) * alpha * scale.
at::Tensor elu(const at::Tensor& x, const at::Scalar& alpha, const at::Scalar& scale,
               const at::Scalar& input_scale) {
  double negcoef = alpha.toDouble() * scale.toDouble();
  return rounded_once(x, [&](const at::Tensor& xf) {
    return at::where(xf <= 0, at::expm1(xf * input_scale) * negcoef, xf * scale);
  });
}

at::Tensor& elu_(at::Tensor& x, const at::Scalar& alpha, const at::Scalar& scale,
                 const at::Scalar& input_scale) {
  return x.copy_(dft::elu(x, alpha, scale, input_scale));
}

at::Tensor elu_backward(const at::Tensor& grad, const at::Scalar& alpha, const at::Scalar& scale,
                        const at::Scalar& input_scale, bool is_result, const at::Tensor& y) {
  double negcoef = alpha.toDouble() * scale.toDouble(), negiptcoef = input_scale.toDouble();
  TORCH_CHECK(!is_result || alpha.toDouble() >= 0.0, "In-place elu backward calculation is "
              "triggered with a negative slope which is not supported.");
  return rounded_once(grad, y, [&](const at::Tensor& g, const at::Tensor& yf) {
    if (is_result) return at::where(yf <= 0, g * negiptcoef * (yf + negcoef), g * scale);
    return at::where(yf <= 0, g * negiptcoef * negcoef * at::exp(yf * negiptcoef), g * scale);
  });
}

at::Tensor hardtanh(const at::Tensor& x, const at::Scalar& lo, const at::Scalar& hi) {
  // The result keeps x's dtype (an integer tensor stays one), as CPU's hardtanh_out.
  return cast(at::clamp(x, lo, hi), x.scalar_type());
}

at::Tensor& hardtanh_(at::Tensor& x, const at::Scalar& lo, const at::Scalar& hi) {
  return at::clamp_(x, lo, hi);
}

at::Tensor hardtanh_backward(const at::Tensor& grad, const at::Tensor& x, const at::Scalar& lo,
                             const at::Scalar& hi) {
  return dft::where((x <= lo).logical_or(x >= hi).logical_not(), grad, 0);
}

at::Tensor hardsigmoid(const at::Tensor& x) {
  return rounded_once(x, [](const at::Tensor& xf) { return at::clamp(xf + 3.0, 0.0, 6.0) / 6.0; });
}

at::Tensor& hardsigmoid_(at::Tensor& x) { return x.copy_(dft::hardsigmoid(x)); }

at::Tensor hardsigmoid_backward(const at::Tensor& grad, const at::Tensor& x) {
  return dft::where((x > -3.0).logical_and(x < 3.0), grad / 6.0, 0);
}

at::Tensor hardswish(const at::Tensor& x) {
  return rounded_once(x, [](const at::Tensor& xf) {
    return xf * at::clamp(xf + 3.0, 0.0, 6.0) / 6.0;
  });
}

at::Tensor& hardswish_(at::Tensor& x) { return x.copy_(dft::hardswish(x)); }

at::Tensor hardswish_backward(const at::Tensor& grad, const at::Tensor& x) {
  // PyTorch: 0 for x <= -3, grad * (x / 3 + 0.5) for -3 < x < 3, grad from 3 on.
  return rounded_once(grad, x, [](const at::Tensor& g, const at::Tensor& xf) {
    auto middle = at::where(xf < 3.0, g * (xf / 3.0 + 0.5), g);
    return dft::where((xf <= -3.0).logical_not(), middle, 0);
  });
}

at::Tensor mish(const at::Tensor& x) {
  return rounded_once(x, [](const at::Tensor& xf) { return xf * at::tanh(at::log1p(at::exp(xf))); });
}

at::Tensor& mish_(at::Tensor& x) { return x.copy_(dft::mish(x)); }

at::Tensor mish_backward(const at::Tensor& grad, const at::Tensor& x) {
  return rounded_once(grad, x, [](const at::Tensor& g, const at::Tensor& xf) {
    auto sig = at::reciprocal(at::exp(at::neg(xf)) + 1.0);
    auto tsp = at::tanh(at::log1p(at::exp(xf)));
    return g * (tsp + xf * sig * (1.0 - tsp * tsp));
  });
}

// log_sigmoid(x) = min(x, 0) - log1p(exp(-|x|)); the buffer keeps exp(-|x|) for backward.
std::tuple<at::Tensor, at::Tensor> log_sigmoid_forward(const at::Tensor& x) {
  auto z = at::exp(at::neg(at::abs(x)));
  return {at::clamp_max(x, 0.0) - at::log1p(z), z};
}

at::Tensor log_sigmoid_backward(const at::Tensor& grad, const at::Tensor& x,
                                const at::Tensor& buffer) {
  auto t = buffer / (buffer + 1.0);
  return at::where(x < 0, 1.0 - t, t) * grad;
}

// prelu with the weight already broadcast to x by the composite prelu; the weight gradient is
// per element (autograd sums it to the weight's shape).
at::Tensor prelu(const at::Tensor& x, const at::Tensor& weight) {
  return at::where(x > 0, x, weight * x);
}

std::tuple<at::Tensor, at::Tensor> prelu_backward(const at::Tensor& grad, const at::Tensor& x,
                                                  const at::Tensor& weight) {
  auto pos = x > 0;
  return {at::where(pos, grad, weight * grad), dft::where(pos.logical_not(), x * grad, 0)};
}

// glu: the first half of `dim` gated by the sigmoid of the second.
at::Tensor glu(const at::Tensor& x, int64_t dim) {
  TORCH_CHECK(x.size(dim) % 2 == 0, "Halving dimension must be even, but dimension ", dim,
              " is size ", x.size(dim));
  auto halves = x.chunk(2, dim);
  return halves[0] * at::sigmoid(halves[1]);
}

at::Tensor glu_backward(const at::Tensor& grad, const at::Tensor& x, int64_t dim) {
  auto halves = x.chunk(2, dim);
  auto sig = at::sigmoid(halves[1]);
  auto grad_a = grad * sig;
  auto grad_b = grad_a * halves[0] * (1.0 - sig);
  return at::cat({grad_a, grad_b}, dim);
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("threshold_backward", DFT_GROUPED(dft::threshold_backward));
  m.impl("gelu_backward", DFT_GROUPED(dft::gelu_backward));
  m.impl("tanh_backward", DFT_GROUPED(dft::tanh_backward));
  m.impl("sigmoid_backward", DFT_GROUPED(dft::sigmoid_backward));
  m.impl("silu_backward", DFT_GROUPED(dft::silu_backward));
  m.impl("softplus", DFT_GROUPED(dft::softplus));
  m.impl("softplus_backward", DFT_GROUPED(dft::softplus_backward));
  m.impl("leaky_relu", DFT_GROUPED(dft::leaky_relu));
  m.impl("leaky_relu_", DFT_GROUPED(dft::leaky_relu_));
  m.impl("leaky_relu_backward", DFT_GROUPED(dft::leaky_relu_backward));
  m.impl("rrelu_with_noise", DFT_GROUPED(dft::rrelu_with_noise));
  m.impl("rrelu_with_noise_", DFT_GROUPED(dft::rrelu_with_noise_));
  m.impl("rrelu_with_noise_backward", DFT_GROUPED(dft::rrelu_with_noise_backward));
  m.impl("elu", DFT_GROUPED(dft::elu));
  m.impl("elu_", DFT_GROUPED(dft::elu_));
  m.impl("elu_backward", DFT_GROUPED(dft::elu_backward));
  m.impl("hardtanh", TORCH_FN(dft::hardtanh));
  m.impl("hardtanh_", TORCH_FN(dft::hardtanh_));
  m.impl("hardtanh_backward", DFT_GROUPED(dft::hardtanh_backward));
  m.impl("hardsigmoid", DFT_GROUPED(dft::hardsigmoid));
  m.impl("hardsigmoid_", DFT_GROUPED(dft::hardsigmoid_));
  m.impl("hardsigmoid_backward", DFT_GROUPED(dft::hardsigmoid_backward));
  m.impl("hardswish", DFT_GROUPED(dft::hardswish));
  m.impl("hardswish_", DFT_GROUPED(dft::hardswish_));
  m.impl("hardswish_backward", DFT_GROUPED(dft::hardswish_backward));
  m.impl("mish", DFT_GROUPED(dft::mish));
  m.impl("mish_", DFT_GROUPED(dft::mish_));
  m.impl("mish_backward", DFT_GROUPED(dft::mish_backward));
  m.impl("log_sigmoid_forward", DFT_GROUPED(dft::log_sigmoid_forward));
  m.impl("log_sigmoid_backward", DFT_GROUPED(dft::log_sigmoid_backward));
  m.impl("_prelu_kernel", DFT_GROUPED(dft::prelu));
  m.impl("_prelu_kernel_backward", DFT_GROUPED(dft::prelu_backward));
  m.impl("glu", DFT_GROUPED(dft::glu));
  m.impl("glu_backward", DFT_GROUPED(dft::glu_backward));
}
