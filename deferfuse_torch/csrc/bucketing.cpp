// Ops that place values into bins: searchsorted, bucketize, histc, bincount and
// repeat_interleave's indices. searchsorted
// counts, for each value, the boundaries before it (a broadcast comparison and a sum, the same
// answer as CPU's binary search, NaN included); histc and bincount scatter-add ones (or
// weights) into their bins. Three read values back, as sync points counted as
// data_dependent_size (as nonzero does): bincount its input's min and max (its output size is
// the largest value), histc without a range its data's (CPU's error for a NaN or infinite one)
// and repeat_interleave without output_size its repeats' sum. The others never leave the
// device.
#include "common.h"

#include <torch/library.h>

#include <cmath>

namespace dft {
namespace {

// CPU's lower bound keeps going right while !(boundary >= value), its upper bound while
// !(boundary > value): the count of such boundaries is the insertion index.
at::Tensor insertion_index(const at::Tensor& sorted, const at::Tensor& values, bool right,
                           bool out_int32) {
  auto before = right ? sorted.unsqueeze(-2).gt(values.unsqueeze(-1))
                      : sorted.unsqueeze(-2).ge(values.unsqueeze(-1));
  auto idx = before.logical_not().sum(-1);
  return out_int32 ? idx.to(at::kInt) : idx;
}

bool side_is_right(const char* op, bool right, const std::optional<c10::string_view>& side) {
  if (!side) return right;
  TORCH_CHECK(*side == "left" || *side == "right", op, ": side can only be 'left' or 'right', "
              "got '", *side, "'");
  TORCH_CHECK(!right || *side == "right", op, ": side and right can't be set to opposites, got "
              "side of left while right was True");
  return *side == "right";
}

at::Tensor tpu_searchsorted(const at::Tensor& sorted, const at::Tensor& self, bool out_int32,
                            bool right, std::optional<c10::string_view> side,
                            const std::optional<at::Tensor>& sorter) {
  const char* op = "searchsorted";
  bool r = side_is_right(op, right, side);
  auto seq = sorted;
  if (sorter && sorter->defined()) {
    TORCH_CHECK(sorter->sizes().equals(sorted.sizes()), op, ": boundary and sorter must have "
                "the same size, but got boundary tensor ", sorted.sizes(),
                " and got sorter tensor ", sorter->sizes());
    seq = at::gather(sorted, -1, *sorter);
  }
  TORCH_CHECK(seq.dim() == 1 || (seq.dim() == self.dim() &&
                                 seq.sizes().slice(0, seq.dim() - 1)
                                     .equals(self.sizes().slice(0, self.dim() - 1))),
              op, ": boundaries tensor should be 1 dimension or the first N-1 dimensions of "
              "boundaries tensor and input value tensor must match, but we got boundaries tensor ",
              seq.sizes(), " and input value tensor ", self.sizes());
  if (seq.dim() == 1) {
    auto flat = insertion_index(seq, self.reshape({-1}), r, out_int32);
    return flat.view(self.sizes());
  }
  return insertion_index(seq, self, r, out_int32);
}

// A scalar value compares in the dtype it promotes to with the boundaries as a Python number
// (a wrapped scalar), as on CPU: 0.5 among int64 boundaries is a float32 between 0 and 1 (cast
// to int64 first, it was truncated to 0), and 1.00000001 is float32's 1.
at::Tensor scalar_values(const at::Scalar& value, const at::Tensor& boundaries) {
  return at::scalar_tensor(value, boundaries.options().dtype(at::result_type(boundaries, value)));
}

at::Tensor searchsorted_scalar(const at::Tensor& sorted, const at::Scalar& self, bool out_int32,
                               bool right, std::optional<c10::string_view> side,
                               const std::optional<at::Tensor>& sorter) {
  TORCH_CHECK(sorted.dim() == 1, "searchsorted: input value can be a scalar only when boundaries "
              "tensor dimension is 1, but we got boundaries tensor dim(", sorted.dim(), ")");
  return tpu_searchsorted(sorted, scalar_values(self, sorted), out_int32, right, side, sorter);
}

at::Tensor tpu_bucketize(const at::Tensor& self, const at::Tensor& boundaries, bool out_int32,
                         bool right) {
  TORCH_CHECK(boundaries.dim() == 1, "bucketize: boundaries tensor must be 1 dimension, but got "
              "dim(", boundaries.dim(), ")");
  return tpu_searchsorted(boundaries, self, out_int32, right, std::nullopt, std::nullopt);
}

at::Tensor bucketize_scalar(const at::Scalar& self, const at::Tensor& boundaries, bool out_int32,
                            bool right) {
  return tpu_bucketize(scalar_values(self, boundaries), boundaries, out_int32, right);
}

// histc: `bins` equal bins over [min, max] (the data's own range when min == max, read back,
// widened by one each way when that is empty too); values outside are not counted, the last
// bin includes max. With the range given, nothing is read back.
//
// Integer inputs are counted as CUDA counts them (PyTorch's CPU kernel refuses them): a result
// of the input's dtype, min and max truncated to it, bins found in float64 (exact for the
// integer division CUDA does on values below 2^53). Hugging Face's mixture-of-experts layers
// count tokens per expert with histc of int32 ids on every device but the CPU and MPS.
at::Tensor tpu_histc(const at::Tensor& self, int64_t bins, const at::Scalar& min,
                     const at::Scalar& max) {
  TORCH_CHECK(bins > 0, "histc: bins must be > 0, but got ", bins, " for dimension 0");
  const bool integral = at::isIntegralType(self.scalar_type(), /*includeBool=*/false);
  TORCH_CHECK(self.is_floating_point() || integral, "histc: \"histogram_cpu\" not implemented for '",
              self.scalar_type(), "'");
  double lo_s = min.toDouble(), hi_s = max.toDouble();
  if (integral) {
    lo_s = std::trunc(lo_s);
    hi_s = std::trunc(hi_s);
  }
  TORCH_CHECK(lo_s <= hi_s, "histc: min should not exceed max, but got min ", lo_s, " max ", hi_s);
  auto hist = at::zeros({bins}, self.options());
  if (self.numel() == 0) return hist;
  auto x = self.reshape({-1});
  if (integral) x = x.to(at::kDouble);
  if (lo_s == hi_s) {
    // The data's own range, read back (a sync point counted as data_dependent_size) so a
    // NaN or an infinity among the values raises CPU's error rather than counting nothing.
    auto range = read_for_size(at::stack({x.min(), x.max()}).to(at::kDouble));
    lo_s = range[0].item<double>();
    hi_s = range[1].item<double>();
  }
  TORCH_CHECK(std::isfinite(lo_s) && std::isfinite(hi_s), "torch.histc: range of [", lo_s, ", ",
              hi_s, "] is not finite");
  if (lo_s == hi_s) {
    lo_s -= 1;
    hi_s += 1;
  }
  auto lo = at::scalar_tensor(lo_s, x.options());
  auto hi = at::scalar_tensor(hi_s, x.options());
  auto inside = x.ge(lo).logical_and(x.le(hi));
  auto pos = at::trunc((x - lo) * double(bins) / (hi - lo));
  auto bin = at::clamp(at::where(inside, pos, at::zeros({}, pos.options())), 0, bins - 1);
  return hist.scatter_add(0, bin.to(at::kLong), inside.to(self.scalar_type()));
}

// bincount: counts (or summed weights) of each value 0 .. max(input), at least minlength bins.
// Float weights sum in float, any other weights in double, as on CPU.
at::Tensor tpu_bincount(const at::Tensor& self, const std::optional<at::Tensor>& weights,
                        c10::SymInt minlength_) {
  int64_t minlength = minlength_.expect_int();
  TORCH_CHECK(minlength >= 0, "bincount: minlength should be >= 0, got ", minlength);
  // As CPU: a dtype its kernel lacks is a NotImplementedError, a shape a RuntimeError.
  TORCH_CHECK_NOT_IMPLEMENTED(
      !at::isFloatingType(self.scalar_type()) && self.scalar_type() != at::kBool,
      "\"bincount\" not implemented for '", self.scalar_type(), "' (tpu: bincount only supports "
      "1-d non-negative integral inputs)");
  TORCH_CHECK(self.dim() == 1, "bincount only supports 1-d non-negative integral inputs, got a ",
              self.dim(), "-D tensor");
  bool weighted = weights && weights->defined();
  if (weighted) {
    TORCH_CHECK(weights->dim() == 1 && weights->size(0) == self.size(0), "bincount: weights "
                "should be 1-d and have the same length as input, got weights of shape ",
                weights->sizes(), " for an input of shape ", self.sizes());
  }
  auto dtype = !weighted ? at::kLong
                         : (weights->scalar_type() == at::kFloat ? at::kFloat : at::kDouble);
  if (self.numel() == 0) return at::zeros({minlength}, self.options().dtype(dtype));
  auto range = read_for_size(at::stack({self.min(), self.max()}).to(at::kLong));
  int64_t lo = range[0].item<int64_t>(), hi = range[1].item<int64_t>();
  TORCH_CHECK(lo >= 0, "bincount only supports 1-d non-negative integral inputs, got the value ",
              lo);
  auto counts = at::zeros({std::max(hi + 1, minlength)}, self.options().dtype(dtype));
  auto add = weighted ? weights->to(dtype) : at::ones({self.size(0)}, counts.options());
  return counts.scatter_add(0, self.to(at::kLong), add);
}

// repeat_interleave(repeats): index i repeated repeats[i] times ([1, 0, 3] -> [0, 2, 2, 2]),
// what `x.repeat_interleave(tensor, dim)` index_selects with (it ran on the CPU fallback). A
// one at each entry's first position (entries that repeat 0 times share it; one starting at
// the end lands in an extra slot), summed along: as embedding_bag's bag of each position. The
// length is the repeats' sum: one read, with their minimum for CPU's negative check, unless
// output_size gives it.
at::Tensor repeat_interleave_indices(const at::Tensor& repeats,
                                     std::optional<c10::SymInt> output_size) {
  TORCH_CHECK(repeats.dim() == 1, "repeat_interleave only accept 1D vector as repeat");
  TORCH_CHECK(repeats.scalar_type() == at::kLong || repeats.scalar_type() == at::kInt,
              "repeats has to be Long or Int tensor");
  if (repeats.numel() == 0) return at::empty({0}, repeats.options());
  auto longs = repeats.options().dtype(at::kLong);
  auto cum = repeats.to(at::kLong).cumsum(0);
  int64_t total = 0;
  if (output_size.has_value()) {
    total = output_size->expect_int();
  } else {
    auto host = read_for_size(at::stack({cum[-1], repeats.min().to(at::kLong)}));
    TORCH_CHECK(host[1].item<int64_t>() >= 0, "repeats can not be negative");
    total = host[0].item<int64_t>();
  }
  auto marks = at::zeros({total + 1}, longs)
                   .index_add(0, cum.slice(0, 0, -1), at::ones({repeats.numel() - 1}, longs));
  return marks.slice(0, 0, total).cumsum(0).to(repeats.scalar_type());
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("repeat_interleave.Tensor", DFT_GROUPED(dft::repeat_interleave_indices));
  m.impl("searchsorted.Tensor", DFT_GROUPED(dft::tpu_searchsorted));
  m.impl("searchsorted.Scalar", TORCH_FN(dft::searchsorted_scalar));
  m.impl("bucketize.Tensor", DFT_GROUPED(dft::tpu_bucketize));
  m.impl("bucketize.Scalar", TORCH_FN(dft::bucketize_scalar));
  m.impl("histc", DFT_GROUPED(dft::tpu_histc));
  m.impl("bincount", DFT_GROUPED(dft::tpu_bincount));
}
