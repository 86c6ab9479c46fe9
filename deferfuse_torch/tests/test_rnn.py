"""Recurrent layers on "tpu": nn.LSTM, nn.GRU and their cells take PyTorch's fused-cell path on
every device but CPU (_thnn_fused_lstm_cell / _thnn_fused_gru_cell, CUDA-only kernels), which
the device composes from its own ops (csrc/rnn.cpp). Each must run with no CPU fallback and
give CPU's outputs, gradients and training losses, in every mode."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import deferfuse_torch

from conftest import check


def both(module):
    """The CPU module and its copy on tpu (same weights)."""
    torch.manual_seed(0)
    cpu = module()
    return cpu, copy.deepcopy(cpu).to("tpu")


def train_losses(model, loss_fn, steps=3):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_a_stacked_bidirectional_rnn_trains_with_cpus_losses_and_no_fallback(mode, kind):
    cpu, dev = both(lambda: getattr(nn, kind)(8, 16, num_layers=2, batch_first=True,
                                              bidirectional=True))
    head_cpu, head_dev = both(lambda: nn.Linear(32, 3))
    x, y = torch.randn(4, 7, 8), torch.tensor([0, 2, 1, 2])

    def loss_fn(rnn, head, d):
        out, _ = rnn(x.to(d))
        return F.cross_entropy(head(out[:, -1]), y.to(d))

    want = train_losses(nn.ModuleList([cpu, head_cpu]), lambda m: loss_fn(m[0], m[1], "cpu"))
    deferfuse_torch.reset_fallback_counts()
    got = train_losses(nn.ModuleList([dev, head_dev]), lambda m: loss_fn(m[0], m[1], "tpu"))
    assert deferfuse_torch.fallback_counts() == {}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for p, q in zip(dev.parameters(), cpu.parameters()):
        check(p.detach(), q.detach(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell"])
def test_a_cell_gives_cpus_state_and_gradients(mode, kind):
    cpu, dev = both(lambda: getattr(nn, kind)(6, 10))
    x = torch.randn(5, 6)
    h0 = torch.randn(5, 10)
    state = (h0, torch.randn(5, 10)) if kind == "LSTMCell" else h0

    def run(cell, d):
        s = tuple(t.to(d) for t in state) if isinstance(state, tuple) else state.to(d)
        out = cell(x.to(d), s)
        h = out[0] if isinstance(out, tuple) else out
        (h * torch.arange(10.0, device=d)).sum().backward()
        return out

    want = run(cpu, "cpu")
    deferfuse_torch.reset_fallback_counts()
    got = run(dev, "tpu")
    assert deferfuse_torch.fallback_counts() == {}
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        check(g.detach(), w.detach())
    for p, q in zip(dev.parameters(), cpu.parameters()):
        check(p.grad, q.grad, atol=1e-5, rtol=1e-4)


def test_an_lstm_runs_under_inference_mode(mode):
    # Below autograd the cell is the device kernel itself, not the autograd registration.
    cpu, dev = both(lambda: nn.LSTM(8, 12, num_layers=2))
    x = torch.randn(9, 3, 8)
    with torch.inference_mode():
        want, (wh, wc) = cpu(x)
        deferfuse_torch.reset_fallback_counts()
        got, (gh, gc) = dev(x.to("tpu"))
        assert deferfuse_torch.fallback_counts() == {}
        for g, w in ((got, want), (gh, wh), (gc, wc)):
            check(g, w)


def test_a_packed_padded_batch_gives_cpus_outputs_and_gradients(mode):
    cpu, dev = both(lambda: nn.GRU(4, 6, batch_first=True))
    x, lengths = torch.randn(3, 5, 4), torch.tensor([5, 3, 2])

    def run(rnn, d):
        packed = nn.utils.rnn.pack_padded_sequence(x.to(d), lengths, batch_first=True)
        out, h = rnn(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        (padded.sum() + h.sum()).backward()
        return padded

    want = run(cpu, "cpu")
    deferfuse_torch.reset_fallback_counts()
    got = run(dev, "tpu")
    assert deferfuse_torch.fallback_counts() == {}
    check(got.detach(), want.detach())
    for p, q in zip(dev.parameters(), cpu.parameters()):
        check(p.grad, q.grad, atol=1e-5, rtol=1e-4)


def test_a_strict_lstm_cell_is_one_op_group_of_fewer_programs_than_ops():
    # The fused cell's pieces (bias adds, activations, state update, workspace) are one op
    # group: strict mode plans them together as it plans layer_norm's (one program per op
    # before; the planner still cuts where the shapes change, at the gate chunks).
    g_in, g_h, cx = torch.randn(4, 32), torch.randn(4, 32), torch.randn(4, 8)
    b_in, b_h = torch.randn(32), torch.randn(32)
    args = [t.to("tpu") for t in (g_in, g_h, cx, b_in, b_h)]
    with deferfuse_torch.mode("strict"), torch.no_grad():
        torch.tpu.synchronize()
        before = deferfuse_torch.stats()
        hy, cy, _ = torch.ops.aten._thnn_fused_lstm_cell(*args)
        torch.tpu.synchronize()
        after = deferfuse_torch.stats()
    ops = after["ops_recorded"] - before["ops_recorded"]
    programs = after["programs_run"] - before["programs_run"]
    assert ops >= 10 and programs <= ops // 2, (ops, programs)
    # CPU's cell on the same gates.
    gates = (g_h + b_h) + (g_in + b_in)
    i, f, g, o = gates.chunk(4, 1)
    want_cy = torch.sigmoid(f) * cx + torch.sigmoid(i) * torch.tanh(g)
    check(cy, want_cy)
    check(hy, torch.sigmoid(o) * torch.tanh(want_cy))


def cell_steps(kind, dev, dtype=torch.float64, bias=True, read_c=False):
    """A cell stepped 6 times in Python from a fixed state; returns (cell, x, h0, loss_fn)."""
    torch.manual_seed(0)
    cell = getattr(nn, kind)(5, 7, bias=bias).to(dev, dtype)
    x = torch.randn(6, 3, 5, dtype=dtype).to(dev)
    h0 = torch.randn(3, 7, dtype=dtype).to(dev)

    def loss_fn(params, h):
        state = (h, h * 0.5) if kind == "LSTMCell" else h
        total = 0
        for t in range(6):
            state = torch.func.functional_call(cell, params, (x[t], state))
            out = (state[1] if read_c else state[0]) if kind == "LSTMCell" else state
            total = total + (out * out).sum()
        return total

    return cell, h0, loss_fn


@pytest.mark.parametrize("kind, bias, read_c", [
    ("LSTMCell", True, False), ("LSTMCell", True, True), ("LSTMCell", False, False),
    ("GRUCell", True, False), ("GRUCell", False, False),
])
def test_a_cell_step_is_one_autograd_node_with_its_composed_gradients_bits(mode, kind, bias,
                                                                            read_c):
    # One node per step (its backward below autograd) instead of ~25 autograd nodes (the LSTM:
    # its state's node and hy's two): the same bits as autograd through the composed cell,
    # which torch.func's transforms still take.
    cell, h0, loss_fn = cell_steps(kind, "tpu", bias=bias, read_c=read_c)
    params = dict(cell.named_parameters())
    composed = torch.func.grad(loss_fn, argnums=(0, 1))(params, h0)
    leaves = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    h = h0.clone().requires_grad_()
    out = cell(torch.zeros(3, 5, dtype=h.dtype, device="tpu"),
               (h, h) if kind == "LSTMCell" else h)
    # The LSTM's node makes its state (cy); hy = o * tanh(cy) is autograd's own ops.
    node = (out[1] if kind == "LSTMCell" else out).grad_fn.name()
    assert ("LstmCellState" if kind == "LSTMCell" else "GruCell") in node, node
    loss_fn(leaves, h).backward()
    for k in params:
        assert torch.equal(leaves[k].grad.cpu(), composed[0][k].cpu()), k
    assert torch.equal(h.grad.cpu(), composed[1].cpu())


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell"])
def test_a_cell_gives_cpus_second_derivatives(kind):
    # create_graph=True: the node's backward takes PyTorch's differentiable formulas.
    got = {}
    for dev in ("cpu", "tpu"):
        cell, h0, loss_fn = cell_steps(kind, dev)
        params = dict(cell.named_parameters())
        h = h0.clone().requires_grad_()
        (g,) = torch.autograd.grad(loss_fn(params, h), h, create_graph=True)
        (gg,) = torch.autograd.grad(g.pow(2).sum(), params["weight_hh"])
        got[dev] = gg.cpu()
    torch.testing.assert_close(got["tpu"], got["cpu"], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell"])
def test_a_cell_takes_forward_mode_tangents_as_cpu(kind):
    got = {}
    for dev in ("cpu", "tpu"):
        cell, h0, loss_fn = cell_steps(kind, dev)
        params = dict(cell.named_parameters())
        tangent = torch.ones_like(h0)
        _, jvp = torch.func.jvp(lambda h: loss_fn(params, h), (h0,), (tangent,))
        got[dev] = jvp.cpu()
    torch.testing.assert_close(got["tpu"], got["cpu"], rtol=1e-9, atol=1e-10)


def lstm_cell_pair(dev):
    torch.manual_seed(0)
    cell = nn.LSTMCell(4, 5).to(dev)
    return cell, torch.randn(2, 4).to(dev)


def test_an_lstm_cells_cy_is_on_hys_path_as_in_cpus_graph(mode):
    # A hook on cy (retain_grad) sees its gradient through hy too; autograd.grad(hy, cy) works.
    got = {}
    for dev in ("cpu", "tpu"):
        cell, x = lstm_cell_pair(dev)
        h, c = cell(x)
        c.retain_grad()
        (h.sum() + c.sum()).backward()
        h2, c2 = cell(x)
        (through,) = torch.autograd.grad(h2.sum(), c2)
        got[dev] = (c.grad.cpu(), through.cpu())
    torch.testing.assert_close(got["tpu"], got["cpu"])


def test_an_lstm_cells_cy_may_be_written_in_place_before_the_backward(mode):
    # CPU's graph does not save cy (tanh saves its result), so this works there.
    got = {}
    for dev in ("cpu", "tpu"):
        cell, x = lstm_cell_pair(dev)
        h, c = cell(x)
        c.mul_(0.5)
        (h.sum() + c.sum()).backward()
        got[dev] = cell.weight_hh.grad.cpu()
    torch.testing.assert_close(got["tpu"], got["cpu"])
