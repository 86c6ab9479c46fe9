// nn.LSTM, nn.GRU and nn.RNN (at::lstm, at::gru, at::rnn_tanh, at::rnn_relu on padded input) on
// "tpu" as one autograd node per call, with their own backward.
//
// PyTorch's composite RNN on a device other than CPU computes both gate products of every
// step (input and hidden) and one fused cell op (rnn.cpp), and autograd records every one of
// them: a 2-layer LSTM over 32 steps was ~4,000 recorded ops per training step, 385 of them
// small matmuls, 3x CPU's time (where oneDNN runs whole layers). Here, as CPU's own composite
// and cuDNN do, each layer's input products for all steps are one GEMM, each step is its
// hidden product and the gate arithmetic (recorded below autograd), and the backward walks the
// steps in reverse computing only the gate gradients and the hidden-state product, then takes
// the weight gradients as one GEMM per weight over all steps (K = steps x batch) instead of
// one small product per step summed by autograd.
//
// Each step computes in the order CPU's cells do (gates = hidden product + input product, CPU's
// activations and state update; the backward uses sigmoid_backward and tanh_backward as
// autograd through CPU's cell would), so values agree with CPU within float32 rounding: the
// weight gradients sum over steps in one product, not step by step.
//
// In float32 each layer direction's steps (forward, and backward) run as one runtime kernel
// op (DFUSE_OP_KIND_RECURRENCE: the hidden products and the gate arithmetic of every step in
// one host routine), so the host records a handful of ops per layer instead of ~10 per step:
// the LSTM LM's training step was ~6,900 recorded ops and its recording, not its arithmetic,
// bounded it. The op computes each step as the step-by-step ops below do (the same order, the
// same activation routines); float64 records step by step.
//
// Under a bfloat16 autocast region a covered LSTM (padded) or plain RNN call does as CPU's:
// its operands rounded to bfloat16, outputs and states returned in bfloat16, its products in
// bf16 and the rest in float32 (run_layers_bf16); a GRU or packed LSTM call stays float32, as
// on CPU. Autocast is off inside the layer, forward and backward. Calls this does not cover
// keep PyTorch's composite path (and its errors): other dtypes (a model cast to half types),
// projections (proj_size), inputs that are not 3-D or empty, parameters not on "tpu", and
// tensors the dispatcher must see whole (torch.compile's fake and functional tensors). A double
// backward (create_graph=True) runs the forward again with autograd on (the same dropout
// masks) and differentiates that, so it sees every dependency.
//
// Packed sequences (pack_padded_sequence, the .data overloads) in float32 take the same node:
// the packed data's rows are the steps' samples, step after step, and each direction runs as
// the kernel op over packed steps (rnn_packing.h says where a step's samples lie); the final
// states are each sample's at its own last step. Before, they kept PyTorch's composite path,
// which records every step's cell: a small packed BiLSTM classifier was ~5,900 recorded ops a
// training step.
#include "rnn_layers.h"

#include <algorithm>

#include <ATen/autocast_mode.h>
#include <ATen/ops/gru_native.h>
#include <ATen/ops/lstm_native.h>
#include <ATen/ops/rnn_relu_native.h>
#include <ATen/ops/rnn_tanh_native.h>
#include <torch/autograd.h>
#include <torch/library.h>

