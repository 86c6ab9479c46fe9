"""torch.optim.Adam, AdamW, SGD and Adagrad with fused=True run their fused step on the device (no CPU
fallback) and train as CPU's fused step does, within float32 rounding: weight decay, amsgrad,
maximize, momentum, dampening, nesterov, a tensor learning rate, and GradScaler's skipped
steps."""
import copy

import pytest
import torch
from torch import nn

import deferfuse_torch

CONFIGS = {
    "adam": lambda p, **k: torch.optim.Adam(p, lr=0.05, fused=True, **k),
    "adam_decay_amsgrad_maximize": lambda p, **k: torch.optim.Adam(
        p, lr=0.05, weight_decay=0.1, amsgrad=True, maximize=True, fused=True, **k),
    "adamw": lambda p, **k: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1, fused=True, **k),
    "adamw_amsgrad": lambda p, **k: torch.optim.AdamW(p, lr=0.05, amsgrad=True, fused=True, **k),
    "sgd": lambda p, **k: torch.optim.SGD(p, lr=0.1, weight_decay=0.01, fused=True, **k),
    "sgd_momentum": lambda p, **k: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1,
                                                    fused=True, **k),
    "sgd_nesterov_maximize": lambda p, **k: torch.optim.SGD(
        p, lr=0.1, momentum=0.9, nesterov=True, maximize=True, fused=True, **k),
    "adagrad": lambda p, **k: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01, weight_decay=0.1,
                                                  fused=True, **k),
}


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def train(m, opt, dev, steps=4, scaler=None, inf_at=None):
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
        if i == inf_at:
            x[0, 0] = float("inf")
        opt.zero_grad()
        loss = nn.functional.mse_loss(m(x.to(dev)), y.to(dev))
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()


def assert_trained_alike(cpu_model, tpu_model):
    for (name, want), got in zip(cpu_model.named_parameters(), tpu_model.parameters()):
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=2e-5, atol=2e-6,
                                   msg=name)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_a_fused_step_trains_as_cpus_fused_step(mode, config):
    ref, m = model(), model().to("tpu")
    train(ref, CONFIGS[config](ref.parameters()), "cpu")
    deferfuse_torch.reset_fallback_counts()
    train(m, CONFIGS[config](m.parameters()), "tpu")
    assert deferfuse_torch.fallback_counts() == {}
    assert_trained_alike(ref, m)


@pytest.mark.parametrize("lr_device", ["cpu", "tpu"])
def test_a_tensor_learning_rate_trains_as_on_cpu(mode, lr_device):
    ref, m = model(), model().to("tpu")
    train(ref, torch.optim.AdamW(ref.parameters(), lr=torch.tensor(0.05), fused=True), "cpu")
    lr = torch.tensor(0.05, device=lr_device)
    deferfuse_torch.reset_fallback_counts()
    train(m, torch.optim.AdamW(m.parameters(), lr=lr, fused=True), "tpu")
    assert deferfuse_torch.fallback_counts() == {}
    assert_trained_alike(ref, m)


@pytest.mark.parametrize("config", ["adamw", "sgd_momentum"])
def test_grad_scaler_skips_the_step_with_an_inf_gradient_as_on_cpu(mode, config):
    ref, m = model(), model().to("tpu")
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    scaler = torch.amp.GradScaler("tpu", init_scale=256.0)
    train(ref, CONFIGS[config](ref.parameters()), "cpu", scaler=ref_scaler, inf_at=2)
    train(m, CONFIGS[config](m.parameters()), "tpu", scaler=scaler, inf_at=2)
    assert scaler.get_scale() == ref_scaler.get_scale() == 128.0
    assert_trained_alike(ref, m)


