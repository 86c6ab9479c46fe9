// Indexing kernels: index_select, gather, the scatter family, index_add, index_copy,
// index_fill, embedding's backward, advanced indexing (x[idx], x[idx] = v, x[mask]),
// masked_select, masked_scatter_, nonzero, isin, flip, roll and channel_shuffle.
// All of them are the runtime's gather or scatter over an index view: index_select's 1-D index,
// for example, is viewed with stride 0 along every other dim, so no expanded copy is made.
// Ops whose output size depends on the data (nonzero, boolean masks) read the mask on the host:
// a sync point, as on CUDA, counted as sync_points["data_dependent_size"].
#include "complex.h"
#include "kernel_ops.h"

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/WrapDimUtilsMulti.h>
#include <torch/library.h>

namespace dft {

at::Tensor expand_index(const at::Tensor& index, at::IntArrayRef like, int64_t dim) {
  auto flat = index.reshape({-1});
  std::vector<int64_t> sizes = like.vec(), strides(like.size(), 0);
  sizes[dim] = flat.size(0);
  strides[dim] = flat.stride(0);
  return flat.as_strided(sizes, strides, flat.storage_offset());
}

namespace {

void check_index_dtype(const at::Tensor& index, const char* op) {
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt, op,
              "(): Expected dtype int32/int64 for index, got ", index.scalar_type());
}

// Writes `value` into `self` in place (every alias of self sees it).
at::Tensor& assign(at::Tensor& self, const at::Tensor& value) {
  run_into(DFUSE_OP_KIND_COPY, nullptr, Operands().t(value), self, "in-place indexing op");
  return self;
}

// `dim` wrapped as CPU wraps it: a 0-dim tensor takes 0 or -1 (IndexError otherwise).
int64_t wrap(const at::Tensor& self, int64_t dim) {
  return at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
}

at::Tensor tpu_index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  check_index_dtype(index, "index_select");
  TORCH_CHECK_INDEX(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
  wrap(self, dim);  // CPU's IndexError for a bad dim
  if (self.dim() == 0) {
    // A 0-dim source has one element and takes one index (which must be 0); the result is
    // 0-dim like the source, as on CPU.
    TORCH_CHECK(index.numel() == 1, "index_select(): Index to scalar can have only 1 value, got ",
                index.numel(), " value(s)");
    return gather_op(self.reshape({1}), 0, index.reshape({1})).reshape({});
  }
  dim = at::maybe_wrap_dim(dim, self.dim());
  return gather_op(self, dim, expand_index(index, self.sizes(), dim));
}

at::Tensor& index_select_out(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                             at::Tensor& out) {
  // CPU's checks: an out sharing memory with an input is refused, not read while written.
  at::assert_no_internal_overlap(out);
  at::assert_no_overlap(out, self);
  at::assert_no_overlap(out, index);
  auto r = tpu_index_select(self, dim, index);
  at::native::resize_output(out, r.sizes());
  return assign(out, r);
}

at::Tensor tpu_gather(const at::Tensor& self, int64_t dim, const at::Tensor& index, bool) {
  // CPU checks the index dtype only when there is an index to read.
  if (index.numel() == 0) return at::empty(index.sizes(), self.options());
  check_index_dtype(index, "gather");
  // A 0-dim input takes an index of one element of rank 0 or 1 (CPU's result: its shape).
  if (self.dim() == 0 && index.dim() == 1) {
    return gather_op(self.reshape({1}), 0, index).reshape(index.sizes());
  }
  // A 1-D input takes a 0-dim index as one of one element (a 0-dim result), as on CPU.
  if (self.dim() == 1 && index.dim() == 0) {
    return gather_op(self, wrap(self, dim), index.reshape({1})).reshape({});
  }
  return gather_op(self, wrap(self, dim), index);
}

at::Tensor& gather_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, bool sg,
                       at::Tensor& out) {
  auto r = tpu_gather(self, dim, index, sg);
  at::native::resize_output(out, r.sizes());
  return assign(out, r);
}

ScatterReduce parse_reduce(c10::string_view reduce, bool two) {
  if (reduce == "sum" || (!two && reduce == "add")) return ScatterReduce::Sum;
  if (reduce == "prod" || (!two && reduce == "multiply")) return ScatterReduce::Prod;
  if (two && reduce == "mean") return ScatterReduce::Mean;
  // CPU's scatter_reduce also takes "max" and "min" for amax and amin.
  if (two && (reduce == "amax" || reduce == "max")) return ScatterReduce::Amax;
  if (two && (reduce == "amin" || reduce == "min")) return ScatterReduce::Amin;
  TORCH_CHECK(false, "reduce argument must be ",
              two ? "one of sum, prod, mean, amax, amin" : "either add or multiply", ", got ",
              reduce);
}

