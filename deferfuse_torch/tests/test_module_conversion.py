"""Module conversions (.to("tpu"), .tpu(), .to(dtype), .to("cpu")) keep PyTorch's object
identities, as CPU<->CUDA conversions do: each Parameter stays the same object (so an optimizer
built before `.to("tpu")` trains the model), a weight tied between modules stays one Parameter,
a buffer shared by modules stays one tensor, and a Parameter keeps its subclass, attributes,
requires_grad and grad."""
import warnings
import weakref

import pytest
import torch
from torch import nn

import deferfuse_torch  # noqa: F401


def tied():
    torch.manual_seed(0)
    e = nn.Embedding(10, 4)
    l = nn.Linear(4, 10, bias=False)
    l.weight = e.weight
    return nn.ModuleDict(dict(e=e, l=l))


CONVERSIONS = {
    "to_tpu": lambda m: m.to("tpu"),
    "tpu": lambda m: m.tpu(),
    "to_tpu_then_dtype": lambda m: m.to("tpu").to(torch.float64),
    "to_tpu_and_dtype": lambda m: m.to("tpu", torch.float64),
    "round_trip_cpu": lambda m: m.to("tpu").to("cpu"),
}


@pytest.mark.parametrize("conv", list(CONVERSIONS))
def test_tied_weight_stays_one_parameter(mode, conv):
    m = CONVERSIONS[conv](tied())
    assert m.e.weight is m.l.weight
    assert len(list(m.parameters())) == 1
    idx = torch.tensor([1, 3, 3])
    want = tied().to(m.e.weight.dtype)
    got = m.l(m.e(idx.to(m.e.weight.device)))
    torch.testing.assert_close(got.cpu(), want.l(want.e(idx)))


def test_tied_weight_trains_as_one_tensor(mode):
    m = tied().to("tpu")
    ref = tied()
    for model, dev in ((m, "tpu"), (ref, "cpu")):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        out = model.l(model.e(torch.tensor([1, 2]).to(dev))).sum()
        out.backward()
        opt.step()
    assert m.e.weight is m.l.weight
    torch.testing.assert_close(m.e.weight.detach().cpu(), ref.e.weight.detach())


def test_grad_and_requires_grad_follow_the_parameter(mode):
    m = tied()
    m.e.weight.grad = torch.ones(10, 4)
    frozen = nn.Linear(2, 2)
    frozen.weight.requires_grad_(False)
    m["f"] = frozen
    m = m.to("tpu")
    assert m.e.weight is m.l.weight
    assert m.e.weight.grad.device.type == "tpu"
    torch.testing.assert_close(m.e.weight.grad.cpu(), torch.ones(10, 4))
    assert m.e.weight.requires_grad and not m.f.weight.requires_grad
    assert m.f.bias.requires_grad


class TaggedParameter(nn.Parameter):
    pass


def test_parameter_subclass_and_attributes_survive(mode):
    lin = nn.Linear(3, 3)
    lin.weight = TaggedParameter(lin.weight.detach().clone())
    lin.weight.no_decay = True
    lin = lin.to("tpu")
    assert type(lin.weight) is TaggedParameter and lin.weight.no_decay
    assert lin.weight.device.type == "tpu" and lin.weight.requires_grad
    back = lin.to("cpu")
    assert type(back.weight) is TaggedParameter and back.weight.no_decay


def test_shared_buffer_stays_one_tensor(mode):
    a, b = nn.Module(), nn.Module()
    shared = torch.arange(4.0)
    a.register_buffer("s", shared)
    b.register_buffer("s", shared)
    m = nn.ModuleDict(dict(a=a, b=b)).to("tpu")
    assert m.a.s is m.b.s and m.a.s.device.type == "tpu"
    torch.testing.assert_close(m.a.s.cpu(), shared)


def test_untied_parameters_stay_distinct(mode):
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)).to("tpu")
    assert m[0].weight is not m[1].weight
    assert len(list(m.parameters())) == 4


@pytest.mark.parametrize("conv", list(CONVERSIONS))
def test_every_parameter_stays_the_same_object(mode, conv):
    m = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    before = list(m.parameters())
    CONVERSIONS[conv](m)
    after = list(m.parameters())
    assert len(after) == len(before) and all(a is b for a, b in zip(after, before))


def test_an_optimizer_built_before_to_tpu_trains_the_model(mode):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    m.load_state_dict(ref.state_dict())
    opt_ref = torch.optim.Adam(ref.parameters(), lr=0.1)
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    m.to("tpu")
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(3):
        for model, o, dev in ((ref, opt_ref, "cpu"), (m, opt, "tpu")):
            o.zero_grad()
            nn.functional.mse_loss(model(x.to(dev)), y.to(dev)).backward()
            o.step()
    assert all(p.device.type == "tpu" for g in opt.param_groups for p in g["params"])
    for got, want in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)


class NestedRNN(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(4, 3, batch_first=True)
        self.out = nn.Linear(3, 1)

    def forward(self, x):
        return self.out(self.rnn(x)[0])


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU, nn.RNN])
def test_an_optimizer_built_before_to_tpu_trains_an_rnn_inside_a_module(mode, cell):
    # The RNN takes weak references to its converted weights inside the conversion; they
    # must not stop its Parameters from being kept (they did, with a warning each).
    torch.manual_seed(0)
    ref = NestedRNN(cell)
    m = NestedRNN(cell)
    m.load_state_dict(ref.state_dict())
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.to("tpu")
    x = torch.randn(2, 5, 4)
    for _ in range(2):
        for model, o, dev in ((ref, opt_ref, "cpu"), (m, opt, "tpu")):
            o.zero_grad()
            model(x.to(dev)).pow(2).sum().backward()
            o.step()
    for got, want in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    assert all(w is p for w, p in zip(m.rnn._flat_weights, m.rnn.parameters()))


def test_a_parameter_a_live_graph_saved_keeps_its_object_through_to_tpu(mode):
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    before = list(m.parameters())
    out = m(torch.randn(2, 3, 6, 6))  # its graph holds the CPU weights
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.to("tpu").half()
    assert all(a is b for a, b in zip(m.parameters(), before))
    assert all(p.device.type == "tpu" and p.dtype == torch.float16 for p in m.parameters())
    with pytest.raises(RuntimeError, match="moved after the forward that recorded it"):
        out.sum().backward()


def test_a_parameter_pytorch_cannot_swap_becomes_a_new_object_with_a_warning(mode):
    m = nn.Linear(2, 2)
    w = m.weight
    keep = weakref.ref(w)  # swap_tensors refuses a tensor with a weak reference
    with pytest.warns(UserWarning, match="Linear.weight became a new Parameter object.*weak "
                                         "reference"):
        m.to("tpu")
    assert m.weight is not w and m.weight.device.type == "tpu" and keep() is w
    assert m.bias.device.type == "tpu"


def test_same_device_conversion_keeps_the_parameter_object(mode):
    m = tied()
    w = m.e.weight
    m.to(torch.float64)  # CPU to CPU: PyTorch's `.data =` path, nothing to retie
    assert m.e.weight is w and m.l.weight is w and w.dtype == torch.float64


def test_gpt2_lm_head_stays_tied_to_the_token_embedding(mode):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100,
                                  n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        want = model(ids).logits
        model = model.to("tpu")
        assert model.lm_head.weight is model.transformer.wte.weight
        assert model.lm_head.weight.device.type == "tpu"
        got = model(ids.to("tpu")).logits
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
