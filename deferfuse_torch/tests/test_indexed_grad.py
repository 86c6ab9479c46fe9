"""The gradient of indexing in a loop (`x[:, t]`, `x[..., a:b]`): select_backward and
slice_backward give CPU's values, and autograd's sum of them adds each into its view alone
(indexed_grad.cpp), so a loop over T steps does O(T) work, not O(T^2)."""
import pytest
import torch

import deferfuse_torch
from conftest import check


def scan(dev, create_graph=False):
    """A recurrence that indexes its inputs each step (as HF Mamba's slow path does): the loss
    and the gradients of both inputs."""
    torch.manual_seed(0)
    a = (torch.randn(4, 32, 16, 8) * 0.5).to(dev).requires_grad_()
    b = torch.randn(4, 16, 1, 8).to(dev).requires_grad_()
    s = torch.zeros(4, 32, 8, device=dev)
    outs = []
    for i in range(16):
        s = a[:, :, i] * s.tanh() + b[:, i]
        outs.append(s[..., 1:5].sum(-1) + s[:, 3:9:2].mean())
    loss = torch.stack(outs).pow(2).sum()
    ga, gb = torch.autograd.grad(loss, (a, b), create_graph=create_graph)
    return loss, ga, gb


@pytest.mark.parametrize("create_graph", [False, True])
def test_gradients_of_indexing_in_a_loop_are_cpus(mode, create_graph):
    for got, want in zip(scan("tpu", create_graph), scan("cpu")):
        check(got.detach(), want, rtol=1e-5, atol=1e-4)


def test_the_sum_of_indexed_gradients_runs_no_whole_tensor_add_per_step():
    # Each step's gradient is added into its slice of a's gradient: of the program runs over
    # a's whole shape, at most a few remain (its zeros, a copy), not one per step.
    with deferfuse_torch.mode("defer"):
        report = deferfuse_torch.explain(lambda: scan("tpu")[1].sum().item())
    whole = [e for e in report.timeline["traceEvents"]
             if e.get("cat") == "run" and "[4, 32, 16, 8]" in str(e.get("args", {}).get("shapes"))]
    assert len(whole) <= 4, [e["name"] for e in whole]


@pytest.mark.parametrize("args", [(1, 2), (2, -3), (0, 0)])
def test_select_backward_is_cpus(mode, args):
    dim, index = args
    g = torch.randn(3, 4, 5)
    g = g.select(dim, 0)
    check(torch.ops.aten.select_backward(g.to("tpu"), [3, 4, 5], dim, index),
          torch.ops.aten.select_backward(g, [3, 4, 5], dim, index))


@pytest.mark.parametrize("args", [(1, 1, 4, 2), (2, -3, 2**62, 1), (0, 0, 2, 1)])
def test_slice_backward_is_cpus(mode, args):
    dim, start, end, step = args
    sizes = [3, 4, 5]
    g = torch.zeros(sizes)[(slice(None),) * dim + (slice(start, end, step),)]
    g = torch.randn(g.shape)
    check(torch.ops.aten.slice_backward(g.to("tpu"), sizes, dim, start, end, step),
          torch.ops.aten.slice_backward(g, sizes, dim, start, end, step))


def sb(g, sizes, dim, index):
    return torch.ops.aten.select_backward(g, sizes, dim, index)


def test_an_indexed_gradient_added_to_a_tensor_is_the_dense_sum(mode):
    g, x = torch.randn(4, 5), torch.randn(3, 4, 5)
    check(x.to("tpu") + sb(g.to("tpu"), [3, 4, 5], 0, 1), x + sb(g, [3, 4, 5], 0, 1))
    g1 = torch.randn(3, 5)
    check(sb(g1.to("tpu"), [3, 4, 5], 1, 2) + x.to("tpu"), sb(g1, [3, 4, 5], 1, 2) + x)