// The scatter family's index: CPU checks its dtype only when it has elements (gather's
// backward scatters through an empty uint8 index); scatter_op returns self for an empty one.
const at::Tensor& scatter_index(const at::Tensor& index, const char* op) {
  if (index.numel() > 0) check_index_dtype(index, op);
  return index;
}

// scatter_index for a scatter from a tensor: CPU checks first that src has self's dtype (the
// runtime would cast it: an int64 self took a float32 src's values truncated).
const at::Tensor& scatter_index(const at::Tensor& index, const char* op, const at::Tensor& self,
                                const at::Tensor& src) {
  TORCH_CHECK(self.scalar_type() == src.scalar_type(),
              "scatter(): Expected self.dtype to be equal to src.dtype");
  return scatter_index(index, op);
}

// CPU's scatter_add, scatter_reduce (sum, mean, prod), scatter's reduce="add"/"multiply" and
// some index_adds (index_add_to) accumulate float16/bfloat16 values in float32 and round each
// result once (2000 additions of 0.1 into one element give 200, where rounding every step
// stalls at 32 in bfloat16; gather's and index_select's backward are such scatters): the
// runtime's scatter does so when asked (`wide`), with float32 running values for the elements
// the index reaches only. Other index_adds, index_put_'s accumulate and embedding's backward
// round every step on CPU, as the runtime's scatter does otherwise.
bool sums_wide(const at::Tensor& self, ScatterReduce r) {
  return is_reduced_float(self.scalar_type()) &&
         (r == ScatterReduce::Sum || r == ScatterReduce::Mean || r == ScatterReduce::Prod);
}

// scatter_op, summing half types in float32 where CPU does (sums_wide; a mean as CPU's: the
// rounded sum over the count rounded to the dtype).
at::Tensor scatter_sums(const at::Tensor& self, int64_t dim, const at::Tensor& idx,
                        const at::Tensor& src, ScatterReduce r, bool include_self = true,
                        ScatterInto into = ScatterInto::Copy) {
  return scatter_op(self, dim, idx, src, r, include_self, into, sums_wide(self, r));
}

// scatter_value_op, summing half types in float32 where CPU does.
at::Tensor scatter_value_sums(const at::Tensor& self, int64_t dim, const at::Tensor& idx,
                              const at::Scalar& value, ScatterReduce r,
                              ScatterInto into = ScatterInto::Copy) {
  if (sums_wide(self, r)) check_value_fits(value, self.scalar_type());  // CPU's overflow error
  return scatter_value_op(self, dim, idx, value, r, into, sums_wide(self, r));
}

at::Tensor scatter_src(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                       const at::Tensor& src) {
  auto idx = scatter_index(index, "scatter", self, src);
  return scatter_op(self, wrap(self, dim), idx, src, ScatterReduce::Assign);
}

at::Tensor scatter_value(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                         const at::Scalar& value) {
  auto idx = scatter_index(index, "scatter");
  return scatter_value_op(self, wrap(self, dim), idx, value, ScatterReduce::Assign);
}

at::Tensor scatter_reduce_src(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                              const at::Tensor& src, c10::string_view reduce) {
  auto idx = scatter_index(index, "scatter", self, src);
  return scatter_sums(self, wrap(self, dim), idx, src, parse_reduce(reduce, false));
}

at::Tensor scatter_reduce_value(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                                const at::Scalar& value, c10::string_view reduce) {
  auto idx = scatter_index(index, "scatter");
  return scatter_value_sums(self, wrap(self, dim), idx, value, parse_reduce(reduce, false));
}

at::Tensor tpu_scatter_add(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                       const at::Tensor& src) {
  auto idx = scatter_index(index, "scatter_add", self, src);
  return scatter_sums(self, wrap(self, dim), idx, src, ScatterReduce::Sum);
}

at::Tensor scatter_reduce_two(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                              const at::Tensor& src, c10::string_view reduce,
                              bool include_self) {
  auto idx = scatter_index(index, "scatter_reduce", self, src);
  return scatter_sums(self, wrap(self, dim), idx, src, parse_reduce(reduce, true), include_self);
}

// The in-place scatters write into self itself (ScatterInto::Self): only the indexed elements.
at::Tensor& scatter_src_(at::Tensor& self, int64_t dim, const at::Tensor& index,
                         const at::Tensor& src) {
  auto idx = scatter_index(index, "scatter", self, src);
  scatter_op(self, wrap(self, dim), idx, src, ScatterReduce::Assign, true, ScatterInto::Self);
  return self;
}

