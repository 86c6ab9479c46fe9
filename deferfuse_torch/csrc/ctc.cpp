// F.ctc_loss (speech and handwriting recognition; Hugging Face's *ForCTC heads): _ctc_loss and
// _ctc_loss_backward on the runtime's CTC kernel op (DFUSE_OP_KIND_CTC_LOSS: the alphas, the
// loss read from them, and the gradient), which runs PyTorch's CPU algorithm inside the flush;
// before, both ran on the CPU fallback (a download and a sync point each, twice a step).
//
// The lengths arrive as int lists: PyTorch's own meta kernel checks them (CPU's errors, word for
// word), and they travel to the op as one int64 [N, 3] tensor of input length, target length
// and target offset, so its shapes never depend on tensor values. Targets go as one 1-D int64
// tensor (a padded [N, S] one flattened). zero_infinity's zeroed gradient is a where here.
#include "common.h"

#include <torch/library.h>

namespace dft {
namespace {

void check_dtype(const at::Tensor& log_probs, const char* op) {
  auto d = log_probs.scalar_type();
  TORCH_CHECK(d == at::kFloat || d == at::kDouble, "\"", op, "\" not implemented for '", d, "'");
}

// The checks of PyTorch's meta kernel (the CPU kernel's own): sizes only, nothing read.
void check_like_cpu(const at::Tensor& log_probs, const at::Tensor& targets, at::IntArrayRef il,
                    at::IntArrayRef tl, int64_t blank) {
  auto meta = [](const at::Tensor& t) {
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
  };
  at::_ctc_loss(meta(log_probs), meta(targets), il, tl, blank, false);
}

// What the op takes besides log_probs: the targets as one int64 vector, the [N, 3] lengths and
// the longest target.
struct Plan {
  at::Tensor targets, lengths;
  int64_t max_target;
};

Plan plan(const at::Tensor& log_probs, const at::Tensor& targets, at::IntArrayRef il,
          at::IntArrayRef tl) {
  int64_t n = log_probs.size(1);
  std::vector<int64_t> lengths;
  int64_t offset = 0, max_target = 0;
  for (int64_t b = 0; b < n; ++b) {
    int64_t start = targets.dim() == 1 ? offset : b * targets.size(1);
    lengths.insert(lengths.end(), {il[b], tl[b], start});
    offset += tl[b];
    max_target = std::max(max_target, tl[b]);
  }
  auto host = at::tensor(lengths, at::TensorOptions().dtype(at::kLong)).view({n, 3});
  auto dev = at::empty({n, 3}, host.options().device(log_probs.device()));
  dev.copy_(host);
  auto t = targets.dim() == 1 ? targets : targets.reshape({-1});
  return {cast(t.contiguous(), at::kLong), dev, max_target};
}

DfuseAttrs ctc_attrs(uint32_t part, int64_t blank, int64_t max_target) {
  DfuseAttrs a = attrs_sub(part);
  a.dims[0] = blank;
  a.dims[1] = max_target;
  a.n_dims = 2;
  return a;
}

std::tuple<at::Tensor, at::Tensor> ctc_loss(const at::Tensor& log_probs, const at::Tensor& targets,
                                            at::IntArrayRef il, at::IntArrayRef tl, int64_t blank,
                                            bool /*zero_infinity: the backward's*/) {
  check_dtype(log_probs, "ctc_loss_cpu");
  check_like_cpu(log_probs, targets, il, tl, blank);
  auto p = plan(log_probs, targets, il, tl);
  auto a = ctc_attrs(DFUSE_CTC_PART_ALPHA, blank, p.max_target);
  auto alpha = run(DFUSE_OP_KIND_CTC_LOSS, &a, Operands().t(log_probs).t(p.targets).t(p.lengths),
                   "ctc_loss");
  auto l = ctc_attrs(DFUSE_CTC_PART_LOSS, blank, p.max_target);
  auto loss = run(DFUSE_OP_KIND_CTC_LOSS, &l, Operands().t(alpha).t(p.lengths), "ctc_loss");
  return {loss, alpha};
}

at::Tensor ctc_loss_backward(const at::Tensor& grad, const at::Tensor& log_probs,
                             const at::Tensor& targets, at::IntArrayRef il, at::IntArrayRef tl,
                             const at::Tensor& nll, const at::Tensor& log_alpha, int64_t blank,
                             bool zero_infinity) {
  check_dtype(log_probs, "ctc_loss_backward_cpu");
  auto p = plan(log_probs, targets, il, tl);
  auto a = ctc_attrs(DFUSE_CTC_PART_GRAD, blank, p.max_target);
  auto g = run(DFUSE_OP_KIND_CTC_LOSS, &a,
               Operands().t(grad).t(log_probs).t(p.targets).t(p.lengths).t(nll).t(log_alpha),
               "ctc_loss_backward");
  if (!zero_infinity) return g;
  // CPU zeroes a sample's whole gradient when its loss is +inf (no alignment fits).
  auto inf = nll.eq(std::numeric_limits<double>::infinity()).view({1, -1, 1});
  return at::where(inf, at::zeros({}, g.options()), g);
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_ctc_loss", TORCH_FN(dft::ctc_loss));
  m.impl("_ctc_loss_backward", TORCH_FN(dft::ctc_loss_backward));
}
