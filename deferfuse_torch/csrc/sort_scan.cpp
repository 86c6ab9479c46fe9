// Sorting, scans and the ops built on them: sort, topk, median, nanmedian, kthvalue, cumsum,
// cumprod, cummax, cummin, logcumsumexp, unique; and small creation/reduction ops with no
// better home: count_nonzero, linspace, logspace, eye. Sorting is the runtime's stable argsort
// plus a gather of the values.
#include "kernel_ops.h"

#include <ATen/WrapDimUtils.h>
#include <torch/library.h>

#include <limits>

namespace dft {
namespace {

at::Tensor& assign(at::Tensor& self, const at::Tensor& value) {
  run_into(DFUSE_OP_KIND_COPY, nullptr, Operands().t(cast(value, self.scalar_type())), self,
           "sort/scan result");
  return self;
}

void assign_out(at::Tensor& out, const at::Tensor& value) {
  at::native::resize_output(out, value.sizes());
  assign(out, value);
}

std::tuple<at::Tensor, at::Tensor> sort_stable(const at::Tensor& self, std::optional<bool>,
                                               int64_t dim, bool descending) {
  // A 0-dim input takes dim 0 or -1, as on CPU (IndexError otherwise).
  dim = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  if (self.dim() == 0) return {self.clone(), at::zeros({}, self.options().dtype(at::kLong))};
  auto idx = argsort_op(self, dim, descending);
  return {gather_op(self, dim, idx), idx};
}

std::tuple<at::Tensor&, at::Tensor&> sort_values_stable(const at::Tensor& self,
                                                        std::optional<bool> stable, int64_t dim,
                                                        bool descending, at::Tensor& values,
                                                        at::Tensor& indices) {
  auto [v, i] = sort_stable(self, stable, dim, descending);
  assign_out(values, v);
  assign_out(indices, i);
  return {values, indices};
}

std::tuple<at::Tensor, at::Tensor> tpu_topk(const at::Tensor& self, c10::SymInt k_, int64_t dim,
                                        bool largest, bool) {
  int64_t k = k_.expect_int();
  at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));  // CPU's IndexError for a bad dim
  if (self.dim() == 0) {
    TORCH_CHECK(k <= 1, "selected index k out of range");
    return {self.clone(), at::zeros({}, self.options().dtype(at::kLong))};
  }
  dim = at::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK(k >= 0 && k <= self.size(dim), "selected index k out of range");
  // The stable sort's first k positions, selected rather than sorted whole (limit 0 would ask
  // for every position: k = 0 takes none of a whole sort's).
  auto idx = k == 0 ? argsort_op(self, dim, largest).narrow(dim, 0, 0)
                    : argsort_op(self, dim, largest, k);
  return {gather_op(self, dim, idx), idx};
}

std::tuple<at::Tensor&, at::Tensor&> topk_values(const at::Tensor& self, c10::SymInt k,
                                                 int64_t dim, bool largest, bool sorted,
                                                 at::Tensor& values, at::Tensor& indices) {
  auto [v, i] = tpu_topk(self, k, dim, largest, sorted);
  assign_out(values, v);
  assign_out(indices, i);
  return {values, indices};
}

// The k-th smallest (1-based) along dim, NaN counting as the largest; a NaN anywhere in a row
// makes that row's median NaN, as on CPU.
std::tuple<at::Tensor, at::Tensor> kth(const at::Tensor& self, int64_t k, int64_t dim,
                                       bool keepdim, bool nan_propagates) {
  auto x = self.dim() == 0 ? self.reshape({1}) : self;
  dim = at::maybe_wrap_dim(dim, x.dim());
  TORCH_CHECK(k >= 1 && k <= x.size(dim), "kthvalue(): selected number k out of range for "
              "dimension ", dim);
  // The stable sort's first k positions only (a selection), of which the last is the k-th.
  auto idx = argsort_op(x, dim, false, k).narrow(dim, k - 1, 1);
  auto val = gather_op(x, dim, idx);
  if (nan_propagates && at::isFloatingType(x.scalar_type())) {
    // The first NaN of the row sorts right after the finite values: pick it instead.
    auto nan = x.isnan();
    auto any_nan = at::any(nan, dim, true);
    auto first_nan = argsort_op(nan.logical_not(), dim, false, 1);
    idx = at::where(any_nan, first_nan, idx);
    val = at::where(any_nan, gather_op(x, dim, idx), val);
  }
  if (!keepdim) {
    val = val.squeeze(dim);
    idx = idx.squeeze(dim);
  }
  if (self.dim() == 0) return {val.reshape({}), idx.reshape({})};
  return {val, idx};
}