at::Tensor& scatter_value_(at::Tensor& self, int64_t dim, const at::Tensor& index,
                           const at::Scalar& value) {
  auto idx = scatter_index(index, "scatter");
  scatter_value_op(self, wrap(self, dim), idx, value, ScatterReduce::Assign, ScatterInto::Self);
  return self;
}

at::Tensor& scatter_reduce_src_(at::Tensor& self, int64_t dim, const at::Tensor& index,
                                const at::Tensor& src, c10::string_view reduce) {
  auto idx = scatter_index(index, "scatter", self, src);
  scatter_sums(self, wrap(self, dim), idx, src, parse_reduce(reduce, false), true,
               ScatterInto::Self);
  return self;
}

at::Tensor& scatter_reduce_value_(at::Tensor& self, int64_t dim, const at::Tensor& index,
                                  const at::Scalar& value, c10::string_view reduce) {
  auto idx = scatter_index(index, "scatter");
  scatter_value_sums(self, wrap(self, dim), idx, value, parse_reduce(reduce, false),
                     ScatterInto::Self);
  return self;
}

at::Tensor& scatter_add_(at::Tensor& self, int64_t dim, const at::Tensor& index,
                         const at::Tensor& src) {
  auto idx = scatter_index(index, "scatter_add", self, src);
  scatter_sums(self, wrap(self, dim), idx, src, ScatterReduce::Sum, true, ScatterInto::Self);
  return self;
}

at::Tensor& scatter_reduce_two_(at::Tensor& self, int64_t dim, const at::Tensor& index,
                                const at::Tensor& src, c10::string_view reduce,
                                bool include_self) {
  auto idx = scatter_index(index, "scatter_reduce", self, src);
  scatter_sums(self, wrap(self, dim), idx, src, parse_reduce(reduce, true), include_self,
               ScatterInto::Self);
  return self;
}

at::Tensor index_add_to(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                        const at::Tensor& source, const at::Scalar& alpha, ScatterInto into) {
  check_index_dtype(index, "index_add");
  TORCH_CHECK(index.dim() <= 1, "index_add_(): Index is supposed to be a vector");
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "index_add_(): self (",
              self.scalar_type(), ") and source (", source.scalar_type(),
              ") must have the same scalar type");
  if (into == ScatterInto::Self) at::assert_no_overlap(self, source);
  if (self.dim() == 0) {
    auto r = index_add_to(self.reshape({1}), 0, index.reshape({-1}), source.reshape({-1}), alpha,
                          into);
    return r.reshape({});
  }
  dim = at::maybe_wrap_dim(dim, self.dim());
  auto src = source.dim() == 0 ? source.reshape({1}) : source;
  if (!alpha.equal(1)) src = src * alpha;
  // CPU sums half types in float32 (sums_wide) only into a self of two or more dims, along its
  // first or last dim, with alpha 1 (its scatter_add path); otherwise it rounds every step.
  auto idx = expand_index(index, src.sizes(), dim);
  bool scatter_add_path = self.dim() > 1 && (dim == 0 || dim == self.dim() - 1) && alpha.equal(1);
  if (!scatter_add_path) return scatter_op(self, dim, idx, src, ScatterReduce::Sum, true, into);
  return scatter_sums(self, dim, idx, src, ScatterReduce::Sum, true, into);
}

at::Tensor tpu_index_add(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                         const at::Tensor& source, const at::Scalar& alpha) {
  return index_add_to(self, dim, index, source, alpha, ScatterInto::Copy);
}

at::Tensor& index_add_(at::Tensor& self, int64_t dim, const at::Tensor& index,
                       const at::Tensor& source, const at::Scalar& alpha) {
  index_add_to(self, dim, index, source, alpha, ScatterInto::Self);
  return self;
}

at::Tensor& index_add_out(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                          const at::Tensor& source, const at::Scalar& alpha, at::Tensor& out) {
  auto r = tpu_index_add(self, dim, index, source, alpha);
  at::native::resize_output(out, r.sizes());
  return assign(out, r);
}

