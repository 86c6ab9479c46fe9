// LSTM and GRU cells on "tpu".
//
// at::lstm and at::gru (nn.LSTM, nn.GRU) and at::lstm_cell / at::gru_cell (nn.LSTMCell,
// nn.GRUCell) compute each step on CPU from linear() and pointwise ops, but on every other
// device (CUDA, XPU, PrivateUse1) from the gate products without bias and one fused cell op,
// _thnn_fused_lstm_cell or _thnn_fused_gru_cell, for which PyTorch has only CUDA kernels: on
// "tpu" the CPU fallback found no kernel either, and nn.LSTM raised NotImplementedError.
//
// Here each cell is composed from the device's own ops in the order CPU's cell computes it
// (each product plus its bias, as linear() adds it; hidden gates plus input gates; then the
// activations and the state update), so the results agree with CPU within float32 rounding of
// the products. With autograd each cell is one node (a C++ autograd Function) whose backward
// computes what CPU's autograd computes through its cell, op for op in the same order (the
// same bits): an LSTMCell stepped in Python paid PyTorch's dispatcher and autograd for ~13 ops
// forward and ~25 backward nodes a step, where the device's own ops cost a fraction of that.
// Under a torch.func transform, with forward-mode dual tensors, or in a double backward, the
// cell is differentiated through its composed ops instead (PyTorch's differentiable formulas).
#include "common.h"

#include <torch/autograd.h>
#include <torch/library.h>

namespace dft {
namespace {

// `gates + bias`, or `gates` when the cell has no bias.
at::Tensor with_bias(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return bias && bias->defined() ? gates + *bias : gates;
}

// CPU's LSTMCell: gates = linear_hh(hx) + linear_ih(x); i, f, o = sigmoid, g = tanh;
// cy = f * cx + i * g; hy = o * tanh(cy).
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  auto gates = with_bias(hidden_gates, hidden_bias) + with_bias(input_gates, input_bias);
  auto chunks = gates.chunk(4, 1);
  auto i = chunks[0].sigmoid(), f = chunks[1].sigmoid();
  auto g = chunks[2].tanh(), o = chunks[3].sigmoid();
  auto cy = f * cx + i * g;
  auto hy = o * cy.tanh();
  return {hy, cy, at::cat({i, f, g, o}, 1)};
}

// CPU's GRUCell: r = sigmoid(h_r + i_r), z = sigmoid(h_z + i_z), n = tanh(i_n + h_n * r),
// hy = (hx - n) * z + n. The workspace is CUDA's: r, z, n, hx, h_n side by side.
std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates,
                                                  const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx,
                                                  const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  auto ic = with_bias(input_gates, input_bias).chunk(3, 1);
  auto hc = with_bias(hidden_gates, hidden_bias).chunk(3, 1);
  auto r = (hc[0] + ic[0]).sigmoid();
  auto z = (hc[1] + ic[1]).sigmoid();
  auto n = (ic[2] + hc[2] * r).tanh();
  auto hy = (hx - n) * z + n;
  return {hy, at::cat({r, z, n, hx, hc[2]}, 1)};
}

// CPU's autograd through its LSTM cell, given the activated gates (the workspace: i, f, g, o)
// and the state: hy = o * tanh(cy) and cy = f * cx + i * g, each Mul/Tanh/Sigmoid backward in
// autograd's own form. Returns the gates' gradient (for both products), cx's and the bias's.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& grad_cy, const at::Tensor& cx,
    const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  auto gates = workspace.chunk(4, 1);
  const auto &i = gates[0], &f = gates[1], &g = gates[2], &o = gates[3];
  at::Tensor grad_o, grad_c = grad_cy;
  if (grad_hy.defined()) {
    auto t = cy.tanh();
    grad_o = at::sigmoid_backward(grad_hy * t, o);
    auto from_hy = at::tanh_backward(grad_hy * o, t);
    grad_c = grad_c.defined() ? grad_c + from_hy : from_hy;
  } else {
    grad_o = at::zeros_like(o);
  }
  auto grad_gates = at::cat({at::sigmoid_backward(grad_c * g, i),
                             at::sigmoid_backward(grad_c * cx, f),
                             at::tanh_backward(grad_c * i, g), grad_o},
                            1);
  auto grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, grad_c * f, grad_bias};
}

// CPU's autograd through its GRU cell, given the workspace (r, z, n, hx and the hidden new
// gate hn): hy = (hx - n) * z + n, n = tanh(in + hn * r), r and z sigmoids of the summed
// gates. Returns the input gates', hidden gates' and hx's gradients.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(const at::Tensor& grad_hy,
                                                                 const at::Tensor& workspace) {
  auto w = workspace.chunk(5, 1);
  const auto &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
  auto grad_hz = grad_hy * z;
  auto grad_z = at::sigmoid_backward(grad_hy * (hx - n), z);
  auto grad_n = at::tanh_backward(grad_hy + at::neg(grad_hz), n);
  auto grad_r = at::sigmoid_backward(grad_n * hn, r);
  return {at::cat({grad_r, grad_z, grad_n}, 1), at::cat({grad_r, grad_z, grad_n * r}, 1),
          grad_hz};
}

bool defined(const std::optional<at::Tensor>& t) { return t && t->defined(); }