def test_a_found_inf_step_changes_no_parameter_or_state(mode):
    m = model().to("tpu")
    opt = torch.optim.Adam(m.parameters(), lr=0.05, fused=True)
    train(m, opt, "tpu", steps=1)
    before = copy.deepcopy((list(m.parameters()), opt.state_dict()["state"]))
    for p in m.parameters():
        p.grad = torch.ones_like(p)
    params = list(m.parameters())
    state = [opt.state[p] for p in params]
    torch._fused_adam_(params, [p.grad for p in params], [s["exp_avg"] for s in state],
                       [s["exp_avg_sq"] for s in state], [], [s["step"] for s in state],
                       lr=0.05, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8,
                       amsgrad=False, maximize=False,
                       found_inf=torch.ones((), device="tpu"))
    for got, want in zip(m.parameters(), before[0]):
        assert torch.equal(got.cpu(), want.cpu())
    for i, s in enumerate(state):
        assert torch.equal(s["exp_avg"].cpu(), before[1][i]["exp_avg"].cpu())
        assert torch.equal(s["exp_avg_sq"].cpu(), before[1][i]["exp_avg_sq"].cpu())


def one_step(config, dev, dtype, param, grad, steps=1):
    """`steps` steps of CONFIGS[config] on one parameter of `dtype` with gradient `grad`."""
    p = param.to(dtype).to(dev).clone().requires_grad_()
    opt = CONFIGS[config]([p])
    for _ in range(steps):
        p.grad = grad.to(dtype).to(dev)
        opt.step()
    return p.detach().cpu(), {k: v.cpu() for k, v in opt.state[p].items()}


@pytest.mark.parametrize("config", ["adam", "adamw", "sgd_momentum", "adagrad"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_step_computes_in_float32_and_rounds_once_as_cpus(mode, config, dtype):
    # CPU's fused kernels read a half-precision parameter, gradient and state into float32 and
    # round each stored value once; op by op in the half type the values drifted by an ulp,
    # and in float16 Adam's eps (1e-8) rounded to 0, so a zero gradient gave 0/0 = NaN.
    torch.manual_seed(0)
    param, grad = torch.randn(64), torch.randn(64) * 0.5
    grad[::7] = 0.0
    want_p, want_state = one_step(config, "cpu", dtype, param, grad, steps=3)
    got_p, got_state = one_step(config, "tpu", dtype, param, grad, steps=3)
    # The same bits, but where CPU's vector loop fuses a multiply-add (SGD's momentum, whose
    # float32 value then rounds to the neighbouring half value at a tie's edge): one unit.
    ulps = 1 if config == "sgd_momentum" else 0
    for k, v in [("param", want_p), *want_state.items()]:
        got = got_p if k == "param" else got_state[k]
        torch.testing.assert_close(got, v, rtol=ulps * torch.finfo(dtype).eps, atol=0, msg=k)


@pytest.mark.parametrize("config", ["adam", "adamw_amsgrad", "adagrad"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_steps_scalars_are_computed_in_float64_as_cpus(mode, config, dtype):
    # The bias corrections, Adam's step size and Adagrad's decayed rate come from the step
    # count in float64 (CPU computes them on the host): in float32 Adam drifted ~7e-6
    # relative a step at the default betas, and float64 parameters kept float32's precision.
    torch.manual_seed(1)
    param, grad = torch.randn(32), torch.randn(32)
    want, _ = one_step(config, "cpu", dtype, param, grad, steps=5)
    got, _ = one_step(config, "tpu", dtype, param, grad, steps=5)
    # Within a few roundings of the parameters' scale (an element near zero after the update
    # keeps the absolute error of the values it came from).
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got, want, rtol=4 * eps, atol=8 * eps * want.abs().max().item())


@pytest.mark.parametrize("config", ["adam", "sgd_momentum", "adagrad"])
def test_a_fused_step_moves_no_version_counter_as_on_cpu(mode, config):
    # CPU's fused kernels write the parameters' memory below autograd: a graph that saved a
    # parameter before step() still runs its backward (with the updated values), on tpu too.
    results = {}
    for dev in ("cpu", "tpu"):
        w = torch.ones(3, device=dev, requires_grad=True)
        opt = CONFIGS[config]([w])
        w.grad = torch.ones(3, device=dev)
        y = (w * w).sum()
        before = w._version
        opt.step()
        assert w._version == before, dev
        y.backward()
        results[dev] = w.grad.cpu()
    torch.testing.assert_close(results["tpu"], results["cpu"])