// index_copy: source's slices written at the indexed positions of dim (a scatter); HF's
// static KV cache writes each step's keys and values this way.
at::Tensor index_copy_to(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                         const at::Tensor& source, ScatterInto into) {
  TORCH_CHECK_INDEX(index.dim() <= 1, "index_copy_(): Index should have dimension 1 or 0 (got ",
                    index.dim(), ")");
  TORCH_CHECK_INDEX(index.scalar_type() == at::kLong,
                    "index_copy_(): Expected a long tensor for index, but got ",
                    index.scalar_type());
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "index_copy_(): self and source "
              "expected to have the same dtype, but got (self) ", self.scalar_type(),
              " and (source) ", source.scalar_type());
  if (self.dim() == 0) {
    return index_copy_to(self.reshape({1}), 0, index.reshape({-1}), source.reshape({-1}), into)
        .reshape({});
  }
  dim = at::maybe_wrap_dim(dim, self.dim());
  auto src = source.dim() == 0 ? source.reshape({1}) : source;
  bool same_slices = src.dim() == self.dim();
  for (int64_t d = 0; same_slices && d < self.dim(); ++d) {
    same_slices = d == dim || src.size(d) == self.size(d);
  }
  TORCH_CHECK_INDEX(same_slices, "index_copy_(): Source/destination tensor must have same slice "
                    "shapes. Destination slice shape: ", self.sizes(), " at dimension ", dim,
                    " and source slice shape: ", src.sizes(), " at dimension ", dim, ".");
  TORCH_CHECK_INDEX(index.numel() == src.size(dim), "index_copy_(): Number of indices (",
                    index.numel(), ") should be equal to source.size(dim) (", src.size(dim), ")");
  return scatter_op(self, dim, expand_index(index, src.sizes(), dim), src, ScatterReduce::Assign,
                    true, into);
}

at::Tensor tpu_index_copy(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                          const at::Tensor& source) {
  return index_copy_to(self, dim, index, source, ScatterInto::Copy);
}

at::Tensor& index_copy_(at::Tensor& self, int64_t dim, const at::Tensor& index,
                        const at::Tensor& source) {
  index_copy_to(self, dim, index, source, ScatterInto::Self);
  return self;
}

at::Tensor& index_copy_out(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                           const at::Tensor& source, at::Tensor& out) {
  auto r = tpu_index_copy(self, dim, index, source);
  at::native::resize_output(out, r.sizes());
  return assign(out, r);
}

at::Tensor& index_fill_(at::Tensor& self, int64_t dim, const at::Tensor& index,
                        const at::Scalar& value) {
  check_index_dtype(index, "index_fill_");
  check_value_fits(value, self.scalar_type());
  // CPU's index_fill counts a negative index from the end (scatter does not).
  auto from_end = [](const at::Tensor& i, int64_t size) { return at::where(i.lt(0), i + size, i); };
  wrap(self, dim);  // CPU's IndexError for a bad dim
  if (self.dim() == 0) {
    scatter_value_op(self.reshape({1}), 0, from_end(index.reshape({-1}), 1), value,
                     ScatterReduce::Assign, ScatterInto::Self);
    return self;
  }
  dim = at::maybe_wrap_dim(dim, self.dim());
  scatter_value_op(self, dim, expand_index(from_end(index, self.size(dim)), self.sizes(), dim),
                   value, ScatterReduce::Assign, ScatterInto::Self);
  return self;
}

at::Tensor& index_fill_tensor_(at::Tensor& self, int64_t dim, const at::Tensor& index,
                               const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "index_fill_ only supports a 0-dimensional value tensor, but got "
              "tensor with ", value.dim(), " dimension(s).");
  return index_fill_(self, dim, index, value.item());
}

at::Tensor embedding_dense_backward(const at::Tensor& grad, const at::Tensor& indices,
                                    c10::SymInt num_weights, c10::SymInt padding_idx,
                                    bool scale_grad_by_freq) {
  check_index_dtype(indices, "embedding_backward");
  int64_t n_w = num_weights.expect_int(), pad = padding_idx.expect_int();
  int64_t d = grad.size(-1);
  auto idx = indices.reshape({-1});
  auto g = grad.reshape({-1, d});
  if (pad >= 0) g = at::where(idx.eq(pad).unsqueeze(1), at::zeros({}, g.options()), g);
  if (scale_grad_by_freq) {
    auto counts = scatter_value_op(at::zeros({n_w}, g.options()), 0, idx, 1,
                                   ScatterReduce::Sum);
    g = g / tpu_index_select(counts, 0, idx).unsqueeze(1);
  }
  auto zeros = at::zeros({n_w, d}, g.options());
  return scatter_op(zeros, 0, expand_index(idx, {idx.size(0), d}, 0), g, ScatterReduce::Sum, true,
                    ScatterInto::Self);
}