namespace dft {
namespace {

using namespace rnn;
using torch::autograd::AutogradContext;

// Whether a covered call's directions run as the kernel op: float32.
bool runs_as_kernel(const at::Tensor& input) { return input.scalar_type() == at::kFloat; }

// The kernel op's attributes: which cell and half, and a reverse direction walking from the
// last step.
DfuseAttrs recurrence_attrs(uint32_t part, int64_t d) {
  DfuseAttrs a = attrs_sub(part);
  a.descending = d == 1;
  return a;
}

// What the backward needs beyond the call's inputs, filled by a forward that autograd will
// differentiate: each layer's input (time-major, after dropout), the dropout masks, and per
// layer and direction the per-step tensors in time order (Config::per_step of them a step).
struct Saved {
  std::vector<at::Tensor> layer_inputs, masks;
  std::vector<std::vector<at::Tensor>> steps;
};

// One direction's steps as the kernel op: its result [T, B, 6H] (LSTM), [T, B, 5H] (GRU) or
// [T, B, H] (plain RNN), packed [N, ..], holds per step what the backward reads, h among it.
Direction run_direction_kernel(const Config& cfg, const at::Tensor& xg, const at::Tensor& w_hh,
                               const at::Tensor& b_hh, int64_t d, const at::Tensor& h0,
                               const at::Tensor& c0, std::vector<at::Tensor>* save) {
  int64_t H = h0.size(-1);
  const auto& packing = cfg.packing;
  // W_hh^T laid out once: the steps' products read a plain B in place. Under bfloat16
  // autocast (Config::bf16_products) it goes as bfloat16 (exact: it holds bfloat16 values), and
  // the op runs each step's hidden product in bf16 on h rounded to bfloat16, as CPU's layer.
  Operands ops;
  auto w_t = w_hh.t().contiguous();
  ops.t(xg).t(cfg.bf16_products ? w_t.to(at::kBFloat16) : w_t).t(h0);
  if (cfg.lstm()) ops.t(c0);
  if (b_hh.defined()) ops.t(b_hh);
  at::Tensor sizes;
  if (packing.packed()) {
    sizes = packing.device_sizes();
    ops.t(sizes);
  }
  auto a = recurrence_attrs(cfg.forward_part(), d);
  auto y = run(DFUSE_OP_KIND_RECURRENCE, &a, ops, cfg.name());
  if (save) {
    *save = {y, h0};
    if (cfg.lstm()) save->push_back(c0);
  }
  // The last states: each sample's at its last step (packed, walking forward: its own step;
  // walking in reverse every sample ends at step 0, whose rows come first).
  at::Tensor last;
  if (!packing.packed()) {
    last = y.select(0, d == 0 ? xg.size(0) - 1 : 0);
  } else if (d == 0) {
    last = y.index_select(0, packing.last_rows());
  } else {
    last = y.narrow(0, 0, packing.batch());
  }
  return {y.narrow(-1, cfg.h_at() * H, H), last.narrow(1, cfg.h_at() * H, H),
          cfg.lstm() ? last.narrow(1, 4 * H, H) : at::Tensor()};
}

Direction run_direction(const Config& cfg, const at::Tensor& x, at::TensorList params,
                        int64_t l, int64_t d, at::Tensor h, at::Tensor c,
                        std::vector<at::Tensor>* save) {
  int64_t k = cfg.group(l, d);
  const auto &w_ih = params[k], &w_hh = params[k + 1];
  at::Tensor b_ih = cfg.biases ? params[k + 2] : at::Tensor();
  at::Tensor b_hh = cfg.biases ? params[k + 3] : at::Tensor();
  if (cfg.packing.packed()) {
    // Packed steps run as the kernel op only (covered() takes float32 alone).
    return run_direction_kernel(cfg, product(x, w_ih, b_ih), w_hh, b_hh, d, h, c, save);
  }
  int64_t T = x.size(0), B = x.size(1);
  auto rows = x.reshape({T * B, x.size(2)});
  auto xg_all = cfg.bf16_products
                    ? (b_ih.defined() ? bf16_product(rows, w_ih.t()) + b_ih
                                      : bf16_product(rows, w_ih.t())).view({T, B, -1})
                    : product(rows, w_ih, b_ih).view({T, B, -1});
  if (cfg.kernel) return run_direction_kernel(cfg, xg_all, w_hh, b_hh, d, h, c, save);
  return run_direction_steps(cfg, xg_all, w_hh, b_hh, d, h, c, save);
}

// The forward of every layer: (output, hy, cy). Dropout draws its masks, or applies `replay`'s
// (the masks a first run drew).
std::tuple<at::Tensor, at::Tensor, at::Tensor> run_forward(
    const Config& cfg, const at::Tensor& input, at::TensorList hx, at::TensorList params,
    Saved* saved, const std::vector<at::Tensor>* replay = nullptr) {
  auto x = cfg.batch_first ? input.transpose(0, 1) : input;
  std::vector<at::Tensor> hs, cs;
  if (saved) saved->steps.resize(cfg.layers * cfg.dirs);
  for (int64_t l = 0; l < cfg.layers; ++l) {
    if (saved) saved->layer_inputs.push_back(x);
    std::vector<at::Tensor> outs;
    for (int64_t d = 0; d < cfg.dirs; ++d) {
      int64_t j = l * cfg.dirs + d;
      auto r = run_direction(cfg, x, params, l, d, hx[0][j], cfg.lstm() ? hx[1][j] : at::Tensor(),
                             saved ? &saved->steps[j] : nullptr);
      outs.push_back(r.out);
      hs.push_back(r.h);
      if (cfg.lstm()) cs.push_back(r.c);
    }
    x = cfg.dirs == 1 ? outs[0] : at::cat(outs, -1);
    if (cfg.dropout > 0 && l + 1 < cfg.layers) {
      if (replay) {
        x = at::native_dropout_backward(x, (*replay)[l], 1.0 / (1.0 - cfg.dropout));
        continue;
      }
      auto [dropped, mask] = at::native_dropout(x, cfg.dropout, true);
      if (saved) saved->masks.push_back(mask);
      x = dropped;
    }
  }
  // The kernel op's last layer leaves its h steps as a view of the op's result, which the
  // backward keeps: the output is a tensor of its own, contiguous, as CPU's is (a caller may
  // write into it before the backward).
  if (cfg.kernel && cfg.dirs == 1) x = x.clone(at::MemoryFormat::Contiguous);
  auto out = cfg.batch_first ? x.transpose(0, 1) : x;
  return {out, at::stack(hs), cfg.lstm() ? at::stack(cs) : at::Tensor()};
}

// One direction's gradients through the kernel op: its result's rows 0..T are every step's
// gate gradients (the weights' products read them: the LSTM's once for both weights, the
// GRU's input product's then its hidden product's), row T the first states' gradients.
DirectionGrads backward_direction_kernel(const Config& cfg, const at::Tensor& x,
                                         at::TensorList params, int64_t l, int64_t d,
                                         const std::vector<at::Tensor>& saved,
                                         const at::Tensor& dy, const at::Tensor& dh,
                                         const at::Tensor& dc, tensor_list& grads,
                                         int64_t params_at, bool want_dx) {
  const auto &y = saved[0], &h0 = saved[1];
  const auto& packing = cfg.packing;
  int64_t B = h0.size(0), H = h0.size(-1), G = cfg.gates() * H;
  // Packed, the time-major operands are [N, ..]; else [T, B, ..].
  int64_t T = packing.packed() ? packing.steps() : x.size(0);
  int64_t rows = packing.packed() ? packing.rows() : T * B;
  auto per_row = [&](int64_t n) {
    return packing.packed() ? std::vector<int64_t>{rows, n} : std::vector<int64_t>{T, B, n};
  };
  int64_t k = cfg.group(l, d);
  const auto &w_ih = params[k], &w_hh = params[k + 1];
  auto zeros = [&](at::IntArrayRef sizes) { return at::zeros(sizes, x.options()); };
  Operands ops;
  // The first state the walk reads: the LSTM's c0, the GRU's h0 (the plain RNN's none).
  ops.t(y);
  if (!cfg.plain()) ops.t(cfg.lstm() ? saved[2] : h0);
  // As the forward's: a bfloat16 weight makes the walk's products bf16 ones (the gate
  // gradients rounded to bfloat16, as CPU's bf16 backward keeps them).
  ops.t(cfg.bf16_products ? w_hh.to(at::kBFloat16) : w_hh)
      .t(dy.defined() ? dy : zeros(per_row(H)))
      .t(dh.defined() ? dh : zeros({B, H}));
  if (cfg.lstm()) ops.t(dc.defined() ? dc : zeros({B, H}));
  at::Tensor sizes;
  if (packing.packed()) {
    sizes = packing.device_sizes();
    ops.t(sizes);
  }
  auto a = recurrence_attrs(cfg.forward_part() + 1, d);
  auto r = run(DFUSE_OP_KIND_RECURRENCE, &a, ops, cfg.name());
  auto steps = r.narrow(0, 0, packing.packed() ? rows : T);
  auto dgi = steps.narrow(-1, 0, G).reshape({rows, G});
  auto dgh = cfg.gru() ? steps.narrow(-1, G, G).reshape({rows, G}) : dgi;
  // Each step's h before it: h0 first in the walk's order, then the steps' own h (packed: a
  // sample's h0 where it starts, gathered by row).
  auto hs = y.narrow(-1, cfg.h_at() * H, H);
  auto first = h0.unsqueeze(0);
  at::Tensor h_prev;
  if (packing.packed()) {
    h_prev = at::cat({hs, h0}).index_select(0, packing.previous_rows(d));
  } else {
    h_prev = T == 1  ? first
             : d == 0 ? at::cat({first, hs.narrow(0, 0, T - 1)})
                      : at::cat({hs.narrow(0, 1, T - 1), first});
  }
  // With bf16 products each operand is rounded once for all of them (the gate gradients feed
  // three products; each rounding of a transposed view was a copy of its own).
  auto operand = [&](const at::Tensor& t) {
    return cfg.bf16_products ? t.to(at::kBFloat16) : t;
  };
  auto dgi_p = operand(dgi);
  auto dgh_p = cfg.gru() ? operand(dgh) : dgi_p;
  grads[params_at + k] = layer_mm(cfg, dgi_p.t(), operand(x.reshape({rows, x.size(-1)})));
  grads[params_at + k + 1] = layer_mm(cfg, dgh_p.t(), operand(h_prev.reshape({rows, H})));
  if (cfg.biases) {
    // Two sums even where dgh is dgi: each parameter's .grad must be its own tensor.
    grads[params_at + k + 2] = dgi.sum(0);
    grads[params_at + k + 3] = dgh.sum(0);
  }
  // The first states' gradients: row T, or packed the last B rows.
  auto last = packing.packed() ? r.narrow(0, rows, B) : r.select(0, T);
  at::Tensor dx;
  if (want_dx) {
    auto w = operand(w_ih);
    dx = packing.packed() ? layer_mm(cfg, dgi_p, w) : layer_mm(cfg, dgi_p, w).view({T, B, -1});
  }
  return {dx, last.narrow(1, 0, H), cfg.lstm() ? last.narrow(1, H, H) : at::Tensor()};
}

DirectionGrads backward_direction(const Config& cfg, const at::Tensor& x, at::TensorList params,
                                  int64_t l, int64_t d, const std::vector<at::Tensor>& steps,
                                  const at::Tensor& dy, at::Tensor dh, at::Tensor dc,
                                  tensor_list& grads, int64_t params_at, bool want_dx) {
  if (cfg.kernel) {
    return backward_direction_kernel(cfg, x, params, l, d, steps, dy, dh, dc, grads, params_at,
                                     want_dx);
  }
  return backward_direction_steps(cfg, x, params, l, d, steps, dy, dh, dc, grads, params_at,
                                  want_dx);
}

// A packed forward recorded by autograd, for a double backward: PyTorch's composite (step by
// step, differentiable) one layer at a time, the first run's dropout masks applied between
// layers as run_forward replays them.
std::tuple<at::Tensor, at::Tensor, at::Tensor> run_forward_packed_recorded(
    const Config& cfg, const at::Tensor& data, at::TensorList hx, at::TensorList params,
    const std::vector<at::Tensor>& masks) {
  auto sizes = at::tensor(cfg.packing.sizes(), at::TensorOptions().dtype(at::kLong));
  int64_t per_layer = cfg.dirs * (cfg.biases ? 4 : 2);
  bool bidirectional = cfg.dirs == 2;
  at::Tensor x = data;
  std::vector<at::Tensor> hs, cs;
  for (int64_t l = 0; l < cfg.layers; ++l) {
    at::TensorList p(params.data() + l * per_layer, per_layer);
    auto h = hx[0].narrow(0, l * cfg.dirs, cfg.dirs);
    if (cfg.lstm()) {
      auto c = hx[1].narrow(0, l * cfg.dirs, cfg.dirs);
      auto [o, hy, cy] = at::native::lstm(x, sizes, {h, c}, p, cfg.biases, 1, 0.0, true,
                                          bidirectional);
      x = o;
      hs.push_back(hy);
      cs.push_back(cy);
    } else {
      using Native = std::tuple<at::Tensor, at::Tensor> (*)(
          const at::Tensor&, const at::Tensor&, const at::Tensor&, at::TensorList, bool, int64_t,
          double, bool, bool);
      Native native = cfg.gru()                ? Native(&at::native::gru)
                      : cfg.cell == kRnnTanh ? Native(&at::native::rnn_tanh)
                                             : Native(&at::native::rnn_relu);
      auto [o, hy] = native(x, sizes, h, p, cfg.biases, 1, 0.0, true, bidirectional);
      x = o;
      hs.push_back(hy);
    }
    if (cfg.dropout > 0 && l + 1 < cfg.layers) {
      x = at::native_dropout_backward(x, masks[l], 1.0 / (1.0 - cfg.dropout));
    }
  }
  return {x, at::cat(hs), cfg.lstm() ? at::cat(cs) : at::Tensor()};
}

// The backward with create_graph: the forward again, recorded by autograd from the saved
// inputs (dropout replaying the first run's masks), differentiated with its graph kept, so a
// second backward reaches every dependency (the saved activations of the first run are not
// connected to the weights).
tensor_list double_backward(const Config& cfg, const std::vector<at::Tensor>& inputs,
                            at::TensorList hx, at::TensorList params,
                            const std::vector<at::Tensor>& masks, const tensor_list& grad_outputs,
                            tensor_list& grads) {
  // Step by step, so autograd records (and a second backward reaches) every op.
  Config differentiable = cfg;
  differentiable.kernel = false;
  // The bf16 products are ops autograd cannot differentiate: the recorded forward runs float32
  // products on the same bfloat16 operands, without rounding h or the gate gradients to
  // bfloat16 (its gradients differ from the first backward's by that rounding, ~0.5%).
  differentiable.bf16_products = false;
  auto [out, hy, cy] =
      cfg.packing.packed()
          ? run_forward_packed_recorded(cfg, inputs[0], hx, params, masks)
          : run_forward(differentiable, inputs[0], hx, params, nullptr, &masks);
  tensor_list outs, gos, wrt;
  std::vector<size_t> slots;
  for (const auto& [o, g] : {std::pair{out, grad_outputs[0]}, std::pair{hy, grad_outputs[1]},
                             std::pair{cy, cfg.lstm() ? grad_outputs[2] : at::Tensor()}}) {
    if (o.defined() && g.defined()) {
      outs.push_back(o);
      gos.push_back(g);
    }
  }
  // A tensor passed twice (lstm(x, (h, h)), one weight in two slots) is differentiated once:
  // autograd adds what each slot returns, and grad() gives each copy the whole gradient.
  std::vector<const c10::TensorImpl*> seen;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const auto* impl = inputs[k].unsafeGetTensorImpl();
    if (inputs[k].requires_grad() && std::find(seen.begin(), seen.end(), impl) == seen.end()) {
      seen.push_back(impl);
      wrt.push_back(inputs[k]);
      slots.push_back(k);
    }
  }
  if (outs.empty() || wrt.empty()) return grads;
  auto g = torch::autograd::grad(outs, wrt, gos, /*retain_graph=*/true, /*create_graph=*/true,
                                 /*allow_unused=*/true);
  for (size_t k = 0; k < slots.size(); ++k) grads[slots[k]] = g[k];
  return grads;
}

class RnnLayers : public torch::autograd::Function<RnnLayers> {
 public:
  // `batch_sizes`: packed steps' (empty for a padded input).
  static tensor_list forward(AutogradContext* ctx, const at::Tensor& input, at::TensorList hx,
                             at::TensorList params, int64_t cell, bool biases, int64_t layers,
                             double dropout, bool train, bool bidirectional, bool batch_first,
                             std::vector<int64_t> batch_sizes, bool bf16_products) {
    at::AutoDispatchBelowADInplaceOrView guard;
    Config cfg{Cell(cell), biases, layers, bidirectional ? 2 : 1, train ? dropout : 0.0, batch_first,
               runs_as_kernel(input)};
    if (!batch_sizes.empty()) cfg.packing = Packing(batch_sizes);
    cfg.bf16_products = bf16_products;
    Saved saved;
    auto [out, hy, cy] = run_forward(cfg, input, hx, params, &saved);
    // Everything through save_for_backward (released after the backward, version-checked):
    // input, hx..., params..., the inputs of layers 1.., the masks, then each layer and
    // direction's steps.
    std::vector<at::Tensor> keep{input};
    keep.insert(keep.end(), hx.begin(), hx.end());
    keep.insert(keep.end(), params.begin(), params.end());
    keep.insert(keep.end(), saved.layer_inputs.begin() + 1, saved.layer_inputs.end());
    keep.insert(keep.end(), saved.masks.begin(), saved.masks.end());
    for (const auto& steps : saved.steps) keep.insert(keep.end(), steps.begin(), steps.end());
    ctx->save_for_backward(keep);
    ctx->set_materialize_grads(false);
    ctx->saved_data["config"] = std::vector<double>{
        double(cell),      double(biases),        double(layers),
        double(cfg.dirs),  cfg.dropout,           double(batch_first),
        double(hx.size()), double(params.size()), double(saved.masks.size()),
        double(input.size(batch_first ? 1 : 0)), double(cfg.kernel), double(bf16_products)};
    ctx->saved_data["batch_sizes"] = batch_sizes;
    return cfg.lstm() ? tensor_list{out, hy, cy} : tensor_list{out, hy};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    // A backward called inside an autocast region would cast its products too.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto c = ctx->saved_data["config"].toDoubleVector();
    Config cfg{Cell(int64_t(c[0])), c[1] != 0, int64_t(c[2]), int64_t(c[3]), c[4], c[5] != 0,
               c[10] != 0};
    cfg.bf16_products = c[11] != 0;
    auto batch_sizes = ctx->saved_data["batch_sizes"].toIntVector();
    if (!batch_sizes.empty()) cfg.packing = Packing(batch_sizes);
    int64_t n_hx = int64_t(c[6]), n_params = int64_t(c[7]), n_masks = int64_t(c[8]);
    int64_t T = int64_t(c[9]);
    auto kept = ctx->get_saved_variables();  // in the order forward saved them
    auto next = kept.begin();
    auto take = [&](int64_t n) {
      std::vector<at::Tensor> v(next, next + n);
      next += n;
      return v;
    };
    auto inputs = take(1 + n_hx + n_params);
    at::TensorList hx(inputs.data() + 1, n_hx);
    at::TensorList params(inputs.data() + 1 + n_hx, n_params);
    auto layer_inputs = take(cfg.layers - 1);
    layer_inputs.insert(layer_inputs.begin(),
                        cfg.batch_first ? inputs[0].transpose(0, 1) : inputs[0]);
    auto masks = take(n_masks);
    // Gradients for every forward argument: input, hx..., params..., nine non-tensors.
    tensor_list grads(inputs.size() + 9);
    if (at::GradMode::is_enabled()) {
      return double_backward(cfg, inputs, hx, params, masks, grad_outputs, grads);
    }
    at::AutoDispatchBelowADInplaceOrView below;
    const auto& dout = grad_outputs[0];
    const auto& dhy = grad_outputs[1];
    at::Tensor dcy = cfg.lstm() ? grad_outputs[2] : at::Tensor();
    int64_t params_at = 1 + n_hx;
    auto dy = dout.defined() && cfg.batch_first ? dout.transpose(0, 1) : dout;
    std::vector<at::Tensor> dh0(cfg.layers * cfg.dirs), dc0(cfg.layers * cfg.dirs);
    for (int64_t l = cfg.layers - 1; l >= 0; --l) {
      const auto& x = layer_inputs[l];
      at::Tensor dx;
      for (int64_t d = 0; d < cfg.dirs; ++d) {
        int64_t j = l * cfg.dirs + d;
        int64_t H = params[cfg.group(l, d) + 1].size(1);
        auto dyd = dy.defined() && cfg.dirs == 2 ? dy.narrow(-1, d * H, H) : dy;
        auto steps = std::vector<at::Tensor>(next + j * cfg.per_direction(T),
                                             next + (j + 1) * cfg.per_direction(T));
        auto r = backward_direction(cfg, x, params, l, d, steps, dyd,
                                    dhy.defined() ? dhy[j] : at::Tensor(),
                                    dcy.defined() ? dcy[j] : at::Tensor(), grads, params_at,
                                    l > 0 || ctx->needs_input_grad(0));
        dx = add_grads(dx, r.dx);
        dh0[j] = r.dh0;
        dc0[j] = r.dc0;
      }
      if (l > 0 && !masks.empty()) {
        dx = at::native_dropout_backward(dx, masks[l - 1], 1.0 / (1.0 - cfg.dropout));
      }
      dy = dx;
    }
    if (dy.defined()) grads[0] = cfg.batch_first ? dy.transpose(0, 1) : dy;
    // Every direction's walk ends with a state gradient (zeros where none reached it).
    grads[1] = at::stack(dh0);
    if (cfg.lstm()) grads[2] = at::stack(dc0);
    return grads;
  }
};

// Whether packed steps' sizes (from a PackedSequence's batch_sizes) describe `rows` packed
// rows: non-increasing, positive, summing to them. Else PyTorch's path gives its own error.
bool packs(const std::vector<int64_t>& sizes, int64_t rows) {
  int64_t total = 0;
  for (size_t t = 0; t < sizes.size(); ++t) {
    if (sizes[t] < 1 || (t > 0 && sizes[t] > sizes[t - 1])) return false;
    total += sizes[t];
  }
  return !sizes.empty() && total == rows;
}

// Whether the call is this file's: see the header comment for what keeps PyTorch's path.
// `batch_sizes` non-empty: packed steps (float32 only: the kernel op's).
bool covered(const at::Tensor& input, at::TensorList hx, at::TensorList params, Cell cell,
             bool biases, int64_t layers, double dropout, bool train, bool bidirectional,
             bool batch_first, const std::vector<int64_t>& batch_sizes = {}) {
  // First: a tensor torch.compile traces (fake, sizes possibly symbolic) takes PyTorch's path,
  // and the checks below read sizes as numbers (numel() raised on the second input shape).
  if (!recordable(input)) return false;
  auto dt = input.scalar_type();
  auto direct = [&](const at::Tensor& t) { return recordable(t) && t.scalar_type() == dt; };
  int64_t dirs = bidirectional ? 2 : 1;
  bool packed = !batch_sizes.empty();
  if (packed && (dt != at::kFloat || input.dim() != 2 || !packs(batch_sizes, input.size(0)))) {
    return false;
  }
  if (!(dt == at::kFloat || dt == at::kDouble) || input.dim() != (packed ? 2 : 3) ||
      input.numel() == 0 ||
      layers < 1 || int64_t(hx.size()) != (cell == kLstm ? 2 : 1) ||
      (train && layers > 1 && !(dropout >= 0 && dropout < 1)) ||
      int64_t(params.size()) != layers * dirs * (biases ? 4 : 2) || !direct(input)) {
    return false;
  }
  int64_t B = packed ? batch_sizes[0] : input.size(batch_first ? 0 : 1);
  int64_t H = hx[0].dim() == 3 ? hx[0].size(2) : 0;
  for (const auto& t : hx) {
    if (!direct(t) || t.dim() != 3 || t.size(0) != layers * dirs || t.size(1) != B ||
        t.size(2) != H) {
      return false;  // PyTorch's path raises its own error
    }
  }
  int64_t G = Config{cell}.gates() * H;
  for (int64_t g = 0; g < layers * dirs; ++g) {
    const auto* p = params.data() + g * (biases ? 4 : 2);
    int64_t in = g < dirs ? input.size(-1) : dirs * H;
    if (!direct(p[0]) || !direct(p[1]) || p[0].dim() != 2 || p[1].dim() != 2 ||
        p[0].size(0) != G || p[0].size(1) != in || p[1].size(0) != G || p[1].size(1) != H) {
      return false;  // a projection (proj_size) or a shape PyTorch will reject
    }
    if (biases && (!direct(p[2]) || !direct(p[3]) || p[2].sizes() != at::IntArrayRef{G} ||
                   p[3].sizes() != at::IntArrayRef{G})) {
      return false;
    }
  }
  return true;
}

// Whether autograd will differentiate the call: grad mode on and some input requiring grad.
bool records(const at::Tensor& input, at::TensorList hx, at::TensorList params) {
  auto wants = [](const at::Tensor& t) { return t.requires_grad(); };
  return at::GradMode::is_enabled() &&
         (input.requires_grad() || std::any_of(hx.begin(), hx.end(), wants) ||
          std::any_of(params.begin(), params.end(), wants));
}

// A covered call: the node when autograd will differentiate it, else the forward alone
// (no_grad, eval without gradients), keeping nothing for a backward.
tensor_list run_layers(Cell cell, const at::Tensor& input, at::TensorList hx,
                       at::TensorList params, bool biases, int64_t layers, double dropout,
                       bool train, bool bidirectional, bool batch_first,
                       const std::vector<int64_t>& batch_sizes = {}, bool bf16_products = false) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  if (records(input, hx, params)) {
    return RnnLayers::apply(input, hx, params, int64_t(cell), biases, layers, dropout, train,
                            bidirectional, batch_first, batch_sizes, bf16_products);
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  Config cfg{cell, biases, layers, bidirectional ? 2 : 1, train ? dropout : 0.0, batch_first,
             runs_as_kernel(input)};
  if (!batch_sizes.empty()) cfg.packing = Packing(batch_sizes);
  cfg.bf16_products = bf16_products;
  auto [out, hy, cy] = run_forward(cfg, input, hx, params, nullptr);
  return {out, hy, cy};
}

// Whether a covered float32 call is in a bfloat16 autocast region on tpu, where CPU's LSTM
// (oneDNN's, on a padded input without projections) and plain RNN (its products autocast)
// compute on bfloat16 operands and return bfloat16 outputs and states. (CPU's GRU and packed
// LSTM stay float32, and so do these; its packed plain RNN is bfloat16, as here.)
bool under_bf16_autocast(const at::Tensor& input) {
  return input.scalar_type() == at::kFloat &&
         at::autocast::is_autocast_enabled(c10::DeviceType::PrivateUse1) &&
         at::autocast::get_autocast_dtype(c10::DeviceType::PrivateUse1) == at::kBFloat16;
}

// `t` rounded to bfloat16 values, kept float32 (autograd sees both casts: a gradient reaching
// it is rounded to bfloat16 on its way back, as through CPU's autocast casts).
at::Tensor bf16_values(const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); }

