// What nn.LSTM, nn.GRU and nn.RNN's autograd node (rnn_layers.cpp) shares with its
// step-by-step path (rnn_steps.cpp): a call's configuration and one direction's results.
#pragma once

#include "common.h"
#include "rnn_packing.h"

#include <torch/autograd.h>

namespace dft::rnn {

using torch::autograd::tensor_list;

// The cell a layer's steps compute (the numbers are kept in the node's saved config).
enum Cell : int64_t { kLstm = 0, kGru = 1, kRnnTanh = 2, kRnnRelu = 3 };

// One call's configuration: what the forward computed and the backward retraces.
struct Config {
  Cell cell;
  bool biases;
  int64_t layers;
  int64_t dirs;
  double dropout;  // applied between layers; 0 when not training
  bool batch_first;
  // Each direction's steps as one kernel op (float32), not recorded step by step.
  bool kernel = false;
  // Packed steps (a PackedSequence's batch sizes); none for a padded input.
  Packing packing;
  // The operands hold bfloat16 values (a call under bfloat16 autocast, rounded as CPU's
  // oneDNN LSTM reads them): every product runs in bf16 at the bf16 kernel's rate (exact
  // products, float32 sums): those outside the recurrence on bfloat16 copies, each step's
  // hidden product on h rounded to bfloat16 (the recurrence op, given W_hh in bfloat16), and
  // the backward's on its gradients rounded to bfloat16, as CPU's bf16 layer keeps them.
  bool bf16_products = false;

  bool lstm() const { return cell == kLstm; }
  bool gru() const { return cell == kGru; }
  // nn.RNN's cell: h = act(x W_ih^T + b_ih + h W_hh^T + b_hh).
  bool plain() const { return cell == kRnnTanh || cell == kRnnRelu; }
  int64_t gates() const { return lstm() ? 4 : gru() ? 3 : 1; }
  // (w_ih, w_hh[, b_ih, b_hh]) for layer l, direction d.
  int64_t group(int64_t l, int64_t d) const { return (l * dirs + d) * (biases ? 4 : 2); }
  // Tensors saved per step: lstm i, f, g, o, c, h_prev, c_prev; gru r, z, n, hidden n gate,
  // h_prev; the plain RNN h, h_prev.
  int64_t per_step() const { return lstm() ? 7 : gru() ? 5 : 2; }
  // Tensors saved per direction over T steps: the kernel op's result with h0 (and c0), or the
  // per-step tensors.
  int64_t per_direction(int64_t T) const { return kernel ? (lstm() ? 3 : 2) : T * per_step(); }
  // Where h sits in a step's row of the kernel op's result, in units of H (after the LSTM's
  // i, f, g, o, c; the GRU's r, z, n, hn; the plain RNN's row is h alone).
  int64_t h_at() const { return lstm() ? 5 : gru() ? 4 : 0; }
  // The kernel op's forward part; its backward is the next number.
  uint32_t forward_part() const {
    switch (cell) {
      case kLstm: return DFUSE_RECURRENCE_PART_LSTM_FORWARD;
      case kGru: return DFUSE_RECURRENCE_PART_GRU_FORWARD;
      case kRnnTanh: return DFUSE_RECURRENCE_PART_RNN_TANH_FORWARD;
      default: return DFUSE_RECURRENCE_PART_RNN_RELU_FORWARD;
    }
  }
  const char* name() const {
    switch (cell) {
      case kLstm: return "lstm";
      case kGru: return "gru";
      case kRnnTanh: return "rnn_tanh";
      default: return "rnn_relu";
    }
  }
};

// x @ w^T (+ b): a layer's input products, every step at once.
inline at::Tensor product(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return b.defined() ? at::addmm(b, x, w.t()) : at::mm(x, w.t());
}

// a @ b as a bfloat16 product summed in float32 (DFUSE_OP_KIND_WIDE_MATMUL on bf16 copies of
// float32 operands): exact for operands holding bfloat16 values, else each rounded first.
inline at::Tensor bf16_product(const at::Tensor& a, const at::Tensor& b) {
  auto bf16 = [](const at::Tensor& t) {
    return t.scalar_type() == at::kBFloat16 ? t : t.to(at::kBFloat16);
  };
  return wide_matmul(bf16(a), bf16(b));
}

// A layer's products outside its recurrence: float32, or (Config::bf16_products) bf16 ones.
inline at::Tensor layer_mm(const Config& cfg, const at::Tensor& a, const at::Tensor& b) {
  return cfg.bf16_products ? bf16_product(a, b) : at::mm(a, b);
}

// a + b where either may be undefined (no gradient reached that way).
inline at::Tensor add_grads(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return a + b;
}

// One direction of one layer over x [T, B, I] from state (h, c): its outputs [T, B, H] and
// final state.
struct Direction {
  at::Tensor out, h, c;
};

// Gradients of one direction of one layer: dx [T, B, I] and the state's, accumulating the
// weights' into grads at the group's slots.
struct DirectionGrads {
  at::Tensor dx, dh0, dc0;
};

// One direction's steps recorded op by op from the input products `xg_all` [T, B, G] (float64,
// and a double backward, which autograd must see whole): its outputs and last states; `save`
// gets the per-step tensors the backward reads (Config::per_step a step, in time order).
Direction run_direction_steps(const Config& cfg, const at::Tensor& xg_all, const at::Tensor& w_hh,
                              const at::Tensor& b_hh, int64_t d, at::Tensor h, at::Tensor c,
                              std::vector<at::Tensor>* save);

// The gradients of one direction recorded by run_direction_steps, from its saved `steps`: dx
// (when `want_dx`) and the first states', the weights' written into `grads` at the group's
// slots from `params_at`.
DirectionGrads backward_direction_steps(const Config& cfg, const at::Tensor& x,
                                        at::TensorList params, int64_t l, int64_t d,
                                        const std::vector<at::Tensor>& steps, const at::Tensor& dy,
                                        at::Tensor dh, at::Tensor dc, tensor_list& grads,
                                        int64_t params_at, bool want_dx);

}  // namespace dft::rnn
