"""Where a tpu backward runs: on the thread that calls it, as PyTorch runs a CPU backward, not
on PyTorch's device thread for "tpu" (common.cpp says why). Hooks see the caller's thread, and
steps that differentiate inside the step (autograd.grad with create_graph, as MAML does) record
the same ops every time, so they compile nothing after warm-up."""
import threading

import torch
import torch.nn.functional as F
from torch.func import functional_call

import deferfuse_torch


def hook_threads(x):
    """The threads a gradient hook on `x * 2` ran on during one backward."""
    seen = []
    y = x * 2
    y.register_hook(lambda g: seen.append(threading.get_ident()))
    y.sum().backward()
    return seen


def test_a_tpu_backward_runs_its_hooks_on_the_calling_thread_as_cpu_does():
    me = threading.get_ident()
    assert hook_threads(torch.ones(3, requires_grad=True)) == [me]
    assert hook_threads(torch.ones(3, device="tpu", requires_grad=True)) == [me]


def test_a_new_thread_runs_its_own_tpu_backward():
    result = {}

    def worker():
        x = torch.ones(3, device="tpu", requires_grad=True)
        result["threads"] = hook_threads(x)
        result["me"] = threading.get_ident()
        result["grad"] = x.grad.cpu()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert result["threads"] == [result["me"]]
    torch.testing.assert_close(result["grad"], torch.full((3,), 2.0))


def test_multithreading_enabled_still_runs_the_backward_on_the_device_thread():
    # PyTorch's own switch keeps working: inside it the device's worker thread runs the backward.
    x = torch.ones(3, device="tpu", requires_grad=True)
    with torch.autograd.set_multithreading_enabled(True):
        threads = hook_threads(x)
    assert threads != [threading.get_ident()]
    torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 2.0))


def meta_step(net, opt, tasks):
    """One MAML step: two inner SGD steps per task through autograd.grad(create_graph=True)."""
    params = dict(net.named_parameters())
    outer = 0.0
    for xs, ys, xq, yq in tasks:
        fast = params
        for _ in range(2):
            loss = F.mse_loss(functional_call(net, fast, (xs,)), ys)
            grads = torch.autograd.grad(loss, list(fast.values()), create_graph=True)
            fast = {k: v - 0.01 * g for (k, v), g in zip(fast.items(), grads)}
        outer = outer + F.mse_loss(functional_call(net, fast, (xq,)), yq)
    opt.zero_grad()
    outer.backward()
    opt.step()
    return outer.item()


def test_create_graph_meta_learning_steps_compile_nothing_after_warm_up():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                              torch.nn.ReLU(), torch.nn.Linear(32, 1)).to("tpu")
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    tasks = [tuple(torch.randn(10, 1).to("tpu") for _ in range(4)) for _ in range(4)]
    with deferfuse_torch.mode("defer"):
        for _ in range(4):
            meta_step(net, opt, tasks)
        before = deferfuse_torch.stats()["programs_compiled"]
        for _ in range(8):
            meta_step(net, opt, tasks)
        assert deferfuse_torch.stats()["programs_compiled"] == before