// Whether the cell takes its autograd Function (see the file comment).
bool one_node(std::initializer_list<const at::Tensor*> ts) {
  if (under_functorch_transform()) return false;
  for (const auto* t : ts) {
    if (t->defined() && t->_fw_grad(/*level=*/0).defined()) return false;
  }
  return true;
}

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

class LstmCell : public torch::autograd::Function<LstmCell> {
 public:
  static tensor_list forward(AutogradContext* ctx, const at::Tensor& input_gates,
                             const at::Tensor& hidden_gates, const at::Tensor& cx,
                             const std::optional<at::Tensor>& input_bias,
                             const std::optional<at::Tensor>& hidden_bias) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [hy, cy, workspace] = fused_lstm_cell(input_gates, hidden_gates, cx, input_bias,
                                               hidden_bias);
    ctx->set_materialize_grads(false);
    ctx->mark_non_differentiable({workspace});
    // The gates and biases serve a double backward only (its differentiable formula).
    ctx->save_for_backward({input_gates, hidden_gates, cx, cy, workspace,
                            input_bias.value_or(at::Tensor()),
                            hidden_bias.value_or(at::Tensor())});
    return {hy, cy, workspace};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto s = ctx->get_saved_variables();
    const auto &grad_hy = grads[0], &grad_cy = grads[1];
    if (!grad_hy.defined() && !grad_cy.defined()) return tensor_list(5);
    if (at::GradMode::is_enabled()) {
      auto [gi, gh, gc, gbi, gbh] = at::_thnn_differentiable_lstm_cell_backward(
          grad_hy, grad_cy, s[0], s[1], s[5], s[6], s[2], s[3]);
      return {gi, gh, gc, gbi, gbh};
    }
    at::AutoDispatchBelowADInplaceOrView guard;
    bool has_bias = s[5].defined();
    auto [gates, gc, gb] = lstm_cell_backward(grad_hy, grad_cy, s[2], s[3], s[4], has_bias);
    return {gates, gates, gc, gb, s[6].defined() ? gb : at::Tensor()};
  }
};

class GruCell : public torch::autograd::Function<GruCell> {
 public:
  static tensor_list forward(AutogradContext* ctx, const at::Tensor& input_gates,
                             const at::Tensor& hidden_gates, const at::Tensor& hx,
                             const std::optional<at::Tensor>& input_bias,
                             const std::optional<at::Tensor>& hidden_bias) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [hy, workspace] = fused_gru_cell(input_gates, hidden_gates, hx, input_bias, hidden_bias);
    ctx->set_materialize_grads(false);
    ctx->mark_non_differentiable({workspace});
    ctx->save_for_backward({input_gates, hidden_gates, hx, workspace,
                            input_bias.value_or(at::Tensor()),
                            hidden_bias.value_or(at::Tensor())});
    return {hy, workspace};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto s = ctx->get_saved_variables();
    const auto& grad_hy = grads[0];
    if (!grad_hy.defined()) return tensor_list(5);
    if (at::GradMode::is_enabled()) {
      auto [gi, gh, gx, gbi, gbh] = at::_thnn_differentiable_gru_cell_backward(
          grad_hy, s[0], s[1], s[2], s[4], s[5]);
      return {gi, gh, gx, gbi, gbh};
    }
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [gi, gh, gx] = gru_cell_backward(grad_hy, s[3]);
    return {gi, gh, gx, s[4].defined() ? gi.sum(0) : at::Tensor(),
            s[5].defined() ? gh.sum(0) : at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> autograd_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor none;
  const auto& bi = defined(input_bias) ? *input_bias : none;
  const auto& bh = defined(hidden_bias) ? *hidden_bias : none;
  if (!one_node({&input_gates, &hidden_gates, &cx, &bi, &bh})) {
    return Grouped<decltype(&fused_lstm_cell), &fused_lstm_cell>::call(
        input_gates, hidden_gates, cx, input_bias, hidden_bias);
  }
  OpGroup group;
  auto r = LstmCell::apply(input_gates, hidden_gates, cx, input_bias, hidden_bias);
  group.end();
  return {r[0], r[1], r[2]};
}

std::tuple<at::Tensor, at::Tensor> autograd_gru_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& hx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor none;
  const auto& bi = defined(input_bias) ? *input_bias : none;
  const auto& bh = defined(hidden_bias) ? *hidden_bias : none;
  if (!one_node({&input_gates, &hidden_gates, &hx, &bi, &bh})) {
    return Grouped<decltype(&fused_gru_cell), &fused_gru_cell>::call(
        input_gates, hidden_gates, hx, input_bias, hidden_bias);
  }
  OpGroup group;
  auto r = GruCell::apply(input_gates, hidden_gates, hx, input_bias, hidden_bias);
  group.end();
  return {r[0], r[1]};
}

}  // namespace
}  // namespace dft

// Each cell is one op group, so strict mode runs its pieces as one fused program (as it runs
// layer_norm's), below autograd (inference_mode) and through it.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", DFT_GROUPED(dft::fused_lstm_cell));
  m.impl("_thnn_fused_gru_cell", DFT_GROUPED(dft::fused_gru_cell));
}

// With autograd: one node per cell (its backward as CPU's autograd computes it), or the
// composition recorded op by op where that node cannot serve (see the file comment).
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(dft::autograd_lstm_cell));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(dft::autograd_gru_cell));
}
