"""torch.compile on the device: the "tpu" backend (deferfuse_torch/compile_backend.py) and
plain torch.compile's error (deferfuse_torch/inductor_refusal.py).

Losses are compared with CPU eager at rtol 1e-4, atol 1e-5 per step (the model zoo's
tolerance): the runtime's f32 sums and transcendentals differ from torch's by rounding."""

import copy

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn as nn
import torch.nn.functional as F

import deferfuse_torch
from deferfuse_torch import compile_backend

RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: Dynamo's caches are per code object, and the tests
    count compiles."""
    torch._dynamo.reset()
    deferfuse_torch.reset_fallback_counts()
    yield
    torch.tpu.synchronize()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(),
                         nn.Linear(64, 10))


class Block(nn.Module):
    """A pre-norm transformer block: layernorm, causal SDPA, GELU MLP."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def block():
    torch.manual_seed(0)
    return Block()


def train_losses(model, batches, loss_fn, device, compiled, steps=10):
    """Trains a copy of the model with AdamW; with compiled, the model (fullgraph: all its ops
    have tpu kernels) and the optimizer step both go through torch.compile(backend="tpu")."""
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    forward = torch.compile(model, backend="tpu", fullgraph=True) if compiled else model
    step = torch.compile(opt.step, backend="tpu") if compiled else opt.step
    losses = []
    for i in range(steps):
        x, y = (t.to(device) for t in batches[i % len(batches)])
        opt.zero_grad()
        loss = loss_fn(forward(x), y)
        loss.backward()
        step()
        losses.append(loss.item())
    return losses


def assert_trains_like_cpu(model, batches, loss_fn):
    want = train_losses(model, batches, loss_fn, "cpu", compiled=False)
    got = train_losses(model, batches, loss_fn, "tpu", compiled=True)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    assert deferfuse_torch.fallback_counts() == {}


def test_compiled_mlp_trains_like_cpu():
    torch.manual_seed(1)
    batches = [(torch.randn(16, 32), torch.randint(0, 10, (16,))) for _ in range(3)]
    assert_trains_like_cpu(mlp(), batches, F.cross_entropy)


def test_compiled_transformer_block_trains_like_cpu():
    torch.manual_seed(1)
    batches = [(torch.randn(4, 8, 32), torch.randn(4, 8, 32)) for _ in range(3)]
    assert_trains_like_cpu(block(), batches, F.mse_loss)


def test_a_compiled_call_launches_its_captured_graph_recording_no_ops_and_keeps_the_mode():
    def f(x):
        return ((x * 2 + 1).relu() - x.exp()).sum(dim=1)

    x = torch.randn(64, 32)
    compiled = torch.compile(f, backend="tpu")
    xt = x.to("tpu")
    compiled(xt).cpu()  # compiles, and the runtime captures the graph
    launches = compile_backend.counts["launches"]
    with deferfuse_torch.mode("strict"):
        before = deferfuse_torch.stats()
        got = compiled(xt)
        assert deferfuse_torch.get_mode() == "strict"
        got = got.cpu()
        after = deferfuse_torch.stats()
    torch.testing.assert_close(got, f(x), rtol=RTOL, atol=ATOL)
    assert compile_backend.counts["launches"] == launches + 1
    # The replay dispatches no op: the captured plan's one fused program runs on the input.
    assert after["ops_recorded"] == before["ops_recorded"]
    assert after["programs_run"] - before["programs_run"] == 1


def test_a_captured_graph_launched_on_new_inputs_matches_cpu():
    def f(x, y):
        return (x @ y).softmax(dim=-1) * y.sum()

    compiled = torch.compile(f, backend="tpu")
    for seed in range(3):
        torch.manual_seed(seed)
        x, y = torch.randn(8, 8), torch.randn(8, 8)
        got = compiled(x.to("tpu"), y.to("tpu"))
        torch.testing.assert_close(got.cpu(), f(x, y), rtol=RTOL, atol=ATOL)
    assert compile_backend.counts["launches"] >= 2


def test_a_compiled_in_place_update_of_an_input_leaves_the_state_cpu_leaves():
    def f(w, g):
        w.sub_(g * 0.5)
        return (w * 2).sum()

    compiled = torch.compile(f, backend="tpu")
    w, g = torch.randn(6), torch.randn(6)
    wt, gt = w.to("tpu"), g.to("tpu")
    for _ in range(3):
        got = compiled(wt, gt)
        want = f(w, g)
        torch.testing.assert_close(got.cpu(), want, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(wt.cpu(), w, rtol=RTOL, atol=ATOL)


def test_a_compiled_capturable_adamw_step_is_launched_and_matches_eager():
    model = mlp()
    eager, compiled = copy.deepcopy(model).to("tpu"), copy.deepcopy(model).to("tpu")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, capturable=True)
            for m in (eager, compiled)]
    step = torch.compile(opts[1].step, backend="tpu")
    x = torch.randn(16, 32).to("tpu")
    for i in range(3):
        for m in (eager, compiled):
            m(x).square().mean().backward()
        opts[0].step()
        launches = compile_backend.counts["launches"]
        step()
    assert compile_backend.counts["launches"] == launches + 1
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(b.cpu(), a.cpu(), rtol=RTOL, atol=ATOL)


