// Sparse tensors on tpu: the runtime has no sparse layout, so every op that would make or use a
// sparse tpu tensor is refused with an error naming the op and what to do. (PyTorch's own
// message for a backend without sparse kernels is a dispatcher table: "Could not run ... with
// arguments from the 'Sparsetpu' backend".) The common way in is a sparse gradient: an
// nn.Embedding(sparse=True), refused at its backward with the fix in the message.
#include "common.h"

#include <torch/library.h>

namespace dft {
namespace {

void refuse_sparse(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "tpu: ", op.schema().name(), " on a sparse tensor: tpu has "
                              "no sparse tensors (the runtime has no sparse layout); keep sparse "
                              "tensors on the CPU, or make them dense (to_dense()) before moving "
                              "them to tpu");
}

at::Tensor embedding_sparse_backward(const at::Tensor&, const at::Tensor&, int64_t, int64_t,
                                     bool) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "tpu: nn.Embedding(sparse=True) (F.embedding(..., "
                              "sparse=True)) needs a sparse gradient, and tpu has no sparse "
                              "tensors; use sparse=False (a dense gradient, with torch.optim.Adam "
                              "or SGD in place of SparseAdam)");
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&dft::refuse_sparse>());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("embedding_sparse_backward", TORCH_FN(dft::embedding_sparse_backward));
}
