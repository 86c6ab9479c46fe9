"""End to end: a 3-layer MLP trained with AdamW (and SGD) for 20 steps gives the CPU losses in
every eager mode with zero CPU-fallback ops; a transformer block forward matches CPU."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import deferfuse_torch
from conftest import check

STEPS = 20
# f32 training on two backends drifts apart slowly through rounding (different sum orders, the
# runtime's ~2 ulp exp/tanh); measured: the MLP's 20 AdamW losses differ by < 2e-7 relative.
# The bound leaves room for other CPUs' GEMM blocking.
LOSS_RTOL = 1e-5


def mlp(sizes=(784, 256, 256, 10)):
    torch.manual_seed(0)
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def data(batch=64, features=784, classes=10):
    # Two batches, alternating: the model can fit them, so the loss must fall.
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(2, batch, features, generator=g)
    ys = torch.randint(0, classes, (2, batch), generator=g)
    return xs.repeat(STEPS // 2, 1, 1), ys.repeat(STEPS // 2, 1)


def train(model, device, xs, ys, make_opt, loss_fn):
    model = copy.deepcopy(model).to(device)
    opt = make_opt(model.parameters())
    losses = []
    for x, y in zip(xs, ys):
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01),
    "adamw_single_tensor": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=False),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
}


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_mlp_training_matches_cpu_with_zero_fallbacks(mode, opt):
    model = mlp()
    xs, ys = data()
    want, _ = train(model, "cpu", xs, ys, OPTIMIZERS[opt], F.cross_entropy)
    deferfuse_torch.reset_fallback_counts()
    got, trained = train(model, "tpu", xs, ys, OPTIMIZERS[opt], F.cross_entropy)
    assert deferfuse_torch.fallback_counts() == {}
    assert got == pytest.approx(want, rel=LOSS_RTOL)
    assert got[-1] < got[0]  # it actually trained


def test_mlp_mse_loss_with_gelu_tanh(mode):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 4), nn.Sigmoid())
    xs = torch.randn(STEPS, 16, 32)
    ys = torch.rand(STEPS, 16, 4)
    make = OPTIMIZERS["adamw"]
    want, _ = train(model, "cpu", xs, ys, make, F.mse_loss)
    deferfuse_torch.reset_fallback_counts()
    got, _ = train(model, "tpu", xs, ys, make, F.mse_loss)
    assert deferfuse_torch.fallback_counts() == {}
    assert got == pytest.approx(want, rel=LOSS_RTOL)


class Block(nn.Module):
    """Pre-norm transformer block: attention with softmax, then a GELU MLP, both residual."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, h, d // h).transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // h) ** 0.5, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def test_transformer_block_forward_matches_cpu(mode):
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, 16, 64)
    want = block(x)
    deferfuse_torch.reset_fallback_counts()
    with torch.no_grad():
        got = copy.deepcopy(block).to("tpu")(x.to("tpu"))
    fallbacks = deferfuse_torch.fallback_counts()
    check(got, want.detach(), atol=1e-4, rtol=1e-4)
    assert fallbacks == {}


def test_transformer_block_backward_matches_cpu_without_fallbacks(mode):
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, 8, 64)
    block(x).square().mean().backward()
    dev = copy.deepcopy(block).to("tpu")
    for p in dev.parameters():
        p.grad = None
    xt = x.to("tpu")
    deferfuse_torch.reset_fallback_counts()
    dev(xt).square().mean().backward()
    assert deferfuse_torch.fallback_counts() == {}
    for (name, p), q in zip(block.named_parameters(), dev.parameters()):
        check(q.grad, p.grad, atol=1e-4, rtol=1e-3)


def test_scaled_dot_product_attention_matches_cpu_without_fallbacks(mode):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    deferfuse_torch.reset_fallback_counts()
    got = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), is_causal=True)
    check(got, want, atol=1e-5, rtol=1e-4)
    assert deferfuse_torch.fallback_counts() == {}
