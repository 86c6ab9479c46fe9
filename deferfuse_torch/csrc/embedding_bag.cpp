// nn.EmbeddingBag / F.embedding_bag on "tpu": each bag's rows summed, averaged or maxed.
//
// PyTorch's _embedding_bag is a fused kernel for CPU and CUDA only; on "tpu" it ran on the CPU
// fallback, forward and backward. Here it is the device's ops: the rows looked up with
// at::embedding (whose backward already handles padding_idx and scale_grad_by_freq), each
// position's bag numbered from the offsets, then an index_add per bag (sum, mean) or, for max,
// the first position holding each bag's maximum, gathered. Registered for autograd as well,
// so the backward is autograd through those ops: the gradient of a max goes to that first
// position, as CPU's does.
//
// Not checked, unlike CPU: that offsets[0] is 0 and that offsets increase (each would be a
// host read of a device tensor, a sync point in defer mode); invalid offsets give unspecified
// bags instead of an error. Rows past the table's end fail as index_select's do.
#include "common.h"

#include <torch/library.h>

#include <limits>

namespace dft {
namespace {

enum Mode : int64_t { kSum = 0, kMean = 1, kMax = 2 };

using Bags = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

Bags embedding_bag(const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& offsets,
                   bool scale_grad_by_freq, int64_t mode, bool sparse,
                   const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
                   int64_t padding_idx) {
  TORCH_CHECK(indices.dim() == 1, "input has to be a 1D or 2D Tensor, but got Tensor of dimension ",
              indices.dim());
  TORCH_CHECK(offsets.dim() == 1, "offsets has to be a 1D Tensor, but got Tensor of dimension ",
              offsets.dim());
  TORCH_CHECK(weight.dim() == 2, "weight has to be a 2D Tensor, but got Tensor of dimension ",
              weight.dim());
  TORCH_CHECK(mode >= kSum && mode <= kMax, "embedding_bag: unknown mode ", mode);
  TORCH_CHECK(!sparse, "tpu: embedding_bag with sparse=True is not supported: the device has no "
              "sparse tensors; use sparse=False (dense gradients)");
  bool weighted = per_sample_weights && per_sample_weights->defined();
  TORCH_CHECK(!weighted || mode == kSum, "embedding_bag: per_sample_weights was not None. "
              "per_sample_weights is only supported for mode='sum' (got mode='",
              mode == kMean ? "mean" : "max", "'). Please open a feature request on GitHub.");
  TORCH_CHECK(!(scale_grad_by_freq && mode == kMax),
              "max mode does not support scaling the gradient by the frequency");
  TORCH_SYM_CHECK(offsets.sym_numel().sym_ge(include_last_offset ? 1 : 0),
                  "include_last_offset: number of offset should be at least 1");
  // Sizes are symbolic while torch.compile traces with dynamic shapes: as numbers they made
  // the trace fail (or guard on every batch's size).
  const c10::SymInt n = indices.sym_numel();
  const c10::SymInt bags = include_last_offset ? offsets.sym_numel() - 1 : offsets.sym_numel();
  if (get_mode() == DFUSE_MODE_DEBUG && recordable(offsets) && offsets.numel() > 0) {
    // Debug mode checks the offsets as CPU's kernel does (a host read the other modes skip).
    auto o = offsets.to(at::kLong).cpu();
    const int64_t* v = o.const_data_ptr<int64_t>();
    TORCH_CHECK(v[0] == 0, "offsets[0] has to be 0, i.e., the first sequence in the mini-batch "
                "has to start from position 0. However, got ", v[0]);
    for (int64_t i = 1; i < o.numel(); ++i) {
      TORCH_CHECK(v[i] >= v[i - 1], "embedding_bag: offsets must be non-decreasing, got offsets[",
                  i, "] = ", v[i], " after ", v[i - 1]);
    }
    TORCH_CHECK(v[o.numel() - 1] <= n.expect_int(), "offsets[-1] can not be greater than input's length ", n,
                ", but got offsets[-1] of ", v[o.numel() - 1]);
  }
  const c10::SymInt dim = weight.sym_size(1);
  auto idx_opts = indices.options();
  if (bags.maybe_as_int() == 0) {
    // No bags (include_last_offset with one offset): CPU's empty results. Below, every
    // position would belong to bag -1, which debug mode's bounds check refuses.
    // The empty result still comes from the weight, so backward gives it a zero gradient.
    auto none = at::empty({0}, idx_opts);
    return {weight.slice(0, 0, 0).clone(), at::zeros_symint({n}, idx_opts),
            none, mode == kMax ? at::empty_symint({0, dim}, idx_opts) : none};
  }

  // offset2bag[i]: the bag of position i. A 1 where each bag starts (a bag starting at n, an
  // empty trailing one, lands in the extra slot), summed along: empty bags are skipped.
  auto starts = offsets.slice_symint(0, 0, bags).to(at::kLong);
  auto marks = at::zeros_symint({n + 1}, idx_opts.dtype(at::kLong))
                   .index_add(0, starts, at::ones_symint({bags}, idx_opts.dtype(at::kLong)));
  auto offset2bag = marks.slice_symint(0, 0, n).cumsum(0) - 1;

  // Padding positions take no part: zero rows, not counted in a bag's size.
  auto rows = at::embedding(weight, indices, padding_idx, scale_grad_by_freq, false);
  at::Tensor keep;
  if (padding_idx >= 0) {
    keep = indices.ne(padding_idx);
    rows = rows * keep.unsqueeze(1).to(rows.scalar_type());
  }
  auto counts =
      keep.defined() ? keep.to(at::kLong) : at::ones_symint({n}, idx_opts.dtype(at::kLong));
  auto bag_size =
      at::zeros_symint({bags}, idx_opts.dtype(at::kLong)).index_add(0, offset2bag, counts);

  at::Tensor out, max_indices;
  if (mode == kMax && n.maybe_as_int() == 0) {
    // No positions at all: every bag is empty, zeros and index -1 (gathering a row of the
    // empty lookup raised at the result's read).
    out = at::zeros_symint({bags, dim}, rows.options()) + rows.sum();
    max_indices = at::full_symint({bags, dim}, -1, idx_opts);
  } else if (mode == kMax) {
    // As CPU's loop: each bag starts from its first (non-padding) position's row and takes a
    // later one only where it is greater, so the first of equal values stays, a NaN later in
    // the bag is passed over, and a NaN first stays (no value is greater). That is the largest
    // non-NaN value at its first position, or NaN at the first position where that one is
    // NaN; an empty bag (or one of padding only) gives zeros and index -1.
    auto where_rows = offset2bag.unsqueeze(1).expand_symint({n, dim});
    const double lowest = -std::numeric_limits<double>::infinity();
    auto values = rows.detach();
    auto candidates = keep.defined() ? at::where(keep.unsqueeze(1), values, lowest) : values;
    auto positions =
        at::arange(c10::Scalar(n), idx_opts.dtype(at::kLong)).unsqueeze(1).expand_symint({n, dim});
    const c10::Scalar none(n);  // past every position: a bag with no maximum
    auto first_of = [&](const at::Tensor& chosen) {
      return at::full_symint({bags, dim}, none, idx_opts.dtype(at::kLong))
          .scatter_reduce(0, where_rows, at::where(chosen, positions, none), "amin", true);
    };
    auto nan = values.isnan();
    auto best = at::full_symint({bags, dim}, lowest, rows.options())
                    .scatter_reduce(0, where_rows, at::where(nan, lowest, candidates), "amax",
                                    true);
    auto is_best = candidates.eq(best.index_select(0, offset2bag));
    at::Tensor start = keep.defined() ? keep.unsqueeze(1).expand_symint({n, dim})
                                      : at::ones_like(nan);
    if (keep.defined()) is_best = is_best.logical_and(start);
    auto first_kept = first_of(start);
    auto has = first_kept.ne(none);
    auto nan_first = has.logical_and(
        nan.gather(0, at::where(has, first_kept, 0)));
    auto first = at::where(nan_first, first_kept, first_of(is_best));
    auto empty = first.eq(none);
    auto safe = at::where(empty, 0, first);
    out = at::where(empty.logical_not(), rows.gather(0, safe), 0);
    max_indices = at::where(empty, -1, indices.to(at::kLong).index_select(0, safe.view(-1))
                                           .view_symint({bags, dim}))
                      .to(indices.scalar_type());
  } else {
    if (weighted) rows = rows * per_sample_weights->unsqueeze(1).to(rows.scalar_type());
    out = at::zeros_symint({bags, dim}, rows.options()).index_add(0, offset2bag, rows);
    if (mode == kMean) {
      out = out / bag_size.clamp_min(1).unsqueeze(1).to(out.scalar_type());
    }
    max_indices = at::empty({0}, idx_opts);
  }
  return {out, offset2bag.to(indices.scalar_type()), bag_size.to(indices.scalar_type()),
          max_indices};
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_embedding_bag", DFT_GROUPED(dft::embedding_bag));
  m.impl("_embedding_bag_forward_only", DFT_GROUPED(dft::embedding_bag));
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_embedding_bag", DFT_GROUPED(dft::embedding_bag));
  m.impl("_embedding_bag_forward_only", DFT_GROUPED(dft::embedding_bag));
}
