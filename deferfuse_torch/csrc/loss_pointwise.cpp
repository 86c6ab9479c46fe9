// Elementwise losses, forward and backward: smooth_l1, huber, binary_cross_entropy (on
// probabilities) and soft_margin. Each follows PyTorch's CPU formula, including which branch a
// boundary point takes and the order of the final scaling, so results match to rounding.
#include "common.h"

#include <torch/library.h>

namespace dft {
namespace {

enum { kNone = 0, kMean = 1, kSum = 2 };

at::Tensor reduced(const at::Tensor& loss, int64_t reduction) {
  TORCH_CHECK(reduction >= kNone && reduction <= kSum, "tpu: unknown loss reduction ", reduction);
  if (reduction == kNone) return loss;
  return reduce(loss, reduction == kMean ? DFUSE_REDUCE_OP_MEAN : DFUSE_REDUCE_OP_SUM, {}, false);
}

// What backward scales each element's gradient by: 1/numel for a mean.
double norm_of(const at::Tensor& self, int64_t reduction) {
  return reduction == kMean ? 1.0 / double(self.numel()) : 1.0;
}

at::Tensor smooth_l1_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction,
                          double beta) {
  TORCH_CHECK(beta >= 0, "smooth_l1_loss does not support negative values for beta.");
  auto z = at::abs(self - target);
  // beta == 0 is the l1 loss: the quadratic branch is never taken.
  return reduced(at::where(z < beta, z * z * 0.5 / beta, z - 0.5 * beta), reduction);
}

at::Tensor smooth_l1_loss_backward(const at::Tensor& grad, const at::Tensor& self,
                                   const at::Tensor& target, int64_t reduction, double beta) {
  double norm = norm_of(self, reduction);
  auto x = self - target;
  auto inner = at::where(x >= beta, grad * norm, x * norm * grad / beta);
  return at::where(x <= -beta, grad * -norm, inner);
}

at::Tensor huber_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction,
                      double delta) {
  TORCH_CHECK(delta > 0, "huber_loss does not support non-positive values for delta.");
  auto z = at::abs(self - target);
  return reduced(at::where(z < delta, z * z * 0.5, (z - 0.5 * delta) * delta), reduction);
}

at::Tensor huber_loss_backward(const at::Tensor& grad, const at::Tensor& self,
                               const at::Tensor& target, int64_t reduction, double delta) {
  double norm = norm_of(self, reduction);
  auto x = self - target;
  auto inner = at::where(x >= delta, grad * norm * delta, x * norm * grad);
  return at::where(x <= -delta, grad * -norm * delta, inner);
}

// -w (y log(x) + (1 - y) log(1 - x)), each log clamped at -100 as PyTorch does.
at::Tensor binary_cross_entropy(const at::Tensor& self, const at::Tensor& target,
                                const std::optional<at::Tensor>& weight, int64_t reduction) {
  TORCH_CHECK(self.sizes().equals(target.sizes()), "binary_cross_entropy: the target size ",
              target.sizes(), " must be the same as the input size ", self.sizes());
  auto log_x = at::clamp_min(at::log(self), -100.0);
  auto log_1mx = at::clamp_min(at::log1p(at::neg(self)), -100.0);
  auto loss = (target - 1.0) * log_1mx - target * log_x;
  if (weight && weight->defined()) loss = loss * *weight;
  return reduced(loss, reduction);
}

at::Tensor binary_cross_entropy_backward(const at::Tensor& grad, const at::Tensor& self,
                                         const at::Tensor& target,
                                         const std::optional<at::Tensor>& weight,
                                         int64_t reduction) {
  const double kEpsilon = 1e-12;
  auto g = grad * (self - target) / at::clamp_min((1.0 - self) * self, kEpsilon);
  if (weight && weight->defined()) g = g * *weight;
  if (reduction == kMean) g = g / double(self.numel());
  return g;
}

at::Tensor soft_margin_loss(const at::Tensor& self, const at::Tensor& target,
                            int64_t reduction) {
  return reduced(at::log1p(at::exp(at::neg(self) * target)), reduction);
}

at::Tensor soft_margin_loss_backward(const at::Tensor& grad, const at::Tensor& self,
                                     const at::Tensor& target, int64_t reduction) {
  auto z = at::exp(at::neg(target) * self);
  return target * z * -norm_of(self, reduction) / (z + 1.0) * grad;
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("smooth_l1_loss", TORCH_FN(dft::smooth_l1_loss));
  m.impl("smooth_l1_loss_backward", TORCH_FN(dft::smooth_l1_loss_backward));
  m.impl("huber_loss", TORCH_FN(dft::huber_loss));
  m.impl("huber_loss_backward", TORCH_FN(dft::huber_loss_backward));
  m.impl("binary_cross_entropy", TORCH_FN(dft::binary_cross_entropy));
  m.impl("binary_cross_entropy_backward", TORCH_FN(dft::binary_cross_entropy_backward));
  m.impl("soft_margin_loss", TORCH_FN(dft::soft_margin_loss));
  m.impl("soft_margin_loss_backward", TORCH_FN(dft::soft_margin_loss_backward));
}
