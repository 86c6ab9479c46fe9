// torch._grouped_mm (F.grouped_mm): a mixture-of-experts layer's products, each expert's
// weights applied to the tokens routed to it, the groups cut by offsets on the device. Hugging
// Face's experts (Mixtral, Qwen-MoE, DeepSeek, OLMoE...) call it on every device but the CPU.
//
// One kernel op (DFUSE_OP_KIND_GROUPED_MM) reads the offsets when it runs, so neither the
// forward nor its gradients (autograd's formula calls _grouped_mm again on transposed
// operands: the input gradient is the ROWS case, the weight gradient CONTRACTION) is a sync
// point; PyTorch's own path for devices without a kernel copies the offsets to the host first.
// The checks follow PyTorch's (GroupedMMUtils.h, as on the CPU: no pointer alignment), with
// its messages; the result has PyTorch's strides (the last dim padded to 16 bytes). Rows past
// the last offset are zero where PyTorch leaves them uninitialised.
#include "common.h"

#include <ATen/native/GroupedMMUtils.h>
#include <torch/library.h>

namespace dft {
namespace {

// PyTorch's layout rule for each operand: one of the last two dims has unit stride and the
// other a stride that is a multiple of 16 bytes.
void check_strides(const at::Tensor& m) {
  auto st = m.strides();
  auto sz = m.sizes();
  const int64_t e = m.dim() - 1;
  const int64_t align = 16 / m.element_size();
  if (st[e - 1] == 1 && st[e] >= std::max<int64_t>(1, sz[e - 1])) {
    TORCH_CHECK(st[e] % align == 0, "strides should be multiple of 16 bytes");
  } else if (st[e] == 1 && st[e - 1] >= std::max<int64_t>(1, sz[e])) {
    TORCH_CHECK(st[e - 1] % align == 0, "strides should be multiple of 16 bytes");
  } else {
    TORCH_CHECK(false, "Invalid strides/sizes, got ", m.strides(), " for strides and ",
                m.sizes(), " for sizes");
  }
}

bool is_grouped_dtype(const at::Tensor& t) {
  auto d = t.scalar_type();
  return d == at::kBFloat16 || d == at::kFloat || d == at::kHalf;
}

void validate(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs,
              const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK(is_grouped_dtype(a), "Expected mat_a to be Float32, BFloat16 or Float16 matrix, got ",
              a.scalar_type());
  TORCH_CHECK(is_grouped_dtype(b), "Expected mat_b to be Float32, BFloat16 or Float16 matrix, got ",
              b.scalar_type());
  TORCH_CHECK(a.dtype() == b.dtype(), "Expected mat_a and mat_b to have the same dtype, got ",
              a.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK(a.dim() == 2 || a.dim() == 3, "mat_a has to be 2 or 3d");
  TORCH_CHECK(b.dim() == 2 || b.dim() == 3, "mat_b has to be 2 or 3d");
  const bool a2 = a.dim() == 2, b2 = b.dim() == 2;
  if (!a2 || !b2) {
    TORCH_CHECK(a.size(-1) == b.size(-2), "contraction dimension of mat_a and mat_b must match");
  }
  check_strides(a);
  check_strides(b);
  TORCH_CHECK(offs.has_value() == (a2 || b2),
              "Have to provide offsets if there is a 2d matrix, or no offset if both matrices "
              "are 3d");
  if (offs.has_value()) {
    TORCH_CHECK(offs->dim() == 1, "offs has to be 1D");
    TORCH_CHECK(offs->dtype() == at::kInt, "Offsets have to be int32");
    TORCH_CHECK(offs->stride(0) == 1, "Offsets must have stride (1,)");
    TORCH_CHECK(offs->device().type() == c10::DeviceType::PrivateUse1,
                "grouped_mm: expected offs on the tpu device like mat_a, got ",
                offs->device());
  }
  TORCH_CHECK(!bias.has_value(), "Bias not supported yet");
  TORCH_CHECK(out_dtype.value_or(a.scalar_type()) == a.scalar_type(),
              "Grouped gemm output dtype must match `mat_a` dtype");
}

at::Tensor grouped_mm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs,
                      const std::optional<at::Tensor>& bias,
                      std::optional<at::ScalarType> out_dtype) {
  validate(a, b, offs, bias, out_dtype);
  auto [size, stride] =
      at::native::compute_grouped_gemm_output_size_stride(a, b, offs, a.scalar_type());
  auto out = at::empty_strided(size, stride, a.options());
  if (!offs.has_value()) {  // 3-D x 3-D: a batched product, written into the padded result
    run_into(DFUSE_OP_KIND_MATMUL, nullptr, Operands().t(a).t(b), out, "grouped_mm");
    return out;
  }
  const bool a2 = a.dim() == 2, b2 = b.dim() == 2;
  auto attrs = attrs_sub(a2 && b2 ? DFUSE_GROUPED_MM_CONTRACTION
                         : a2     ? DFUSE_GROUPED_MM_ROWS
                                  : DFUSE_GROUPED_MM_COLS);
  run_into(DFUSE_OP_KIND_GROUPED_MM, &attrs, Operands().t(a).t(b).t(*offs), out, "grouped_mm");
  return out;
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("_grouped_mm", TORCH_FN(dft::grouped_mm)); }
