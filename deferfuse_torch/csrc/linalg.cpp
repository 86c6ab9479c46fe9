// Matrix products (mm, bmm, mv, dot, addmm, baddbmm), cat and arange.
#include "common.h"

#include <ATen/ExpandUtils.h>
#include <torch/library.h>

namespace dft {
namespace {

at::Tensor matmul2(const at::Tensor& a, const at::Tensor& b) {
  return run(DFUSE_OP_KIND_MATMUL, nullptr, Operands().t(a).t(b), "matmul");
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D matrices, got shapes ", a.sizes(),
              " and ", b.sizes());
  return matmul2(a, b);
}

at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D tensors, got shapes ", a.sizes(),
              " and ", b.sizes());
  TORCH_CHECK(a.size(0) == b.size(0), "bmm: batch sizes differ: ", a.size(0), " and ", b.size(0));
  return matmul2(a, b);
}

at::Tensor mv(const at::Tensor& a, const at::Tensor& v) {
  TORCH_CHECK(a.dim() == 2 && v.dim() == 1, "mv: expected a matrix and a vector, got shapes ",
              a.sizes(), " and ", v.sizes());
  return matmul2(a, v);
}

at::Tensor dot(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 1 && b.dim() == 1, "dot: expected 1-D tensors, got shapes ", a.sizes(),
              " and ", b.sizes());
  return matmul2(a, b);
}

at::Tensor addmm(const at::Tensor& self, const at::Tensor& m1, const at::Tensor& m2,
                 const at::Scalar& beta, const at::Scalar& alpha) {
  return run(DFUSE_OP_KIND_ADDMM, nullptr, Operands().t(self).t(m1).t(m2).s(beta).s(alpha),
             "addmm");
}

at::Tensor& addmm_(at::Tensor& self, const at::Tensor& m1, const at::Tensor& m2,
                   const at::Scalar& beta, const at::Scalar& alpha) {
  // CPU's addmm_ accepts a factor that overlaps self in any way (`a.addmm_(a.t(), w)`) and
  // reads it while writing; here the runtime copies such a factor first (see the README's
  // table of differences).
  run_into_from_old_values(DFUSE_OP_KIND_ADDMM, nullptr,
                           Operands().t(self).t(m1).t(m2).s(beta).s(alpha), self, "addmm_");
  return self;
}

// baddbmm: beta * self + alpha * bmm(batch1, batch2); beta = 0 ignores self (NaN included), as
// PyTorch documents.
at::Tensor baddbmm(const at::Tensor& self, const at::Tensor& b1, const at::Tensor& b2,
                   const at::Scalar& beta0, const at::Scalar& alpha0) {
  // Half dtypes: the product, its scaling and the sum in float32, rounded once (CPU's kernel;
  // rounding the product first differed from it on a quarter of the elements).
  auto t = at::result_type(b1, b2);
  if (is_reduced_float(t) && self.scalar_type() == t) {
    return cast(dft::baddbmm(opmath(self), opmath(b1), opmath(b2), beta0, alpha0), t);
  }
  // Integer products take alpha and beta as integers (truncated), as CPU's kernel does.
  bool integral = !at::isFloatingType(t);
  auto beta = integral ? at::Scalar(beta0.toLong()) : beta0;
  auto alpha = integral ? at::Scalar(alpha0.toLong()) : alpha0;
  auto p = dft::bmm(b1, b2);  // qualified: at::bmm is found by ADL too
  if (!alpha.equal(1)) p = p * alpha;
  if (beta.equal(0)) return p.expand(at::infer_size(self.sizes(), p.sizes())).clone();
  return (beta.equal(1) ? self : self * beta) + p;
}

at::Tensor cat(const at::ITensorListRef& tensors, int64_t dim) {
  Operands o;
  size_t n = 0;
  const at::Tensor* first = nullptr;
  for (const at::Tensor& t : tensors) {
    if (!first) first = &t;
    // PyTorch still accepts legacy 1-D empty tensors in cat and skips them.
    if (t.dim() == 1 && t.numel() == 0) continue;
    o.t(t);
    ++n;
  }
  TORCH_CHECK(first, "torch.cat(): expected a non-empty list of Tensors");
  if (n == 0) return at::empty({0}, first->options());
  DfuseAttrs a{};
  a.dim = dim;
  return run(DFUSE_OP_KIND_CAT, &a, o, "cat");
}

at::Tensor& arange_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step,
                       at::Tensor& out) {
  DfuseAttrs a{};
  a.dtype = to_dtype(out.scalar_type());
  auto r = run(DFUSE_OP_KIND_ARANGE, &a, Operands().s(start).s(end).s(step), "arange");
  if (!out.sizes().equals(r.sizes())) out.resize_(r.sizes());
  return out.copy_(r);
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("mm", TORCH_FN(dft::mm));
  m.impl("bmm", TORCH_FN(dft::bmm));
  m.impl("mv", TORCH_FN(dft::mv));
  m.impl("dot", TORCH_FN(dft::dot));
  // vdot conjugates its first argument: for the real dtypes the device has, it is dot
  // (spectral_norm's power iteration calls it).
  m.impl("vdot", TORCH_FN(dft::dot));
  m.impl("addmm", TORCH_FN(dft::addmm));
  m.impl("addmm_", TORCH_FN(dft::addmm_));
  m.impl("baddbmm", DFT_GROUPED(dft::baddbmm));
  m.impl("cat", DFT_GROUPED(dft::cat));
  m.impl("arange.start_out", DFT_GROUPED(dft::arange_out));
}