std::tuple<at::Tensor&, at::Tensor&> kthvalue_values(const at::Tensor& self, c10::SymInt k,
                                                     int64_t dim, bool keepdim,
                                                     at::Tensor& values, at::Tensor& indices) {
  auto [v, i] = kth(self, k.expect_int(), dim, keepdim, false);
  assign_out(values, v);
  assign_out(indices, i);
  return {values, indices};
}

std::tuple<at::Tensor&, at::Tensor&> median_dim_values(const at::Tensor& self, int64_t dim,
                                                       bool keepdim, at::Tensor& values,
                                                       at::Tensor& indices) {
  int64_t n = self.dim() == 0 ? 1 : self.size(at::maybe_wrap_dim(dim, self.dim()));
  TORCH_CHECK_INDEX(n > 0, "median(): Expected reduction dim ", at::maybe_wrap_dim(dim, self.dim()),
                    " to have non-zero size.");
  auto [v, i] = kth(self, (n + 1) / 2, dim, keepdim, true);
  assign_out(values, v);
  assign_out(indices, i);
  return {values, indices};
}

at::Tensor tpu_median(const at::Tensor& self) {
  // CPU's median of nothing is NaN in the tensor's dtype (an integer's is NaN cast, as CPU
  // casts it): computed by CPU's kernel on an empty host tensor.
  if (self.numel() == 0) {
    return at::empty({0}, self.options().device(at::kCPU)).median().to(self.device());
  }
  auto flat = self.reshape({-1});
  return std::get<0>(kth(flat, (flat.size(0) + 1) / 2, 0, false, true));
}

// nanmedian: the median of each row's non-NaN values (the lower of the two middle ones), NaN
// for a row of NaNs only; the NaNs sort last, so it is the sorted row's element
// (count - 1) / 2.
std::tuple<at::Tensor, at::Tensor> nan_median(const at::Tensor& self, int64_t dim, bool keepdim) {
  auto x = self.dim() == 0 ? self.reshape({1}) : self;
  dim = at::maybe_wrap_dim(dim, x.dim());
  TORCH_CHECK_INDEX(x.size(dim) > 0, "nanmedian(): Expected reduction dim ", dim,
                    " to have non-zero size.");
  auto order = argsort_op(x, dim, false);
  auto count = reduce(cast(x.isnan().logical_not(), at::kLong), DFUSE_REDUCE_OP_SUM, {dim}, true);
  auto pos = at::floor_divide(at::clamp_min(count - 1, 0), 2);
  auto idx = gather_op(order, dim, pos);
  auto val = gather_op(x, dim, idx);
  if (!keepdim) {
    val = val.squeeze(dim);
    idx = idx.squeeze(dim);
  }
  if (self.dim() == 0) return {val.reshape({}), idx.reshape({})};
  return {val, idx};
}

std::tuple<at::Tensor&, at::Tensor&> nanmedian_dim_values(const at::Tensor& self, int64_t dim,
                                                          bool keepdim, at::Tensor& values,
                                                          at::Tensor& indices) {
  // Without NaNs (integers) it is the median.
  if (!at::isFloatingType(self.scalar_type())) {
    return median_dim_values(self, dim, keepdim, values, indices);
  }
  auto [v, i] = nan_median(self, dim, keepdim);
  assign_out(values, v);
  assign_out(indices, i);
  return {values, indices};
}

at::Tensor tpu_nanmedian(const at::Tensor& self) {
  if (self.numel() == 0) {
    return at::empty({0}, self.options().device(at::kCPU)).nanmedian().to(self.device());
  }
  if (!at::isFloatingType(self.scalar_type())) return tpu_median(self);
  return std::get<0>(nan_median(self.reshape({-1}), 0, false));
}

// CPU's scan kernels have no bool: a scan in bool (asked for, or into a bool tensor) raises
// there, so it does here.
at::ScalarType refuse_bool_scan(const char* op, at::ScalarType dt) {
  TORCH_CHECK_NOT_IMPLEMENTED(dt != at::kBool, "\"", op, "_out_cpu\" not implemented for 'Bool'");
  return dt;
}

