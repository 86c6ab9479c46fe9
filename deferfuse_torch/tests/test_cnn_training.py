"""End to end: a small CNN (conv-bn-relu-maxpool-conv-bn-relu-adaptiveavgpool-linear) trained
with SGD momentum on tpu gives CPU's losses, weights and BatchNorm running statistics, with zero
CPU-fallback ops, in every eager mode."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import deferfuse_torch
from conftest import check


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def train(model, device, steps=3, memory_format=torch.contiguous_format, opt=None):
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(steps, 8, 3, 12, 12, generator=g)
    ys = torch.randint(0, 10, (steps, 8), generator=g)
    model = copy.deepcopy(model).to(device).to(memory_format=memory_format)
    opt = (opt or (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)))(model.parameters())
    losses = []
    for x, y in zip(xs, ys):
        opt.zero_grad()
        x = x.to(device).to(memory_format=memory_format)
        loss = F.cross_entropy(model(x), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def test_cnn_training_matches_cpu_with_zero_fallbacks(mode):
    model = cnn()
    want, cpu_model = train(model, "cpu")
    deferfuse_torch.reset_fallback_counts()
    got, dev_model = train(model, "tpu")
    assert deferfuse_torch.fallback_counts() == {}
    assert got == pytest.approx(want, rel=1e-5)
    for (name, b), c in zip(cpu_model.named_buffers(), dev_model.buffers()):
        check(c, b, atol=1e-5, rtol=1e-4)
    for p, q in zip(cpu_model.parameters(), dev_model.parameters()):
        check(q, p.detach(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("opt", [None, lambda p: torch.optim.AdamW(p, lr=1e-2)],
                         ids=["sgd_momentum", "adamw"])
def test_cnn_in_channels_last_trains_like_cpu(mode, opt):
    # `model.to(memory_format=torch.channels_last)` and channels-last inputs, the usual CNN
    # speed idiom, were refused ("memory format ChannelsLast is not supported"). The weights
    # keep their channels-last strides through the optimizer's in-place updates.
    model = cnn()
    cl = torch.channels_last
    want, cpu_model = train(model, "cpu", memory_format=cl, opt=opt)
    deferfuse_torch.reset_fallback_counts()
    got, dev_model = train(model, "tpu", memory_format=cl, opt=opt)
    assert deferfuse_torch.fallback_counts() == {}
    assert got == pytest.approx(want, rel=1e-5)
    for (name, p), q in zip(cpu_model.named_parameters(), dev_model.parameters()):
        assert q.stride() == p.stride()
        # A conv bias followed by BatchNorm has a zero gradient up to rounding, which Adam's
        # normalization turns into a full-size step either way: not comparable.
        if opt is None or name not in ("0.bias", "4.bias"):
            check(q, p.detach(), atol=1e-5, rtol=1e-4)


def test_channels_last_3d_tensors_are_accepted(mode):
    x = torch.randn(2, 3, 4, 5, 6)
    got = x.to("tpu").to(memory_format=torch.channels_last_3d)
    assert got.stride() == x.to(memory_format=torch.channels_last_3d).stride()
    check(F.interpolate(got, scale_factor=2, mode="nearest-exact"),
          F.interpolate(x, scale_factor=2, mode="nearest-exact"))


def test_cnn_eval_forward_uses_running_stats_and_matches_cpu(mode):
    _, cpu_model = train(cnn(), "cpu", steps=1)
    dev_model = copy.deepcopy(cpu_model).to("tpu").eval()
    x = torch.randn(4, 3, 12, 12)
    deferfuse_torch.reset_fallback_counts()
    with torch.no_grad():
        got = dev_model(x.to("tpu"))
    assert deferfuse_torch.fallback_counts() == {}
    check(got, cpu_model.eval()(x).detach(), atol=1e-5, rtol=1e-4)
