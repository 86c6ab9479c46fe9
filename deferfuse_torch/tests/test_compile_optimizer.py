"""torch.compile of optimizer steps whose state is partly on the CPU: PyTorch keeps a default
(capturable=False) optimizer's step counts, and a tensor learning rate, as CPU tensors. The
compiled graph is split (deferfuse_torch/host_split.py): its CPU ops run at every call and
its device part is captured and launched with their values as inputs.

Each compiled step is compared bit for bit with the same compiled graph run with capture off
(`capture_enabled = False`: its ops dispatched one by one, CPU values read as they are, the
path every graph took before), and with the same compiled step on CPU tensors
(`backend="aot_eager"`: the graph's ops run by CPU eager) within a few ulps: the device's
eager ops already differ from CPU's in the last bit here (CPU's `add` with `alpha` fuses the
multiply-add in its vector loop only; `lerp`), capture or not. Both sides get the same
gradients, so only the optimizer's arithmetic is compared."""

import copy

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn as nn

import deferfuse_torch
from deferfuse_torch import compile_backend

STEPS = 5


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch.tpu.synchronize()


def params():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 3))
    return [p.detach() for p in model.parameters()]


def grads(step):
    torch.manual_seed(100 + step)
    return [torch.randn(p.shape) for p in params()]


def train(device, make_opt, make_sched=None, backend="tpu", counter=None):
    """The parameters after STEPS compiled optimizer steps on fixed gradients."""
    ps = [p.clone().to(device).requires_grad_() for p in params()]
    opt = make_opt(ps)
    sched = make_sched(opt) if make_sched else None
    step = torch.compile(opt.step, backend=counter or backend)
    for i in range(STEPS):
        for p, g in zip(ps, grads(i)):
            p.grad = g.to(device)
        step()
        if sched:
            sched.step()
    return [p.detach().cpu() for p in ps]


def dispatched(make_opt, make_sched=None):
    """The tpu result with capture off: the same graph's ops dispatched one by one."""
    compile_backend.capture_enabled = False
    try:
        torch._dynamo.reset()
        return train("tpu", make_opt, make_sched)
    finally:
        compile_backend.capture_enabled = True
        torch._dynamo.reset()


def assert_equal_bits(got, want):
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b), (a - b).abs().max()


def assert_close_to_cpu(got, make_opt, make_sched=None):
    torch._dynamo.reset()
    want = train("cpu", make_opt, make_sched, backend="aot_eager")
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def assert_captured_like_dispatched(make_opt, make_sched=None):
    """Trains captured; checks it against the dispatched and CPU runs; returns what the
    captured graphs did."""
    want = dispatched(make_opt, make_sched)
    counts = dict(compile_backend.counts)
    got = train("tpu", make_opt, make_sched)
    done = {k: compile_backend.counts[k] - counts[k] for k in counts}
    assert_equal_bits(got, want)
    assert_close_to_cpu(got, make_opt, make_sched)
    return done


def test_a_default_adamw_step_is_captured_and_matches_its_dispatched_graph():
    done = assert_captured_like_dispatched(lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    assert done["refused"] == 0 and done["fallback_calls"] == 0
    assert done["launches"] >= STEPS - 2


def test_a_default_adam_step_with_weight_decay_is_captured_like_its_dispatched_graph():
    done = assert_captured_like_dispatched(
        lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1))
    assert done["refused"] == 0 and done["launches"] >= STEPS - 2


def test_an_sgd_step_with_momentum_and_a_tensor_lr_is_captured_like_its_dispatched_graph():
    done = assert_captured_like_dispatched(
        lambda ps: torch.optim.SGD(ps, lr=torch.tensor(0.1), momentum=0.9, nesterov=True))
    assert done["refused"] == 0 and done["launches"] >= STEPS - 2


def test_an_lr_schedule_changing_a_tensor_lr_each_step_is_launched_with_each_new_lr():
    def make_opt(ps):
        return torch.optim.AdamW(ps, lr=torch.tensor(1e-2))

    def make_sched(opt):
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (i + 1))

    want = dispatched(make_opt, make_sched)
    counter = torch._dynamo.testing.CompileCounterWithBackend("tpu")
    counts = dict(compile_backend.counts)
    got = train("tpu", make_opt, make_sched, counter=counter)
    assert_equal_bits(got, want)
    assert_close_to_cpu(got, make_opt, make_sched)
    # The lr is a graph input: one compile, one capture, every later step a launch.
    assert counter.frame_count == 1
    assert compile_backend.counts["captures"] - counts["captures"] == 1
    assert compile_backend.counts["launches"] - counts["launches"] == STEPS - 1


def test_a_float_lr_schedule_recompiles_and_each_graph_matches_its_dispatched_graph():
    assert_captured_like_dispatched(
        lambda ps: torch.optim.AdamW(ps, lr=1e-2),
        lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5))


def test_a_capturable_adamw_step_is_captured_whole_with_no_host_part(monkeypatch):
    made = []
    original = compile_backend.CapturedGraph

    def record(gm):
        made.append(original(gm))
        return made[-1]

    monkeypatch.setattr(compile_backend, "CapturedGraph", record)
    ps = [p.clone().to("tpu").requires_grad_() for p in params()]
    opt = torch.optim.AdamW(ps, lr=1e-2, capturable=True)
    step = torch.compile(opt.step, backend="tpu")
    for i in range(3):
        for p, g in zip(ps, grads(i)):
            p.grad = g.to("tpu")
        step()
    assert made and all(g.split is None for g in made)
    assert all(s["step"].device.type == "tpu" for s in opt.state.values())


def test_a_cpu_value_the_graph_updates_is_read_by_the_device_ops_as_it_was_at_the_call():
    def f(w, s):
        w.mul_(s)  # reads s before the graph adds to it
        s.add_(1)
        return w * s

    compiled = torch.compile(f, backend="tpu")
    w, s = torch.randn(5), torch.tensor(2.0)
    wt, st = w.clone().to("tpu"), s.clone()
    for _ in range(3):
        want = f(w, s)
        got = compiled(wt, st)
        assert torch.equal(got.cpu(), want)
        assert torch.equal(wt.cpu(), w) and torch.equal(st, s)
    assert compile_backend.counts["launches"] >= 1


def test_a_cpu_result_of_the_graph_comes_back_as_a_cpu_tensor():
    def f(x, s):
        t = s * 3
        return x + t, t

    compiled = torch.compile(f, backend="tpu")
    x = torch.randn(4)
    for v in (1.0, 2.0, 5.0):
        s = torch.tensor(v)
        got, t = compiled(x.to("tpu"), s)
        want, want_t = f(x, s)
        assert t.device.type == "cpu" and torch.equal(t, want_t)
        assert torch.equal(got.cpu(), want)


def test_a_cpu_tensor_the_graph_moves_to_the_device_is_uploaded_at_each_launch():
    def f(x, c):
        return x * c.to(x.device) + 1

    compiled = torch.compile(f, backend="tpu")
    x = torch.randn(3, 4)
    launches = compile_backend.counts["launches"]
    for seed in range(3):
        torch.manual_seed(seed)
        c = torch.randn(3, 4)
        assert torch.equal(compiled(x.to("tpu"), c).cpu(), f(x, c))
    assert compile_backend.counts["launches"] == launches + 2