at::Tensor tpu_nonzero(const at::Tensor& self) {
  // The output's size depends on the values: read them on the host (a sync point of its own
  // reason, data_dependent_size).
  return at::nonzero(read_for_size(self)).to(self.device());
}

// nonzero_static: the first `size` rows of nonzero, padded with fill_value (torch.combinations
// calls it). The positions are read on the host as nonzero's are.
at::Tensor nonzero_static(const at::Tensor& self, int64_t size, int64_t fill_value) {
  TORCH_CHECK(size >= 0, "nonzero_static: 'size' must be an non-negative integer");
  auto found = tpu_nonzero(self);
  int64_t n = std::min(size, found.size(0));
  auto out = at::full({size, self.dim()}, fill_value, found.options());
  if (n > 0) out.slice(0, 0, n).copy_(found.slice(0, 0, n));
  return out;
}

at::Tensor& nonzero_out(const at::Tensor& self, at::Tensor& out) {
  auto r = tpu_nonzero(self);
  at::native::resize_output(out, r.sizes());
  return assign(out, r);
}

at::Tensor tpu_masked_select(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_select: expected BoolTensor for mask");
  auto [s, m] = at::expand_outplace(self, mask);
  auto pos = tpu_nonzero(m->reshape({-1})).reshape({-1});
  return tpu_index_select(s->reshape({-1}), 0, pos);
}

// masked_scatter_ (masked_select's backward): the k-th true position, in row-major order, takes
// source's k-th element. Its rank among the true positions is a cumsum of the mask, so the ranks
// come from the device and no host read is needed.
at::Tensor& masked_scatter_(at::Tensor& self, const at::Tensor& mask, const at::Tensor& source) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_scatter_: expected BoolTensor for mask, "
              "got ", mask.scalar_type());
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "masked_scatter_: expected self and "
              "source to have same dtypes but got ", self.scalar_type(), " and ",
              source.scalar_type());
  auto m = mask.expand(self.sizes());
  if (source.numel() == 0) {
    // Nothing to take from: valid only when no position is selected (a host read, rare).
    TORCH_CHECK(!m.any().item<bool>(), "masked_scatter_: Number of elements of source < number "
                "of ones in mask");
    return self;
  }
  auto rank = (at::cumsum(m.reshape({-1}), 0) - 1).clamp_min(0);
  auto picked = tpu_index_select(source.reshape({-1}), 0, rank).view(self.sizes());
  return assign(self, at::where(m, picked, self));
}

// flip: an index_select of the reversed positions per flipped dim (autograd's cumsum and cumprod
// backward flip the gradient).
at::Tensor tpu_flip(const at::Tensor& self, at::IntArrayRef dims) {
  auto flipped = at::dim_list_to_bitset(dims, self.dim());  // raises on repeated dims
  if (self.is_complex()) {
    // complex64: its pairs flipped along the same dims (never the pairs' own).
    std::vector<int64_t> wrapped;
    for (int64_t d = 0; d < self.dim(); ++d) {
      if (flipped[d]) wrapped.push_back(d);
    }
    return at::view_as_complex(tpu_flip(pairs(self), wrapped).contiguous());
  }
  at::Tensor r = self;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (!flipped[d]) continue;
    auto rev = at::arange(self.size(d) - 1, -1, -1,
                          at::TensorOptions().dtype(at::kLong).device(self.device()));
    r = tpu_index_select(r, d, rev);
  }
  return r.is_same(self) ? self.clone() : r;
}

// roll: per rolled dim the last s positions, then the first n - s, concatenated (two slice
// copies, as CPU's roll_common does); with no dims the flattened tensor is rolled and viewed
// back (its backward rolls the gradient back). An index_select of (i - shift) mod n, as before,
// built an index tensor and gathered element by element: 60x CPU's time on 262,144 floats
// (Swin's shifted windows roll every block's activations twice).
at::Tensor tpu_roll(const at::Tensor& self, c10::SymIntArrayRef shifts_, at::IntArrayRef dims) {
  std::vector<int64_t> shifts;
  for (const auto& s : shifts_) shifts.push_back(s.expect_int());
  if (dims.empty()) {
    TORCH_CHECK(shifts.size() == 1, "roll: shifts must have one element when dims is empty, got ",
                shifts.size());
    return tpu_roll(self.reshape({-1}), shifts_, {0}).view(self.sizes());
  }
  TORCH_CHECK(shifts.size() == dims.size(), "shifts and dimensions must align. shifts: ",
              shifts.size(), ", dims:", dims.size());
  at::Tensor r = self;
  for (size_t k = 0; k < dims.size(); ++k) {
    int64_t d = at::maybe_wrap_dim(dims[k], self.dim());
    int64_t n = self.size(d);
    if (n == 0) continue;
    int64_t s = ((shifts[k] % n) + n) % n;
    if (s == 0) continue;
    r = at::cat({r.narrow(d, n - s, s), r.narrow(d, 0, n - s)}, d);
  }
  return r.is_same(self) ? self.clone() : r;
}

