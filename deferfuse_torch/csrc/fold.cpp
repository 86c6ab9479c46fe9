// nn.Unfold / nn.Fold (F.unfold, F.fold: at::im2col, at::col2im) on "tpu", and the gradient of
// Tensor.unfold (unfold_backward).
//
// PyTorch implements both as CPU and CUDA kernels only, so on "tpu" they ran on the CPU
// fallback, forward and backward. Here each is one gather or one scatter-add over the padded
// image plane, by a table of flat positions: entry (i, j, l) is where kernel offset (i, j) of
// output position l reads, (oh * sh + i * dh) * Wp + (ow * sw + j * dw). Unfold is an
// index_select of the plane by that table, fold an index_add into a zero plane (overlapping
// windows sum), then the padding cropped. Registered for autograd as well: each one's backward
// is the other, through autograd of those two ops. The table depends only on the shapes; it is
// built on the host and uploaded (tables.h's upload_table). Shape errors are CPU's own (im2col_shape_check.h).
#include "windows.h"

#include <ATen/native/im2col_shape_check.h>
#include <torch/library.h>

namespace dft {
namespace {

struct Window {
  int64_t kh, kw, dh, dw, ph, pw, sh, sw;
};

Window window(at::IntArrayRef kernel, at::IntArrayRef dilation, at::IntArrayRef padding,
              at::IntArrayRef stride) {
  TORCH_CHECK(kernel.size() == 2, "It is expected kernel_size equals to 2, but got size ",
              kernel.size());
  TORCH_CHECK(dilation.size() == 2, "It is expected dilation equals to 2, but got size ",
              dilation.size());
  TORCH_CHECK(padding.size() == 2, "It is expected padding equals to 2, but got size ",
              padding.size());
  TORCH_CHECK(stride.size() == 2, "It is expected stride equals to 2, but got size ",
              stride.size());
  return {kernel[0], kernel[1], dilation[0], dilation[1],
          padding[0], padding[1], stride[0], stride[1]};
}

// Output positions along one dim (the shape checks have made it positive).
int64_t positions(int64_t size, int64_t pad, int64_t dil, int64_t k, int64_t s) {
  return (size + 2 * pad - (dil * (k - 1) + 1)) / s + 1;
}

// Flat positions in the padded [hp, wp] plane, ordered (i, j, oh, ow): [kh * kw * oh * ow],
// on `like`'s device. While torch.compile traces (`like` fake or functional) the table is
// computed by tensor ops: an uploaded one is written from host memory, which a fake tensor
// does not have (F.unfold, and so HF ConvBERT, failed to compile). Eager calls upload it once.
at::Tensor window_table(const Window& w, int64_t wp, int64_t oh, int64_t ow,
                        const at::Tensor& like) {
  if (!recordable(like)) {
    auto rows = table_axis(like, oh, 2, 4) * w.sh + table_axis(like, w.kh, 0, 4) * w.dh;
    auto cols = table_axis(like, ow, 3, 4) * w.sw + table_axis(like, w.kw, 1, 4) * w.dw;
    return (rows * wp + cols).reshape({-1});
  }
  std::vector<double> t;
  t.reserve(w.kh * w.kw * oh * ow);
  for (int64_t i = 0; i < w.kh; ++i)
    for (int64_t j = 0; j < w.kw; ++j)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x)
          t.push_back(double((y * w.sh + i * w.dh) * wp + (x * w.sw + j * w.dw)));
  return upload_table(t, {int64_t(t.size())}, at::kLong);
}

at::Tensor im2col(const at::Tensor& input, at::IntArrayRef kernel, at::IntArrayRef dilation,
                  at::IntArrayRef padding, at::IntArrayRef stride) {
  auto w = window(kernel, dilation, padding, stride);
  at::native::im2col_shape_check(input, at::Tensor(), w.kh, w.kw, w.dh, w.dw, w.ph, w.pw, w.sh,
                                 w.sw);
  bool batched = input.dim() == 4;
  auto x = batched ? input : input.unsqueeze(0);
  int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  int64_t oh = positions(h, w.ph, w.dh, w.kh, w.sh), ow = positions(wd, w.pw, w.dw, w.kw, w.sw);
  int64_t hp = h + 2 * w.ph, wp = wd + 2 * w.pw;
  auto padded = (w.ph || w.pw) ? at::constant_pad_nd(x, {w.pw, w.pw, w.ph, w.ph}, 0) : x;
  auto table = window_table(w, wp, oh, ow, x);
  auto cols = padded.reshape({n, c, hp * wp}).index_select(2, table)
                  .view({n, c * w.kh * w.kw, oh * ow});
  return batched ? cols : cols.squeeze(0);
}

at::Tensor col2im(const at::Tensor& input, at::IntArrayRef output_size, at::IntArrayRef kernel,
                  at::IntArrayRef dilation, at::IntArrayRef padding, at::IntArrayRef stride) {
  TORCH_CHECK(output_size.size() == 2, "It is expected output_size equals to 2, but got size ",
              output_size.size());
  auto w = window(kernel, dilation, padding, stride);
  int64_t h = output_size[0], wd = output_size[1];
  at::native::col2im_shape_check(input, at::Tensor(), h, wd, w.kh, w.kw, w.dh, w.dw, w.ph, w.pw,
                                 w.sh, w.sw);
  bool batched = input.dim() == 3;
  auto cols = batched ? input : input.unsqueeze(0);
  int64_t n = cols.size(0), c = cols.size(1) / (w.kh * w.kw);
  int64_t oh = positions(h, w.ph, w.dh, w.kh, w.sh), ow = positions(wd, w.pw, w.dw, w.kw, w.sw);
  int64_t hp = h + 2 * w.ph, wp = wd + 2 * w.pw;
  auto table = window_table(w, wp, oh, ow, cols);
  auto plane = at::zeros({n, c, hp * wp}, cols.options())
                   .index_add(2, table, cols.reshape({n, c, w.kh * w.kw * oh * ow}));
  auto out = plane.view({n, c, hp, wp}).slice(2, w.ph, w.ph + h).slice(3, w.pw, w.pw + wd)
                 .contiguous();
  return batched ? out : out.squeeze(0);
}

// The gradient of Tensor.unfold(dim, size, step) (sliding windows as a view, e.g. framing a
// signal or cutting patches): each window's gradient added back at its positions. Windows
// that do not overlap (step >= size) are one copy into the same unfold view of a zero tensor;
// overlapping ones add one kernel offset at a time, each a strided slice with no overlap.
at::Tensor unfold_backward(const at::Tensor& grad, c10::SymIntArrayRef input_sizes, int64_t dim,
                           int64_t size, int64_t step) {
  auto sizes = C10_AS_INTARRAYREF_SLOW(input_sizes);
  auto out = at::zeros(sizes, grad.options());
  if (grad.numel() == 0) return out;
  dim = at::maybe_wrap_dim(dim, std::max<int64_t>(int64_t(sizes.size()), 1));
  auto windows =
      out.dim() == 0 ? out.reshape({1}).unfold(0, size, step) : out.unfold(dim, size, step);
  if (step >= size) {
    windows.copy_(grad);
    return out;
  }
  for (int64_t k = 0; k < size; ++k) {
    auto dst = windows.select(-1, k);
    dst.copy_(dst + grad.select(-1, k));
  }
  return out;
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("im2col", DFT_GROUPED(dft::im2col));
  m.impl("col2im", DFT_GROUPED(dft::col2im));
  m.impl("unfold_backward", DFT_GROUPED(dft::unfold_backward));
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("im2col", DFT_GROUPED(dft::im2col));
  m.impl("col2im", DFT_GROUPED(dft::col2im));
}