at::ScalarType scan_dtype(const char* op, const at::Tensor& x,
                          std::optional<at::ScalarType> dtype) {
  return refuse_bool_scan(
      op, dtype.value_or(at::isIntegralType(x.scalar_type(), true) ? at::kLong : x.scalar_type()));
}

at::Tensor tpu_cumsum(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  auto x = self.dim() == 0 ? self.reshape({1}) : self;
  auto dt = scan_dtype("cumsum", self, dtype);
  auto r = scan_op(x, at::maybe_wrap_dim(dim, x.dim()), false, dt);
  return self.dim() == 0 ? r.reshape({}) : r;
}

at::Tensor tpu_cumprod(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  auto x = self.dim() == 0 ? self.reshape({1}) : self;
  auto dt = scan_dtype("cumprod", self, dtype);
  auto r = scan_op(x, at::maybe_wrap_dim(dim, x.dim()), true, dt);
  return self.dim() == 0 ? r.reshape({}) : r;
}

// The dtype an in-place or out= scan runs in: the tensor written's, which an asked-for dtype
// must equal (CPU's errors).
at::ScalarType scan_into(const char* op, std::optional<at::ScalarType> dtype,
                         const at::Tensor& written, bool in_place) {
  auto dt = written.scalar_type();
  if (dtype && *dtype != dt) {
    // TypeMeta prints CPU's names ("float", "double").
    auto name = [](at::ScalarType t) { return c10::scalarTypeToTypeMeta(t); };
    TORCH_CHECK(!in_place, "Bad in-place call: input tensor dtype ", name(dt),
                " and output tensor dtype ", name(*dtype), " should match");
    TORCH_CHECK(false, "Expected out tensor to have dtype ", name(*dtype), ", but got ", name(dt),
                " instead");
  }
  return refuse_bool_scan(op, dt);
}

at::Tensor& cumsum_(at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  return assign(self, tpu_cumsum(self, dim, scan_into("cumsum", dtype, self, true)));
}

at::Tensor& cumprod_(at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  return assign(self, tpu_cumprod(self, dim, scan_into("cumprod", dtype, self, true)));
}

at::Tensor& cumsum_out(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype,
                       at::Tensor& out) {
  assign_out(out, tpu_cumsum(self, dim, scan_into("cumsum", dtype, out, false)));
  return out;
}

at::Tensor& cumprod_out(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype,
                        at::Tensor& out) {
  assign_out(out, tpu_cumprod(self, dim, scan_into("cumprod", dtype, out, false)));
  return out;
}

// An inclusive scan along `dim` with an associative `combine(earlier, later)` the runtime's
// scan lacks (max, min, log-add-exp), by doubling: after the step with shift s every element
// holds the combination of the 2s elements ending at it; log2(n) steps of elementwise ops,
// which fuse in defer mode. State is a list of tensors scanned together (values, indices).
using ScanState = std::vector<at::Tensor>;

template <typename Combine>
ScanState doubling_scan(ScanState x, int64_t dim, Combine combine) {
  int64_t n = x[0].size(dim);
  for (int64_t shift = 1; shift < n; shift *= 2) {
    ScanState earlier, later;
    for (auto& t : x) {
      earlier.push_back(t.narrow(dim, 0, n - shift));
      later.push_back(t.narrow(dim, shift, n - shift));
    }
    auto merged = combine(earlier, later);
    for (size_t k = 0; k < x.size(); ++k) {
      x[k] = at::cat({x[k].narrow(dim, 0, shift), merged[k]}, dim);
    }
  }
  return x;
}

// cummax/cummin as on CPU: the later element wins ties (its index is kept), and a NaN, once
// seen, stays (with the index of the last NaN).
template <bool MAX>
void cummaxmin_helper(const at::Tensor& self, at::Tensor& values, at::Tensor& indices,
                      int64_t dim) {
  dim = at::maybe_wrap_dim(dim, self.dim());
  std::vector<int64_t> shape(self.dim(), 1);
  shape[dim] = self.size(dim);
  auto pos = at::arange(self.size(dim), self.options().dtype(at::kLong))
                 .view(shape)
                 .expand(self.sizes());
  bool floating = self.is_floating_point();
  auto r = doubling_scan({self, pos}, dim, [&](const ScanState& a, const ScanState& b) {
    auto take = MAX ? b[0].ge(a[0]) : b[0].le(a[0]);
    if (floating) take = b[0].isnan().logical_or(take.logical_and(a[0].isnan().logical_not()));
    return ScanState{at::where(take, b[0], a[0]), at::where(take, b[1], a[1])};
  });
  assign(values, r[0]);
  assign(indices, r[1]);
}