// channel_shuffle (nn.ChannelShuffle): channels [g, c/g] transposed to [c/g, g], a view and one
// copy, as CPU's kernel computes it (its backward is a channel_shuffle of the gradient).
at::Tensor tpu_channel_shuffle(const at::Tensor& self, c10::SymInt groups_) {
  int64_t groups = groups_.expect_int();
  TORCH_CHECK(self.dim() > 2, "channel_shuffle expects input to have at least 3 dimensions, but "
              "got input with sizes ", self.sizes());
  TORCH_CHECK(groups > 0, "Number of groups to divide channels in must be positive.",
              " Value of groups:", groups);
  int64_t c = self.size(1);
  TORCH_CHECK(c % groups == 0, "Number of channels must be divisible by groups. Got ", c,
              " channels and ", groups, " groups.");
  std::vector<int64_t> split = {self.size(0), groups, c / groups};
  for (int64_t d = 2; d < self.dim(); ++d) split.push_back(self.size(d));
  return self.reshape(split).transpose(1, 2).contiguous().view(self.sizes());
}

// Advanced indexing, in the form both x[indices] and x[indices] = v use: the indexed dims moved
// to the front and flattened into one, the index tensors (broadcast) combined into one linear
// index into that dim, and where the indexed dims go in the result.
struct Linearized {
  at::Tensor self_flat;          // [prod(indexed sizes), rest...]
  at::Tensor lin;                // broadcast shape B of the indices: linear positions
  std::vector<int64_t> perm;     // self.permute(perm) puts the indexed dims first
  std::vector<int64_t> rest;     // sizes of the other dims, in order
  int64_t insert_at = 0;         // where B goes in the result among the rest dims
};

Linearized linearize(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& ind) {
  // Boolean masks become the long indices of their true positions (a host read).
  std::vector<at::Tensor> idx;
  std::vector<int64_t> dims;
  int64_t d = 0;
  for (size_t i = 0; i < ind.size(); ++i) {
    std::optional<at::Tensor> t = ind.get(i);
    if (!t || !t->defined()) {
      ++d;
      continue;
    }
    // Index tensors on the CPU are taken as CUDA takes them (BEiT's relative position index is
    // built on the host): a mask's true positions found there (no device read), an index
    // uploaded.
    const bool on_host = t->device().is_cpu();
    if (t->scalar_type() == at::kBool || t->scalar_type() == at::kByte) {
      if (t->scalar_type() == at::kByte) {
        TORCH_WARN("indexing with dtype torch.uint8 is now deprecated, please use a dtype "
                   "torch.bool instead.");
      }
      // CPU's IndexError, checked before the mask is read.
      for (int64_t k = 0; k < t->dim(); ++k) {
        TORCH_CHECK_INDEX(d + k < self.dim(), "too many indices for tensor of dimension ",
                          self.dim());
        TORCH_CHECK_INDEX(t->size(k) == self.size(d + k), "The shape of the mask ", t->sizes(),
                          " at index ", k, " does not match the shape of the indexed tensor ",
                          self.sizes(), " at index ", d + k);
      }
      auto nz = on_host ? at::nonzero(*t).to(self.device()) : tpu_nonzero(*t);
      for (int64_t k = 0; k < t->dim(); ++k) {
        idx.push_back(nz.select(1, k));
        dims.push_back(d + k);
      }
      d += t->dim();
    } else {
      TORCH_CHECK_INDEX(t->scalar_type() == at::kLong || t->scalar_type() == at::kInt,
                        "tensors used as indices must be long, int, byte or bool tensors");
      idx.push_back(on_host ? t->to(self.device()) : *t);
      dims.push_back(d++);
    }
  }
  TORCH_CHECK_INDEX(d <= self.dim(), "too many indices for tensor of dimension ", self.dim());
  TORCH_CHECK(!idx.empty(), "index: at least one index tensor is needed");
  auto bcast = at::expand_outplace(idx);
  Linearized r;
  std::vector<bool> indexed(self.dim(), false);
  for (auto k : dims) indexed[k] = true;
  bool adjacent = dims.back() - dims.front() + 1 == int64_t(dims.size());
  r.perm = dims;
  for (int64_t k = 0; k < self.dim(); ++k) {
    if (indexed[k]) continue;
    if (adjacent && k < dims.front()) ++r.insert_at;
    r.perm.push_back(k);
    r.rest.push_back(self.size(k));
  }
  // lin = sum_j wrap(idx_j) * stride_j over the indexed dims (row-major over their sizes).
  at::Tensor lin;
  int64_t stride = 1, total = 1;
  for (auto k : dims) total *= self.size(k);
  for (size_t j = dims.size(); j-- > 0;) {
    int64_t size = self.size(dims[j]);
    auto ij = bcast[j].to(at::kLong);
    ij = at::where(ij.lt(0), ij + size, ij);  // negative indices count from the end
    auto term = stride == 1 ? ij : ij * stride;
    lin = lin.defined() ? lin + term : term;
    stride *= size;
  }
  r.lin = lin;
  std::vector<int64_t> flat = {total};
  flat.insert(flat.end(), r.rest.begin(), r.rest.end());
  r.self_flat = self.permute(r.perm).reshape(flat);
  return r;
}

