// scaled_dot_product_attention on "tpu" as one autograd node with its own backward.
//
// PyTorch has no fused attention for an out-of-tree device, so without this kernel
// F.scaled_dot_product_attention takes its math path: q and k each scaled by sqrt(scale), a
// causal mask built and applied as separate ops, softmax, and autograd through every one of
// them (the scales, the mask, the softmax) in the backward. Here the forward is
// softmax(q @ k^T * scale, masked) @ v, and the backward is the four matmuls and one softmax
// backward flash attention's backward computes; in defer mode the scale and the mask fuse into
// the first matmul's epilogue or the softmax's row kernel. PyTorch's CPU kernel for this op is
// flash attention, which rounds differently from its own math path too: the results agree
// with CPU within float32 rounding, not bit for bit (tests/test_attention.py).
//
// Grouped-query attention repeats the key/value heads first, as the math path does. Cases this
// kernel does not cover go to PyTorch's own composite implementation (its math path on this
// device), unchanged: dropout, a mask that requires grad or comes with is_causal, inputs whose
// batch dims differ (broadcast), dtypes other than float32/float64 (autocast's half types keep
// the math path's upcasting), and invalid calls, so that they raise PyTorch's own errors.
#include "common.h"

#include <ATen/ops/scaled_dot_product_attention_native.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

