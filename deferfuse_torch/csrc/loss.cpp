// Losses, forward and backward: the elementwise ones (mse, smooth_l1, huber,
// binary_cross_entropy on probabilities, soft_margin) and multi_margin, each following
// PyTorch's CPU formula including which branch a boundary point takes and the order of the
// final scaling; and nll_loss / nll_loss2d (what cross_entropy lowers to). nll_loss2d picks
// and masks along its class dim 1 in place: moving the classes last copied the whole [N, C, H,
// W] input through a transpose forward and the gradient back through another.
// nll_loss's forward gathers input[n, target[n]] (one element a sample); its backward writes
// the gradient through a one-hot mask built from arange(C) == target[:, None], which carries
// the class weights and ignore_index and fuses into log_softmax's backward. Both stay on the
// device.
#include "common.h"
#include "kernel_ops.h"

#include <torch/library.h>

namespace dft {
namespace {

enum { kNone = 0, kMean = 1, kSum = 2 };

at::Tensor reduced(const at::Tensor& loss, int64_t reduction) {
  TORCH_CHECK(reduction >= kNone && reduction <= kSum, "tpu: unknown loss reduction ", reduction);
  if (reduction == kNone) return loss;
  return reduce(loss, reduction == kMean ? DFUSE_REDUCE_OP_MEAN : DFUSE_REDUCE_OP_SUM, {}, false);
}

at::Tensor mse_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  auto d = self - target;
  return reduced(d * d, reduction);
}

at::Tensor mse_loss_backward(const at::Tensor& grad, const at::Tensor& self,
                             const at::Tensor& target, int64_t reduction) {
  double norm = reduction == kMean ? 2.0 / double(self.numel()) : 2.0;
  return (self - target) * norm * grad;
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
  if (get_mode() == DFUSE_MODE_DEBUG && self.numel() > 0) {
    // Debug mode checks the input's range as CPU does (a host read the other modes skip).
    auto outside = self.lt(0).logical_or(self.gt(1)).logical_or(self.isnan());
    TORCH_CHECK(!outside.any().item<bool>(), "all elements of input should be between 0 and 1");
  }
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

// The dim of nll_loss's input that holds the classes: the last of [N, C] and [C], dim 1 of
// nll_loss2d's [N, C, H, W].
int64_t class_dim(const at::Tensor& self) { return self.dim() == 4 ? 1 : self.dim() - 1; }

// The checks nll_loss makes of its input and target (nll_loss2d's shapes: check_2d).
void check_nll(const at::Tensor& self, const at::Tensor& target, int64_t ignore_index) {
  TORCH_CHECK(self.dim() == 1 || self.dim() == 2 || self.dim() == 4,
              "nll_loss: expected a 1-D, 2-D or (nll_loss2d) 4-D input, got ", self.dim(), "-D");
  TORCH_CHECK(target.dim() == self.dim() - 1, "nll_loss: expected a target of ", self.dim() - 1,
              " dims for an input of shape ", self.sizes(), ", got ", target.sizes());
  TORCH_CHECK(at::isIntegralType(target.scalar_type(), false),
              "nll_loss: expected an integer target, got ", target.scalar_type());
  int64_t C = self.size(class_dim(self));
  if (get_mode() == DFUSE_MODE_DEBUG && target.numel() > 0) {
    // Debug mode checks what PyTorch's CPU kernel checks; it may sync, the other modes may not.
    auto valid = target.ne(ignore_index);
    auto bad = valid.logical_and(target.lt(0).logical_or(target.ge(C)));
    TORCH_CHECK(!bad.sum().item<int64_t>(), "nll_loss: a target is out of bounds [0, ", C, ")");
  }
}

// The samples a loss counts (target != ignore_index) and each one's class, 0 where ignored,
// both flat [N] ([1] for a 0-D target): what the gathers read through. A target outside
// [0, C) (other than ignore_index) fails in the runtime, at the next sync point, instead of
// picking nothing and returning a loss.
struct Targets {
  at::Tensor counted, safe;
};

Targets targets(const at::Tensor& target, int64_t ignore_index) {
  auto t = target.reshape({-1});
  auto counted = t.ne(ignore_index);
  return {counted, dft::where(counted, t, at::Scalar(int64_t(0)))};
}

// The [N, C] (or [C], or [N, C, H, W]) pairs (sample, class) with c == target[n] and
// target[n] != ignore_index, and each pair's weight: weight[c] there, else 0.
std::pair<at::Tensor, at::Tensor> pick_mask(const at::Tensor& self, const at::Tensor& target,
                                            const std::optional<at::Tensor>& weight,
                                            int64_t ignore_index) {
  check_nll(self, target, ignore_index);
  int64_t cd = class_dim(self), C = self.size(cd);
  // The class list in float32 where every class is exact in it (C <= 2^24): the [N, C]
  // compare then runs on float lanes, twice as many a register as int64's (the mask was
  // 0.6-1.4 ns an element, most of a vocabulary-sized cross-entropy backward).
  bool as_float = C <= (int64_t(1) << 24);
  DfuseAttrs a{};
  a.dtype = as_float ? DFUSE_DTYPE_F32 : to_dtype(target.scalar_type());
  auto classes = run(DFUSE_OP_KIND_ARANGE, &a,
                     Operands().s(at::Scalar(int64_t(0))).s(at::Scalar(C)).s(at::Scalar(int64_t(1))),
                     "nll_loss classes");
  auto shape = target.dim() == 0 ? target.sizes().vec() : target.unsqueeze(cd).sizes().vec();
  // The classes along the class dim, every other dim 1.
  std::vector<int64_t> along(self.dim(), 1);
  along[cd] = C;
  auto [counted, safe] = targets(target, ignore_index);
  // The class each sample picks, read through a gather from the class list (bounds-checked).
  auto picked = gather_op(classes, 0, safe).view(shape);
  auto hit = classes.view(along).eq(picked).logical_and(counted.view(shape));
  auto mask = cast(hit, self.scalar_type());
  if (weight && weight->defined()) mask = mask * weight->view(along);
  return {hit, mask};
}

// nll_loss's forward: -input[n, target[n]] * weight[target[n]] per counted sample, gathered.
// Summing input * one-hot mask over the classes instead made a class at -inf (a masked logit)
// give 0 * -inf = NaN where CPU's loss is finite.
std::tuple<at::Tensor, at::Tensor> nll_forward(const at::Tensor& self, const at::Tensor& target,
                                               const std::optional<at::Tensor>& weight,
                                               int64_t reduction, int64_t ignore_index) {
  check_nll(self, target, ignore_index);
  auto [counted, safe] = targets(target, ignore_index);
  // Each sample's input at its class, in the target's order.
  auto x = self.dim() == 4
      ? gather_op(self, 1, safe.view(target.unsqueeze(1).sizes())).reshape({-1})
      : gather_op(self.reshape({-1, self.size(-1)}), 1, safe.unsqueeze(1)).reshape({-1});
  at::Tensor w;
  if (weight && weight->defined()) {
    w = gather_op(*weight, 0, safe);
    x = x * w;
  } else {
    w = at::ones({}, self.options());
  }
  auto zero = at::zeros({}, self.options());
  // An ignored sample contributes +0 whatever its input (CPU skips it).
  auto per = at::where(counted, at::neg(x), zero);
  if (reduction == kNone) {
    return {target.dim() == 0 ? per.reshape({}) : per, at::zeros({}, self.options())};
  }
  auto total_weight = reduce(at::where(counted, w, zero), DFUSE_REDUCE_OP_SUM, {}, false);
  auto total = reduce(per, DFUSE_REDUCE_OP_SUM, {}, false);
  return {reduction == kMean ? total / total_weight : total, total_weight};
}

at::Tensor nll_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                        const std::optional<at::Tensor>& weight, int64_t reduction,
                        int64_t ignore_index, const at::Tensor& total_weight) {
  auto [hit, mask] = pick_mask(self, target, weight, ignore_index);
  at::Tensor g = grad;
  if (reduction == kNone) {
    if (self.dim() > 1) g = grad.unsqueeze(class_dim(self));
  } else if (reduction == kMean) {
    g = grad / total_weight;
  }
  // Only the picked pairs get a gradient, as CPU writes only those: with every sample ignored,
  // a mean's grad / total_weight is NaN, and mask * NaN would spread it.
  return at::where(hit, at::neg(mask * g), at::zeros({}, self.options()));
}

// nll_loss proper takes 1-D and 2-D inputs only (a 4-D one is nll_loss2d's).
void check_1d_or_2d(const at::Tensor& self) {
  TORCH_CHECK(self.dim() == 1 || self.dim() == 2, "nll_loss: expected a 1-D or 2-D input, got ",
              self.dim(), "-D");
}

std::tuple<at::Tensor, at::Tensor> nll_loss_forward(const at::Tensor& self,
                                                    const at::Tensor& target,
                                                    const std::optional<at::Tensor>& weight,
                                                    int64_t reduction, int64_t ignore_index) {
  check_1d_or_2d(self);
  return nll_forward(self, target, weight, reduction, ignore_index);
}

at::Tensor nll_loss_backward(const at::Tensor& grad, const at::Tensor& self,
                             const at::Tensor& target, const std::optional<at::Tensor>& weight,
                             int64_t reduction, int64_t ignore_index,
                             const at::Tensor& total_weight) {
  check_1d_or_2d(self);
  return nll_backward(grad, self, target, weight, reduction, ignore_index, total_weight);
}

// nll_loss2d's shape checks: a 4-D input and a 3-D target of its batch and spatial sizes.
void check_2d(const at::Tensor& self, const at::Tensor& target) {
  TORCH_CHECK(self.dim() == 4 && target.dim() == 3, "nll_loss2d: expected a 4-D input and a 3-D "
              "target, got shapes ", self.sizes(), " and ", target.sizes());
  TORCH_CHECK(self.size(0) == target.size(0) && self.size(2) == target.size(1) &&
              self.size(3) == target.size(2), "nll_loss2d: input ", self.sizes(),
              " and target ", target.sizes(), " differ in batch or spatial sizes");
}

std::tuple<at::Tensor, at::Tensor> nll_loss2d_forward(const at::Tensor& self,
                                                      const at::Tensor& target,
                                                      const std::optional<at::Tensor>& weight,
                                                      int64_t reduction, int64_t ignore_index) {
  check_2d(self, target);
  auto [out, total_weight] = nll_forward(self, target, weight, reduction, ignore_index);
  return {reduction == kNone ? out.view(target.sizes()) : out, total_weight};
}

at::Tensor nll_loss2d_backward(const at::Tensor& grad, const at::Tensor& self,
                               const at::Tensor& target, const std::optional<at::Tensor>& weight,
                               int64_t reduction, int64_t ignore_index,
                               const at::Tensor& total_weight) {
  check_2d(self, target);
  return nll_backward(grad, self, target, weight, reduction, ignore_index, total_weight);
}

// multi_margin_loss: for each sample, sum over the other classes j of
// max(0, margin - x[y] + x[j])^p, times weight[y], over C (CPU's formula, p 1 or 2). The
// target's one-hot mask (as nll_loss) picks x[y]; a term counts where it is > 0.
struct MultiMargin {
  at::Tensor x, onehot, z, active, w;  // x [N, C]; the rest broadcast to it
};

MultiMargin multi_margin_terms(const at::Tensor& self, const at::Tensor& target,
                               const at::Scalar& margin,
                               const std::optional<at::Tensor>& weight) {
  TORCH_CHECK(self.dim() <= 2 && self.numel() > 0, "Expected non-empty vector or matrix with "
              "optional 0-dim batch size, but got: ", self.sizes());
  auto x = self.dim() == 2 ? self : self.reshape({1, -1});
  auto y = target.reshape({-1, 1});
  TORCH_CHECK(y.size(0) == x.size(0), "inconsistent target size, expected ", x.size(0),
              " but got ", target.sizes());
  auto classes = at::arange(x.size(1), target.options().dtype(at::kLong));
  auto onehot = classes.eq(y);
  auto xy = reduce(at::where(onehot, x, at::zeros({}, x.options())), DFUSE_REDUCE_OP_SUM, {1},
                   true);
  auto z = (x - xy) + margin.toDouble();
  auto active = z.gt(0).logical_and(onehot.logical_not());
  at::Tensor w;
  if (weight && weight->defined()) {
    w = gather_op(*weight, 0, target.reshape({-1})).reshape({-1, 1});
  }
  return {x, onehot, z, active, w};
}

at::Tensor multi_margin_loss(const at::Tensor& self, const at::Tensor& target,
                             const at::Scalar& p, const at::Scalar& margin,
                             const std::optional<at::Tensor>& weight, int64_t reduction) {
  TORCH_CHECK(p.toLong() == 1 || p.toLong() == 2, "only p == 1 and p == 2 supported");
  auto m = multi_margin_terms(self, target, margin, weight);
  auto term = p.toLong() == 1 ? m.z : m.z * m.z;
  if (m.w.defined()) term = term * m.w;
  auto per = reduce(at::where(m.active, term, at::zeros({}, term.options())), DFUSE_REDUCE_OP_SUM,
                    {1}, false) / double(m.x.size(1));
  if (reduction == kNone) return self.dim() == 2 ? per : per.reshape(target.sizes());
  return reduced(per, reduction);
}

at::Tensor multi_margin_loss_backward(const at::Tensor& grad, const at::Tensor& self,
                                      const at::Tensor& target, const at::Scalar& p,
                                      const at::Scalar& margin,
                                      const std::optional<at::Tensor>& weight,
                                      int64_t reduction) {
  auto m = multi_margin_terms(self, target, margin, weight);
  auto h = p.toLong() == 1 ? at::ones_like(m.z) : m.z * 2.0;
  if (m.w.defined()) h = h * m.w;
  double scale = 1.0 / double(m.x.size(1)) / (reduction == kMean ? double(m.x.size(0)) : 1.0);
  auto g = reduction == kNone ? grad.reshape({-1, 1}) : grad;
  h = at::where(m.active, h, at::zeros({}, h.options())) * scale * g;
  auto on_target = reduce(h, DFUSE_REDUCE_OP_SUM, {1}, true);
  auto gx = h - at::where(m.onehot, on_target, at::zeros({}, h.options()));
  return gx.reshape(self.sizes());
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("mse_loss", DFT_GROUPED(dft::mse_loss));
  m.impl("mse_loss_backward", DFT_GROUPED(dft::mse_loss_backward));
  m.impl("smooth_l1_loss", DFT_GROUPED(dft::smooth_l1_loss));
  m.impl("smooth_l1_loss_backward", DFT_GROUPED(dft::smooth_l1_loss_backward));
  m.impl("huber_loss", DFT_GROUPED(dft::huber_loss));
  m.impl("huber_loss_backward", DFT_GROUPED(dft::huber_loss_backward));
  m.impl("binary_cross_entropy", DFT_GROUPED(dft::binary_cross_entropy));
  m.impl("binary_cross_entropy_backward", DFT_GROUPED(dft::binary_cross_entropy_backward));
  m.impl("soft_margin_loss", DFT_GROUPED(dft::soft_margin_loss));
  m.impl("soft_margin_loss_backward", DFT_GROUPED(dft::soft_margin_loss_backward));
  m.impl("nll_loss_forward", DFT_GROUPED(dft::nll_loss_forward));
  m.impl("nll_loss_backward", DFT_GROUPED(dft::nll_loss_backward));
  m.impl("nll_loss2d_forward", DFT_GROUPED(dft::nll_loss2d_forward));
  m.impl("nll_loss2d_backward", DFT_GROUPED(dft::nll_loss2d_backward));
  m.impl("multi_margin_loss", DFT_GROUPED(dft::multi_margin_loss));
  m.impl("multi_margin_loss_backward", DFT_GROUPED(dft::multi_margin_loss_backward));
}
