// One dfuse_op call per runtime kernel op (GATHER, SCATTER, SCAN, SORT): the only place that
// fills their DfuseAttrs.
#include "kernel_ops.h"

namespace dft {
namespace {

uint32_t reduce_code(ScatterReduce r) {
  switch (r) {
    case ScatterReduce::Assign: return DFUSE_SCATTER_REDUCE_ASSIGN;
    case ScatterReduce::Sum: return DFUSE_SCATTER_REDUCE_SUM;
    case ScatterReduce::Prod: return DFUSE_SCATTER_REDUCE_PROD;
    case ScatterReduce::Amax: return DFUSE_SCATTER_REDUCE_AMAX;
    case ScatterReduce::Amin: return DFUSE_SCATTER_REDUCE_AMIN;
    case ScatterReduce::Mean: return DFUSE_SCATTER_REDUCE_MEAN;
  }
  TORCH_CHECK(false, "tpu: unknown scatter reduction");
}

DfuseAttrs scatter_attrs(int64_t dim, ScatterReduce reduce, bool include_self, bool wide) {
  DfuseAttrs a{};
  a.sub_op = reduce_code(reduce);
  a.dim = dim;
  a.include_self = include_self;
  if (wide) {  // the accumulation dtype of half-precision sums
    a.has_dtype = 1;
    a.dtype = DFUSE_DTYPE_F32;
  }
  return a;
}

}  // namespace

at::Tensor gather_op(const at::Tensor& src, int64_t dim, const at::Tensor& index) {
  DfuseAttrs a{};
  a.dim = dim;
  return run(DFUSE_OP_KIND_GATHER, &a, Operands().t(src).t(index), "gather");
}

namespace {

at::Tensor scatter_run(const at::Tensor& self, const DfuseAttrs& a, const Operands& in,
                       ScatterInto into) {
  if (into == ScatterInto::Copy) return run(DFUSE_OP_KIND_SCATTER, &a, in, "scatter");
  // An index or source that overlaps self is read from a copy taken first, as eager reads
  // the old values.
  run_into_from_old_values(DFUSE_OP_KIND_SCATTER, &a, in, self, "scatter");
  return self;
}

}  // namespace

at::Tensor scatter_op(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                      const at::Tensor& src, ScatterReduce reduce, bool include_self,
                      ScatterInto into, bool wide) {
  // Nothing to write (an empty index of any shape, as gather's backward makes): self's values.
  if (index.numel() == 0) return into == ScatterInto::Self ? self : self.clone();
  // A 0-dim self takes a one-element 1-D index (gather's backward of a 0-dim input), as on CPU.
  if (self.dim() == 0 && index.dim() == 1) {
    return scatter_op(self.reshape({1}), 0, index, src.reshape({-1}), reduce, include_self, into,
                      wide)
        .reshape({});
  }
  // A 1-D self takes a 0-dim index (and source) as one of one element, as on CPU.
  if (self.dim() == 1 && index.dim() == 0) {
    return scatter_op(self, dim, index.reshape({1}), src.dim() == 0 ? src.reshape({1}) : src,
                      reduce, include_self, into, wide);
  }
  auto a = scatter_attrs(dim, reduce, include_self, wide);
  return scatter_run(self, a, Operands().t(self).t(index).t(cast(src, self.scalar_type())), into);
}

at::Tensor scatter_value_op(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                            const at::Scalar& value, ScatterReduce reduce, ScatterInto into,
                            bool wide) {
  if (index.numel() == 0) return into == ScatterInto::Self ? self : self.clone();
  if (self.dim() == 0 && index.dim() == 1) {
    return scatter_value_op(self.reshape({1}), 0, index, value, reduce, into, wide).reshape({});
  }
  if (self.dim() == 1 && index.dim() == 0) {
    return scatter_value_op(self, dim, index.reshape({1}), value, reduce, into, wide);
  }
  auto a = scatter_attrs(dim, reduce, true, wide);
  return scatter_run(self, a, Operands().t(self).t(index).s(value), into);
}

at::Tensor scan_op(const at::Tensor& x, int64_t dim, bool prod, at::ScalarType dtype) {
  DfuseAttrs a{};
  a.sub_op = prod ? DFUSE_SCAN_OP_PROD : DFUSE_SCAN_OP_SUM;
  a.dim = dim;
  a.dtype = to_dtype(dtype);
  a.has_dtype = 1;
  return run(DFUSE_OP_KIND_SCAN, &a, Operands().t(x), prod ? "cumprod" : "cumsum");
}

at::Tensor argsort_op(const at::Tensor& x, int64_t dim, bool descending, int64_t limit) {
  DfuseAttrs a{};
  a.dim = dim;
  a.descending = descending;
  a.limit = limit;
  return run(DFUSE_OP_KIND_SORT, &a, Operands().t(x), "sort");
}

}  // namespace dft