// log(exp(a) + exp(b)) as CPU's _log_add_exp_helper: max + log1p(exp(min - max)), except two
// equal infinities, which stay themselves.
at::Tensor log_add_exp(const at::Tensor& a, const at::Tensor& b) {
  auto lo = at::minimum(a, b), hi = at::maximum(a, b);
  auto r = hi + at::log1p(at::exp(lo - hi));
  return at::where(lo.eq(hi).logical_and(lo.isinf()), a, r);
}

at::Tensor tpu_logcumsumexp(const at::Tensor& self, int64_t dim) {
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(self.scalar_type()),
                              "\"logcumsumexp\" not implemented for '", self.scalar_type(), "'");
  // A 0-dim input takes dim 0 or -1, as on CPU (IndexError otherwise). A scan with no step
  // would hand back `self` itself: the result must be a new tensor.
  dim = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  if (self.dim() == 0 || self.size(dim) <= 1) return self.clone();
  return doubling_scan({self}, dim, [](const ScanState& a, const ScanState& b) {
    return ScanState{log_add_exp(a[0], b[0])};
  })[0];
}

at::Tensor count_nonzero(const at::Tensor& self, at::IntArrayRef dims) {
  return reduce(cast(self.ne(0), at::kLong), DFUSE_REDUCE_OP_SUM, dims, false);
}

// The runs of equal neighbours in the non-empty 1-D `x`: each run's first value, each
// element's run (if asked) and each run's length (if asked). How many runs there are decides
// the sizes: a host read (in nonzero). NaN equals nothing, so each NaN is a run, as on CPU.
struct Runs {
  at::Tensor values, run, counts;
};

Runs runs_of(const at::Tensor& x, bool want_run, bool want_counts) {
  int64_t n = x.numel();
  auto long_opts = x.options().dtype(at::kLong);
  auto starts = at::cat({at::ones({1}, x.options().dtype(at::kBool)),
                         x.narrow(0, 1, n - 1).ne(x.narrow(0, 0, n - 1))});
  auto pos = at::nonzero(starts).reshape({-1});
  Runs r{at::index_select(x, 0, pos), at::empty({0}, long_opts), at::empty({0}, long_opts)};
  if (want_run) r.run = tpu_cumsum(starts, 0, at::kLong) - 1;
  if (want_counts) {
    auto ends = at::cat({pos.narrow(0, 1, pos.size(0) - 1), at::full({1}, n, long_opts)});
    r.counts = ends - pos;
  }
  return r;
}

// Sorted unique values: the runs of a stable sort, each element's run as its inverse.
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique2(const at::Tensor& self, bool,
                                                       bool return_inverse, bool return_counts) {
  auto x = self.reshape({-1});
  int64_t n = x.numel();
  auto long_opts = self.options().dtype(at::kLong);
  if (n == 0) {
    return {x.clone(), at::empty(return_inverse ? self.sizes() : at::IntArrayRef{0}, long_opts),
            at::empty({0}, long_opts)};
  }
  auto order = argsort_op(x, 0, false);
  auto r = runs_of(gather_op(x, 0, order), return_inverse, return_counts);
  if (return_inverse) {
    r.run = scatter_op(at::zeros({n}, long_opts), 0, order, r.run, ScatterReduce::Assign)
                .reshape(self.sizes());
  }
  return {r.values, r.run, r.counts};
}

// torch.unique_consecutive: the runs of the flattened input (it ran on the CPU fallback;
// mixture-of-experts code groups sorted token ids this way). Over a dim (runs of equal
// slices) it still runs on the host, counted as a fallback.
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_consecutive(
    const at::Tensor& self, bool return_inverse, bool return_counts, std::optional<int64_t> dim) {
  if (dim.has_value()) {
    count_fallback("aten::unique_consecutive");
    auto [v, i, c] = at::unique_consecutive(self.cpu(), return_inverse, return_counts, dim);
    return {v.to(self.device()), i.to(self.device()), c.to(self.device())};
  }
  auto x = self.reshape({-1});
  auto long_opts = self.options().dtype(at::kLong);
  if (x.numel() == 0) {
    return {x.clone(), at::empty(return_inverse ? self.sizes() : at::IntArrayRef{0}, long_opts),
            at::empty({0}, long_opts)};
  }
  auto r = runs_of(x, return_inverse, return_counts);
  if (return_inverse) r.run = r.run.reshape(self.sizes());
  return {r.values, r.run, r.counts};
}

