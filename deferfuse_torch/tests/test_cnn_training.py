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


def train(model, device, steps=3):
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(steps, 8, 3, 12, 12, generator=g)
    ys = torch.randint(0, 10, (steps, 8), generator=g)
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in zip(xs, ys):
        opt.zero_grad()
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
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


def test_cnn_eval_forward_uses_running_stats_and_matches_cpu(mode):
    _, cpu_model = train(cnn(), "cpu", steps=1)
    dev_model = copy.deepcopy(cpu_model).to("tpu").eval()
    x = torch.randn(4, 3, 12, 12)
    deferfuse_torch.reset_fallback_counts()
    with torch.no_grad():
        got = dev_model(x.to("tpu"))
    assert deferfuse_torch.fallback_counts() == {}
    check(got, cpu_model.eval()(x).detach(), atol=1e-5, rtol=1e-4)
