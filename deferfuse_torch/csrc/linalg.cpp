// Matrix products (mm, bmm, mv, dot, addmm, baddbmm, addmv, addbmm), cross products, cat and
// arange.
#include "common.h"
#include "complex.h"

#include <ATen/ExpandUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
#include <torch/library.h>

namespace dft {
namespace {

at::Tensor matmul2(const at::Tensor& a, const at::Tensor& b) {
  // complex64 (a Fourier layer's einsum over modes): four real products of the parts.
  if (a.is_complex() || b.is_complex()) {
    TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected m1 and m2 to have the same dtype, "
                "but got: ", a.dtype().name(), " != ", b.dtype().name());
    return complex_bilinear(a, b, matmul2);
  }
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

// vdot conjugates its first operand (the same as dot for real tensors).
at::Tensor vdot(const at::Tensor& a, const at::Tensor& b);

at::Tensor dot(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 1 && b.dim() == 1, "dot: expected 1-D tensors, got shapes ", a.sizes(),
              " and ", b.sizes());
  return matmul2(a, b);
}

at::Tensor vdot(const at::Tensor& a, const at::Tensor& b) {
  return dft::dot(a.is_complex() ? a.conj() : a, b);
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

// beta * self + alpha * p for a product p of baddbmm's family: alpha and beta truncated to
// integers for integer products, as CPU's kernels take them; beta = 0 ignores self (NaN
// included), as PyTorch documents.
at::Tensor scaled_sum(const at::Tensor& self, at::Tensor p, const at::Scalar& beta0,
                      const at::Scalar& alpha0) {
  bool integral = !at::isFloatingType(p.scalar_type());
  auto beta = integral ? at::Scalar(beta0.toLong()) : beta0;
  auto alpha = integral ? at::Scalar(alpha0.toLong()) : alpha0;
  if (!alpha.equal(1)) p = p * alpha;
  if (beta.equal(0)) return p.expand(at::infer_size(self.sizes(), p.sizes())).clone();
  return (beta.equal(1) ? self : self * beta) + p;
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
  return scaled_sum(self, dft::bmm(b1, b2), beta0, alpha0);  // at::bmm is found by ADL too
}

// addmv: beta * self + alpha * (mat @ vec), with CPU's checks (torch.addmv, and mv's and a
// vector matmul's out= forms, which PyTorch composes from addmv.out).
at::Tensor addmv(const at::Tensor& self, const at::Tensor& mat, const at::Tensor& vec,
                 const at::Scalar& beta, const at::Scalar& alpha) {
  TORCH_CHECK(mat.dim() == 2 && vec.dim() == 1 && self.dim() <= 1,
              "vector + matrix @ vector expected, got ", self.dim(), ", ", mat.dim(), ", ",
              vec.dim());
  TORCH_CHECK(mat.size(1) == vec.size(0) && (mat.size(0) == self.numel() || self.numel() == 1),
              "size mismatch, got input (", self.numel(), "), mat (", mat.size(0), "x",
              mat.size(1), "), vec (", vec.size(0), ")");
  auto t = at::result_type(mat, vec);
  if (is_reduced_float(t) && self.scalar_type() == t) {
    return cast(dft::addmv(opmath(self), opmath(mat), opmath(vec), beta, alpha), t);
  }
  return scaled_sum(self, matmul2(mat, vec), beta, alpha);
}

// addbmm: beta * self + alpha * the sum over the batch of batch1[i] @ batch2[i], as one product
// over every batch ([n, B * m] @ [B * m, p]) with CPU's checks; half dtypes sum batch by batch.
at::Tensor addbmm(const at::Tensor& self, const at::Tensor& b1, const at::Tensor& b2,
                  const at::Scalar& beta, const at::Scalar& alpha) {
  // CPU's order: self expanded to the result's shape first, then the batches checked.
  self.expand({b1.size(1), b2.size(2)});
  TORCH_CHECK(b1.dim() == 3, "batch1 must be a 3D tensor");
  TORCH_CHECK(b2.dim() == 3, "batch2 must be a 3D tensor");
  TORCH_CHECK(b1.size(0) == b2.size(0), "batch1 and batch2 must have same number of batches, got ",
              b1.size(0), " and ", b2.size(0));
  TORCH_CHECK(b1.size(2) == b2.size(1), "Incompatible matrix sizes for bmm (", b1.size(1), "x",
              b1.size(2), " and ", b2.size(1), "x", b2.size(2), ")");
  int64_t n = b1.size(1), k = b1.size(0) * b1.size(2), p = b2.size(2);
  if (is_reduced_float(b1.scalar_type()) && b1.size(0) > 0) {
    // Half dtypes as CPU's kernel: one addmm_ per batch, each rounded to the dtype.
    auto acc = self.expand({n, p}).clone();
    for (int64_t i = 0; i < b1.size(0); ++i) acc.addmm_(b1[i], b2[i], i == 0 ? beta : 1, alpha);
    return acc;
  }
  auto prod = matmul2(b1.permute({1, 0, 2}).reshape({n, k}), b2.reshape({k, p}));
  return scaled_sum(self, prod, beta, alpha);
}

// cat with a complex64 input: the pairs concatenated (a real input promoted, as CPU does), so
// the result is complex64 as on CPU. `dim` is checked against the inputs already.
at::Tensor complex_cat(const at::ITensorListRef& tensors, int64_t dim) {
  std::vector<at::Tensor> parts;
  int64_t wrapped = 0;
  bool first = true;
  auto promoted = at::kBool;
  for (const at::Tensor& t : tensors) promoted = c10::promoteTypes(promoted, t.scalar_type());
  TORCH_CHECK(promoted == at::kComplexFloat, "tpu: cat would give ", promoted,
              "; complex64 is the only complex dtype tpu holds");
  for (const at::Tensor& t : tensors) {
    if (t.dim() == 1 && t.numel() == 0) continue;
    if (first) wrapped = at::maybe_wrap_dim(dim, t.dim());
    first = false;
    parts.push_back(pairs(t.is_complex() ? t : t.to(at::kComplexFloat)));
  }
  return at::view_as_complex(at::cat(parts, wrapped));
}

at::Tensor cat(const at::ITensorListRef& tensors, int64_t dim) {
  const at::Tensor* first = nullptr;
  size_t n = 0;
  bool complex = false;
  for (const at::Tensor& t : tensors) {
    if (!first) first = &t;
    complex = complex || t.is_complex();
    // PyTorch still accepts legacy 1-D empty tensors in cat and skips them.
    if (!(t.dim() == 1 && t.numel() == 0)) ++n;
  }
  TORCH_CHECK(first, "torch.cat(): expected a non-empty list of Tensors");
  // CPU promotes over every input, the skipped legacy empties too (the runtime sees only the
  // others): a float64 empty with float32 tensors gives float64.
  auto dtype = at::native::result_type(tensors);
  if (n == 0) return at::empty({0}, first->options().dtype(dtype));
  // CPU's errors: a 0-dim tensor cannot be concatenated; a dim out of range (IndexError),
  // against the first tensor cat does not skip.
  int64_t position = 0;
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.dim() > 0, "zero-dimensional tensor (at position ", position,
                ") cannot be concatenated");
    ++position;
  }
  for (const at::Tensor& t : tensors) {
    if (t.dim() == 1 && t.numel() == 0) continue;
    at::maybe_wrap_dim(dim, t.dim());
    break;
  }
  if (complex) return complex_cat(tensors, dim);
  Operands o;
  for (const at::Tensor& t : tensors) {
    if (!(t.dim() == 1 && t.numel() == 0)) o.t(t);
  }
  DfuseAttrs a{};
  a.dim = dim;
  auto r = run(DFUSE_OP_KIND_CAT, &a, o, "cat");
  return r.scalar_type() == dtype ? r : cast(r, dtype);
}

