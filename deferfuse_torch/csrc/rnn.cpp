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
// the products. With autograd a GRU cell is one node (a C++ autograd Function), an LSTM cell
// one node for its state (cy and the output gate) and hy = o * tanh(cy) through autograd's own
// ops, so that cy stays on hy's path as in CPU's graph; each node's backward computes what
// CPU's autograd computes through the cell, op for op in the same order (the same bits). An
// LSTMCell stepped in Python paid PyTorch's dispatcher and autograd for ~13 ops forward and
// ~25 backward nodes a step, where the device's own ops cost a fraction of that. Under a
// torch.func transform or with forward-mode dual tensors the cell is differentiated through its
// composed ops instead; a double backward differentiates the nodes' formulas (the LSTM's) or
// PyTorch's differentiable cell backward (the GRU's).
#include "common.h"

#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <optional>

namespace dft {
namespace {

// `gates + bias`, or `gates` when the cell has no bias.
at::Tensor with_bias(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return bias && bias->defined() ? gates + *bias : gates;
}

// The activated gates of CPU's LSTMCell: gates = linear_hh(hx) + linear_ih(x); i, f, o =
// sigmoid, g = tanh.
std::array<at::Tensor, 4> lstm_gates(const at::Tensor& input_gates,
                                     const at::Tensor& hidden_gates,
                                     const std::optional<at::Tensor>& input_bias,
                                     const std::optional<at::Tensor>& hidden_bias) {
  auto gates = with_bias(hidden_gates, hidden_bias) + with_bias(input_gates, input_bias);
  auto c = gates.chunk(4, 1);
  return {c[0].sigmoid(), c[1].sigmoid(), c[2].tanh(), c[3].sigmoid()};
}

// CPU's LSTMCell: cy = f * cx + i * g; hy = o * tanh(cy).
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  auto [i, f, g, o] = lstm_gates(input_gates, hidden_gates, input_bias, hidden_bias);
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

// CPU's autograd through cy = f * cx + i * g and the gates' activations, given cy's gradient
// (its own plus what hy's tanh passed on) and the activated output gate's: each Mul, Tanh and
// Sigmoid backward in autograd's own form. Returns the gates' gradient (for both products)
// and cx's.
std::tuple<at::Tensor, at::Tensor> lstm_state_backward(const at::Tensor& grad_cy,
                                                       const at::Tensor& grad_o,
                                                       const std::array<at::Tensor, 4>& gates,
                                                       const at::Tensor& cx) {
  const auto &i = gates[0], &f = gates[1], &g = gates[2], &o = gates[3];
  auto go = grad_o.defined() ? at::sigmoid_backward(grad_o, o) : at::zeros_like(o);
  if (!grad_cy.defined()) {
    auto z = at::zeros_like(i);
    return {at::cat({z, z, z, go}, 1), at::Tensor()};
  }
  auto grad_gates = at::cat({at::sigmoid_backward(grad_cy * g, i),
                             at::sigmoid_backward(grad_cy * cx, f),
                             at::tanh_backward(grad_cy * i, g), go},
                            1);
  return {grad_gates, grad_cy * f};
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

// Whether the cell takes its autograd Function (see the file comment): not under a torch.func
// transform, and no operand a forward-mode dual tensor.
bool one_node(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
              const at::Tensor& state, const std::optional<at::Tensor>& input_bias,
              const std::optional<at::Tensor>& hidden_bias) {
  if (under_functorch_transform()) return false;
  auto dual = [](const at::Tensor& t) { return t.defined() && t._fw_grad(/*level=*/0).defined(); };
  return !(dual(input_gates) || dual(hidden_gates) || dual(state) ||
           (input_bias && dual(*input_bias)) || (hidden_bias && dual(*hidden_bias)));
}

// A saved optional tensor back as an optional (saved, an absent one is undefined).
std::optional<at::Tensor> if_defined(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The cell's state: cy and the activated output gate o, from which the caller makes hy = o *
// tanh(cy) with autograd's own ops, so cy stays on hy's path (a hook on cy or
// `autograd.grad(hy, cy)` sees what CPU's graph gives) and cy is not saved (it may be written
// in place before the backward, as on CPU).
class LstmCellState : public torch::autograd::Function<LstmCellState> {
 public:
  static tensor_list forward(AutogradContext* ctx, const at::Tensor& input_gates,
                             const at::Tensor& hidden_gates, const at::Tensor& cx,
                             const std::optional<at::Tensor>& input_bias,
                             const std::optional<at::Tensor>& hidden_bias) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto gates = lstm_gates(input_gates, hidden_gates, input_bias, hidden_bias);
    auto cy = gates[1] * cx + gates[0] * gates[2];
    auto workspace = at::cat({gates[0], gates[1], gates[2], gates[3]}, 1);
    ctx->set_materialize_grads(false);
    ctx->mark_non_differentiable({workspace});
    // The gates and biases serve a double backward only (the gates again, with history).
    ctx->save_for_backward({input_gates, hidden_gates, cx, workspace,
                            input_bias.value_or(at::Tensor()),
                            hidden_bias.value_or(at::Tensor())});
    return {cy, gates[3], workspace};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto s = ctx->get_saved_variables();
    const auto &grad_cy = grads[0], &grad_o = grads[1];
    if (!grad_cy.defined() && !grad_o.defined()) return tensor_list(5);
    std::array<at::Tensor, 4> gates;
    std::optional<at::AutoDispatchBelowADInplaceOrView> below;
    if (at::GradMode::is_enabled()) {
      // A double backward (create_graph=True) differentiates these formulas: the gates again
      // from the saved inputs with autograd recording (the workspace has no history).
      gates = lstm_gates(s[0], s[1], if_defined(s[4]), if_defined(s[5]));
    } else {
      below.emplace();
      auto w = s[3].chunk(4, 1);
      gates = {w[0], w[1], w[2], w[3]};
    }
    auto [grad_gates, grad_cx] = lstm_state_backward(grad_cy, grad_o, gates, s[2]);
    auto grad_bias = s[4].defined() || s[5].defined() ? grad_gates.sum(0) : at::Tensor();
    return {grad_gates, grad_gates, grad_cx, s[4].defined() ? grad_bias : at::Tensor(),
            s[5].defined() ? grad_bias : at::Tensor()};
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
  if (!one_node(input_gates, hidden_gates, cx, input_bias, hidden_bias)) {
    return Grouped<decltype(&fused_lstm_cell), &fused_lstm_cell>::call(
        input_gates, hidden_gates, cx, input_bias, hidden_bias);
  }
  OpGroup group;
  auto r = LstmCellState::apply(input_gates, hidden_gates, cx, input_bias, hidden_bias);
  auto hy = r[1] * r[0].tanh();
  group.end();
  return {hy, r[0], r[2]};
}

std::tuple<at::Tensor, at::Tensor> autograd_gru_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& hx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  if (!one_node(input_gates, hidden_gates, hx, input_bias, hidden_bias)) {
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
