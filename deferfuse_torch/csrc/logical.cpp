// Boolean reductions (all/any, equal), isneginf/isposinf, tril/triu and their index lists
// (tril_indices/triu_indices), masked_fill and where's out= form:
// what the math path of scaled_dot_product_attention and masking code call, kept off the CPU
// fallback.
#include "common.h"
#include "elementwise_ops.h"

#include <ATen/ExpandUtils.h>
#include <limits>
#include <torch/library.h>

namespace dft {
namespace {

at::Tensor& assign_out(at::Tensor& out, const at::Tensor& r) {
  at::native::resize_output(out, r.sizes());
  return out.copy_(r);
}

// all(x) over dims: no element is zero, i.e. the count of zeros is 0 (counts are exact int64
// sums, so this needs no bool min/max support).
at::Tensor all_dims(const at::Tensor& x, at::IntArrayRef dims, bool keepdim) {
  auto zeros = binary(x, at::Scalar(0), DFUSE_BINARY_OP_EQ);
  auto n = reduce(cast(zeros, at::kLong), DFUSE_REDUCE_OP_SUM, dims, keepdim);
  return binary(n, at::Scalar(int64_t(0)), DFUSE_BINARY_OP_EQ);
}

at::Tensor any_dims(const at::Tensor& x, at::IntArrayRef dims, bool keepdim) {
  auto nonzero = binary(x, at::Scalar(0), DFUSE_BINARY_OP_NE);
  auto n = reduce(cast(nonzero, at::kLong), DFUSE_REDUCE_OP_SUM, dims, keepdim);
  return binary(n, at::Scalar(int64_t(0)), DFUSE_BINARY_OP_NE);
}

// A 0-dim input reduces over "no dims" in PyTorch (the value itself); the runtime's empty dim
// list means all dims, which for a 0-dim tensor is the same thing.
// PyTorch keeps uint8 for all/any of a uint8 tensor (its legacy rule), bool otherwise.
at::Tensor logical_result(const at::Tensor& r, const at::Tensor& x) {
  return x.scalar_type() == at::kByte ? cast(r, at::kByte) : r;
}
at::Tensor all_k(const at::Tensor& x) { return logical_result(all_dims(x, {}, false), x); }
at::Tensor any_k(const at::Tensor& x) { return logical_result(any_dims(x, {}, false), x); }
at::Tensor all_dim(const at::Tensor& x, int64_t dim, bool keepdim) {
  return x.dim() == 0 ? all_k(x) : logical_result(all_dims(x, {dim}, keepdim), x);
}
at::Tensor any_dim(const at::Tensor& x, int64_t dim, bool keepdim) {
  return x.dim() == 0 ? any_k(x) : logical_result(any_dims(x, {dim}, keepdim), x);
}
at::Tensor& all_out(const at::Tensor& x, int64_t dim, bool keepdim, at::Tensor& out) {
  return assign_out(out, all_dim(x, dim, keepdim));
}
at::Tensor& any_out(const at::Tensor& x, int64_t dim, bool keepdim, at::Tensor& out) {
  return assign_out(out, any_dim(x, dim, keepdim));
}
at::Tensor& all_all_out(const at::Tensor& x, at::Tensor& out) { return assign_out(out, all_k(x)); }
at::Tensor& any_all_out(const at::Tensor& x, at::Tensor& out) { return assign_out(out, any_k(x)); }

at::Tensor isneginf_k(const at::Tensor& x) {
  return binary(x, at::Scalar(-std::numeric_limits<double>::infinity()), DFUSE_BINARY_OP_EQ);
}
at::Tensor isposinf_k(const at::Tensor& x) {
  return binary(x, at::Scalar(std::numeric_limits<double>::infinity()), DFUSE_BINARY_OP_EQ);
}
at::Tensor& isneginf_out(const at::Tensor& x, at::Tensor& out) {
  return assign_out(out, isneginf_k(x));
}
at::Tensor& isposinf_out(const at::Tensor& x, at::Tensor& out) {
  return assign_out(out, isposinf_k(x));
}

at::Tensor& where_out(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                      at::Tensor& out) {
  auto shape = at::infer_size(at::infer_size(c.sizes(), a.sizes()), b.sizes());
  // An out that is also an input cannot be resized to the broadcast shape, as on CPU.
  TORCH_CHECK(out.sizes().equals(shape) || !(out.is_same(c) || out.is_same(a) || out.is_same(b)),
              "output with shape ", out.sizes(), " doesn't match the broadcast shape ",
              c10::IntArrayRef(shape));
  at::native::resize_output(out, shape);
  run_into(DFUSE_OP_KIND_WHERE, nullptr, Operands().t(ew::where_condition(c)).t(a).t(b), out,
           "where (out=)");
  return out;
}

// tril/triu: keep x[..., i, j] where j - i <= diagonal (tril) or >= diagonal (triu), else 0;
// the mask comes from two aranges, so nothing leaves the device.
at::Tensor tri_mask(const at::Tensor& x, int64_t diagonal, bool lower) {
  TORCH_CHECK(x.dim() >= 2, lower ? "tril" : "triu", ": input tensor must have at least 2 dimensions");
  DfuseAttrs a{};
  a.dtype = DFUSE_DTYPE_I64;
  auto ar = [&](int64_t n) {
    return run(DFUSE_OP_KIND_ARANGE, &a,
               Operands().s(at::Scalar(int64_t(0))).s(at::Scalar(n)).s(at::Scalar(int64_t(1))),
               "tril/triu index");
  };
  auto rows = ar(x.size(-2)).unsqueeze(1);
  auto cols = ar(x.size(-1));
  auto d = cols - rows;
  return binary(d, at::Scalar(diagonal), lower ? DFUSE_BINARY_OP_LE : DFUSE_BINARY_OP_GE);
}

at::Tensor tri(const at::Tensor& x, int64_t diagonal, bool lower) {
  // The zero must be of x's kind: a Python int 0 would promote a bool x to int64.
  at::ScalarType t = x.scalar_type();
  at::Scalar zero = t == at::kBool                        ? at::Scalar(false)
                    : at::isIntegralType(t, false)        ? at::Scalar(int64_t(0))
                                                          : at::Scalar(0.0);
  return run(DFUSE_OP_KIND_WHERE, nullptr,
             Operands().t(tri_mask(x, diagonal, lower)).t(x).s(zero), "tril/triu");
}

at::Tensor tril(const at::Tensor& x, int64_t diagonal) { return tri(x, diagonal, true); }
at::Tensor triu(const at::Tensor& x, int64_t diagonal) { return tri(x, diagonal, false); }
at::Tensor& tril_(at::Tensor& x, int64_t diagonal) { return x.copy_(tri(x, diagonal, true)); }
at::Tensor& triu_(at::Tensor& x, int64_t diagonal) { return x.copy_(tri(x, diagonal, false)); }
at::Tensor& tril_out(const at::Tensor& x, int64_t diagonal, at::Tensor& out) {
  return assign_out(out, tri(x, diagonal, true));
}
at::Tensor& triu_out(const at::Tensor& x, int64_t diagonal, at::Tensor& out) {
  return assign_out(out, tri(x, diagonal, false));
}

// torch.equal: same sizes and every element equal (after type promotion, as on CPU; NaN is
// unequal): one bool read from the device instead of two tensors copied to the host.
bool tpu_equal(const at::Tensor& a, const at::Tensor& b) {
  if (!a.sizes().equals(b.sizes())) return false;
  if (a.numel() == 0) return true;
  return at::eq(a, b).all().item<bool>();
}

// tril_indices/triu_indices: the indices depend only on three integers, so PyTorch's CPU
// kernel builds them (its checks and errors included) and they are uploaded as torch.tensor's
// values are: recorded, no sync point. DLRM's feature interaction reads its pairs this way.
at::Tensor tri_indices(bool lower, int64_t row, int64_t col, int64_t offset,
                       std::optional<at::ScalarType> dtype, std::optional<at::Device> device) {
  auto opts = at::TensorOptions().dtype(dtype.value_or(at::kLong));
  auto host = lower ? at::tril_indices(row, col, offset, opts) : at::triu_indices(row, col, offset, opts);
  auto out = at::empty(host.sizes(), host.options().device(device.value_or(c10::Device("tpu"))));
  out.copy_(host);
  return out;
}
at::Tensor tril_indices(int64_t row, int64_t col, int64_t offset,
                        std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                        std::optional<at::Device> device, std::optional<bool>) {
  return tri_indices(true, row, col, offset, dtype, device);
}
at::Tensor triu_indices(int64_t row, int64_t col, int64_t offset,
                        std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                        std::optional<at::Device> device, std::optional<bool>) {
  return tri_indices(false, row, col, offset, dtype, device);
}

// masked_fill is where(mask, value, self) in self's dtype; the value is converted to that dtype
// first (as PyTorch does), so the in-place form's write is never a narrowing cast. The
// out-of-place form broadcasts self and mask together, as CPU's does (Falcon's alibi masks a
// [b, h, 1, s] tensor with a [b, 1, s, s] mask); the in-place form's mask must broadcast to
// self, with CPU's message.
void check_mask(const at::Tensor& self, const at::Tensor& mask, bool in_place) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_fill_ only supports boolean masks, but got "
              "mask with dtype ", mask.dtype());
  if (in_place) {
    auto shape = at::infer_size(self.sizes(), mask.sizes());
    TORCH_CHECK(shape == self.sizes(), "output with shape ", self.sizes(),
                " doesn't match the broadcast shape ", at::IntArrayRef(shape));
  }
}

