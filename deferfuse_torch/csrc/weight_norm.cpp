// Weight normalization on "tpu": w = v * (g / ||v||), the norm over every dim but `dim`.
//
// nn.utils.weight_norm and parametrizations.weight_norm call at::_weight_norm, which for
// dim 0 or the last dim (the common case: a Linear's or a convolution's output channels, and
// wav2vec2's positional convolution) takes _weight_norm_interface, a fused kernel PyTorch has
// for CPU and CUDA only: on "tpu" it ran on the CPU fallback, its backward too. Here it is the
// device's ops in the CPU kernel's order (the norm, g / norm, then v times that), registered
// for autograd as well, so the backward is autograd through those ops.
#include "common.h"

#include <torch/library.h>

namespace dft {
namespace {

std::tuple<at::Tensor, at::Tensor> weight_norm_interface(const at::Tensor& v, const at::Tensor& g,
                                                         int64_t dim) {
  TORCH_CHECK(v.device() == g.device(), "weight_norm: v and g must be on the same device");
  int64_t d = at::maybe_wrap_dim(dim, v.dim());
  std::vector<int64_t> others;
  for (int64_t i = 0; i < v.dim(); ++i) {
    if (i != d) others.push_back(i);
  }
  // The norm keeps g's shape (1 on every dim but `dim`), as the CPU kernel's output does.
  auto norm = others.empty() ? v.abs() : (v * v).sum(others, /*keepdim=*/true).sqrt();
  return {v * (g / norm), norm.view(g.sizes())};
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_weight_norm_interface", DFT_GROUPED(dft::weight_norm_interface));
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_weight_norm_interface", DFT_GROUPED(dft::weight_norm_interface));
}
