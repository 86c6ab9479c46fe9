// complex64 on "tpu" (complex.cpp): held as float32 pairs, computed by the device's float ops.
#pragma once

#include "common.h"

namespace dft {

// The float32 pairs [.., 2] (real, imaginary) of a complex64 tensor (tpu or CPU): a view of
// its storage, or for a conjugate view, a new tensor of the conjugated pairs.
at::Tensor pairs(const at::Tensor& t);

// x OP y where either operand is complex (OP: DFUSE_BINARY_OP_ADD, _SUB, _MUL, _DIV, or _EQ
// and _NE: a bool result), as CPU
// computes it; any other op, or a result that would be complex128, is refused with an error
// naming the op.
at::Tensor complex_binary(uint32_t op, const at::Tensor& x, const at::Tensor& y);

// The same with a scalar y.
at::Tensor complex_binary(uint32_t op, const at::Tensor& x, const at::Scalar& y);

// OP x for a complex x (OP: DFUSE_UNARY_OP_NEG, _EXP, or _ABS: a float32 result); _SIGN
// raises CPU's torch.sign error, any other op is refused with an error.
at::Tensor complex_unary(uint32_t op, const at::Tensor& x);

// where(c, x, y) with a complex operand: each part chosen by c.
at::Tensor complex_where(const at::Tensor& c, const at::Tensor& x, const at::Tensor& y);

// torch.sgn of a complex x: x / |x|, 0 where x is 0 (what abs's backward multiplies by).
at::Tensor complex_sgn(const at::Tensor& x);

// product(x, y) of complex64 operands through their parts, for a product that is bilinear
// (a matrix product): (ar br - ai bi, ar bi + ai br), four real products. A real operand takes
// part as (x, 0), as CPU promotes it.
at::Tensor complex_bilinear(const at::Tensor& x, const at::Tensor& y,
                            at::Tensor (*product)(const at::Tensor&, const at::Tensor&));

}  // namespace dft
