// Losses: mse_loss and nll_loss / nll_loss2d (what cross_entropy lowers to), forward and
// backward. nll_loss2d moves the class dim last and reuses the 2-D nll_loss on [N*H*W, C].
// nll_loss picks input[n, target[n]] without a gather op: a one-hot mask built from
// arange(C) == target[:, None] selects it, and the same mask carries the class weights and
// ignore_index, so forward and backward stay on the device.
#include "common.h"

#include <torch/library.h>

namespace dft {
namespace {

enum { kNone = 0, kMean = 1, kSum = 2 };

at::Tensor mse_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  auto d = self - target;
  auto sq = d * d;
  if (reduction == kNone) return sq;
  return reduce(sq, reduction == kMean ? DFUSE_REDUCE_OP_MEAN : DFUSE_REDUCE_OP_SUM, {}, false);
}

at::Tensor mse_loss_backward(const at::Tensor& grad, const at::Tensor& self,
                             const at::Tensor& target, int64_t reduction) {
  double norm = reduction == kMean ? 2.0 / double(self.numel()) : 2.0;
  return (self - target) * norm * grad;
}

// The [N, C] (or [C]) weight of each (sample, class) pair: weight[c] where c == target[n] and
// target[n] != ignore_index, else 0.
at::Tensor pick_mask(const at::Tensor& self, const at::Tensor& target,
                     const std::optional<at::Tensor>& weight, int64_t ignore_index) {
  TORCH_CHECK(self.dim() == 1 || self.dim() == 2, "nll_loss: expected a 1-D or 2-D input, got ",
              self.dim(), "-D");
  TORCH_CHECK(target.dim() == self.dim() - 1, "nll_loss: expected a target of ", self.dim() - 1,
              " dims for an input of shape ", self.sizes(), ", got ", target.sizes());
  TORCH_CHECK(at::isIntegralType(target.scalar_type(), false),
              "nll_loss: expected an integer target, got ", target.scalar_type());
  int64_t C = self.size(-1);
  if (get_mode() == DFUSE_MODE_DEBUG && target.numel() > 0) {
    // Debug mode checks what PyTorch's CPU kernel checks; it may sync, the other modes may not.
    auto valid = target.ne(ignore_index);
    auto bad = valid.logical_and(target.lt(0).logical_or(target.ge(C)));
    TORCH_CHECK(!bad.sum().item<int64_t>(), "nll_loss: a target is out of bounds [0, ", C, ")");
  }
  DfuseAttrs a{};
  a.dtype = to_dtype(target.scalar_type());
  auto classes = run(DFUSE_OP_KIND_ARANGE, &a,
                     Operands().s(at::Scalar(int64_t(0))).s(at::Scalar(C)).s(at::Scalar(int64_t(1))),
                     "nll_loss classes");
  auto t = target.dim() == 0 ? target : target.unsqueeze(-1);
  auto hit = classes.eq(t);
  if (ignore_index >= 0 && ignore_index < C) hit = hit.logical_and(t.ne(ignore_index));
  auto mask = cast(hit, self.scalar_type());
  if (weight && weight->defined()) mask = mask * *weight;
  return mask;
}

std::tuple<at::Tensor, at::Tensor> nll_loss_forward(const at::Tensor& self,
                                                    const at::Tensor& target,
                                                    const std::optional<at::Tensor>& weight,
                                                    int64_t reduction, int64_t ignore_index) {
  auto mask = pick_mask(self, target, weight, ignore_index);
  auto picked = reduce(self * mask, DFUSE_REDUCE_OP_SUM, {-1}, false);
  if (reduction == kNone) return {at::neg(picked), at::zeros({}, self.options())};
  auto total_weight = reduce(mask, DFUSE_REDUCE_OP_SUM, {}, false);
  auto total = at::neg(reduce(picked, DFUSE_REDUCE_OP_SUM, {}, false));
  return {reduction == kMean ? total / total_weight : total, total_weight};
}

at::Tensor nll_loss_backward(const at::Tensor& grad, const at::Tensor& self,
                             const at::Tensor& target, const std::optional<at::Tensor>& weight,
                             int64_t reduction, int64_t ignore_index,
                             const at::Tensor& total_weight) {
  auto mask = pick_mask(self, target, weight, ignore_index);
  at::Tensor g = grad;
  if (reduction == kNone) {
    if (self.dim() == 2) g = grad.unsqueeze(-1);
  } else if (reduction == kMean) {
    g = grad / total_weight;
  }
  return at::neg(mask * g);
}

// [N, C, H, W] -> [N*H*W, C], the layout nll_loss picks classes from.
at::Tensor classes_last(const at::Tensor& self, const at::Tensor& target) {
  TORCH_CHECK(self.dim() == 4 && target.dim() == 3, "nll_loss2d: expected a 4-D input and a 3-D "
              "target, got shapes ", self.sizes(), " and ", target.sizes());
  TORCH_CHECK(self.size(0) == target.size(0) && self.size(2) == target.size(1) &&
              self.size(3) == target.size(2), "nll_loss2d: input ", self.sizes(),
              " and target ", target.sizes(), " differ in batch or spatial sizes");
  return self.permute({0, 2, 3, 1}).reshape({-1, self.size(1)});
}

std::tuple<at::Tensor, at::Tensor> nll_loss2d_forward(const at::Tensor& self,
                                                      const at::Tensor& target,
                                                      const std::optional<at::Tensor>& weight,
                                                      int64_t reduction, int64_t ignore_index) {
  auto [out, total_weight] = dft::nll_loss_forward(classes_last(self, target), target.reshape({-1}),
                                              weight, reduction, ignore_index);
  return {reduction == kNone ? out.view(target.sizes()) : out, total_weight};
}

at::Tensor nll_loss2d_backward(const at::Tensor& grad, const at::Tensor& self,
                               const at::Tensor& target, const std::optional<at::Tensor>& weight,
                               int64_t reduction, int64_t ignore_index,
                               const at::Tensor& total_weight) {
  auto g = reduction == kNone ? grad.reshape({-1}) : grad;
  auto gi = dft::nll_loss_backward(g, classes_last(self, target), target.reshape({-1}), weight,
                              reduction, ignore_index, total_weight);
  return gi.view({self.size(0), self.size(2), self.size(3), self.size(1)})
      .permute({0, 3, 1, 2})
      .contiguous();
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("mse_loss", TORCH_FN(dft::mse_loss));
  m.impl("mse_loss_backward", TORCH_FN(dft::mse_loss_backward));
  m.impl("nll_loss_forward", TORCH_FN(dft::nll_loss_forward));
  m.impl("nll_loss_backward", TORCH_FN(dft::nll_loss_backward));
  m.impl("nll_loss2d_forward", TORCH_FN(dft::nll_loss2d_forward));
  m.impl("nll_loss2d_backward", TORCH_FN(dft::nll_loss2d_backward));
}
