// The kernel templates every elementwise file registers: one runtime op per ATen kernel, with
// functional, in-place and out= forms (in-place and out= write through the destination's
// handle, so every alias sees the write).
#pragma once

#include "common.h"
#include "complex.h"

#include <ATen/ExpandUtils.h>

namespace dft {
namespace ew {

// CPU's own error, exception class included (NotImplementedError), for operand dtypes its
// kernels refuse: `-` or `neg` on bool, bitwise ops on floating tensors. The runtime refuses
// them too, as a RuntimeError in its own words; CPU's op on empty host tensors of the same
// dtypes raises CPU's.
inline at::Tensor host_empty(const at::Tensor& t) {
  // A Python scalar stays one (it promotes as a scalar: `int_tensor & 1.0` is about Float).
  if (t.is_cpu() && t.unsafeGetTensorImpl()->is_wrapped_number()) return t;
  return at::empty({0}, t.options().device(at::kCPU));
}

template <uint32_t OP>
void refuse_as_cpu(const at::Tensor& x) {
  if constexpr (OP == DFUSE_UNARY_OP_NEG) {
    if (x.scalar_type() == at::kBool) at::neg(host_empty(x));
  } else if constexpr (OP == DFUSE_UNARY_OP_ABS) {
    if (x.scalar_type() == at::kBool) at::abs(host_empty(x));
  } else if constexpr (OP == DFUSE_UNARY_OP_BITWISE_NOT) {
    if (at::isFloatingType(x.scalar_type())) at::bitwise_not(host_empty(x));
  }
}

// True for the ops CPU refuses to take an integer divisor of zero in: integer remainder,
// fmod and the rounding divisions.
constexpr bool divides_integers(uint32_t op) {
  return op == DFUSE_BINARY_OP_REMAINDER || op == DFUSE_BINARY_OP_FMOD ||
         op == DFUSE_BINARY_OP_FLOOR_DIVIDE || op == DFUSE_BINARY_OP_TRUNC_DIVIDE;
}

// CPU raises "ZeroDivisionError" for an integer division or remainder by zero. A divisor the
// host holds (a Python number, a CPU 0-dim tensor) is checked in every mode; a tpu divisor's
// values only in debug mode, whose ops wait anyway (a host read per op): strict and defer give
// 0 there, as the README's numerics table says.
inline void check_integer_divisor(const at::Tensor& x, const at::Scalar& y) {
  // An empty dividend divides nothing: CPU gives the empty result.
  TORCH_CHECK(!(at::isIntegralType(x.scalar_type(), true) && y.isIntegral(true) &&
                y.toLong() == 0 && x.numel() > 0),
              "ZeroDivisionError");
}

inline void check_integer_divisor(const at::Tensor& x, const at::Tensor& y) {
  if (!at::isIntegralType(x.scalar_type(), true) || !at::isIntegralType(y.scalar_type(), true) ||
      x.numel() == 0 || y.numel() == 0) {
    return;
  }
  if (y.device().type() != c10::DeviceType::PrivateUse1) {
    if (y.numel() == 1) check_integer_divisor(x, y.item());
    return;
  }
  if (get_mode() == DFUSE_MODE_DEBUG) {
    TORCH_CHECK(!y.eq(0).any().item<bool>(), "ZeroDivisionError");
  }
}

template <uint32_t OP>
void refuse_as_cpu(const at::Tensor& x, const at::Tensor& y) {
  if constexpr (divides_integers(OP)) check_integer_divisor(x, y);
  constexpr bool bitwise = OP == DFUSE_BINARY_OP_BITWISE_AND || OP == DFUSE_BINARY_OP_BITWISE_OR ||
                           OP == DFUSE_BINARY_OP_BITWISE_XOR;
  if constexpr (OP == DFUSE_BINARY_OP_SUB) {
    if (x.scalar_type() == at::kBool || y.scalar_type() == at::kBool) {
      at::sub(host_empty(x), host_empty(y));
    }
  } else if constexpr (bitwise) {
    if (at::isFloatingType(x.scalar_type()) || at::isFloatingType(y.scalar_type())) {
      auto a = host_empty(x), b = host_empty(y);
      if constexpr (OP == DFUSE_BINARY_OP_BITWISE_AND) at::bitwise_and(a, b);
      if constexpr (OP == DFUSE_BINARY_OP_BITWISE_OR) at::bitwise_or(a, b);
      if constexpr (OP == DFUSE_BINARY_OP_BITWISE_XOR) at::bitwise_xor(a, b);
    }
  } else if constexpr (OP == DFUSE_BINARY_OP_REMAINDER || OP == DFUSE_BINARY_OP_POW ||
                       OP == DFUSE_BINARY_OP_FLOOR_DIVIDE) {
    // Two bools: CPU has no kernel for them ("remainder_cpu" not implemented for 'Bool').
    if (x.scalar_type() == at::kBool && y.scalar_type() == at::kBool) {
      auto a = host_empty(x), b = host_empty(y);
      if constexpr (OP == DFUSE_BINARY_OP_REMAINDER) at::remainder(a, b);
      if constexpr (OP == DFUSE_BINARY_OP_POW) at::pow(a, b);
      if constexpr (OP == DFUSE_BINARY_OP_FLOOR_DIVIDE) at::floor_divide(a, b);
    }
  }
}

// CPU's rules for where's condition: uint8 still works (deprecated, warned once), any other
// non-bool dtype raises.
inline at::Tensor where_condition(const at::Tensor& c) {
  if (c.scalar_type() == at::kByte) {
    TORCH_WARN_ONCE("where received a uint8 condition tensor. This behavior is deprecated and "
                    "will be removed in a future version of PyTorch. Use a boolean condition "
                    "instead.");
    return c.ne(0);
  }
  TORCH_CHECK(c.scalar_type() == at::kBool, "where expected condition to be a boolean tensor, "
              "but got a tensor with dtype ", c.scalar_type());
  return c;
}

// In place, self keeps its shape: an operand that broadcasts it bigger gets TensorIterator's
// error (the runtime's own names its C call). Same-shape operands skip the shape math.
inline void check_in_place_shape(const at::Tensor& x, const at::Tensor& y) {
  if (y.sizes().equals(x.sizes()) || y.dim() == 0) return;
  auto shape = at::infer_size(x.sizes(), y.sizes());
  TORCH_CHECK(x.sizes().equals(shape), "output with shape ", x.sizes(),
              " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
}

// In place, the result's dtype must cast into self's (TensorIterator's check, with CPU's
// message): `int_tensor *= 1j` raises, where the copy back would drop the imaginary part.
inline void check_in_place_cast(const at::Tensor& x, at::ScalarType result) {
  TORCH_CHECK(at::canCast(result, x.scalar_type()), "result type ", result,
              " can't be cast to the desired output type ", x.scalar_type());
}

// check_in_place_cast for op OP with operand y; true division's result is floating.
template <uint32_t OP, typename Y>
void check_in_place_result(const at::Tensor& x, const Y& y) {
  auto r = at::result_type(x, y);
  if (OP == DFUSE_BINARY_OP_DIV && at::isIntegralType(r, /*includeBool=*/true)) {
    r = at::typeMetaToScalarType(at::get_default_dtype());
  }
  check_in_place_cast(x, r);
}

// The runtime computes integers and bools promoted to a float in float32, PyTorch's default
// dtype; after torch.set_default_dtype(torch.float64) (or a half one) PyTorch promotes them
// to that instead. True when `r`, computed from the non-floating operands `integral`, took
// float32 where the default is another dtype: the caller computes it again from operands cast
// to the default. Only then: the first result is dropped unread (defer never runs it).
inline bool promoted_past_default(const at::Tensor& r, bool integral) {
  return integral && r.scalar_type() == at::kFloat &&
         at::typeMetaToScalarType(at::get_default_dtype()) != at::kFloat;
}

// A tpu operand in the default dtype; a host scalar (a wrapped number) is left as it is: the
// runtime takes it as a value and the tpu operand's dtype wins.
inline at::Tensor to_default_dtype(const at::Tensor& t) {
  if (t.device().type() != c10::DeviceType::PrivateUse1) return t;
  return cast(t, at::typeMetaToScalarType(at::get_default_dtype()));
}

template <uint32_t OP>
at::Tensor u(const at::Tensor& x) {
  refuse_as_cpu<OP>(x);
  if (x.is_complex()) return complex_unary(OP, x);
  auto r = unary(x, OP);
  if (promoted_past_default(r, !at::isFloatingType(x.scalar_type()))) {
    return unary(to_default_dtype(x), OP);
  }
  return r;
}

template <uint32_t OP>
at::Tensor& u_(at::Tensor& x) {
  refuse_as_cpu<OP>(x);
  if (x.is_complex()) return x.copy_(complex_unary(OP, x));
  auto a = attrs_sub(OP);
  run_into(DFUSE_OP_KIND_UNARY, &a, Operands().t(x), x, "in-place unary op");
  return x;
}

template <uint32_t OP>
at::Tensor& u_out(const at::Tensor& x, at::Tensor& out) {
  refuse_as_cpu<OP>(x);
  at::native::resize_output(out, x.sizes());
  auto a = attrs_sub(OP);
  run_into(DFUSE_OP_KIND_UNARY, &a, Operands().t(x), out, "unary op (out=)");
  return out;
}

template <uint32_t OP>
at::Tensor b(const at::Tensor& x, const at::Tensor& y) {
  refuse_as_cpu<OP>(x, y);
  if (x.is_complex() || y.is_complex()) return complex_binary(OP, x, y);
  auto a = attrs_sub(OP);
  auto r = run(DFUSE_OP_KIND_BINARY, &a, Operands().t(x).t(y), "binary op");
  // A Python number (a wrapped 0-dim tensor) promotes an integer operand to the default
  // dtype, whatever its own. Asked only of a float32 result.
  auto non_floating = [](const at::Tensor& t) {
    return !at::isFloatingType(t.scalar_type()) || t.unsafeGetTensorImpl()->is_wrapped_number();
  };
  if (r.scalar_type() == at::kFloat && promoted_past_default(r, non_floating(x) && non_floating(y))) {
    return run(DFUSE_OP_KIND_BINARY, &a, Operands().t(to_default_dtype(x)).t(to_default_dtype(y)),
               "binary op");
  }
  return r;
}

template <uint32_t OP>
at::Tensor& b_(at::Tensor& x, const at::Tensor& y) {
  // CPU's order: its op checks the result's cast into self before its kernel refuses a dtype.
  check_in_place_shape(x, y);
  if (y.scalar_type() != x.scalar_type() || OP == DFUSE_BINARY_OP_DIV) {
    check_in_place_result<OP>(x, y);
  }
  refuse_as_cpu<OP>(x, y);
  if (x.is_complex() || y.is_complex()) return x.copy_(complex_binary(OP, x, y));
  auto a = attrs_sub(OP);
  run_into(DFUSE_OP_KIND_BINARY, &a, Operands().t(x).t(y), x, "in-place binary op");
  return x;
}

template <uint32_t OP>
at::Tensor bs(const at::Tensor& x, const at::Scalar& y) {
  if constexpr (divides_integers(OP)) check_integer_divisor(x, y);
  if (x.is_complex() || y.isComplex()) return complex_binary(OP, x, y);
  auto r = binary(x, y, OP);
  // A float scalar promotes an integer tensor to the default dtype.
  if (promoted_past_default(r, !at::isFloatingType(x.scalar_type()))) {
    return binary(to_default_dtype(x), y, OP);
  }
  return r;
}

template <uint32_t OP>
at::Tensor& bs_(at::Tensor& x, const at::Scalar& y) {
  check_in_place_result<OP>(x, y);
  if constexpr (divides_integers(OP)) check_integer_divisor(x, y);
  if (x.is_complex() || y.isComplex()) return x.copy_(complex_binary(OP, x, y));
  auto a = attrs_sub(OP);
  run_into(DFUSE_OP_KIND_BINARY, &a, Operands().t(x).s(y), x, "in-place binary op");
  return x;
}

// The scalar first (remainder.Scalar_Tensor): one op with a scalar operand, promoted as a
// wrapped number is. Complex goes through the tensor form, which raises as CPU does.
template <uint32_t OP>
at::Tensor sb(const at::Scalar& x, const at::Tensor& y) {
  if constexpr (divides_integers(OP)) {
    if (x.isIntegral(true)) check_integer_divisor(at::scalar_to_tensor(x), y);
  }
  if (x.isComplex() || y.is_complex()) return b<OP>(at::scalar_to_tensor(x, y.device()), y);
  return binary(x, y, OP);
}

// out= variants (the optimizers' foreach fallbacks and user code call them): written straight
// into `out` when it already has the broadcast shape, else PyTorch's resize-then-write.
// An out that is also an input is not resized: TensorIterator raises (`add(x, y, out=x)` with
// y broadcasting x to a bigger shape).
inline void prepare_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  auto shape = at::infer_size(a.sizes(), b.sizes());
  if (out.sizes().equals(shape)) return;
  TORCH_CHECK(!out.is_same(a) && !out.is_same(b), "output with shape ", out.sizes(),
              " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  at::native::resize_output(out, shape);
}

template <uint32_t OP>
at::Tensor& b_out(const at::Tensor& x, const at::Tensor& y, at::Tensor& out) {
  refuse_as_cpu<OP>(x, y);
  prepare_out(x, y, out);
  if (x.is_complex() || y.is_complex()) return out.copy_(complex_binary(OP, x, y));
  auto a = attrs_sub(OP);
  run_into(DFUSE_OP_KIND_BINARY, &a, Operands().t(x).t(y), out, "binary op (out=)");
  return out;
}

}  // namespace ew
}  // namespace dft
