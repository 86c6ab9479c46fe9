// The kernels of PyTorch's transformer inference fast path, on tpu. In eval mode under no_grad
// nn.MultiheadAttention calls torch._native_multi_head_attention and nn.TransformerEncoderLayer
// calls torch._transformer_encoder_layer_fwd (its feed-forward through _addmm_activation);
// with a padding mask nn.TransformerEncoder first packs the batch into a nested tensor
// (nested.cpp) and its layers run on that. PyTorch names the PrivateUse1 device as one the fast
// path supports, and has no kernels for it: without these every call went to the CPU fallback
// (and the nested one failed).
//
// The encoder layer is PyTorch's own device-generic function; attention is written here from
// the ops it is made of, in CPU's order: q, k, v projections, q scaled by 1/sqrt(head dim),
// q @ k^T, a masked softmax, @ v, the output projection. Values agree with CPU's fast path
// within float32 rounding.
#include "common.h"

#include <ATen/NestedTensorImpl.h>
#include <ATen/ops/_transformer_encoder_layer_fwd_native.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

namespace dft {
namespace {

// The attention mask as CPU's masked softmax takes it: bool, true where a key is masked
// (another dtype is converted: nonzero is masked, so an additive -inf mask reads as intended),
// shaped to broadcast over [batch, heads, queries, keys]. mask_type 1 is a key padding mask
// [batch, keys]; a 2-D mask otherwise is [queries, keys].
at::Tensor attention_mask(const at::Tensor& mask, std::optional<int64_t> mask_type) {
  at::Tensor m = mask.scalar_type() == at::kBool ? mask : mask.to(at::kBool);
  if (m.dim() == 2) {
    m = mask_type == 1 ? m.unsqueeze(1).unsqueeze(1) : m.unsqueeze(0).unsqueeze(0);
  }
  return m;
}

// softmax(scores) over the keys with `masked` keys left out. A query with every key masked
// gets NaN weights, as CPU's kernel gives it.
at::Tensor masked_softmax(const at::Tensor& scores, const std::optional<at::Tensor>& masked) {
  if (!masked) return at::_softmax(scores, -1, false);
  auto neg_inf = at::full({}, -std::numeric_limits<double>::infinity(), scores.options());
  return at::_softmax(at::where(*masked, neg_inf, scores), -1, false);
}

// [batch, seq, embed] -> [batch, heads, seq, head dim].
at::Tensor split_heads(const at::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads}).transpose(1, 2);
}

std::tuple<at::Tensor, at::Tensor> dense_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t embed_dim,
    int64_t heads, const at::Tensor& qkv_weight, const at::Tensor& qkv_bias,
    const at::Tensor& proj_weight, const at::Tensor& proj_bias,
    const std::optional<at::Tensor>& masked,
    bool need_weights, bool average_weights) {
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3,
              "tpu: _native_multi_head_attention takes batch-first [batch, seq, embed] query, key "
              "and value; got ", query.dim(), "-D, ", key.dim(), "-D and ", value.dim(), "-D");
  TORCH_CHECK(query.size(2) == embed_dim && embed_dim % heads == 0,
              "tpu: _native_multi_head_attention: query's last dim ", query.size(2),
              " must be embed_dim ", embed_dim, ", divisible by num_heads ", heads);
  at::Tensor q, k, v;
  if (query.is_same(key) && key.is_same(value)) {
    auto qkv = at::linear(query, qkv_weight, qkv_bias).chunk(3, -1);
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    auto w = qkv_weight.chunk(3, 0), b = qkv_bias.chunk(3, 0);
    q = at::linear(query, w[0], b[0]);
    k = at::linear(key, w[1], b[1]);
    v = at::linear(value, w[2], b[2]);
  }
  int64_t head_dim = embed_dim / heads;
  // CPU's _transform_bias_rescale_qkv multiplies by the reciprocal in the tensor's dtype.
  double inv_sqrt = q.scalar_type() == at::kDouble
                        ? 1.0 / std::sqrt(double(head_dim))
                        : double(1.0f / std::sqrt(float(head_dim)));
  auto qh = split_heads(q, heads) * inv_sqrt;
  auto scores = at::matmul(qh, split_heads(k, heads).transpose(-2, -1));
  auto p = masked_softmax(scores, masked);
  auto ctx = at::matmul(p, split_heads(v, heads)).transpose(1, 2).reshape(query.sizes());
  auto out = at::linear(ctx, proj_weight, proj_bias);
  if (!need_weights) return {out, at::Tensor()};
  if (average_weights) p = p.sum(1) / double(heads);
  return {out, p};
}

