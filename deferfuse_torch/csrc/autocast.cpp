// torch.autocast(device_type="tpu"): PyTorch defines the AutocastPrivateUse1 dispatch key but
// registers no kernel or fallback for it, so an autocast region on tpu would fail on the first
// op. This registers CUDA's op policy for it, from the op lists PyTorch shares between backends
// (ATen/autocast_mode.h): matmul-like ops and convolutions in the autocast dtype, numerically
// sensitive ops (softmax, log_softmax, layer_norm, losses, sums, exp, log...) in float32,
// binary ops with mixed inputs promoted to the widest, and every other op untouched.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace dft {
namespace {

// As on CUDA: binary_cross_entropy on a low-precision input is refused under autocast.
at::Tensor binary_cross_entropy_banned(const at::Tensor&, const at::Tensor&,
                                       const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
              "autocast on tpu (as on cuda). Many models use a sigmoid layer right before the "
              "binary cross entropy layer; in this case, combine the two layers using "
              "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, "
              "which are safe to autocast.");
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

// Inside namespace at, as in ATen's own autocast_mode.cpp: the shared op lists name types
// (Tensor, ScalarType, IntArrayRef) unqualified.
namespace at {
namespace {
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define DFT_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(DFT_LOWER_PRECISION)
#define DFT_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(DFT_FP32)
#define DFT_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(DFT_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
#define DFT_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(DFT_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN(dft::binary_cross_entropy_banned));
}
}  // namespace
}  // namespace at
