// The runtime's data-dependent ops (gather, scatter, scan, argsort), one call each. Every
// indexing, sorting and scan kernel of the device is built from these and the elementwise ops;
// an out-of-range index is reported by the runtime (at the op in debug mode, at the next sync
// point otherwise) and never yields a value.
#pragma once

#include "common.h"

namespace dft {

// How scatter combines a scattered value with what is already there.
enum class ScatterReduce { Assign, Sum, Prod, Amax, Amin, Mean };

// torch.gather(src, dim, index): index has src's rank; the result has index's shape.
at::Tensor gather_op(const at::Tensor& src, int64_t dim, const at::Tensor& index);

// Where scatter writes: a new tensor (a copy of self with the values scattered), or self
// itself, for the in-place ops (scatter_, index_add_, index_copy_, a fresh zeros buffer): the
// runtime then writes only the indexed elements, where a copy of self and an assign back
// would each pass over all of it (an embedding gradient's [50257, 128] zeros: 3.0 ms of
// copying for 1,024 rows).
enum class ScatterInto { Copy, Self };

// `self` with `src` (a tensor of index's shape or more) scattered along `dim`: a copy, or
// self itself (returned). `wide`: float16/bfloat16 sums, means and products accumulate in
// float32, each element rounded once (CPU's scatter_add and scatter_reduce); else every step
// rounds to the dtype.
at::Tensor scatter_op(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                      const at::Tensor& src, ScatterReduce reduce, bool include_self = true,
                      ScatterInto into = ScatterInto::Copy, bool wide = false);
// The same with one value for every index.
at::Tensor scatter_value_op(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                            const at::Scalar& value, ScatterReduce reduce,
                            ScatterInto into = ScatterInto::Copy, bool wide = false);

// Inclusive cumulative sum (prod = false) or product along `dim`, in `dtype`.
at::Tensor scan_op(const at::Tensor& x, int64_t dim, bool prod, at::ScalarType dtype);

// The int64 indices of a stable sort along `dim` (NaN sorts as the largest value).
at::Tensor argsort_op(const at::Tensor& x, int64_t dim, bool descending, int64_t limit = 0);

// `index` (1-D or 0-D) viewed as an index of `like`'s shape along `dim` (stride 0 elsewhere),
// the form index_select, index_add and index_fill hand to gather and scatter.
at::Tensor expand_index(const at::Tensor& index, at::IntArrayRef like, int64_t dim);

}  // namespace dft