at::Scalar value_as(const at::Tensor& self, const at::Scalar& v) {
  if (self.scalar_type() == at::kBool) return v.toBool();
  if (at::isIntegralType(self.scalar_type(), false)) return v.toLong();
  return v.toDouble();
}

Operands fill_operands(const at::Tensor& self, const at::Tensor& mask, const at::Tensor* value,
                       const at::Scalar* scalar, bool in_place) {
  check_mask(self, mask, in_place);
  Operands o;
  o.t(mask);
  if (scalar) {
    o.s(value_as(self, *scalar));
  } else {
    TORCH_CHECK(value->dim() == 0, "masked_fill_ only supports a 0-dimensional value tensor, but "
                "got tensor with ", value->dim(), " dimension(s).");
    if (value->device().is_cpu()) {
      auto v = value->item();
      check_value_fits(v, self.scalar_type());  // CPU raises for 70000 into uint8
      o.s(value_as(self, v));
    } else {
      o.t(cast(*value, self.scalar_type()));
    }
  }
  o.t(self);
  return o;
}

at::Tensor masked_fill_s(const at::Tensor& self, const at::Tensor& mask, const at::Scalar& v) {
  check_value_fits(v, self.scalar_type());
  return cast(run(DFUSE_OP_KIND_WHERE, nullptr, fill_operands(self, mask, nullptr, &v, false),
                  "masked_fill"), self.scalar_type());
}

