// The gradient of indexing a tensor: select_backward (x[:, t]) and slice_backward
// (x[..., a:b]), computed as PyTorch's own kernels do (a zeros tensor of the input's shape with
// the gradient copied into the indexed view), plus a note on its storage saying which view holds
// the gradient.
//
// Autograd adds each such gradient into the input's accumulated one (InputBuffer::accumulate:
// `old.add_(g)`, or `old + g` under create_graph), so `x[:, t]` in a Python loop over T steps
// costs T additions of whole tensors that are zero but for one slice: O(T^2) work where O(T)
// does (HF Mamba's slow-path scan, 64 steps: 75 ms of a 125 ms training step, on CPU eager as
// here). With the note, the add kernels add the gradient into the same view of the other
// operand alone; the zeros tensor, no longer read, is never written in defer mode.
//
// The note holds only while the tensor still is those zeros and that gradient (the note keeps
// its own copy of the gradient, a slice's size): the tensor's version counter must be
// unchanged (every in-place write through the dispatcher bumps the counter all its views
// share), no kernel may have written its storage since (a write
// through `.data` or `set_` bumps no counter of the tensor's: every device write path drops
// the note, note_storage_write), and the operand must be the whole tensor, in the layout it was
// made with. In place, x must not overlap itself (an expanded x raises as on CPU), and alpha
// must be finite (inf * 0 is NaN outside the view). The result
// differs from a dense add only in the sign of zeros outside the view: `-0.0 + 0.0` is +0.0
// where the view-only add leaves -0.0 (README).
#include "indexed_grad.h"

#include "common.h"

#include <torch/library.h>

#include <cmath>

namespace dft {

struct IndexedGrad {
  // A private copy of the view's gradient: the caller's tensor may be written later through
  // an alias that shares no version counter with it (`.data`).
  at::Tensor grad;
  uint32_t whole_version;
  bool select;  // select(dim, start); otherwise slice(dim, start, end, step)
  int64_t dim, start, end, step;

  // The same view of a tensor of the whole's shape.
  at::Tensor view_of(const at::Tensor& t) const {
    return select ? t.select(dim, start) : t.slice(dim, start, end, step);
  }
};

namespace {

uint32_t version(const at::Tensor& t) {
  return t.unsafeGetTensorImpl()->version_counter().current_version();
}

// t's note, if t is still exactly the zeros-but-one-view tensor it describes.
const IndexedGrad* indexed_grad(const at::Tensor& t) {
  const StorageCtx* c = find_storage_ctx(t);
  if (c == nullptr || !c->indexed_grad || t.is_inference() || !recordable(t)) return nullptr;
  const IndexedGrad& g = *c->indexed_grad;
  bool whole = t.storage_offset() == 0 && t.sizes().equals(c->sizes) &&
               t.strides().equals(c->strides) && t.scalar_type() == from_dtype(c->dtype);
  if (!whole || version(t) != g.whole_version) {
    return nullptr;
  }
  return &g;
}

// Whether `x` (a tensor of the same shape and dtype as the indexed gradient `y`) can take it
// by a view-only add, and `g` is y's note.
const IndexedGrad* addable(const at::Tensor& x, const at::Tensor& y, const at::Scalar& alpha) {
  const IndexedGrad* g = indexed_grad(y);
  if (g == nullptr || !recordable(x) || x.scalar_type() != y.scalar_type() ||
      !std::isfinite(alpha.toDouble()) ||
      !x.sizes().equals(y.sizes()) || x.is_alias_of(y)) {
    return nullptr;
  }
  return g;
}

at::Tensor with_note(at::Tensor whole, const at::Tensor& grad, IndexedGrad note) {
  note.view_of(whole).copy_(grad);
  if (whole.is_inference() || grad.is_inference() || !recordable(whole)) return whole;
  note.grad = grad.clone(at::MemoryFormat::Contiguous);
  note.whole_version = version(whole);
  find_storage_ctx(whole)->indexed_grad = std::make_shared<const IndexedGrad>(std::move(note));
  return whole;
}

at::Tensor select_backward(const at::Tensor& grad, c10::SymIntArrayRef input_sizes, int64_t dim,
                           c10::SymInt index) {
  auto whole = at::zeros_symint(input_sizes, grad.options());
  dim = at::maybe_wrap_dim(dim, whole.dim());
  int64_t i = index.expect_int();
  if (i < 0) i += whole.size(dim);
  return with_note(whole, grad, IndexedGrad{{}, 0, true, dim, i, i + 1, 1});
}

at::Tensor slice_backward(const at::Tensor& grad, c10::SymIntArrayRef input_sizes, int64_t dim,
                          c10::SymInt start, c10::SymInt end, c10::SymInt step) {
  auto whole = at::zeros_symint(input_sizes, grad.options());
  dim = at::maybe_wrap_dim(dim, whole.dim());
  return with_note(whole, grad,
                   IndexedGrad{{}, 0, false, dim, start.expect_int(), end.expect_int(),
                               step.expect_int()});
}

}  // namespace

std::optional<at::Tensor> add_indexed_grad(const at::Tensor& x, const at::Tensor& y,
                                           const at::Scalar& alpha) {
  // A dense add of two contiguous tensors is contiguous: so is the copy.
  if (const IndexedGrad* g = addable(x, y, alpha); g != nullptr && x.is_contiguous()) {
    auto out = x.clone(at::MemoryFormat::Contiguous);
    g->view_of(out).add_(g->grad, alpha);
    return out;
  }
  if (const IndexedGrad* g = addable(y, x, alpha); g != nullptr && alpha.equal(1) &&
                                                     y.is_contiguous()) {
    auto out = y.clone(at::MemoryFormat::Contiguous);
    g->view_of(out).add_(g->grad);  // y + g == g + y, bit for bit
    return out;
  }
  return std::nullopt;
}

bool add_indexed_grad_(const at::Tensor& x, const at::Tensor& y, const at::Scalar& alpha) {
  const IndexedGrad* g = addable(x, y, alpha);
  if (g == nullptr || !x.is_non_overlapping_and_dense()) return false;
  // Keep the note's gradient alive past the write: x's own note, if any, goes stale now (a
  // write below the dispatcher's version bump) and is dropped.
  at::Tensor grad = g->grad;
  g->view_of(x).add_(grad, alpha);  // a write into x: drops x's own note, if any
  return true;
}

void note_storage_write(const at::Tensor& written) {
  if (StorageCtx* c = find_storage_ctx(written); c != nullptr) {
    c->indexed_grad.reset();
    ++c->writes;
  }
}

}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("select_backward", DFT_GROUPED(dft::select_backward));
  m.impl("slice_backward", DFT_GROUPED(dft::slice_backward));
}
