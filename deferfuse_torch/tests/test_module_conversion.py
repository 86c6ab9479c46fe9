"""Module conversions (.to("tpu"), .tpu(), .to(dtype), .to("cpu")) keep PyTorch's object
identities: a weight tied between modules stays one Parameter, a buffer shared by modules stays
one tensor, and a Parameter keeps its subclass, attributes, requires_grad and grad."""
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
