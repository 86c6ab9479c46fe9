// Adding the gradient of an indexing op (x[:, t], x[..., a:b]) into another tensor, touching
// only the indexed view (indexed_grad.cpp says why).
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace dft {

// x + alpha * y where y (or, with alpha 1, x) is still the zeros-but-one-view result of this
// device's select_backward / slice_backward: a copy of the other operand with the gradient
// added into that view. nullopt where that does not apply (the caller adds as usual).
std::optional<at::Tensor> add_indexed_grad(const at::Tensor& x, const at::Tensor& y,
                                           const at::Scalar& alpha);

// x += alpha * y the same way, into x's view alone; false where that does not apply.
bool add_indexed_grad_(const at::Tensor& x, const at::Tensor& y, const at::Scalar& alpha);

// Notes a write into `written`'s storage: forgets its indexed-gradient note and counts the
// write (StorageCtx::writes). Every kernel path that writes into an existing tpu storage calls
// it (run_into_from_old_values, the host uploads, fill_, storage byte copies, graph launches),
// so a write through an alias that shares no version counter with the tensor (`.data`,
// `set_`) cannot leave a stale note or stale kept convolution columns. A new write path must
// call it.
void note_storage_write(const at::Tensor& written);

}  // namespace dft