def test_a_graph_with_a_random_op_is_not_captured_and_draws_new_numbers_each_call():
    compiled = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend="tpu")
    x = torch.ones(256).to("tpu")
    refused = compile_backend.counts["refused"]
    a, b = compiled(x).cpu(), compiled(x).cpu()
    assert compile_backend.counts["refused"] == refused + 1
    assert not torch.equal(a, b)
    assert set(a.unique().tolist()) <= {0.0, 2.0}


def test_compiled_inference_matches_cpu():
    model, x = block().eval(), torch.randn(2, 8, 32)
    compiled = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")
    with torch.no_grad():
        got, want = compiled(x.to("tpu")), model(x)
    torch.testing.assert_close(got.cpu(), want, rtol=RTOL, atol=ATOL)


def test_a_changing_batch_size_recompiles_once_and_compiles_no_new_programs():
    counter = torch._dynamo.testing.CompileCounterWithBackend("tpu")
    model = copy.deepcopy(mlp()).to("tpu")
    compiled = torch.compile(model, backend=counter)

    def step(batch):
        x = torch.randn(batch, 32).to("tpu")
        compiled(x).square().mean().backward()
        torch.tpu.synchronize()

    step(8)
    step(12)  # the second size: Dynamo recompiles with a symbolic batch dim
    step(16)  # programs of the symbolic graph are compiled on its first run
    programs = deferfuse_torch.stats()["programs_compiled"]
    captures = compile_backend.counts["captures"]
    for batch in (20, 24, 40, 13):
        step(batch)
    assert counter.frame_count == 2
    # Sizes are run-time arguments of the runtime's programs: no new program for new sizes,
    # only a capture of the forward and backward graphs per size.
    assert deferfuse_torch.stats()["programs_compiled"] == programs
    assert compile_backend.counts["captures"] == captures + 2 * 4


@pytest.mark.parametrize("vary", ["sequence", "batch"])
def test_compiled_attention_over_changing_sizes_recompiles_once_as_on_cpu(vary):
    # The device's attention kernel reads sizes as numbers: while Dynamo traces, the
    # composite (symbolic sizes) takes the call, or every new length was a new graph.
    counter = torch._dynamo.testing.CompileCounterWithBackend("tpu")

    def attention(q, mask):
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask).sum()
    compiled = torch.compile(attention, backend=counter)
    for n in (5, 7, 9, 11):
        batch, length = (2, n) if vary == "sequence" else (n, 6)
        q = torch.randn(batch, 2, length, 8)
        mask = torch.ones(batch, 1, length, length, dtype=torch.bool).tril()
        got = compiled(q.to("tpu"), mask.to("tpu"))
        torch.testing.assert_close(got.cpu(), attention(q, mask), rtol=1e-5, atol=1e-4)
    assert counter.frame_count == 2


def test_compiled_cdist_over_changing_row_counts_recompiles_once_as_on_cpu():
    counter = torch._dynamo.testing.CompileCounterWithBackend("tpu")
    compiled = torch.compile(lambda a, b: torch.cdist(a, b).sum(), backend=counter)
    for n in (5, 7, 9, 11):
        a, b = torch.randn(n, 3), torch.randn(n + 1, 3)
        got = compiled(a.to("tpu"), b.to("tpu"))
        torch.testing.assert_close(got.cpu(), torch.cdist(a, b).sum(), rtol=1e-5, atol=1e-4)
    assert counter.frame_count == 2


def test_compiled_unfold_and_fold_match_cpu():
    # Their window table is uploaded in eager calls; while Dynamo traces it is computed from
    # tensor ops (a fake tensor has no memory to upload into).
    def patches(x):
        cols = F.unfold(x, 2, padding=1, stride=(1, 2))
        return F.fold(cols * 2, (4, 6), 2, padding=1, stride=(1, 2))
    x = torch.arange(48.).reshape(1, 2, 4, 6)
    got = torch.compile(patches, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), patches(x))


def test_a_graph_break_runs_both_pieces_through_the_backend():
    counter = torch._dynamo.testing.CompileCounterWithBackend("tpu")

    def f(x):
        y = (x * 3).tanh()
        torch._dynamo.graph_break()
        return (y + x).sigmoid().sum()

    x = torch.randn(8, 8)
    got = torch.compile(f, backend=counter)(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), f(x), rtol=RTOL, atol=ATOL)
    assert counter.frame_count == 2


def i0_model(x):
    # aten::i0 has no tpu kernel: eager runs it on the CPU fallback.
    return torch.special.i0(x * 0.5).sum()


def test_fullgraph_with_an_op_on_the_cpu_fallback_raises_naming_the_op():
    compiled = torch.compile(i0_model, backend="tpu", fullgraph=True)
    with pytest.raises(Exception, match=r"aten::i0 with no tpu kernel.*CPU fallback"):
        compiled(torch.randn(4).to("tpu"))


