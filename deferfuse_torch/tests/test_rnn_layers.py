"""nn.LSTM, nn.GRU and nn.RNN on padded input as one autograd node per call
(csrc/rnn_layers.cpp): each layer's input products as one GEMM, the steps below autograd, a
backward of its own with the weight gradients as one product over all steps. Outputs, final
states and every gradient must be CPU's (within float32 rounding: the weight gradients sum over
steps in another order), in every mode; what the node does not cover keeps PyTorch's path."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import deferfuse_torch

from conftest import check


KINDS = ["LSTM", "GRU", "RNN", "RNN_relu"]


def layer(kind, *args, **kwargs):
    """nn.LSTM, nn.GRU or nn.RNN (tanh, or relu for "RNN_relu")."""
    if kind == "RNN_relu":
        return nn.RNN(*args, nonlinearity="relu", **kwargs)
    return getattr(nn, kind)(*args, **kwargs)


def pair(make):
    torch.manual_seed(0)
    cpu = make()
    return cpu, copy.deepcopy(cpu).to("tpu")


def run(rnn, x, state, grads, device):
    """Forward from `state`, backward of every output against its random grad; returns the
    outputs and the gradients of x, of the state and of every parameter."""
    x = x.detach().clone().to(device).requires_grad_()
    state = tuple(s.detach().clone().to(device).requires_grad_() for s in state)
    out, last = rnn(x, state if len(state) == 2 else state[0])
    last = last if isinstance(last, tuple) else (last,)
    loss = sum((t * g.to(device)).sum() for t, g in zip((out, *last), grads) if g is not None)
    loss.backward()
    return [out, *last], [x.grad, *(s.grad for s in state), *(p.grad for p in rnn.parameters())]


CASES = [
    # kind, batch_first, bidirectional, bias, layers, dtype
    ("LSTM", False, True, True, 3, torch.float32),
    ("LSTM", True, False, False, 1, torch.float32),
    ("LSTM", True, True, True, 2, torch.float64),
    ("GRU", True, True, True, 2, torch.float32),
    ("GRU", False, False, False, 1, torch.float32),
    ("RNN", True, True, True, 2, torch.float32),
    ("RNN_relu", False, False, False, 1, torch.float32),
    ("RNN", False, True, True, 2, torch.float64),
]


@pytest.mark.parametrize("kind,batch_first,bidirectional,bias,layers,dtype", CASES)
def test_outputs_final_state_and_every_gradient_match_cpu(
        mode, kind, batch_first, bidirectional, bias, layers, dtype):
    cpu, dev = pair(lambda: layer(kind, 5, 7, num_layers=layers, bias=bias,
                                              batch_first=batch_first,
                                              bidirectional=bidirectional).to(dtype))
    T, B, D = 6, 3, 2 if bidirectional else 1
    x = torch.randn((B, T, 5) if batch_first else (T, B, 5), dtype=dtype)
    state = tuple(torch.randn(layers * D, B, 7, dtype=dtype) for _ in range(2 if kind == "LSTM"
                                                                             else 1))
    grads = [torch.randn((B, T, D * 7) if batch_first else (T, B, D * 7), dtype=dtype)]
    grads += [torch.randn(layers * D, B, 7, dtype=dtype) for _ in state]
    want_out, want_grads = run(cpu, x, state, grads, "cpu")
    deferfuse_torch.reset_fallback_counts()
    got_out, got_grads = run(dev, x, state, grads, "tpu")
    assert deferfuse_torch.fallback_counts() == {}
    for g, w in zip(got_out, want_out):
        check(g.detach(), w.detach())
    for g, w in zip(got_grads, want_grads):
        check(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_a_gradient_through_the_final_state_alone_matches_cpu(mode, kind):
    # The output gets no gradient: the backward starts from h_n (and c_n) only.
    cpu, dev = pair(lambda: layer(kind, 4, 6, num_layers=2))
    x = torch.randn(5, 2, 4)
    state = tuple(torch.randn(2, 2, 6) for _ in range(2 if kind == "LSTM" else 1))
    grads = [None] + [torch.randn(2, 2, 6) for _ in state]
    want_out, want_grads = run(cpu, x, state, grads, "cpu")
    got_out, got_grads = run(dev, x, state, grads, "tpu")
    for g, w in zip(got_grads, want_grads):
        check(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_a_layer_call_is_one_autograd_node(kind):
    # The weights' gradient accumulators hang off the output's node directly: no per-step
    # products or cells in between.
    _, dev = pair(lambda: layer(kind, 4, 6, num_layers=2))
    out, _ = dev(torch.randn(5, 2, 4, device="tpu"))
    children = {id(f.variable) for f, _ in out.grad_fn.next_functions
                if f is not None and hasattr(f, "variable")}
    assert {id(p) for p in dev.parameters()} <= children


@pytest.mark.parametrize("kind", KINDS)
def test_a_strict_step_runs_a_few_programs_not_one_per_gate_op(kind):
    # Each step is an op group: its hidden product and its gate arithmetic run as a fused
    # flush of just that step would (3-4 programs), not one program per recorded op (~11).
    _, dev = pair(lambda: layer(kind, 8, 16))
    steps = 12
    x = torch.randn(steps, 3, 8, device="tpu")
    with deferfuse_torch.mode("strict"), torch.no_grad():
        dev(x)
        torch.tpu.synchronize()
        before = deferfuse_torch.stats()["programs_run"]
        dev(x)[0].cpu()
        programs = deferfuse_torch.stats()["programs_run"] - before
    assert programs <= 4 * steps + 6, programs


def recorded_ops(fn):
    torch.tpu.synchronize()
    before = deferfuse_torch.stats()["ops_recorded"]
    fn()
    return deferfuse_torch.stats()["ops_recorded"] - before


@pytest.mark.parametrize("kind", KINDS)
def test_a_float32_layer_records_its_steps_as_one_op_each_way(mode, kind):
    # The steps of each layer and direction run as one kernel op forward and one backward, so
    # a training step records as many ops for 24 steps as for 3.
    _, dev = pair(lambda: layer(kind, 8, 16, num_layers=2, bidirectional=True))

    def step(steps):
        x = torch.randn(steps, 3, 8, device="tpu", requires_grad=True)
        out, last = dev(x)
        (out.sum() + sum(t.sum() for t in (last if kind == "LSTM" else (last,)))).backward()

    step(3)
    assert recorded_ops(lambda: step(24)) == recorded_ops(lambda: step(3))


@pytest.mark.parametrize("kind", KINDS)
def test_the_output_is_contiguous_as_on_cpu(mode, kind):
    # The kernel op's result holds the gates and the states side by side; the layer's output
    # is nonetheless a tensor of its own, as CPU's is (a user's .view() of it must work).
    cpu, dev = pair(lambda: layer(kind, 4, 6))
    x = torch.randn(5, 2, 4)
    out, last = dev(x.to("tpu"))
    want, want_last = cpu(x)
    assert out.is_contiguous() and out.view(10, 6).shape == (10, 6)
    check(out.detach(), want.detach())
    for g, w in zip(last if kind == "LSTM" else (last,),
                    want_last if kind == "LSTM" else (want_last,)):
        check(g.detach(), w.detach())


@pytest.mark.parametrize("kind", KINDS)
def test_the_output_may_be_written_in_place_before_the_backward(mode, kind):
    # The output is a tensor no backward keeps (the kernel op's result, which the node keeps,
    # holds the steps' h too, but the output is a copy). CPU's GRU and RNN allow this as well;
    # its oneDNN LSTM layer keeps its output and raises (README: where "tpu" differs), so the
    # LSTM's gradients are compared with CPU's for the same loss without the write.
    cpu, dev = pair(lambda: layer(kind, 4, 6))
    x = torch.randn(5, 2, 4)

    def grads(rnn, device, write):
        out, _ = rnn(x.to(device))
        if write:
            out.mul_(2)
        (out.sum() * (1 if write else 2)).backward()
        return [p.grad for p in rnn.parameters()]

    want = grads(cpu, "cpu", kind != "LSTM")
    for g, w in zip(grads(dev, "tpu", True), want):
        check(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_dropout_between_layers_draws_the_masks_f_dropout_draws(mode, kind):
    # Same seed: a 2-layer RNN with dropout equals its two layers run apart with F.dropout
    # between them (the same draws from the device's generator), values and gradients.
    torch.manual_seed(0)
    whole = layer(kind, 4, 6, num_layers=2, dropout=0.4).to("tpu")
    first, second = layer(kind, 4, 6).to("tpu"), layer(kind, 6, 6).to("tpu")
    with torch.no_grad():
        for name, p in whole.named_parameters():
            part, suffix = (first, name) if name.endswith("l0") else (second, name[:-1] + "0")
            getattr(part, suffix).copy_(p)
    x = torch.randn(5, 3, 4, device="tpu")
    torch.manual_seed(7)
    got, _ = whole(x)
    torch.manual_seed(7)
    want, _ = second(F.dropout(first(x)[0], 0.4, training=True))
    check(got.detach(), want.detach().cpu())
    got.sum().backward()
    want.sum().backward()
    pairs = [(p, getattr(first if n.endswith("l0") else second, n if n.endswith("l0")
                         else n[:-1] + "0")) for n, p in whole.named_parameters()]
    for p, q in pairs:
        check(p.grad, q.grad.cpu(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_a_double_backward_matches_cpu(mode, kind):
    # The step-by-step path, which autograd records (the kernel op has no double backward).
    cpu, dev = pair(lambda: layer(kind, 3, 4))
    x = torch.randn(4, 2, 3)

    def grads(rnn, device):
        xd = x.to(device).requires_grad_()
        out, _ = rnn(xd)
        (gx,) = torch.autograd.grad((out ** 2).sum(), xd, create_graph=True)
        gx.pow(2).sum().backward()
        return [p.grad for p in rnn.parameters()]

    for g, w in zip(grads(dev, "tpu"), grads(cpu, "cpu")):
        check(g, w, atol=1e-5, rtol=1e-4)


def test_an_lstm_with_a_projection_keeps_pytorchs_path_and_cpus_results(mode):
    cpu, dev = pair(lambda: nn.LSTM(4, 8, proj_size=3, num_layers=2))
    x = torch.randn(5, 2, 4)
    want, _ = cpu(x)
    want.sum().backward()
    deferfuse_torch.reset_fallback_counts()
    got, _ = dev(x.to("tpu"))
    got.sum().backward()
    assert deferfuse_torch.fallback_counts() == {}
    check(got.detach(), want.detach())
    for p, q in zip(dev.parameters(), cpu.parameters()):
        check(p.grad, q.grad, atol=1e-5, rtol=1e-4)


def test_a_state_passed_twice_gets_its_gradient_once_in_a_double_backward(mode):
    # lstm(x, (h, h)): autograd adds the gradients of both slots; each must hold its own part.
    cpu, dev = pair(lambda: nn.LSTM(3, 4))
    x, h = torch.randn(4, 2, 3), torch.randn(1, 2, 4)

    def grads(rnn, device):
        xd, hd = x.to(device).requires_grad_(), h.detach().clone().to(device).requires_grad_()
        out, _ = rnn(xd, (hd, hd))
        (gh,) = torch.autograd.grad((out ** 2).sum(), hd, create_graph=True)
        gh.pow(2).sum().backward()
        return [gh.detach(), *(p.grad for p in rnn.parameters())]

    for g, w in zip(grads(dev, "tpu"), grads(cpu, "cpu")):
        check(g, w, atol=1e-5, rtol=1e-4)


def test_the_steps_kept_for_the_backward_are_freed_by_it():
    # With the loss (and so the graph) still referenced, what the node kept per step goes once
    # its backward ran: a training loop holding last step's loss does not hold its activations.
    rnn = nn.LSTM(16, 64, num_layers=2).to("tpu")
    x = torch.randn(50, 8, 16, device="tpu")
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    out, _ = rnn(x)
    loss = out.sum()
    torch.tpu.synchronize()
    held = torch.tpu.memory_allocated() - base
    loss.backward()
    torch.tpu.synchronize()
    after = torch.tpu.memory_allocated() - base
    assert after < held / 2, (held, after)


@pytest.mark.parametrize("kind", KINDS)
def test_under_no_grad_the_forward_alone_gives_cpus_outputs(mode, kind):
    cpu, dev = pair(lambda: layer(kind, 4, 6, num_layers=2, bidirectional=True))
    x = torch.randn(5, 3, 4)
    with torch.no_grad():
        want, want_h = cpu(x)
        got, got_h = dev(x.to("tpu"))
    assert got.grad_fn is None
    check(got, want)
    for g, w in zip(got_h if kind == "LSTM" else (got_h,), want_h if kind == "LSTM" else (want_h,)):
        check(g, w)


def run_under_autocast(rnn, x, state, grads, device, inside):
    """`run` in a bfloat16 autocast region of `device`: the backward inside it too, or (not
    `inside`) after it."""
    if inside:
        with torch.autocast(device, dtype=torch.bfloat16):
            return run(rnn, x, state, grads, device)
    xd = x.detach().clone().to(device).requires_grad_()
    sd = tuple(s.detach().clone().to(device).requires_grad_() for s in state)
    with torch.autocast(device, dtype=torch.bfloat16):
        out, last = rnn(xd, sd if len(sd) == 2 else sd[0])
    last = last if isinstance(last, tuple) else (last,)
    sum((t * g.to(device)).sum() for t, g in zip((out, *last), grads)).backward()
    return [out, *last], [xd.grad, *(s.grad for s in sd), *(p.grad for p in rnn.parameters())]


@pytest.mark.parametrize("inside", [False, True])
def test_under_autocast_a_gru_runs_in_float32_as_on_cpu(mode, inside):
    # CPU's GRU stays float32 under autocast; tpu's runs wholly in float32 (autocast off inside
    # the layer, its backward too): CPU's float32 results.
    cpu, dev = pair(lambda: layer("GRU", 4, 6, num_layers=2))
    x, state = torch.randn(5, 2, 4), (torch.randn(2, 2, 6),)
    grads = [torch.randn(5, 2, 6), torch.randn(2, 2, 6)]
    want_out, want_grads = run(cpu, x, state, grads, "cpu")
    deferfuse_torch.reset_fallback_counts()
    got_out, got_grads = run_under_autocast(dev, x, state, grads, "tpu", inside)
    assert deferfuse_torch.fallback_counts() == {}
    for g, w in zip(got_out, want_out):
        assert g.dtype == torch.float32
        check(g.detach(), w.detach())
    for g, w in zip(got_grads, want_grads):
        check(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("inside", [False, True])
@pytest.mark.parametrize("kind", ["LSTM", "RNN", "RNN_relu"])
def test_under_bf16_autocast_an_lstm_or_rnn_returns_bfloat16_as_on_cpu(mode, kind, inside):
    # CPU's oneDNN LSTM, and its plain RNN's autocast products, compute on bfloat16 operands and
    # return bfloat16 outputs and states (float32 gradients for float32 parameters). tpu rounds
    # the operands likewise and returns bfloat16, computing in float32 on those values: within
    # CPU's own rounding (both are ~5e-3 of the values from float64 here; tpu returned float32
    # before).
    cpu, dev = pair(lambda: layer(kind, 4, 6, num_layers=2))
    x = torch.randn(5, 2, 4)
    state = tuple(torch.randn(2, 2, 6) for _ in range(2 if kind == "LSTM" else 1))
    grads = [torch.randn(5, 2, 6)] + [torch.randn(2, 2, 6) for _ in state]
    want_out, want_grads = run_under_autocast(cpu, x, state, grads, "cpu", inside)
    deferfuse_torch.reset_fallback_counts()
    got_out, got_grads = run_under_autocast(dev, x, state, grads, "tpu", inside)
    assert deferfuse_torch.fallback_counts() == {}
    for g, w in zip(got_out, want_out):
        assert g.dtype == w.dtype == torch.bfloat16
        check(g.detach().float(), w.detach().float(), atol=2e-2, rtol=2e-2)
    for g, w in zip(got_grads, want_grads):
        assert g.dtype == w.dtype == torch.float32
        scale = w.abs().max().item()
        assert (g.cpu() - w).abs().max().item() <= 0.03 * scale, (g, w)


def test_under_bf16_autocast_a_packed_rnn_returns_bfloat16_as_on_cpu(mode):
    # CPU's plain RNN is composite: autocast casts its products on packed steps too (its packed
    # LSTM and GRU stay float32, as tpu's do).
    cpu, dev = pair(lambda: layer("RNN", 4, 6))
    x = torch.randn(5, 3, 4)
    outs = {}
    for m, d in ((cpu, "cpu"), (dev, "tpu")):
        packed = nn.utils.rnn.pack_padded_sequence(x.to(d), [5, 4, 2])
        with torch.autocast(d, dtype=torch.bfloat16):
            out, h = m(packed)
        outs[d] = (out.data, h)
    for g, w in zip(outs["tpu"], outs["cpu"]):
        assert g.dtype == w.dtype == torch.bfloat16
        check(g.detach().float(), w.detach().float(), atol=2e-2, rtol=2e-2)


def test_under_bf16_autocast_an_lstm_takes_its_own_bfloat16_states_back(mode):
    # Truncated BPTT feeds the returned (bfloat16) states to the next call: as on CPU it runs
    # (CPU casts them with the rest), and here it stays one recurrence op per direction, not
    # PyTorch's composite step by step (3x slower).
    cpu, dev = pair(lambda: layer("LSTM", 4, 6))
    x = torch.randn(5, 2, 4)
    results = {}
    for m, d in ((cpu, "cpu"), (dev, "tpu")):
        with torch.autocast(d, dtype=torch.bfloat16):
            _, state = m(x.to(d))
            report = deferfuse_torch.explain(lambda: m(x.to(d), state)) if d == "tpu" else None
            out, _ = m(x.to(d), state)
        results[d] = (out, report)
    out, report = results["tpu"]
    assert out.dtype == torch.bfloat16
    check(out.detach().float(), results["cpu"][0].detach().float(), atol=2e-2, rtol=2e-2)
    labels = [r["label"] for r in report.regions]
    assert "lstm_recurrence" in labels, labels