std::vector<at::Tensor> bf16_values(at::TensorList ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(bf16_values(t));
  return out;
}

// A covered call under bfloat16 autocast, as CPU's: its operands rounded to bfloat16, the
// layers computed on them in float32 with every product in bf16 (Config::bf16_products: h
// and the gate gradients rounded to bfloat16 where a product reads them, as CPU's layer keeps
// them), every result rounded to bfloat16. Within CPU's own rounding of its bf16 arithmetic.
tensor_list run_layers_bf16(Cell cell, const at::Tensor& input, at::TensorList hx,
                            at::TensorList params, bool biases, int64_t layers, double dropout,
                            bool train, bool bidirectional, bool batch_first,
                            const std::vector<int64_t>& batch_sizes = {}) {
  auto h = bf16_values(hx);
  auto p = bf16_values(params);
  auto r = run_layers(cell, bf16_values(input), h, p, biases, layers, dropout, train,
                      bidirectional, batch_first, batch_sizes, true);
  for (auto& t : r) {
    if (t.defined()) t = t.to(at::kBFloat16);
  }
  return r;
}

// The states a call under bfloat16 autocast reads: bfloat16 ones (the states a previous call
// returned, fed back as truncated BPTT does) as float32, exact, so the call stays covered (it
// rounds them to bfloat16 again); any others as given.
std::vector<at::Tensor> autocast_states(const at::Tensor& input, at::TensorList hx) {
  std::vector<at::Tensor> out(hx.begin(), hx.end());
  if (!under_bf16_autocast(input)) return out;
  for (auto& h : out) {
    if (h.defined() && h.scalar_type() == at::kBFloat16) h = h.to(at::kFloat);
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm(const at::Tensor& input, at::TensorList hx_in,
                                                    at::TensorList params, bool biases,
                                                    int64_t layers, double dropout, bool train,
                                                    bool bidirectional, bool batch_first) {
  auto states = autocast_states(input, hx_in);
  at::TensorList hx(states);
  if (!covered(input, hx, params, kLstm, biases, layers, dropout, train, bidirectional,
               batch_first)) {
    return at::native::lstm(input, hx, params, biases, layers, dropout, train, bidirectional,
                            batch_first);
  }
  auto r = under_bf16_autocast(input)
               ? run_layers_bf16(kLstm, input, hx, params, biases, layers, dropout, train,
                                 bidirectional, batch_first)
               : run_layers(kLstm, input, hx, params, biases, layers, dropout, train,
                            bidirectional, batch_first);
  return {r[0], r[1], r[2]};
}

// The GRU and the plain RNNs: one state, (output, hy).
template <Cell C>
std::tuple<at::Tensor, at::Tensor> one_state(const at::Tensor& input, const at::Tensor& hx_in,
                                             at::TensorList params, bool biases, int64_t layers,
                                             double dropout, bool train, bool bidirectional,
                                             bool batch_first) {
  // A plain RNN's bfloat16 state fed back under autocast (the GRU's stays float32 there).
  const at::Tensor hx =
      C != kGru ? autocast_states(input, at::TensorList(hx_in))[0] : hx_in;
  if (!covered(input, hx, params, C, biases, layers, dropout, train, bidirectional,
               batch_first)) {
    using Native = std::tuple<at::Tensor, at::Tensor> (*)(
        const at::Tensor&, const at::Tensor&, at::TensorList, bool, int64_t, double, bool, bool,
        bool);
    Native native = C == kGru       ? Native(&at::native::gru)
                    : C == kRnnTanh ? Native(&at::native::rnn_tanh)
                                    : Native(&at::native::rnn_relu);
    return native(input, hx, params, biases, layers, dropout, train, bidirectional, batch_first);
  }
  // CPU's GRU stays float32 under autocast; its plain RNNs run their products in bfloat16.
  auto r = C != kGru && under_bf16_autocast(input)
               ? run_layers_bf16(C, input, at::TensorList(hx), params, biases, layers, dropout,
                                 train, bidirectional, batch_first)
               : run_layers(C, input, at::TensorList(hx), params, biases, layers, dropout, train,
                            bidirectional, batch_first);
  return {r[0], r[1]};
}

// A PackedSequence's batch_sizes on the host (PyTorch keeps them on the CPU): empty when they
// are not a CPU int64 vector, which leaves the call to PyTorch's path and its error.
std::vector<int64_t> host_sizes(const at::Tensor& batch_sizes) {
  if (!batch_sizes.defined() || !batch_sizes.device().is_cpu() || batch_sizes.dim() != 1 ||
      batch_sizes.scalar_type() != at::kLong) {
    return {};
  }
  auto c = batch_sizes.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// nn.LSTM over a PackedSequence (lstm.data): its data [N, I] and batch_sizes.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_packed(
    const at::Tensor& data, const at::Tensor& batch_sizes, at::TensorList hx,
    at::TensorList params, bool biases, int64_t layers, double dropout, bool train,
    bool bidirectional) {
  auto sizes = host_sizes(batch_sizes);
  if (sizes.empty() || !covered(data, hx, params, kLstm, biases, layers, dropout, train,
                                bidirectional, false, sizes)) {
    return at::native::lstm(data, batch_sizes, hx, params, biases, layers, dropout, train,
                            bidirectional);
  }
  auto r = run_layers(kLstm, data, hx, params, biases, layers, dropout, train, bidirectional,
                      false, sizes);
  return {r[0], r[1], r[2]};
}

// nn.GRU and nn.RNN over a PackedSequence (gru.data, rnn_tanh.data, rnn_relu.data).
template <Cell C>
std::tuple<at::Tensor, at::Tensor> one_state_packed(const at::Tensor& data,
                                                    const at::Tensor& batch_sizes,
                                                    const at::Tensor& hx, at::TensorList params,
                                                    bool biases, int64_t layers, double dropout,
                                                    bool train, bool bidirectional) {
  auto sizes = host_sizes(batch_sizes);
  if (sizes.empty() || !covered(data, at::TensorList(hx), params, C, biases, layers, dropout,
                                train, bidirectional, false, sizes)) {
    using Native = std::tuple<at::Tensor, at::Tensor> (*)(
        const at::Tensor&, const at::Tensor&, const at::Tensor&, at::TensorList, bool, int64_t,
        double, bool, bool);
    Native native = C == kGru       ? Native(&at::native::gru)
                    : C == kRnnTanh ? Native(&at::native::rnn_tanh)
                                    : Native(&at::native::rnn_relu);
    return native(data, batch_sizes, hx, params, biases, layers, dropout, train, bidirectional);
  }
  // CPU's plain RNN is composite: autocast casts its products on packed steps too (its packed
  // LSTM and GRU stay float32).
  auto r = C != kGru && under_bf16_autocast(data)
               ? run_layers_bf16(C, data, at::TensorList(hx), params, biases, layers, dropout,
                                 train, bidirectional, false, sizes)
               : run_layers(C, data, at::TensorList(hx), params, biases, layers, dropout, train,
                            bidirectional, false, sizes);
  return {r[0], r[1]};
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("lstm.data", TORCH_FN(dft::lstm_packed));
  m.impl("gru.data", TORCH_FN(dft::one_state_packed<dft::rnn::kGru>));
  m.impl("rnn_tanh.data", TORCH_FN(dft::one_state_packed<dft::rnn::kRnnTanh>));
  m.impl("rnn_relu.data", TORCH_FN(dft::one_state_packed<dft::rnn::kRnnRelu>));
  m.impl("lstm.input", TORCH_FN(dft::lstm));
  m.impl("gru.input", TORCH_FN(dft::one_state<dft::rnn::kGru>));
  m.impl("rnn_tanh.input", TORCH_FN(dft::one_state<dft::rnn::kRnnTanh>));
  m.impl("rnn_relu.input", TORCH_FN(dft::one_state<dft::rnn::kRnnRelu>));
}