def test_without_fullgraph_an_op_on_the_cpu_fallback_runs_there():
    x = torch.rand(4) * 1.8 - 0.9
    got = torch.compile(i0_model, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), i0_model(x), rtol=RTOL, atol=ATOL)
    assert deferfuse_torch.fallback_counts() == {"aten::i0.out": 1}


def test_plain_torch_compile_on_tpu_tensors_says_to_pass_backend_tpu():
    compiled = torch.compile(lambda x: (x * 2).relu().sum())
    with pytest.raises(Exception, match=r'backend="tpu"') as err:
        compiled(torch.randn(4).to("tpu"))
    assert "jax" not in str(err.value).split("(PyTorch's own")[0]


def test_a_compiled_adamw_step_matches_eager_and_fuses_each_parameter_update():
    model = mlp()
    eager, compiled = copy.deepcopy(model).to("tpu"), copy.deepcopy(model).to("tpu")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, compiled)]
    step = torch.compile(opts[1].step, backend="tpu")
    x = torch.randn(16, 32).to("tpu")
    for i in range(3):
        for m in (eager, compiled):
            m(x).square().mean().backward()
        opts[0].step()
        torch.tpu.synchronize()  # the backward's programs are not the step's
        before = deferfuse_torch.stats()
        step()
        torch.tpu.synchronize()
        after = deferfuse_torch.stats()
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(b.cpu(), a.cpu(), rtol=RTOL, atol=ATOL)
    # Eager foreach AdamW alternates between parameters op by op; the compiled step is
    # reordered into one chain per parameter (graph_order), each one fused program that
    # also writes the moments and the parameter in place.
    assert after["programs_run"] - before["programs_run"] <= len(list(compiled.parameters()))


@pytest.fixture
def captured_graphs(monkeypatch):
    """The CapturedGraph of each graph compiled from here on, in order."""
    made = []

    class Recorded(compile_backend.CapturedGraph):
        def __init__(self, gm):
            super().__init__(gm)
            made.append(self)

    monkeypatch.setattr(compile_backend, "CapturedGraph", Recorded)
    return made


def test_a_graph_keeps_at_most_max_captures_dropping_the_least_recently_called(
        monkeypatch, captured_graphs):
    monkeypatch.setattr(compile_backend, "MAX_CAPTURES", 2)

    def f(x):
        return (x * 2 + 1).tanh()

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    xs = {n: torch.randn(n) for n in (4, 5, 6)}
    for n in (4, 5, 4, 6):  # 6 is the third layout: 5, the least recently called, goes
        torch.testing.assert_close(compiled(xs[n].to("tpu")).cpu(), f(xs[n]), rtol=RTOL,
                                   atol=ATOL)
    (graph,) = captured_graphs
    assert len(graph.captures) == 2
    assert compile_backend.counts["evicted"] >= 1
    sizes = [[e[2] for e in key if e[0] == "tpu"] for key in graph.captures]
    assert sizes == [[torch.Size([4])], [torch.Size([6])]]


def test_an_evicted_capture_releases_its_runtime_graph_and_its_layout_is_captured_again(
        monkeypatch, captured_graphs):
    monkeypatch.setattr(compile_backend, "MAX_CAPTURES", 1)
    compiled = torch.compile(lambda x: x.exp() - 1, backend="tpu", dynamic=True)
    x4, x5 = torch.randn(4), torch.randn(5)
    compiled(x4.to("tpu"))
    compiled(x5.to("tpu"))
    (graph,) = captured_graphs
    first = next(iter(graph.captures.values()))
    compiled(x5.to("tpu"))
    handle = first.graph
    captures = compile_backend.counts["captures"]
    got = compiled(x4.to("tpu"))  # evicts the size-5 capture, captures size 4 again
    torch.testing.assert_close(got.cpu(), x4.exp() - 1, rtol=RTOL, atol=ATOL)
    assert compile_backend.counts["captures"] == captures + 1
    assert first.graph == 0
    with pytest.raises(RuntimeError, match="was not captured by this process or was destroyed"):
        torch.ops.deferfuse.graph_launch(handle, [x5.to("tpu")])


def test_a_compiled_gru_with_allow_rnn_takes_a_second_input_shape():
    # With allow_rnn Dynamo traces the RNN module; the device's check of its operands read
    # numel() of a symbolic-size input ("Cannot call numel()") on the second shape.
    torch.manual_seed(0)
    gru = torch.nn.GRU(4, 5, batch_first=True)
    dev = torch.nn.GRU(4, 5, batch_first=True).to("tpu")
    dev.load_state_dict(gru.state_dict())
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):
        f = torch.compile(lambda x: dev(x)[0], backend="tpu")
        for steps in (3, 4, 6):
            x = torch.randn(2, steps, 4)
            torch.testing.assert_close(f(x.to("tpu")).cpu(), gru(x)[0], atol=1e-5, rtol=1e-5)
