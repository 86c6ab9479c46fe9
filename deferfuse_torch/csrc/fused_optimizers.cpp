// The fused optimizer steps (torch.optim.Adam / AdamW / SGD / Adagrad with fused=True, which
// PyTorch accepts for the PrivateUse1 device and Hugging Face's "adamw_torch_fused" uses) on
// tpu. Without these each step went to the CPU fallback: every parameter, gradient and state
// tensor copied to the host and back.
//
// Each parameter's update is written from device ops in the order PyTorch's CPU fused kernel
// computes it (FusedAdamKernel.cpp, FusedSGDKernel.cpp, FusedAdagradKernel.cpp), in its
// arithmetic type (at::opmath_type): a float16/bfloat16 parameter, its gradient and its state
// are read into float32, updated there and rounded once when stored, as CPU's kernel does
// (updated op by op in the half type, eps = 1e-8 rounded to 0 in float16 and an element with
// a zero gradient became 0/0); float32 and float64 compute in their own type. The step's
// scalars (the bias corrections, Adam's step size, Adagrad's decayed rate) are computed in
// float64 from the step count, as CPU's kernel computes them on the host, then taken to the
// arithmetic type (computed in float32 they drifted ~7e-6 relative a step with Adam's default
// betas, and float64 parameters lost precision). So values agree with CPU's fused step
// within rounding (CPU's vector loops fuse some multiply-adds). In defer mode each
// parameter's update is one fused loop. The step counts, the gradient scale and AMP's
// found_inf flag stay on the device: a step with found_inf set changes nothing, decided by a
// select instead of a host read.
#include "common.h"

#include <torch/library.h>

