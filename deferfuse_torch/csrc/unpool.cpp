// Max unpooling (nn.MaxUnpool2d, nn.MaxUnpool3d, F.max_unpool*: SegNet-style decoders) on
// "tpu": each (batch, channel) plane's values scattered into a zero plane of the output size
// at the flat positions max pooling returned, one scatter for the whole tensor. A position
// comes twice only where pooling windows overlap and picked one element twice: the same
// value either way (which write lands last is not specified, as for scatter). The backward is PyTorch's (a gather of the gradient at the same positions). CPU's shape and dtype
// errors are raised here; an index outside the output plane is reported by the scatter (at the
// op in debug mode, at the next sync point otherwise) where CPU names it at the call.
#include "kernel_ops.h"

#include <torch/library.h>

namespace dft {
namespace {

// x ([C, *in] or [N, C, *in], `dims` spatial dims) unpooled into `out` spatial sizes.
at::Tensor max_unpool(const at::Tensor& x, const at::Tensor& indices, at::IntArrayRef out,
                      int64_t dims, const char* op) {
  TORCH_CHECK(indices.scalar_type() == at::kLong,
              "elements in indices should be type int64 but got: ", indices.scalar_type());
  TORCH_CHECK(int64_t(out.size()) == dims, "There should be exactly ",
              dims == 2 ? "two elements (height, width)" : "three elements (depth, height, width)",
              " in output_size, but got ", out.size(), " elements.");
  TORCH_CHECK(x.dim() == dims + 1 || x.dim() == dims + 2, "Input to ", op, " should be a ",
              dims + 1, "d or ", dims + 2, "d Tensor, but got a tensor with ", x.dim(),
              " dimensions.");
  TORCH_CHECK(x.sizes().equals(indices.sizes()), "Expected shape of indices to be same as that "
              "of the input tensor (", x.sizes(), ") but got indices tensor with shape: ",
              indices.sizes());
  for (int64_t d = 1; d < x.dim(); ++d) {
    TORCH_CHECK(x.size(d) > 0, op, "_forward_out_cpu(): Expected input to have non-zero size "
                "for non-batch dimensions, but input has sizes ", x.sizes(), " with dimension ",
                d, " being empty");
  }
  bool batched = x.dim() == dims + 2;
  auto xb = batched ? x : x.unsqueeze(0);
  auto ib = batched ? indices : indices.unsqueeze(0);
  int64_t n = xb.size(0), c = xb.size(1), plane = c10::multiply_integers(out);
  auto values = xb.reshape({n, c, -1});
  auto zeros = at::zeros({n, c, plane}, x.options());
  auto r = scatter_op(zeros, 2, ib.reshape({n, c, -1}), values, ScatterReduce::Assign, true,
                      ScatterInto::Self);
  std::vector<int64_t> shape = {n, c};
  shape.insert(shape.end(), out.begin(), out.end());
  auto y = r.view(shape);
  return batched ? y : y.squeeze(0);
}

at::Tensor max_unpool2d(const at::Tensor& x, const at::Tensor& indices,
                        c10::SymIntArrayRef output_size) {
  return max_unpool(x, indices, C10_AS_INTARRAYREF_SLOW(output_size), 2, "max_unpooling2d");
}

at::Tensor max_unpool3d(const at::Tensor& x, const at::Tensor& indices,
                        c10::SymIntArrayRef output_size, at::IntArrayRef, at::IntArrayRef) {
  return max_unpool(x, indices, C10_AS_INTARRAYREF_SLOW(output_size), 3, "max_unpooling3d");
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("max_unpool2d", DFT_GROUPED(dft::max_unpool2d));
  m.impl("max_unpool3d", DFT_GROUPED(dft::max_unpool3d));
}
