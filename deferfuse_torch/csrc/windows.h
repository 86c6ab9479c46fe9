// Sliding-window plumbing shared by convolution and pooling: padding into a filled buffer,
// the free as_strided view of every window, col2im as in-place adds into strided slices (so
// backward needs no scatter op); the small host-computed tables the window ops use (window
// divisors, window index maps, averaging matrices) come from tables.h.
#pragma once

#include "common.h"
#include "tables.h"

namespace dft {

// x padded on its last before.size() dims: `before[i]` elements of `fill` in front and
// `after[i]` behind. Returns x itself when no padding is needed.
at::Tensor pad_spatial(const at::Tensor& x, at::IntArrayRef before, at::IntArrayRef after,
                       const at::Scalar& fill);

// The view of buf's elements that pad_spatial copied x (of spatial `sizes`) into.
at::Tensor unpad_spatial(const at::Tensor& buf, at::IntArrayRef before, at::IntArrayRef sizes);

// A view [lead..., k..., out...] of x [lead..., spatial...]: element (l, k, o) is
// x[l, o * stride + k * dilation] per spatial dim. No data moves.
at::Tensor window_view(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                       at::IntArrayRef dilation, at::IntArrayRef out);

// Average pooling's window sums over their divisors; integer windows divide as CPU's kernel
// does (truncating toward zero), floats divide.
at::Tensor window_mean(const at::Tensor& sums, const at::Tensor& divisors);

// The order in which to walk the dims of a tensor [lead..., middle..., positions...] (`lead`
// leading dims, `positions` trailing ones) elementwise. The CPU backend's loop runs the two
// innermost dims per call and walks the others one call at a time (a call of fewer than 256
// elements takes the longest walked dim as its rows instead), so the window positions stay
// innermost (the order of memory on both sides) unless there are fewer than
// kMinPositionsPerCall of them; then the order is [middle..., positions..., lead...].
// Measured on resnet18's im2col copies (1 thread, session 33): layer 4's windows [8, 512, 3, 3,
// 2, 2] take 209 us lead innermost and 246 us naturally (rows of 2 elements); layer 3's [8,
// 256, 3, 3, 4, 4] 250 us naturally and 592 us lead innermost; layer 1's [8, 64, 3, 3, 16,
// 16] took 1.5 ms naturally, 19 ms lead innermost (each element a page apart).
std::vector<int64_t> walk_order(at::IntArrayRef sizes, int64_t lead, int64_t positions);

// dst.copy_(src) for window-shaped tensors [lead..., k..., out...] (d = kernel dims), walked in
// walk_order (im2col into columns of any layout, pooling's window copies).
void copy_windows(const at::Tensor& dst, const at::Tensor& src, int64_t d);

// col2im: a zero buffer of shape [lead..., buf_spatial...] into which every window slice
// contrib[lead..., k..., out...] is added at the positions window_view reads it from.
at::Tensor add_windows(const at::Tensor& contrib, at::IntArrayRef buf_spatial,
                       at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef dilation);

// a @ b with torch.matmul's batch broadcasting, recorded as one op (im2col products, the
// adaptive pooling matrices).
at::Tensor batched_matmul(const at::Tensor& a, const at::Tensor& b);

// Python-style list arguments: one value for every spatial dim, or the same value repeated.
std::vector<int64_t> expand_param(at::IntArrayRef v, int64_t d, const char* op, const char* name);

}  // namespace dft
