// Small host-built constant tables on the device (window index maps, pooling divisors and
// averaging matrices, fold indices, interpolation source indices and weights). They depend
// only on an op's geometry, so a model that pools or resizes the same shapes every step would
// build and upload the same tables every step: each upload is a CPU tensor, a dtype
// conversion and a host-to-device copy through the dispatcher, which cost more than the
// resize itself (HF BEiT's bilinear position-bias resize: ~440K instructions a backward, most
// of it its eight uploads). The device copy of each table is kept, keyed by its content.
#pragma once

#include "common.h"

#include <vector>

namespace dft {

// A host-computed table as a tpu tensor of `dtype` (int64 or a float type): the values,
// rounded to `dtype`, shaped `sizes`. The tensor may be shared with earlier callers: read it,
// never write into it.
at::Tensor upload_table(const std::vector<double>& values, at::IntArrayRef sizes,
                        at::ScalarType dtype);

// The same for an int64 table (indices).
at::Tensor upload_table(const std::vector<int64_t>& values, at::IntArrayRef sizes);

// A table's coordinate along one axis for the tables computed by tensor ops instead, while
// torch.compile traces (a fake tensor has no memory to upload into): arange(n) as int64 on
// `like`'s device, laid along `axis` of a rank-`rank` shape of ones, to broadcast with the
// other axes' coordinates.
at::Tensor table_axis(const at::Tensor& like, int64_t n, int64_t axis, int64_t rank);

// Drops the kept tables (torch.tpu.empty_cache(): their memory goes back with the rest).
void clear_uploaded_tables();

}  // namespace dft