def test_an_indexed_gradient_added_in_place_is_the_dense_sum(mode):
    g, x = torch.randn(4, 5), torch.randn(3, 4, 5)
    d_x = x.to("tpu")
    d_x.add_(sb(g.to("tpu"), [3, 4, 5], 0, 1), alpha=2.0)
    check(d_x, x.add_(sb(g, [3, 4, 5], 0, 1), alpha=2.0))


def test_an_indexed_gradient_whose_gradient_was_written_after_adds_its_own_values(mode):
    g = torch.ones(4, 5, device="tpu")
    t = sb(g, [3, 4, 5], 0, 1)
    g.mul_(3.0)  # t holds a copy of the ones
    check(torch.zeros(3, 4, 5, device="tpu") + t, sb(torch.ones(4, 5), [3, 4, 5], 0, 1))


def test_an_indexed_gradient_written_after_it_was_made_adds_as_written(mode):
    t = sb(torch.ones(4, 5, device="tpu"), [3, 4, 5], 0, 1)
    t.add_(1.0)
    check(torch.zeros(3, 4, 5, device="tpu") + t, sb(torch.ones(4, 5), [3, 4, 5], 0, 1) + 1.0)
    t2 = sb(torch.ones(4, 5, device="tpu"), [3, 4, 5], 0, 2)
    t2[0].fill_(7.0)  # through a view of the whole
    want = sb(torch.ones(4, 5), [3, 4, 5], 0, 2)
    want[0] = 7.0
    check(torch.zeros(3, 4, 5, device="tpu") + t2, want)


def test_an_indexed_gradient_keeps_the_other_operands_negative_zeros():
    # The one difference from a dense add (README): outside the view, x's -0.0 stays -0.0
    # where CPU's `-0.0 + 0.0` gives +0.0.
    x = torch.full((3, 2), -0.0)
    g = torch.ones(2)
    got = (x.to("tpu") + torch.ops.aten.select_backward(g.to("tpu"), [3, 2], 0, 1)).cpu()
    want = x + torch.ops.aten.select_backward(g, [3, 2], 0, 1)
    assert torch.equal(got, want)
    assert torch.signbit(got[0]).all() and not torch.signbit(want[0]).any()


def manual_sgd_after_accumulation(dev):
    w = torch.zeros(4, 3, device=dev, requires_grad=True)
    w[1].sum().backward()  # w.grad is select_backward's result
    (w * 2).sum().backward()  # accumulated into w.grad in place
    w.data.add_(w.grad.data, alpha=-1.0)  # `.data` aliases share no version counter
    return w.detach()


def test_a_write_through_an_alias_without_the_version_counter_is_seen(mode):
    # Found by review: the note survived the accumulation, and the add through `.data`
    # (whose counter starts at 0) added the first gradient's row alone.
    check(manual_sgd_after_accumulation("tpu"), manual_sgd_after_accumulation("cpu"))


def test_an_indexed_gradient_added_with_a_non_finite_alpha_is_the_dense_sum(mode):
    g, x = torch.ones(3), torch.zeros(2, 3)
    for alpha in (float("inf"), float("nan")):
        want = x + alpha * sb(g, [2, 3], 0, 1)  # inf * 0 is NaN outside the view
        check(x.to("tpu").add(sb(g.to("tpu"), [2, 3], 0, 1), alpha=alpha), want)


def test_adding_an_indexed_gradient_into_an_expanded_tensor_raises(mode):
    x = torch.zeros(1, 3, device="tpu").expand(4, 3)
    with pytest.raises(RuntimeError):
        x.add_(sb(torch.ones(3, device="tpu"), [4, 3], 0, 1))


def test_a_write_to_the_gradient_through_an_alias_is_not_seen_by_the_sum(mode):
    # The note keeps its own copy of the view's gradient: select_backward's result holds the
    # values the gradient had when it was made, whatever is written into the gradient later.
    g = torch.ones(3, device="tpu")
    t = sb(g, [2, 3], 0, 1)
    g.data.mul_(5.0)
    check(torch.zeros(2, 3, device="tpu") + t, sb(torch.ones(3), [2, 3], 0, 1))