namespace dft {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// A batched matrix product on the runtime's MATMUL op, which takes any batch strides:
// at::matmul would first copy a head-split view (q, k, v as nanoGPT and Hugging Face models
// make them, [batch, heads, seq, dim] views of one [batch, seq, 3 * d] projection) into a
// contiguous 3-D batch. Tensors the dispatcher must see go through at::matmul: fake and
// functional tensors while torch.compile traces, and products autograd must record (a
// double backward: grad mode on).
at::Tensor product(const at::Tensor& a, const at::Tensor& b) {
  if (!at::GradMode::is_enabled() && recordable(a) && recordable(b)) {
    return run(DFUSE_OP_KIND_MATMUL, nullptr, Operands().t(a).t(b),
               "scaled_dot_product_attention");
  }
  return at::matmul(a, b);
}

// The attention logits q @ k^T * scale with the mask applied (masked positions -inf).
at::Tensor masked_logits(const at::Tensor& q, const at::Tensor& k,
                         const std::optional<at::Tensor>& mask, bool is_causal, double scale) {
  auto s = product(q, k.transpose(-2, -1)) * scale;
  int64_t L = q.size(-2), S = k.size(-2);
  auto neg_inf = at::full({}, -std::numeric_limits<double>::infinity(), s.options());
  if (is_causal) {
    // Top-left aligned, as torch's math path builds it: ones(L, S).tril().
    auto rows = at::arange(L, q.options().dtype(at::kLong)).unsqueeze(1);
    auto cols = at::arange(S, q.options().dtype(at::kLong));
    s = at::where(cols.le(rows), s, neg_inf);
  }
  if (mask) {
    s = mask->scalar_type() == at::kBool ? at::where(*mask, s, neg_inf) : s + *mask;
  }
  return s;
}

// softmax of the masked logits. A query whose every key is masked (a padded position under a
// padding mask) gets weights 0, as CPU's flash kernel gives it: softmax over a row of -inf is
// NaN, and its backward would spread that NaN into every gradient through dq and dk.
at::Tensor probabilities(const at::Tensor& q, const at::Tensor& k,
                         const std::optional<at::Tensor>& mask, bool is_causal, double scale) {
  auto logits = masked_logits(q, k, mask, is_causal, scale);
  auto p = at::_softmax(logits, -1, false);
  if (mask) {
    auto dead = at::amax(logits, {-1}, true).eq(-std::numeric_limits<double>::infinity());
    p = at::where(dead, at::zeros({}, p.options()), p);
  }
  return p;
}

class Attention : public torch::autograd::Function<Attention> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const std::optional<at::Tensor>& mask,
                            bool is_causal, double scale) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto p = probabilities(q, k, mask, is_causal, scale);
    ctx->save_for_backward({q, k, v, p});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["is_causal"] = is_causal;
    if (mask) ctx->saved_data["mask"] = *mask;
    return product(p, v);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2];
    double scale = ctx->saved_data["scale"].toDouble();
    at::Tensor p = saved[3];
    if (at::GradMode::is_enabled()) {
      // A double backward (create_graph=True) differentiates these formulas, and p depends on
      // q and k: the saved p has no history (the forward ran below autograd), so it is
      // computed again from q and k with autograd recording.
      std::optional<at::Tensor> mask;
      if (ctx->saved_data.count("mask")) mask = ctx->saved_data["mask"].toTensor();
      p = probabilities(q, k, mask, ctx->saved_data["is_causal"].toBool(), scale);
    }
    const auto& dout = grads[0];
    auto dv = product(p.transpose(-2, -1), dout);
    auto dp = product(dout, v.transpose(-2, -1));
    // Masked positions have p == 0 (a query with every key masked a whole row of them), so
    // their logits get no gradient.
    auto ds = at::_softmax_backward_data(dp, p, -1, p.scalar_type()) * scale;
    auto dq = product(ds, k);
    auto dk = product(ds.transpose(-2, -1), q);
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Whether this kernel computes the call; anything else (and every invalid call, so that it
// raises PyTorch's own error) goes to PyTorch's composite implementation.
bool covered(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
             bool enable_gqa) {
  // Under a torch.func transform (grad, vmap, jvp) or with forward-mode dual tensors, the
  // composite's plain ops take part: a C++ autograd Function supports neither.
  if (under_functorch_transform()) return false;
  for (const auto* t : {&q, &k, &v}) {
    if (t->_fw_grad(/*level=*/0).defined()) return false;
  }
  auto dt = q.scalar_type();
  if (!(dt == at::kFloat || dt == at::kDouble) || k.scalar_type() != dt ||
      v.scalar_type() != dt || q.is_nested() || dropout_p != 0.0 || enable_gqa) {
    return false;
  }
  int64_t r = q.dim();
  if (r < 3 || k.dim() != r || v.dim() != r) return false;
  auto batch = [](const at::Tensor& t) { return t.sizes().slice(0, t.dim() - 2); };
  if (batch(q) != batch(k) || batch(q) != batch(v) || q.size(-1) != k.size(-1) ||
      k.size(-2) != v.size(-2) || q.size(-1) == 0) {
    return false;
  }
  if (!mask) return true;
  const auto& m = *mask;
  bool mask_shape = m.dim() >= 2 && m.dim() <= r && (m.size(-2) == 1 || m.size(-2) == q.size(-2)) &&
                    (m.size(-1) == 1 || m.size(-1) == k.size(-2));
  for (int64_t d = 3; mask_shape && d <= m.dim(); ++d) {
    mask_shape = m.size(-d) == 1 || m.size(-d) == q.size(-d);
  }
  return !is_causal && !m.requires_grad() && (m.scalar_type() == at::kBool || m.scalar_type() == dt) &&
         mask_shape;
}

at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                std::optional<double> scale, bool enable_gqa) {
  // When torch.compile traces with dynamic shapes the composite takes the call: it reads sizes
  // symbolically, where this kernel's checks read them as numbers, so every new sequence
  // length or batch size was a guard and a recompile (a Llama on padded batches built a graph
  // per length, ~1.3 s each). Its math path rounds differently from this kernel (README);
  // a trace with static shapes still runs this kernel, with eager's bits.
  auto symbolic = [](const at::Tensor& t) {
    for (const auto& d : t.sym_sizes()) {
      if (!d.maybe_as_int()) return true;
    }
    return false;
  };
  if (symbolic(q) || symbolic(k) || symbolic(v) || (mask && mask->defined() && symbolic(*mask))) {
    return at::native::scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal, scale,
                                                     enable_gqa);
  }
  // Grouped query attention: each key/value head serves a group of query heads. Repeating
  // them, as PyTorch's math path does, lets autograd sum their gradients over each group.
  int64_t heads = q.dim() >= 3 ? q.size(-3) : 0, kv_heads = k.dim() >= 3 ? k.size(-3) : 0;
  bool gqa = enable_gqa && k.dim() == q.dim() && v.dim() == q.dim() && kv_heads > 0 &&
             v.size(-3) == kv_heads && heads % kv_heads == 0 && heads != kv_heads;
  auto k2 = gqa ? k.repeat_interleave(heads / kv_heads, -3) : k;
  auto v2 = gqa ? v.repeat_interleave(heads / kv_heads, -3) : v;
  if (!covered(q, k2, v2, mask, dropout_p, is_causal, enable_gqa && !gqa && heads != kv_heads)) {
    return at::native::scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal, scale,
                                                     enable_gqa);
  }
  double s = scale ? *scale : 1.0 / std::sqrt(double(q.size(-1)));
  return Attention::apply(q, k2, v2, mask, is_causal, s);
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("scaled_dot_product_attention", TORCH_FN(dft::sdpa));
}
