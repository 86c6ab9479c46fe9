// nn.LSTM, nn.GRU and nn.RNN one step at a time (rnn_layers.h): the path for float64, and
// for a double backward, where autograd must record every op. Each step is an op group, so
// strict mode runs its product and its gate arithmetic as CPU's cell does, a few programs a
// step instead of one per gate op; the backward walks the steps in reverse computing the gate
// gradients and the hidden-state product, then takes each weight's gradient as one product
// over all steps.
#include "rnn_layers.h"

namespace dft::rnn {

Direction run_direction_steps(const Config& cfg, const at::Tensor& xg_all, const at::Tensor& w_hh,
                              const at::Tensor& b_hh, int64_t d, at::Tensor h, at::Tensor c,
                              std::vector<at::Tensor>* save) {
  int64_t T = xg_all.size(0), B = xg_all.size(1);
  auto xg = xg_all.unbind(0);
  // Each step's h is written into its place here by the step's own program (one loop with the
  // gates), not gathered by a stack after the last step (a copy program per step).
  auto out = at::empty({T, B, h.size(-1)}, h.options());
  if (save) save->assign(T * cfg.per_step(), at::Tensor());
  // W_hh^T laid out once for all steps: each step's `h @ W_hh^T` then reads a plain B, which
  // the runtime's few-row GEMM reads in place, where a transposed one is transposed again
  // every step (`[16, 128] @ [128, 512]`: 31 -> 23 us a call, the same bits).
  auto w_hh_t = w_hh.t().contiguous();
  for (int64_t s = 0; s < T; ++s) {
    // Strict mode runs a step as CPU's cell does, one product and one pass over the gates,
    // not one program per gate op. The step's temporaries (its hidden product, the gates) die
    // with the lambda, before the group ends, so they are never written.
    OpGroup step;
    [&] {
      int64_t t = d == 0 ? s : T - 1 - s;
      auto hg = b_hh.defined() ? at::addmm(b_hh, h, w_hh_t) : at::mm(h, w_hh_t);
      at::Tensor* slot = save ? save->data() + t * cfg.per_step() : nullptr;
      if (cfg.plain()) {
        auto pre = hg + xg[t];
        auto h_next = cfg.cell == kRnnTanh ? pre.tanh() : pre.relu();
        if (slot) {
          for (const auto& v : {h_next, h}) *slot++ = v;
        }
        h = h_next;
      } else if (cfg.lstm()) {
        auto gates = (hg + xg[t]).chunk(4, 1);
        auto i = gates[0].sigmoid(), f = gates[1].sigmoid();
        auto g = gates[2].tanh(), o = gates[3].sigmoid();
        auto c_next = f * c + i * g;
        auto h_next = o * c_next.tanh();
        if (slot) {
          for (const auto& v : {i, f, g, o, c_next, h, c}) *slot++ = v;
        }
        h = h_next;
        c = c_next;
      } else {
        auto ig = xg[t].chunk(3, 1), hc = hg.chunk(3, 1);
        auto r = (hc[0] + ig[0]).sigmoid();
        auto z = (hc[1] + ig[1]).sigmoid();
        auto n = (ig[2] + hc[2] * r).tanh();
        auto h_next = (h - n) * z + n;
        if (slot) {
          for (const auto& v : {r, z, n, hc[2], h}) *slot++ = v;
        }
        h = h_next;
      }
      out.select(0, t).copy_(h);
    }();
    step.end();
  }
  return {out, h, c};
}

DirectionGrads backward_direction_steps(const Config& cfg, const at::Tensor& x,
                                        at::TensorList params, int64_t l, int64_t d,
                                        const std::vector<at::Tensor>& steps, const at::Tensor& dy,
                                        at::Tensor dh, at::Tensor dc, tensor_list& grads,
                                        int64_t params_at, bool want_dx) {
  int64_t T = x.size(0), B = x.size(1), H = params[cfg.group(l, d) + 1].size(1);
  int64_t k = cfg.group(l, d);
  const auto &w_ih = params[k], &w_hh = params[k + 1];
  auto dys = dy.defined() ? dy.unbind(0) : std::vector<at::Tensor>();
  auto zeros = at::zeros({B, H}, x.options());
  int64_t G = cfg.gates() * H;
  // Each step's gate gradients are written into their place for the weight gradients' products
  // by the step's own program, not gathered by a stack after the last step.
  auto dgi_steps = at::empty({T, B, G}, x.options());
  auto dgh_steps = cfg.gru() ? at::empty({T, B, G}, x.options()) : dgi_steps;
  // Writes the pieces side by side into step t's row of `steps`, as `cat` would write them.
  auto into = [](const at::Tensor& steps, int64_t t, std::initializer_list<at::Tensor> pieces) {
    auto slot = steps.select(0, t);
    int64_t col = 0;
    for (const auto& p : pieces) {
      slot.narrow(1, col, p.size(1)).copy_(p);
      col += p.size(1);
    }
    return slot;
  };
  std::vector<at::Tensor> h_prev(T);
  for (int64_t s = 0; s < T; ++s) {
    OpGroup step;  // one step's gate gradients and hidden product, as in the forward
    [&] {
      int64_t t = d == 0 ? T - 1 - s : s;
      const at::Tensor* v = steps.data() + t * cfg.per_step();
      auto dh_t = add_grads(dys.empty() ? at::Tensor() : dys[t], dh);
      if (!dh_t.defined()) dh_t = zeros;
      if (cfg.plain()) {
        const auto& y = v[0];
        h_prev[t] = v[1];
        auto pre = cfg.cell == kRnnTanh ? at::tanh_backward(dh_t, y)
                                        : at::threshold_backward(dh_t, y, 0);
        dh = at::mm(into(dgi_steps, t, {pre}), w_hh);
      } else if (cfg.lstm()) {
        const auto &i = v[0], &f = v[1], &g = v[2], &o = v[3], &c = v[4], &c_prev = v[6];
        h_prev[t] = v[5];
        auto tc = c.tanh();
        auto d_o = dh_t * tc;
        auto dc_t = add_grads(at::tanh_backward(dh_t * o, tc), dc);
        auto d_gates = into(dgi_steps, t,
                            {at::sigmoid_backward(dc_t * g, i),
                             at::sigmoid_backward(dc_t * c_prev, f), at::tanh_backward(dc_t * i, g),
                             at::sigmoid_backward(d_o, o)});
        dc = dc_t * f;
        dh = at::mm(d_gates, w_hh);
      } else {
        const auto &r = v[0], &z = v[1], &n = v[2], &hn = v[3];
        h_prev[t] = v[4];
        auto d_hmn = dh_t * z;  // through (h - n) * z
        auto dz = dh_t * (h_prev[t] - n);
        auto dn = at::tanh_backward(dh_t - d_hmn, n);
        auto dr = at::sigmoid_backward(dn * hn, r);
        auto dz_pre = at::sigmoid_backward(dz, z);
        into(dgi_steps, t, {dr, dz_pre, dn});
        dh = d_hmn + at::mm(into(dgh_steps, t, {dr, dz_pre, dn * r}), w_hh);
      }
    }();
    step.end();
  }
  auto dgi = dgi_steps.view({T * B, G});
  auto dgh = dgh_steps.view({T * B, G});
  auto x2 = x.reshape({T * B, x.size(2)});
  grads[params_at + k] = at::mm(dgi.t(), x2);
  grads[params_at + k + 1] = at::mm(dgh.t(), at::stack(h_prev).view({T * B, H}));
  if (cfg.biases) {
    grads[params_at + k + 2] = dgi.sum(0);
    grads[params_at + k + 3] = dgh.sum(0);
  }
  return {want_dx ? at::mm(dgi, w_ih).view({T, B, -1}) : at::Tensor(), dh, dc};
}

}  // namespace dft::rnn
