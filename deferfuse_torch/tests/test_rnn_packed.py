"""nn.LSTM, nn.GRU and nn.RNN over a PackedSequence (pack_padded_sequence, the .data overloads)
on "tpu": in float32 the same autograd node as padded input (csrc/rnn_layers.cpp), each
direction's packed steps as one kernel op forward and one backward. Outputs, each sample's
final states and every gradient must be CPU's (within float32 rounding), in every mode; float64
keeps PyTorch's path."""
import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import deferfuse_torch

from conftest import check
from test_rnn_layers import KINDS, layer, pair, recorded_ops

# Lengths out of order (enforce_sorted=False sorts them), with a tie and a one-step sentence.
LENGTHS = torch.tensor([3, 6, 1, 6, 4])


def run(rnn, x, state, grads, device, lengths=LENGTHS):
    """Packs x [B, T, I] by `lengths`, runs from `state`, and backpropagates every output
    (the padded output and the final states) against its grad; returns the outputs and the
    gradients of x, of the state and of every parameter."""
    x = x.detach().clone().to(device).requires_grad_()
    state = tuple(s.detach().clone().to(device).requires_grad_() for s in state)
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, last = rnn(packed, state if len(state) == 2 else state[0])
    out, _ = pad_packed_sequence(out, batch_first=True)
    last = last if isinstance(last, tuple) else (last,)
    loss = sum((t * g.to(device)).sum() for t, g in zip((out, *last), grads))
    loss.backward()
    return [out, *last], [x.grad, *(s.grad for s in state), *(p.grad for p in rnn.parameters())]


CASES = [
    # kind, bidirectional, bias, layers
    ("LSTM", True, True, 2),
    ("LSTM", False, False, 1),
    ("GRU", True, True, 2),
    ("GRU", False, True, 1),
    ("RNN", True, True, 2),
    ("RNN_relu", False, False, 1),
]


def case(kind, bidirectional, layers, dtype=torch.float32):
    torch.manual_seed(1)
    B, T, D = len(LENGTHS), int(LENGTHS.max()), 2 if bidirectional else 1
    x = torch.randn(B, T, 5, dtype=dtype)
    state = tuple(torch.randn(layers * D, B, 7, dtype=dtype)
                  for _ in range(2 if kind == "LSTM" else 1))
    grads = [torch.randn(B, T, D * 7, dtype=dtype)]
    grads += [torch.randn(layers * D, B, 7, dtype=dtype) for _ in state]
    return x, state, grads


@pytest.mark.parametrize("kind,bidirectional,bias,layers", CASES)
def test_packed_outputs_final_states_and_every_gradient_match_cpu(
        mode, kind, bidirectional, bias, layers):
    cpu, dev = pair(lambda: layer(kind, 5, 7, num_layers=layers, bias=bias, batch_first=True,
                                  bidirectional=bidirectional))
    x, state, grads = case(kind, bidirectional, layers)
    want_out, want_grads = run(cpu, x, state, grads, "cpu")
    deferfuse_torch.reset_fallback_counts()
    got_out, got_grads = run(dev, x, state, grads, "tpu")
    assert deferfuse_torch.fallback_counts() == {}
    for g, w in zip(got_out, want_out):
        check(g.detach(), w.detach())
    for g, w in zip(got_grads, want_grads):
        check(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_a_packed_float32_layer_records_its_steps_as_one_op_each_way(mode, kind):
    # As for padded input: a training step records no more ops for sentences of 24 steps than
    # of 3 (PyTorch's path recorded every step's cell; the counts may differ by ops recorded and
    # never run, which small operands leave).
    _, dev = pair(lambda: layer(kind, 8, 16, num_layers=2, bidirectional=True))

    def packed(longest):
        lengths = torch.tensor([longest, longest - 1, 2])
        x = pack_padded_sequence(torch.randn(3, longest, 8, device="tpu"), lengths,
                                 batch_first=True)
        return x._replace(data=x.data.requires_grad_())

    def step(x):
        out, last = dev(x)
        (out.data.sum() + sum(t.sum() for t in (last if kind == "LSTM" else (last,)))).backward()

    short, long = packed(3), packed(24)
    step(short)
    assert recorded_ops(lambda: step(long)) <= recorded_ops(lambda: step(short))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_a_packed_double_backward_matches_cpu(mode, kind):
    # The forward again through PyTorch's step-by-step path, which autograd records.
    cpu, dev = pair(lambda: layer(kind, 3, 4, num_layers=2, bidirectional=True))
    x = torch.randn(5, 6, 3)

    def grads(rnn, device):
        xd = x.to(device).requires_grad_()
        out, _ = rnn(pack_padded_sequence(xd, LENGTHS, batch_first=True, enforce_sorted=False))
        (gx,) = torch.autograd.grad((out.data ** 2).sum(), xd, create_graph=True)
        gx.pow(2).sum().backward()
        return [p.grad for p in rnn.parameters()]

    for g, w in zip(grads(dev, "tpu"), grads(cpu, "cpu")):
        check(g, w, atol=1e-5, rtol=1e-4)


def test_packed_dropout_between_layers_matches_its_layers_run_apart(mode):
    # Same seed: a 2-layer packed LSTM with dropout equals its two layers run apart with
    # F.dropout on the packed data between them (the same draws from the device's generator).
    torch.manual_seed(0)
    whole = layer("LSTM", 4, 6, num_layers=2, dropout=0.4).to("tpu")
    first, second = layer("LSTM", 4, 6).to("tpu"), layer("LSTM", 6, 6).to("tpu")
    with torch.no_grad():
        for name, p in whole.named_parameters():
            part, suffix = (first, name) if name.endswith("l0") else (second, name[:-1] + "0")
            getattr(part, suffix).copy_(p)
    x = pack_padded_sequence(torch.randn(6, 3, 4, device="tpu"), torch.tensor([6, 4, 2]))
    torch.manual_seed(7)
    got, _ = whole(x)
    torch.manual_seed(7)
    mid, _ = first(x)
    mid = mid._replace(data=torch.nn.functional.dropout(mid.data, 0.4, training=True))
    want, _ = second(mid)
    check(got.data.detach(), want.data.detach().cpu())


def test_float64_packed_steps_keep_pytorchs_path_and_cpus_results(mode):
    cpu, dev = pair(lambda: layer("GRU", 5, 7, batch_first=True).double())
    x, state, grads = case("GRU", False, 1, torch.float64)
    want_out, want_grads = run(cpu, x, state, grads, "cpu")
    got_out, got_grads = run(dev, x, state, grads, "tpu")
    for g, w in zip(got_out + got_grads, want_out + want_grads):
        check(g.detach(), w.detach(), atol=1e-9, rtol=1e-9)


def test_under_no_grad_a_packed_forward_gives_cpus_outputs(mode):
    cpu, dev = pair(lambda: layer("LSTM", 5, 7, batch_first=True, bidirectional=True))
    x = torch.randn(5, 6, 5)
    with torch.no_grad():
        packed = pack_padded_sequence(x, LENGTHS, batch_first=True, enforce_sorted=False)
        want, (wh, wc) = cpu(packed)
        got, (gh, gc) = dev(pack_padded_sequence(x.to("tpu"), LENGTHS, batch_first=True,
                                                 enforce_sorted=False))
    for g, w in [(got.data, want.data), (gh, wh), (gc, wc)]:
        check(g, w)