at::Tensor& masked_fill_s_(at::Tensor& self, const at::Tensor& mask, const at::Scalar& v) {
  check_value_fits(v, self.scalar_type());
  run_into(DFUSE_OP_KIND_WHERE, nullptr, fill_operands(self, mask, nullptr, &v, true), self,
           "masked_fill_");
  return self;
}

at::Tensor masked_fill_t(const at::Tensor& self, const at::Tensor& mask, const at::Tensor& v) {
  return cast(run(DFUSE_OP_KIND_WHERE, nullptr, fill_operands(self, mask, &v, nullptr, false),
                  "masked_fill"), self.scalar_type());
}

at::Tensor& masked_fill_t_(at::Tensor& self, const at::Tensor& mask, const at::Tensor& v) {
  run_into(DFUSE_OP_KIND_WHERE, nullptr, fill_operands(self, mask, &v, nullptr, true), self,
           "masked_fill_");
  return self;
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("all", TORCH_FN(dft::all_k));
  m.impl("any", DFT_GROUPED(dft::any_k));
  m.impl("all.dim", DFT_GROUPED(dft::all_dim));
  m.impl("any.dim", DFT_GROUPED(dft::any_dim));
  m.impl("all.out", TORCH_FN(dft::all_out));
  m.impl("any.out", TORCH_FN(dft::any_out));
  m.impl("all.all_out", TORCH_FN(dft::all_all_out));
  m.impl("any.all_out", TORCH_FN(dft::any_all_out));
  m.impl("isneginf", TORCH_FN(dft::isneginf_k));
  m.impl("isposinf", TORCH_FN(dft::isposinf_k));
  m.impl("isneginf.out", TORCH_FN(dft::isneginf_out));
  m.impl("isposinf.out", TORCH_FN(dft::isposinf_out));
  m.impl("where.self_out", TORCH_FN(dft::where_out));
  m.impl("masked_fill.Scalar", TORCH_FN(dft::masked_fill_s));
  m.impl("masked_fill_.Scalar", TORCH_FN(dft::masked_fill_s_));
  m.impl("masked_fill.Tensor", TORCH_FN(dft::masked_fill_t));
  m.impl("masked_fill_.Tensor", TORCH_FN(dft::masked_fill_t_));
  m.impl("tril", DFT_GROUPED(dft::tril));
  m.impl("triu", DFT_GROUPED(dft::triu));
  m.impl("tril_", TORCH_FN(dft::tril_));
  m.impl("triu_", TORCH_FN(dft::triu_));
  m.impl("tril.out", TORCH_FN(dft::tril_out));
  m.impl("triu.out", TORCH_FN(dft::triu_out));
  m.impl("equal", TORCH_FN(dft::tpu_equal));
  m.impl("tril_indices", TORCH_FN(dft::tril_indices));
  m.impl("triu_indices", TORCH_FN(dft::triu_indices));
}
