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
// the products. The same function serves autograd (AutogradPrivateUse1): its backward is
// autograd through those ops, so the fused backward kernels (_thnn_fused_lstm_cell_backward_impl,
// _thnn_fused_gru_cell_backward) are never needed. The workspace output (the activated gates,
// which only the fused backward reads) is built from the same values; a deferred step that
// never reads it never computes it.
#include "common.h"

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

}  // namespace
}  // namespace dft

// Each cell is one op group, so strict mode runs its pieces as one fused program (as it runs
// layer_norm's), below autograd (inference_mode) and through it.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", DFT_GROUPED(dft::fused_lstm_cell));
  m.impl("_thnn_fused_gru_cell", DFT_GROUPED(dft::fused_gru_cell));
}

// With autograd: the composition is recorded op by op, and its backward is theirs.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", DFT_GROUPED(dft::fused_lstm_cell));
  m.impl("_thnn_fused_gru_cell", DFT_GROUPED(dft::fused_gru_cell));
}
