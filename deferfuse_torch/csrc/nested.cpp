// Nested tensors on tpu: a NestedTensorImpl whose buffer is a tpu tensor. What makes them:
// nn.TransformerEncoder in eval mode with a padding mask packs its batch into one
// (torch._nested_tensor_from_mask), runs its layers on it (transformer_fast_path.cpp) and pads
// the result back with zeros. PyTorch's own nested kernels registered here are device-generic
// (they work on the buffer through ATen ops, so on tpu kernels); every other op on a nested
// tpu tensor takes the CPU fallback (fallback.cpp), counted like any other.
#include "common.h"

#include <ATen/NestedTensorImpl.h>
#include <ATen/native/nested/NestedTensorUtils.h>

#include <ATen/ops/_nested_from_padded_native.h>
#include <ATen/ops/_nested_tensor_from_mask_left_aligned_native.h>
#include <ATen/ops/_nested_tensor_from_mask_native.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/to_padded_tensor_native.h>
#include <torch/library.h>

namespace dft {
namespace {

// layer_norm over the last dims of a nested tensor: PyTorch's nested kernel calls CPU's and
// CUDA's layer norm kernels directly; here it is the dense layer norm of the contiguous buffer
// seen as rows, packed again with the same sizes.
std::tuple<at::Tensor, at::Tensor, at::Tensor> nested_layer_norm(
    const at::Tensor& input, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
  auto* impl = at::native::get_nested_tensor_impl(input);
  TORCH_CHECK(impl->is_contiguous(), "tpu: layer_norm of a non-contiguous nested tensor; call "
              ".contiguous() first");
  int64_t row = c10::multiply_integers(normalized_shape);
  const at::Tensor& buffer = impl->get_buffer();
  auto flat = [row](const std::optional<at::Tensor>& t) {
    return t && t->defined() ? std::optional<at::Tensor>(t->reshape({row})) : t;
  };
  auto [out, mean, rstd] =
      at::native_layer_norm(buffer.view({-1, row}), {row}, flat(weight), flat(bias), eps);
  return {at::native::wrap_buffer(out.view({-1}), impl->get_nested_sizes().clone()), mean, rstd};
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("_to_copy", TORCH_FN(at::native::_to_copy_nested));
  m.impl("empty_like", TORCH_FN(at::native::empty_like_nested));
  m.impl("copy_", TORCH_FN(at::native::copy_nested_));
  m.impl("clone", TORCH_FN(at::native::clone_nested));
  m.impl("to_padded_tensor", TORCH_FN(at::native::NestedTensor_to_padded_tensor_generic));
  m.impl("add.Tensor", TORCH_FN(at::native::NestedTensor_add_Tensor));
  m.impl("add_.Tensor", TORCH_FN(at::native::NestedTensor_add__Tensor));
  m.impl("native_layer_norm", TORCH_FN(dft::nested_layer_norm));
}

// Dense tpu tensors in, nested tpu tensors out.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_nested_tensor_from_mask", TORCH_FN(at::native::NestedTensor_nested_tensor_from_mask));
  m.impl("_nested_tensor_from_mask_left_aligned",
         TORCH_FN(at::native::NestedTensor_nested_tensor_from_mask_left_aligned));
  m.impl("_nested_from_padded", TORCH_FN(at::native::nested_from_padded_generic));
}