namespace dft {
namespace {

// The type CPU's fused kernels compute in (at::opmath_type): float32 for the half types.
at::ScalarType opmath_of(const at::Tensor& p) {
  auto t = p.scalar_type();
  return t == at::kHalf || t == at::kBFloat16 ? at::kFloat : t;
}

// `t` read as `dtype` (itself when it has it).
at::Tensor as(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

// lr as a Python float or as a device tensor (the ".tensor_lr" overloads), which CPU's kernel
// reads as a double.
struct LR {
  double value = 0.0;
  at::Tensor tensor;  // defined for a tensor lr on the device: float64

  at::Tensor times(const at::Tensor& t) const {
    return tensor.defined() ? t * as(tensor, t.scalar_type()) : t * value;
  }
  // p * (1 - lr * wd), the factor computed in float64 and taken to p's dtype.
  at::Tensor decay(const at::Tensor& p, double wd) const {
    return tensor.defined() ? p * as(1.0 - tensor * wd, p.scalar_type()) : p * (1.0 - value * wd);
  }
  // lr / t for a float64 device scalar t, in float64.
  at::Tensor over(const at::Tensor& t) const {
    return tensor.defined() ? tensor / t : at::reciprocal(t) * value;
  }
};

LR lr_of(double lr) { return LR{lr, at::Tensor()}; }

LR lr_of(const at::Tensor& lr) {
  if (lr.device().type() != c10::DeviceType::PrivateUse1) return LR{lr.item<double>(), {}};
  return LR{0.0, as(lr, at::kDouble)};
}

// The step count as CPU's kernel reads it (the float32 count as a double), on the device.
at::Tensor step_count(const at::Tensor& step) { return as(step, at::kDouble); }

// Where a step is skipped (found_inf set), the old value; else the new one.
at::Tensor unless_inf(const std::optional<at::Tensor>& found_inf, const at::Tensor& old,
                      const at::Tensor& updated) {
  return found_inf ? at::where(found_inf->ne(0), old, updated) : updated;
}

// The gradient the update reads, in the arithmetic type `opmath`: unscaled (and written back
// unscaled, rounded to the gradient's dtype, as CPU's kernel does), negated under maximize.
at::Tensor step_grad(const at::Tensor& grad, const std::optional<at::Tensor>& grad_scale,
                     const std::optional<at::Tensor>& found_inf, bool maximize,
                     at::ScalarType opmath) {
  at::Tensor g = as(grad, opmath);
  if (grad_scale) {
    g = g / *grad_scale;
    grad.copy_(unless_inf(found_inf, grad, g));
  }
  return maximize ? -g : g;
}

// The steps write parameters and state below autograd's in-place tracking, as CPU's fused
// kernels write their memory: no version counter moves, so a graph that saved a parameter
// before step() still runs its backward afterwards, as on CPU (each copy_ here bumped it).
using BelowInplaceTracking = at::AutoDispatchBelowADInplaceOrView;

void check_lists(const char* op, at::TensorList params,
                 std::initializer_list<at::TensorList> others) {
  for (const auto& l : others) {
    TORCH_CHECK(l.empty() || l.size() == params.size(), "tpu: ", op, ": ", params.size(),
                " parameters but a list of ", l.size(), " state tensors");
  }
}

template <bool kAdamW, typename Lr>
void fused_adam(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                at::TensorList state_steps, Lr lr_arg, double beta1, double beta2,
                double weight_decay, double eps, bool amsgrad, bool maximize,
                const std::optional<at::Tensor>& grad_scale,
                const std::optional<at::Tensor>& found_inf) {
  BelowInplaceTracking below;
  const char* op = kAdamW ? "_fused_adamw_" : "_fused_adam_";
  check_lists(op, params, {grads, exp_avgs, exp_avg_sqs, state_steps});
  TORCH_CHECK(!amsgrad || max_exp_avg_sqs.size() == params.size(), "tpu: ", op,
              ": amsgrad needs one max_exp_avg_sq per parameter");
  LR lr = lr_of(lr_arg);
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor &p = params[i], &m = exp_avgs[i], &v = exp_avg_sqs[i];
    const auto op = opmath_of(p);
    at::Tensor g = step_grad(grads[i], grad_scale, found_inf, maximize, op);
    at::Tensor param = as(p, op);
    if (weight_decay != 0) {
      if (kAdamW) {
        param = lr.decay(param, weight_decay);
      } else {
        g = g + param * weight_decay;
      }
    }
    auto m_new = at::lerp(as(m, op), g, 1.0 - beta1);
    auto v_new = as(v, op) * beta2 + g * (1.0 - beta2) * g;
    at::Tensor second = v_new;
    if (amsgrad) {
      second = at::maximum(as(max_exp_avg_sqs[i], op), v_new);
      max_exp_avg_sqs[i].copy_(unless_inf(found_inf, max_exp_avg_sqs[i], second));
    }
    auto step = step_count(state_steps[i]);
    auto step_size = as(lr.over(1.0 - at::pow(beta1, step)), op);
    auto correction2_sqrt = as(at::sqrt(1.0 - at::pow(beta2, step)), op);
    auto denom = at::sqrt(second) / correction2_sqrt + eps;
    auto p_new = param - step_size * m_new / denom;
    p.copy_(unless_inf(found_inf, p, p_new));
    m.copy_(unless_inf(found_inf, m, m_new));
    v.copy_(unless_inf(found_inf, v, v_new));
  }
}

template <typename Lr>
void fused_sgd(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
               double weight_decay, double momentum, Lr lr_arg, double dampening, bool nesterov,
               bool maximize, bool is_first_step, const std::optional<at::Tensor>& grad_scale,
               const std::optional<at::Tensor>& found_inf) {
  BelowInplaceTracking below;
  check_lists("_fused_sgd_", params, {grads, momentum_buffers});
  TORCH_CHECK(momentum == 0 || momentum_buffers.size() == params.size(),
              "tpu: _fused_sgd_: momentum needs one momentum buffer per parameter");
  LR lr = lr_of(lr_arg);
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    const auto op = opmath_of(p);
    at::Tensor param = as(p, op);
    at::Tensor g = step_grad(grads[i], grad_scale, found_inf, maximize, op);
    if (weight_decay != 0) g = g + param * weight_decay;
    if (momentum != 0) {
      const at::Tensor& buf = momentum_buffers[i];
      auto buf_new = is_first_step ? g : as(buf, op) * momentum + g * (1.0 - dampening);
      buf.copy_(unless_inf(found_inf, buf, buf_new));
      g = nesterov ? g + buf_new * momentum : buf_new;
    }
    p.copy_(unless_inf(found_inf, p, param - lr.times(g)));
  }
}

template <typename Lr>
void fused_adagrad(at::TensorList params, at::TensorList grads, at::TensorList state_sums,
                   at::TensorList state_steps, Lr lr_arg, double lr_decay, double weight_decay,
                   double eps, bool maximize, const std::optional<at::Tensor>& grad_scale,
                   const std::optional<at::Tensor>& found_inf) {
  BelowInplaceTracking below;
  check_lists("_fused_adagrad_", params, {grads, state_sums, state_steps});
  LR lr = lr_of(lr_arg);
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor &p = params[i], &sum = state_sums[i];
    const auto op = opmath_of(p);
    at::Tensor param = as(p, op);
    at::Tensor g = step_grad(grads[i], grad_scale, found_inf, maximize, op);
    if (weight_decay != 0) g = g + param * weight_decay;
    auto sum_new = as(sum, op) + g * g;
    auto std = at::sqrt(sum_new) + eps;
    // lr / (1 + (step - 1) * decay), in float64.
    auto clr = as(lr.over(1.0 + (step_count(state_steps[i]) - 1.0) * lr_decay), op);
    sum.copy_(unless_inf(found_inf, sum, sum_new));
    p.copy_(unless_inf(found_inf, p, param - clr * g / std));
  }
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_adam_", TORCH_FN((dft::fused_adam<false, double>)));
  m.impl("_fused_adam_.tensor_lr", TORCH_FN((dft::fused_adam<false, const at::Tensor&>)));
  m.impl("_fused_adamw_", TORCH_FN((dft::fused_adam<true, double>)));
  m.impl("_fused_adamw_.tensor_lr", TORCH_FN((dft::fused_adam<true, const at::Tensor&>)));
  m.impl("_fused_sgd_", TORCH_FN((dft::fused_sgd<double>)));
  m.impl("_fused_sgd_.tensor_lr", TORCH_FN((dft::fused_sgd<const at::Tensor&>)));
  m.impl("_fused_adagrad_", TORCH_FN((dft::fused_adagrad<double>)));
  m.impl("_fused_adagrad_.tensor_lr", TORCH_FN((dft::fused_adagrad<const at::Tensor&>)));
}
