// The kernel templates every elementwise file registers: one runtime op per ATen kernel, with
// functional, in-place and out= forms (in-place and out= write through the destination's
// handle, so every alias sees the write).
#pragma once

#include "common.h"
#include "complex.h"

#include <ATen/ExpandUtils.h>

namespace dft {
namespace ew {

template <uint32_t OP>
at::Tensor u(const at::Tensor& x) {
  if (x.is_complex()) return complex_unary(OP, x);
  return unary(x, OP);
}

template <uint32_t OP>
at::Tensor& u_(at::Tensor& x) {
  if (x.is_complex()) return x.copy_(complex_unary(OP, x));
  auto a = attrs_sub(OP);
  run_into(DFUSE_OP_KIND_UNARY, &a, Operands().t(x), x, "in-place unary op");
  return x;
}

template <uint32_t OP>
at::Tensor& u_out(const at::Tensor& x, at::Tensor& out) {
  if (!out.sizes().equals(x.sizes())) out.resize_(x.sizes());
  auto a = attrs_sub(OP);
  run_into(DFUSE_OP_KIND_UNARY, &a, Operands().t(x), out, "unary op (out=)");
  return out;
}

template <uint32_t OP>
at::Tensor b(const at::Tensor& x, const at::Tensor& y) {
  if (x.is_complex() || y.is_complex()) return complex_binary(OP, x, y);
  auto a = attrs_sub(OP);
  return run(DFUSE_OP_KIND_BINARY, &a, Operands().t(x).t(y), "binary op");
}

template <uint32_t OP>
at::Tensor& b_(at::Tensor& x, const at::Tensor& y) {
  if (x.is_complex() || y.is_complex()) return x.copy_(complex_binary(OP, x, y));
  auto a = attrs_sub(OP);
  run_into(DFUSE_OP_KIND_BINARY, &a, Operands().t(x).t(y), x, "in-place binary op");
  return x;
}

template <uint32_t OP>
at::Tensor bs(const at::Tensor& x, const at::Scalar& y) {
  if (x.is_complex() || y.isComplex()) return complex_binary(OP, x, y);
  return binary(x, y, OP);
}

template <uint32_t OP>
at::Tensor& bs_(at::Tensor& x, const at::Scalar& y) {
  if (x.is_complex() || y.isComplex()) return x.copy_(complex_binary(OP, x, y));
  auto a = attrs_sub(OP);
  run_into(DFUSE_OP_KIND_BINARY, &a, Operands().t(x).s(y), x, "in-place binary op");
  return x;
}

// out= variants (the optimizers' foreach fallbacks and user code call them): written straight
// into `out` when it already has the broadcast shape, else PyTorch's resize-then-write.
inline void prepare_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  auto shape = at::infer_size(a.sizes(), b.sizes());
  if (!out.sizes().equals(shape)) out.resize_(shape);
}

template <uint32_t OP>
at::Tensor& b_out(const at::Tensor& x, const at::Tensor& y, at::Tensor& out) {
  prepare_out(x, y, out);
  if (x.is_complex() || y.is_complex()) return out.copy_(complex_binary(OP, x, y));
  auto a = attrs_sub(OP);
  run_into(DFUSE_OP_KIND_BINARY, &a, Operands().t(x).t(y), out, "binary op (out=)");
  return out;
}

}  // namespace ew
}  // namespace dft
