import pytest
import torch

import deferfuse_torch

MODES = ["strict", "debug", "defer"]


@pytest.fixture(params=MODES)
def mode(request):
    """Runs the test body in each eager mode (set through the package's context manager)."""
    with deferfuse_torch.mode(request.param):
        yield request.param
    torch.tpu.synchronize()


def check(got, want, atol=1e-5, rtol=1e-5):
    """got: a tpu tensor; want: the CPU result. Same dtype, shape and values."""
    assert got.device.type == "tpu", got.device
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    torch.testing.assert_close(got.cpu(), want, atol=atol, rtol=rtol, equal_nan=True)


def run_both(fn, *inputs):
    """fn on CPU and on tpu with the same inputs; backward with the same random grad_output.
    Returns ((out, grads) on CPU, (out, grads) on tpu, the tpu fallback counts)."""
    cpu = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*cpu)
    outs = out if isinstance(out, tuple) else (out,)
    grad = torch.randn_like(outs[0])
    outs[0].backward(grad)
    dev = [t.detach().to("tpu").requires_grad_(t.is_floating_point()) for t in inputs]
    deferfuse_torch.reset_fallback_counts()
    dout = fn(*dev)
    douts = dout if isinstance(dout, tuple) else (dout,)
    douts[0].backward(grad.to("tpu"))
    fallbacks = deferfuse_torch.fallback_counts()
    return ((outs, [t.grad for t in cpu if t.requires_grad]),
            (douts, [t.grad for t in dev if t.requires_grad]), fallbacks)


def assert_same(fn, *inputs, atol=1e-5, rtol=1e-5):
    (want, want_g), (got, got_g), fallbacks = run_both(fn, *inputs)
    assert fallbacks == {}
    for g, w in zip(got, want):
        check(g, w.detach(), atol=atol, rtol=rtol)
    for g, w in zip(got_g, want_g):
        check(g, w, atol=atol, rtol=rtol)


def trains_like_cpu(build, loss_fn, steps=3, lr=1e-2):
    """A model built for CPU and for tpu from the same seed (`build(device)` returns it on that
    device), trained `steps` AdamW steps on `loss_fn(model, device)`: the tpu run must give
    CPU's losses with no op on the CPU fallback."""
    losses = {}
    for dev in ("cpu", "tpu"):
        torch.manual_seed(0)
        model = build(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        deferfuse_torch.reset_fallback_counts()
        losses[dev] = []
        for _ in range(steps):
            opt.zero_grad()
            loss = loss_fn(model, dev)
            loss.backward()
            opt.step()
            losses[dev].append(loss.item())
        if dev == "tpu":
            assert deferfuse_torch.fallback_counts() == {}
    torch.testing.assert_close(losses["tpu"], losses["cpu"], rtol=1e-5, atol=1e-6)


def raises_like_cpu(call, x):
    """call(x) raises on CPU and on tpu (x moved there), with the same first line."""
    with pytest.raises(RuntimeError) as cpu:
        call(x)
    with pytest.raises(RuntimeError) as tpu:
        call(x.to("tpu"))
    assert str(tpu.value).split("\n")[0] == str(cpu.value).split("\n")[0]
