// The two ops torch.amp.GradScaler runs, as device ops (no host round trip, deferrable):
// _amp_foreach_non_finite_check_and_unscale_ (unscale the gradients, flag inf/NaN) and
// _amp_update_scale_ (grow or back off the loss scale). Semantics of PyTorch's CPU kernels.
#include "common.h"

#include <torch/library.h>

namespace dft {
namespace {

void check_one_float(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.numel() == 1, op, ": ", name, " must be a 1-element tensor, got ", t.numel(),
              " elements");
  TORCH_CHECK(t.scalar_type() == at::kFloat, op, ": ", name, " must be a float tensor, got ",
              t.scalar_type());
}

// Gradients are multiplied by inv_scale; found_inf becomes 1.0 if any gradient (before
// unscaling) holds an inf or NaN, and is left as it was otherwise.
void amp_unscale_(at::TensorList grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  const char* op = "_amp_foreach_non_finite_check_and_unscale_";
  check_one_float(inv_scale, op, "inv_scale");
  check_one_float(found_inf, op, "found_inf");
  if (grads.empty()) return;
  // x * 0 is 0 for a finite x and NaN for inf or NaN, so the sum of all of them is NaN exactly
  // when some element is not finite.
  at::Tensor poison;
  for (const auto& g : grads) {
    TORCH_CHECK(g.device() == found_inf.device(), op, ": a gradient is on ", g.device(),
                " but found_inf is on ", found_inf.device());
    TORCH_CHECK(at::isFloatingType(g.scalar_type()), op,
                ": gradients must be floating point, got ", g.scalar_type());
    if (g.numel() == 0) continue;
    at::Tensor p = cast(reduce(binary(g, at::Scalar(0.0), DFUSE_BINARY_OP_MUL), DFUSE_REDUCE_OP_SUM,
                               {}, false),
                        at::kFloat);
    poison = poison.defined() ? binary(poison, p, DFUSE_BINARY_OP_ADD) : p;
  }
  for (const auto& g : grads) {
    if (g.numel() > 0) const_cast<at::Tensor&>(g).mul_(inv_scale);
  }
  if (poison.defined()) {
    at::Tensor finite = binary(poison, at::Scalar(0.0), DFUSE_BINARY_OP_EQ);
    found_inf.copy_(dft::where(finite, found_inf, at::Scalar(1.0)));
  }
}

// found_inf: scale *= backoff, tracker = 0. Otherwise tracker + 1, and on reaching
// growth_interval the scale grows (kept if the grown scale would not be finite) and the
// tracker restarts.
at::Tensor& amp_update_scale_(at::Tensor& scale, at::Tensor& growth_tracker,
                              const at::Tensor& found_inf, double growth, double backoff,
                              int64_t interval) {
  const char* op = "_amp_update_scale_";
  check_one_float(scale, op, "current_scale");
  check_one_float(found_inf, op, "found_inf");
  TORCH_CHECK(growth_tracker.numel() == 1 && growth_tracker.scalar_type() == at::kInt, op,
              ": growth_tracker must be a 1-element int32 tensor, got ", growth_tracker.numel(),
              " elements of ", growth_tracker.scalar_type());
  at::Tensor found = binary(found_inf, at::Scalar(0.0), DFUSE_BINARY_OP_NE);
  at::Tensor next = binary(growth_tracker, at::Scalar(int64_t(1)), DFUSE_BINARY_OP_ADD);
  at::Tensor due = binary(next, at::Scalar(interval), DFUSE_BINARY_OP_EQ);
  at::Tensor grown = binary(scale, at::Scalar(growth), DFUSE_BINARY_OP_MUL);
  at::Tensor grown_finite =
      binary(binary(grown, at::Scalar(0.0), DFUSE_BINARY_OP_MUL), at::Scalar(0.0),
             DFUSE_BINARY_OP_EQ);
  at::Tensor grow = at::logical_and(due, grown_finite);
  at::Tensor kept = at::where(grow, grown, scale);
  at::Tensor new_scale =
      at::where(found, binary(scale, at::Scalar(backoff), DFUSE_BINARY_OP_MUL), kept);
  at::Tensor restart = at::logical_or(found, due);
  at::Tensor new_tracker = at::where(restart, at::zeros_like(next), next);
  scale.copy_(new_scale);
  growth_tracker.copy_(new_tracker);
  return scale;
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_amp_foreach_non_finite_check_and_unscale_", TORCH_FN(dft::amp_unscale_));
  m.impl("_amp_update_scale_", TORCH_FN(dft::amp_update_scale_));
}