at::Tensor& arange_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step,
                       at::Tensor& out) {
  // An integer dtype takes its bounds as int64 (truncated), and CPU refuses one past that
  // range rather than wrap it: Scalar::to<int64_t> raises CPU's message.
  if (at::isIntegralType(out.scalar_type(), /*includeBool=*/false)) {
    (void)start.to<int64_t>(), (void)end.to<int64_t>(), (void)step.to<int64_t>();
  }
  DfuseAttrs a{};
  a.dtype = to_dtype(out.scalar_type());
  auto r = run(DFUSE_OP_KIND_ARANGE, &a, Operands().s(start).s(end).s(step), "arange");
  if (out.numel() != r.numel()) {
    // CPU's warning, for an `out` that held elements.
    if (out.numel() > 0) {
      TORCH_WARN("The number of elements in the out tensor of shape ", out.sizes(), " is ",
                 out.numel(), " which does not match the computed number of elements ",
                 r.numel(), ". Note that this may occur as a result of rounding error. ",
                 "The out tensor will be resized to a tensor of shape (", r.numel(), ",).");
    }
    out.resize_(r.sizes());
  }
  // An out of the right numel keeps its shape, as on CPU (filled in its logical order).
  return out.copy_(r.view(out.sizes()));
}

// linalg.cross (torch.cross): the cross product of 3-vectors along `dim`, broadcast, with CPU's
// errors; each component a[i+1] * b[i+2] - a[i+2] * b[i+1] as CPU's kernel computes it.
at::Tensor cross_product(const at::Tensor& a, const at::Tensor& b, int64_t dim) {
  TORCH_CHECK(a.dim() == b.dim(), "linalg.cross: inputs must have the same number of dimensions.");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected scalar type ", a.scalar_type(),
              " but found ", b.scalar_type());
  int64_t d = c10::maybe_wrap_dim(dim, a.dim());
  TORCH_CHECK(a.size(d) == 3 && b.size(d) == 3, "linalg.cross: inputs dimension ", dim,
              " must have length 3. Got ", a.size(d), " and ", b.size(d));
  auto sizes = at::infer_size(a.sizes(), b.sizes());
  auto x = a.expand(sizes), y = b.expand(sizes);
  auto part = [d](const at::Tensor& t, int64_t i) { return t.narrow(d, i % 3, 1); };
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < 3; ++i) {
    out.push_back(part(x, i + 1) * part(y, i + 2) - part(x, i + 2) * part(y, i + 1));
  }
  return at::cat(out, d);
}

at::Tensor& cross_product_out(const at::Tensor& a, const at::Tensor& b, int64_t dim,
                              at::Tensor& out) {
  auto r = cross_product(a, b, dim);
  at::native::resize_output(out, r.sizes());
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
  m.impl("vdot", TORCH_FN(dft::vdot));
  m.impl("addmm", TORCH_FN(dft::addmm));
  m.impl("addmm_", TORCH_FN(dft::addmm_));
  m.impl("baddbmm", DFT_GROUPED(dft::baddbmm));
  m.impl("addmv", DFT_GROUPED(dft::addmv));
  m.impl("addbmm", DFT_GROUPED(dft::addbmm));
  m.impl("cat", DFT_GROUPED(dft::cat));
  m.impl("linalg_cross", DFT_GROUPED(dft::cross_product));
  m.impl("linalg_cross.out", TORCH_FN(dft::cross_product_out));
  m.impl("arange.start_out", DFT_GROUPED(dft::arange_out));
}
