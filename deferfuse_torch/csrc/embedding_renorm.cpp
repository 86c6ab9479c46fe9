// nn.Embedding(max_norm=...): before each lookup F.embedding renormalizes, in place and under
// no_grad, the weight rows the indices name whose p-norm is above max_norm (embedding_renorm_).
// Without a tpu kernel that went to the CPU fallback, copying the whole table to the host and
// back every forward. Here: the named rows gathered, scaled by max_norm / (norm + 1e-7) where
// their norm is above max_norm (CPU's formula), and written back. A row named twice is
// computed twice to the same values, so the duplicate writes agree; no host read is needed to
// deduplicate the indices as CPU's kernel does.
#include "common.h"

#include <torch/library.h>

namespace dft {
namespace {

at::Tensor& embedding_renorm_(at::Tensor& self, const at::Tensor& indices, double max_norm,
                              double norm_type) {
  TORCH_CHECK(self.dim() == 2, "embedding_renorm_: expected a 2-D weight, got ", self.dim(),
              "-D");
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt,
              "embedding_renorm_: expected indices of dtype Long or Int, got ",
              indices.scalar_type());
  if (indices.numel() == 0) return self;
  auto idx = indices.reshape({-1});
  auto rows = self.index_select(0, idx);
  auto norms = at::linalg_vector_norm(rows, norm_type, at::IntArrayRef{1}, /*keepdim=*/true);
  auto scale = at::where(norms.gt(max_norm), at::full_like(norms, max_norm) / (norms + 1e-7),
                         at::ones_like(norms));
  self.index_copy_(0, idx, rows * scale);
  return self;
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("embedding_renorm_", TORCH_FN(dft::embedding_renorm_));
}
