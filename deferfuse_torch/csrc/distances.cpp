// Pairwise distances: torch.cdist's direct path (_cdist_forward) and F.pdist (_pdist_forward),
// what metric learning, prototype and nearest-neighbour losses call. PyTorch has CPU and CUDA
// kernels only, so on "tpu" both ran on the CPU fallback, their backwards too.
//
// Each is the p-norm of the differences of every pair of rows: one broadcast subtraction and
// one linalg_vector_norm. Registered for autograd as well, so the backward is autograd through
// those ops; vector_norm's gradient is zero where a distance is zero, as _cdist_backward's.
// One difference from CPU, stated in the README: for p = inf, a gradient is split between rows
// that tie for the largest difference (amax's rule) where CPU gives each tied one all of it.
// cdist's matrix-product path for p = 2 (more than 25 rows, PyTorch's _euclidean_dist) is
// composed by PyTorch itself and never comes here unless called directly.
#include "common.h"

#include <torch/library.h>

namespace dft {
namespace {

// The p-norm of each row of the differences, a distance per pair. p = 0 counts the differing
// columns: CPU's gradient is zeros, vector_norm's none at all (x.grad stayed None). A term that
// is zero and has a zero gradient keeps the inputs in the graph (where, unlike 0 * diff, reads
// no infinity).
at::Tensor row_norms(const at::Tensor& diff, double p) {
  auto dist = at::linalg_vector_norm(diff, p, -1);
  if (p != 0) return dist;
  auto none = at::zeros({}, diff.options().dtype(at::kBool));
  return dist + at::where(none, diff, at::zeros({}, diff.options())).sum(-1);
}

at::Tensor cdist_forward(const at::Tensor& x1, const at::Tensor& x2, double p,
                         std::optional<int64_t> compute_mode) {
  TORCH_CHECK(x1.dim() >= 2, "cdist only supports at least 2D tensors, X1 got: ", x1.dim(), "D");
  TORCH_CHECK(x2.dim() >= 2, "cdist only supports at least 2D tensors, X2 got: ", x2.dim(), "D");
  // Sizes compared as SymInts: while torch.compile traces with dynamic shapes, a size read as a
  // number is a guard on its value (a graph per size).
  TORCH_SYM_CHECK(x1.sym_size(-1).sym_eq(x2.sym_size(-1)),
                  "X1 and X2 must have the same number of columns. X1: ", x1.sym_size(-1),
                  " X2: ", x2.sym_size(-1));
  TORCH_CHECK(at::isFloatingType(x1.scalar_type()),
              "cdist only supports floating-point dtypes, X1 got: ", x1.scalar_type());
  TORCH_CHECK(at::isFloatingType(x2.scalar_type()),
              "cdist only supports floating-point dtypes, X2 got: ", x2.scalar_type());
  TORCH_CHECK(p >= 0, "cdist only supports non-negative p values");
  int64_t mode = compute_mode.value_or(0);
  TORCH_CHECK(mode >= 0 && mode <= 2, "possible modes: 0, 1, 2, but was: ", mode);
  if (p == 2 && (mode == 1 || (mode == 0 && (x1.sym_size(-2) > 25 || x2.sym_size(-2) > 25)))) {
    return at::_euclidean_dist(x1, x2);
  }
  return row_norms(x1.unsqueeze(-2) - x2.unsqueeze(-3), p);
}

at::Tensor pdist_forward(const at::Tensor& x, double p) {
  TORCH_CHECK(x.dim() == 2, "pdist only supports 2D tensors, got: ", x.dim(), "D");
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "pdist only supports floating-point dtypes");
  TORCH_CHECK(p >= 0, "pdist only supports non-negative p values");
  int64_t n = x.size(0);
  // The pairs i < j in row-major order, as the CPU kernel lists them (none for n <= 1: the
  // empty result still comes from x, so autograd sees it as x's, as CPU's does).
  auto pairs = at::triu_indices(n, n, 1, x.options().dtype(at::kLong));
  return row_norms(x.index_select(0, pairs[0]) - x.index_select(0, pairs[1]), p);
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_cdist_forward", DFT_GROUPED(dft::cdist_forward));
  m.impl("_pdist_forward", DFT_GROUPED(dft::pdist_forward));
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_cdist_forward", DFT_GROUPED(dft::cdist_forward));
  m.impl("_pdist_forward", DFT_GROUPED(dft::pdist_forward));
}