std::tuple<at::Tensor, at::Tensor> multi_head_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t embed_dim,
    int64_t heads, const at::Tensor& qkv_weight, const at::Tensor& qkv_bias,
    const at::Tensor& proj_weight, const at::Tensor& proj_bias,
    const std::optional<at::Tensor>& mask,
    bool need_weights, bool average_weights, std::optional<int64_t> mask_type) {
  std::optional<at::Tensor> masked;
  if (mask) masked = attention_mask(*mask, mask_type);
  return dense_attention(query, key, value, embed_dim, heads, qkv_weight, qkv_bias, proj_weight,
                         proj_bias, masked, need_weights, average_weights);
}

// Self-attention over a nested batch (the encoder layer's, packed by nn.TransformerEncoder):
// the sequences padded to the longest, each query attending to its own sequence's keys, and
// the result packed again. The padded rows are never read.
std::tuple<at::Tensor, at::Tensor> nested_multi_head_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t embed_dim,
    int64_t heads, const at::Tensor& qkv_weight, const at::Tensor& qkv_bias,
    const at::Tensor& proj_weight, const at::Tensor& proj_bias,
    const std::optional<at::Tensor>& mask,
    bool need_weights, bool average_weights, std::optional<int64_t> mask_type) {
  TORCH_CHECK(query.is_same(key) && key.is_same(value) && !need_weights,
              "tpu: _native_multi_head_attention on a nested tensor takes self-attention "
              "without attention weights (as nn.TransformerEncoderLayer calls it); pad the batch "
              "(to_padded_tensor) and pass a key padding mask instead");
  const at::Tensor sizes = at::native::get_nested_tensor_impl(query)->get_nested_sizes();
  TORCH_CHECK(sizes.dim() == 2 && sizes.size(1) == 2,
              "tpu: _native_multi_head_attention takes a nested batch of [seq, embed] sequences");
  auto padded = query.to_padded_tensor(0.0);
  int64_t batch = padded.size(0), longest = padded.size(1);
  auto lengths = sizes.select(1, 0).contiguous();
  auto positions = at::arange(longest, lengths.options()).unsqueeze(0).expand({batch, longest});
  auto padding = positions.ge(lengths.unsqueeze(1)).to(query.device());
  at::Tensor masked = padding.unsqueeze(1).unsqueeze(1);
  if (mask) masked = at::logical_or(masked, attention_mask(*mask, mask_type));
  auto out = std::get<0>(dense_attention(padded, padded, padded, embed_dim, heads, qkv_weight,
                                         qkv_bias, proj_weight, proj_bias, masked, false, false));
  return {at::_nested_from_padded(out, sizes, false), at::Tensor()};
}

// addmm followed by gelu (erf form) or relu, as CPU's kernel computes it.
at::Tensor addmm_activation(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                            const at::Scalar& beta, const at::Scalar& alpha, bool use_gelu) {
  auto r = at::addmm(self, mat1, mat2, beta, alpha);
  return use_gelu ? at::gelu_(r) : at::relu_(r);
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_native_multi_head_attention", TORCH_FN(dft::multi_head_attention));
  m.impl("_addmm_activation", TORCH_FN(dft::addmm_activation));
  m.impl("_transformer_encoder_layer_fwd", TORCH_FN(at::native::transformer_encoder_layer_forward));
}

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("_native_multi_head_attention", TORCH_FN(dft::nested_multi_head_attention));
  m.impl("_transformer_encoder_layer_fwd", TORCH_FN(at::native::transformer_encoder_layer_forward));
}