// Moves B's dims (the leading lin.dim() dims of `t`) to position insert_at among the rest.
at::Tensor place_index_dims(const at::Tensor& t, const Linearized& l) {
  int64_t nb = l.lin.dim(), nr = int64_t(l.rest.size());
  if (l.insert_at == 0) return t;
  std::vector<int64_t> p;
  for (int64_t k = 0; k < l.insert_at; ++k) p.push_back(nb + k);
  for (int64_t k = 0; k < nb; ++k) p.push_back(k);
  for (int64_t k = l.insert_at; k < nr; ++k) p.push_back(nb + k);
  return t.permute(p);
}

at::Tensor index_tensor(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& ind) {
  auto l = linearize(self, ind);
  auto picked = tpu_index_select(l.self_flat, 0, l.lin.reshape({-1}));
  std::vector<int64_t> shape = l.lin.sizes().vec();
  shape.insert(shape.end(), l.rest.begin(), l.rest.end());
  // Dense in the result's own order, as CPU's result is: a permuted view (`x[..., idx]`,
  // `x[:, mask]`) failed a later `.view(-1)` that works on CPU.
  if (l.insert_at > 0) return place_index_dims(picked.reshape(shape), l).contiguous();
  return picked.reshape(shape);
}

at::Tensor& index_put_(at::Tensor& self, const c10::List<std::optional<at::Tensor>>& ind,
                       const at::Tensor& values, bool accumulate, bool) {
  TORCH_CHECK(values.scalar_type() == self.scalar_type(), "Index put requires the source and "
              "destination dtypes match, got ", self.scalar_type(), " for the destination and ",
              values.scalar_type(), " for the source.");
  auto l = linearize(self, ind);
  // values arrive in the result's layout; bring them to [B..., rest...], then [N, rest...].
  std::vector<int64_t> res_shape = l.lin.sizes().vec();
  res_shape.insert(res_shape.end(), l.rest.begin(), l.rest.end());
  int64_t nb = l.lin.dim(), nr = int64_t(l.rest.size());
  std::vector<int64_t> placed;  // the result-layout shape
  for (int64_t k = 0; k < l.insert_at; ++k) placed.push_back(l.rest[k]);
  for (int64_t k = 0; k < nb; ++k) placed.push_back(l.lin.size(k));
  for (int64_t k = l.insert_at; k < nr; ++k) placed.push_back(l.rest[k]);
  auto v = values.to(self.scalar_type()).expand(placed);
  if (l.insert_at > 0) {
    std::vector<int64_t> p;  // inverse of place_index_dims
    for (int64_t k = 0; k < nb; ++k) p.push_back(l.insert_at + k);
    for (int64_t k = 0; k < l.insert_at; ++k) p.push_back(k);
    for (int64_t k = l.insert_at; k < nr; ++k) p.push_back(nb + k);
    v = v.permute(p);
  }
  int64_t n = l.lin.numel();
  std::vector<int64_t> rows = {n};
  rows.insert(rows.end(), l.rest.begin(), l.rest.end());
  v = v.reshape(rows);
  auto flat_idx = l.lin.reshape({-1});
  auto idx = expand_index(flat_idx, rows, 0);
  auto reduce = accumulate ? ScatterReduce::Sum : ScatterReduce::Assign;
  if (l.self_flat.is_alias_of(self)) {
    // The flattened form is a view of self: scatter into it in place. Scattering into a copy
    // and writing that back made each `buf[idx] = row` a pass over the whole buffer (a loop
    // filling a [T, ...] buffer row by row: O(T^2)).
    scatter_op(l.self_flat, 0, idx, v, reduce, true, ScatterInto::Self);
    return self;
  }
  auto updated = scatter_op(l.self_flat, 0, idx, v, reduce);
  // Write back through the permuted view of self (its flattened form is a copy).
  std::vector<int64_t> permuted;
  for (auto k : l.perm) permuted.push_back(self.size(k));
  auto target = self.permute(l.perm);
  assign(target, updated.reshape(permuted));
  return self;
}