// linspace and logspace are made by PyTorch's own CPU kernel and uploaded: their values are a
// function of (start, end, steps) alone, and CPU's are the oracle to the last bit. Its rounding
// follows its vector width (each vector of lanes counts up from its first lane's value, the
// first half from start, the second from end, in the dtype's own arithmetic): computed here
// in float64 and rounded once, 530 of 594 float32 linspaces were an ulp off somewhere, and
// affine_grid's identity grid, built from linspace, moved off the pixel centres that
// grid_sample's gradient picks its neighbours by (a spatial transformer's first gradient
// changed sign). The upload is one host-to-device copy, as `torch.linspace(...).to("tpu")`.
// An out of the right number of elements keeps its shape, as CPU's linspace_out leaves it.
at::Tensor& upload_into(at::Tensor& out, const at::Tensor& host) {
  if (out.numel() != host.numel()) out.resize_({host.numel()});
  return out.copy_(host.view(out.sizes()));
}

at::Tensor& linspace_out(const at::Scalar& start, const at::Scalar& end, int64_t steps,
                         at::Tensor& out) {
  return upload_into(out, at::linspace(start, end, steps, out.options().device(at::kCPU)));
}

at::Tensor& logspace_out(const at::Scalar& start, const at::Scalar& end, int64_t steps,
                         double base, at::Tensor& out) {
  return upload_into(out, at::logspace(start, end, steps, base, out.options().device(at::kCPU)));
}

at::Tensor& eye_m_out(c10::SymInt n_, c10::SymInt m_, at::Tensor& out) {
  int64_t n = n_.expect_int(), m = m_.expect_int();
  TORCH_CHECK(n >= 0 && m >= 0, "eye: n and m must be non-negative, got ", n, " and ", m);
  out.resize_({n, m});
  if (n == 0 || m == 0) return out;
  auto rows = at::arange(n, out.options().dtype(at::kLong)).unsqueeze(1);
  auto cols = at::arange(m, out.options().dtype(at::kLong));
  return assign(out, rows.eq(cols));
}

at::Tensor& eye_out(c10::SymInt n, at::Tensor& out) { return eye_m_out(n, n, out); }

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("sort.stable", DFT_GROUPED(dft::sort_stable));
  m.impl("sort.values_stable", DFT_GROUPED(dft::sort_values_stable));
  m.impl("topk", DFT_GROUPED(dft::tpu_topk));
  m.impl("topk.values", TORCH_FN(dft::topk_values));
  m.impl("kthvalue.values", DFT_GROUPED(dft::kthvalue_values));
  m.impl("median.dim_values", DFT_GROUPED(dft::median_dim_values));
  m.impl("median", DFT_GROUPED(dft::tpu_median));
  m.impl("nanmedian.dim_values", DFT_GROUPED(dft::nanmedian_dim_values));
  m.impl("nanmedian", DFT_GROUPED(dft::tpu_nanmedian));
  m.impl("cumsum", TORCH_FN(dft::tpu_cumsum));
  m.impl("cumprod", TORCH_FN(dft::tpu_cumprod));
  m.impl("cumsum_", TORCH_FN(dft::cumsum_));
  m.impl("cumprod_", TORCH_FN(dft::cumprod_));
  m.impl("cumsum.out", TORCH_FN(dft::cumsum_out));
  m.impl("cumprod.out", TORCH_FN(dft::cumprod_out));
  m.impl("_cummax_helper", DFT_GROUPED(dft::cummaxmin_helper<true>));
  m.impl("_cummin_helper", DFT_GROUPED(dft::cummaxmin_helper<false>));
  m.impl("_logcumsumexp", TORCH_FN(dft::tpu_logcumsumexp));
  m.impl("count_nonzero.dim_IntList", DFT_GROUPED(dft::count_nonzero));
  m.impl("_unique2", DFT_GROUPED(dft::unique2));
  m.impl("unique_consecutive", DFT_GROUPED(dft::unique_consecutive));
  m.impl("linspace.out", TORCH_FN(dft::linspace_out));
  m.impl("logspace.out", TORCH_FN(dft::logspace_out));
  m.impl("eye.m_out", DFT_GROUPED(dft::eye_m_out));
  m.impl("eye.out", DFT_GROUPED(dft::eye_out));
}