at::Tensor tpu_isin_tt(const at::Tensor& elements, const at::Tensor& test, bool, bool invert) {
  auto hit = at::any(elements.unsqueeze(-1).eq(test.reshape({-1})), -1);
  return invert ? hit.logical_not() : hit;
}

at::Tensor isin_ts(const at::Tensor& elements, const at::Scalar& test, bool, bool invert) {
  return invert ? elements.ne(test) : elements.eq(test);
}

at::Tensor isin_st(const at::Scalar& element, const at::Tensor& test, bool, bool invert) {
  auto hit = at::any(test.reshape({-1}).eq(element));
  return invert ? hit.logical_not() : hit;
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("index_select", TORCH_FN(dft::tpu_index_select));
  m.impl("index_select.out", TORCH_FN(dft::index_select_out));
  m.impl("gather", TORCH_FN(dft::tpu_gather));
  m.impl("gather.out", TORCH_FN(dft::gather_out));
  m.impl("scatter.src", TORCH_FN(dft::scatter_src));
  m.impl("scatter.value", TORCH_FN(dft::scatter_value));
  m.impl("scatter.reduce", TORCH_FN(dft::scatter_reduce_src));
  m.impl("scatter.value_reduce", TORCH_FN(dft::scatter_reduce_value));
  m.impl("scatter_.src", DFT_GROUPED(dft::scatter_src_));
  m.impl("scatter_.value", TORCH_FN(dft::scatter_value_));
  m.impl("scatter_.reduce", TORCH_FN(dft::scatter_reduce_src_));
  m.impl("scatter_.value_reduce", TORCH_FN(dft::scatter_reduce_value_));
  m.impl("scatter_add", TORCH_FN(dft::tpu_scatter_add));
  m.impl("scatter_add_", DFT_GROUPED(dft::scatter_add_));
  m.impl("scatter_reduce.two", TORCH_FN(dft::scatter_reduce_two));
  m.impl("scatter_reduce_.two", TORCH_FN(dft::scatter_reduce_two_));
  m.impl("index_add", DFT_GROUPED(dft::tpu_index_add));
  m.impl("index_add_", TORCH_FN(dft::index_add_));
  m.impl("index_add.out", TORCH_FN(dft::index_add_out));
  m.impl("index_copy", DFT_GROUPED(dft::tpu_index_copy));
  m.impl("index_copy_", TORCH_FN(dft::index_copy_));
  m.impl("index_copy.out", TORCH_FN(dft::index_copy_out));
  m.impl("index_fill_.int_Scalar", DFT_GROUPED(dft::index_fill_));
  m.impl("index_fill_.int_Tensor", DFT_GROUPED(dft::index_fill_tensor_));
  m.impl("embedding_dense_backward", DFT_GROUPED(dft::embedding_dense_backward));
  m.impl("nonzero", TORCH_FN(dft::tpu_nonzero));
  m.impl("nonzero.out", TORCH_FN(dft::nonzero_out));
  m.impl("nonzero_static", TORCH_FN(dft::nonzero_static));
  m.impl("masked_select", DFT_GROUPED(dft::tpu_masked_select));
  m.impl("masked_scatter_", DFT_GROUPED(dft::masked_scatter_));
  m.impl("flip", DFT_GROUPED(dft::tpu_flip));
  m.impl("roll", DFT_GROUPED(dft::tpu_roll));
  m.impl("channel_shuffle", DFT_GROUPED(dft::tpu_channel_shuffle));
  m.impl("index.Tensor", DFT_GROUPED(dft::index_tensor));
  m.impl("_index_put_impl_", DFT_GROUPED(dft::index_put_));
  m.impl("isin.Tensor_Tensor", DFT_GROUPED(dft::tpu_isin_tt));
  m.impl("isin.Tensor_Scalar", TORCH_FN(dft::isin_ts));
  m.impl("isin.Scalar_Tensor", TORCH_FN(dft::isin_st));
}
