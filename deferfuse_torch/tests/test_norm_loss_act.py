"""Normalization layers, losses, activations, masked_fill and vector norms on tpu match CPU in
forward and backward in every eager mode, with zero CPU-fallback ops."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import deferfuse_torch
from conftest import assert_same, check, trains_like_cpu


def compare_module(make, x, train):
    """The module on CPU and a copy on tpu: output, input and parameter gradients, and buffers
    (running statistics) after one forward/backward."""
    torch.manual_seed(0)
    cpu = make().train(train)
    dev = copy.deepcopy(cpu).to("tpu")
    xc = x.clone().requires_grad_()
    out = cpu(xc)
    grad = torch.randn_like(out)
    out.backward(grad)
    xt = x.to("tpu").requires_grad_()
    deferfuse_torch.reset_fallback_counts()
    dout = dev(xt)
    dout.backward(grad.to("tpu"))
    assert deferfuse_torch.fallback_counts() == {}
    check(dout, out.detach())
    check(xt.grad, xc.grad, atol=2e-5)
    for p, q in zip(cpu.parameters(), dev.parameters()):
        check(q.grad, p.grad, atol=2e-5)
    for (name, b), c in zip(cpu.named_buffers(), dev.buffers()):
        check(c, b)


NORMS = {
    "batch_norm2d": (lambda: nn.BatchNorm2d(3, momentum=0.3), (4, 3, 5, 6)),
    "batch_norm2d_no_affine": (lambda: nn.BatchNorm2d(3, affine=False), (4, 3, 5, 6)),
    "batch_norm1d": (lambda: nn.BatchNorm1d(3), (8, 3)),
    "batch_norm_no_running_stats": (lambda: nn.BatchNorm2d(3, track_running_stats=False),
                                    (4, 3, 5, 6)),
    "group_norm": (lambda: nn.GroupNorm(2, 4), (3, 4, 5, 6)),
    # One group (LayerNorm over C, H, W), a group per channel, no affine, 1-D and 3-D inputs.
    "group_norm_one_group": (lambda: nn.GroupNorm(1, 6), (2, 6, 3, 4)),
    "group_norm_group_per_channel": (lambda: nn.GroupNorm(6, 6), (2, 6, 3, 4)),
    "group_norm_no_affine": (lambda: nn.GroupNorm(3, 6, affine=False), (2, 6, 3, 4)),
    "group_norm_1d": (lambda: nn.GroupNorm(2, 6), (4, 6, 7)),
    "group_norm_3d": (lambda: nn.GroupNorm(4, 8), (2, 8, 3, 2, 5)),
    "group_norm_no_spatial_dims": (lambda: nn.GroupNorm(2, 6), (5, 6)),
    "instance_norm": (lambda: nn.InstanceNorm2d(4, affine=True), (3, 4, 5, 6)),
}


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("case", sorted(NORMS))
def test_normalization_matches_cpu_including_running_stats(mode, case, train):
    make, shape = NORMS[case]
    torch.manual_seed(1)
    compare_module(make, torch.randn(shape) * 2 + 0.5, train)


def test_group_norm_of_an_input_far_from_zero_matches_cpu_forward_and_backward(mode):
    # The backward works from per-channel sums of grad * x and grad, as CPU's kernel does: an
    # input centred far from zero loses the same digits on both.
    torch.manual_seed(2)
    assert_same(lambda x, w, b: F.group_norm(x, 2, w, b), torch.randn(2, 4, 6, 5) + 100,
                torch.randn(4), torch.randn(4), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("needs", [(True, False, False), (False, True, False),
                                   (False, False, True)], ids=["input", "weight", "bias"])
def test_group_norm_computes_only_the_gradients_asked_for_and_they_match_cpu(mode, needs):
    # A frozen norm (or input) asks native_group_norm_backward for some gradients only.
    torch.manual_seed(3)
    x, w, b, g = torch.randn(2, 4, 3, 5), torch.randn(4), torch.randn(4), torch.randn(2, 4, 3, 5)
    grads = []
    for dev in ("cpu", "tpu"):
        ts = [t.to(dev).detach().requires_grad_(r) for t, r in zip((x, w, b), needs)]
        F.group_norm(ts[0], 2, ts[1], ts[2]).backward(g.to(dev))
        grads.append([t.grad for t in ts if t.requires_grad])
    (want,), (got,) = grads
    check(got, want)


def test_batch_norm_updates_running_stats_in_place_with_the_unbiased_variance(mode):
    bn = nn.BatchNorm2d(2, momentum=0.5).to("tpu")
    mean_before = bn.running_mean
    x = torch.tensor([[[[1.0, 3.0]], [[0.0, 4.0]]]])  # per channel: mean 2, var 2 (unbiased)
    bn(x.to("tpu"))
    assert bn.running_mean is mean_before
    check(bn.running_mean, torch.tensor([1.0, 1.0]))
    check(bn.running_var, torch.tensor([0.5 + 0.5 * 2.0, 0.5 + 0.5 * 8.0]))


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_per_channel_statistics_and_gradients_read_the_input_in_place(norm):
    # Batch norm's statistics and its weight and bias gradients (and group norm's weight and
    # bias gradients, a conv's bias gradient) reduce over every dim but the channels: over the
    # spatial dims first, then the batch, with no transposing copy of the input before them
    # (one reduction over dims {0, 2, 3} copied it channel-major first).
    torch.manual_seed(0)
    layer = (nn.BatchNorm2d(8) if norm == "batch" else nn.GroupNorm(2, 8)).to("tpu")
    conv = nn.Conv2d(3, 8, 3, padding=1).to("tpu")
    x = torch.randn(4, 3, 32, 32, device="tpu")

    def step():
        y = layer(conv(x))
        grads = torch.autograd.grad(y.square().sum(), [*layer.parameters(), conv.bias])
        return sum(g.sum().item() for g in grads)

    with deferfuse_torch.mode("defer"):
        step()
        report = deferfuse_torch.explain(step)
    runs = [(e["name"], e.get("args", {}).get("shapes", ""))
            for e in report.timeline["traceEvents"] if e.get("cat") == "run"]
    # The step's only copies are of scalars (its outputs' shapes follow the arrow).
    copies = [(n, s) for n, s in runs if "copy" in n and s.split("->")[-1].strip() != "float32[]"]
    assert copies == [], runs
    assert not report.fallbacks


ACTIVATIONS = {
    "softplus": lambda x: F.softplus(x),
    "softplus_beta_threshold": lambda x: F.softplus(x, beta=2.0, threshold=3.0),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "elu": lambda x: F.elu(x, alpha=0.7),
    "selu": lambda x: F.selu(x),
    "celu": lambda x: F.celu(x, alpha=1.5),
    "hardtanh": lambda x: F.hardtanh(x, -2.0, 2.5),
    "relu6": lambda x: F.relu6(x),
    "hardswish": lambda x: F.hardswish(x),
    "hardsigmoid": lambda x: F.hardsigmoid(x),
    "mish": lambda x: F.mish(x),
    "logsigmoid": lambda x: F.logsigmoid(x),
    "glu": lambda x: F.glu(x[:, :16], dim=1),
    "glu_last_dim_negative": lambda x: F.glu(x[:2, :16].reshape(2, 4, 4), dim=-1),
    # In-place forms on a non-leaf, so autograd takes the result-based backward where it has one.
    "leaky_relu_inplace": lambda x: F.leaky_relu(x * 1.0, 0.2, inplace=True),
    "elu_inplace": lambda x: F.elu(x * 1.0, inplace=True),
    "hardtanh_inplace": lambda x: F.hardtanh(x * 1.0, inplace=True),
    "relu6_inplace": lambda x: F.relu6(x * 1.0, inplace=True),
    "hardswish_inplace": lambda x: F.hardswish(x * 1.0, inplace=True),
    "hardsigmoid_inplace": lambda x: F.hardsigmoid(x * 1.0, inplace=True),
    "mish_inplace": lambda x: F.mish(x * 1.0, inplace=True),
}


def boundary_points():
    # Random values plus every branch boundary the formulas above have (0, +-1, +-2.5, +-3, 6),
    # where CPU decides which side a point belongs to.
    torch.manual_seed(0)
    edges = torch.tensor([0.0, 1.0, -1.0, 2.5, -2.0, 3.0, -3.0, 6.0, 1.5, 25.0, -25.0])
    return torch.cat([torch.randn(40) * 4, edges]).view(3, 17)


@pytest.mark.parametrize("case", sorted(ACTIVATIONS))
def test_activation_matches_cpu_forward_and_backward(mode, case):
    assert_same(ACTIVATIONS[case], boundary_points())


def test_prelu_matches_cpu_including_the_weight_gradient(mode):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5)
    x[0, 0, 0, 0] = 0.0
    assert_same(lambda x, w: F.prelu(x, w), x, torch.tensor([0.1, 0.25, -0.3]))
    assert_same(lambda x, w: F.prelu(x, w), x, torch.tensor([0.2]))


LOSSES = {
    "smooth_l1": lambda x, t: F.smooth_l1_loss(x, t),
    "smooth_l1_beta_sum": lambda x, t: F.smooth_l1_loss(x, t, beta=0.5, reduction="sum"),
    "smooth_l1_beta0_none": lambda x, t: F.smooth_l1_loss(x, t, beta=0.0, reduction="none"),
    "huber": lambda x, t: F.huber_loss(x, t, delta=0.8),
    "huber_none": lambda x, t: F.huber_loss(x, t, reduction="none"),
    "soft_margin": lambda x, t: F.soft_margin_loss(x, t.sign()),
    "bce_with_logits": lambda x, t: F.binary_cross_entropy_with_logits(x, t.sigmoid()),
    "bce_with_logits_weights": lambda x, t: F.binary_cross_entropy_with_logits(
        x, t.sigmoid(), weight=torch.linspace(0.5, 1.5, 5).to(x.device),
        pos_weight=torch.linspace(1.0, 3.0, 5).to(x.device), reduction="sum"),
}


@pytest.mark.parametrize("case", sorted(LOSSES))
def test_loss_matches_cpu_forward_and_backward(mode, case):
    torch.manual_seed(0)
    x, t = torch.randn(4, 5), torch.randn(4, 5)
    t[0, :2] = x[0, :2] + 1.0  # exactly at the smooth_l1 / huber boundary
    t[1, 0] = x[1, 0]  # zero difference
    assert_same(lambda x: LOSSES[case](x, t.to(x.device)), x)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_matches_cpu_including_the_log_clamp(mode, reduction):
    torch.manual_seed(0)
    p = torch.rand(3, 4).clamp(0.05, 0.95)
    p[0, 0], p[0, 1] = 0.0, 1.0  # log clamped at -100 on both sides
    t = torch.rand(3, 4)
    w = torch.rand(4)
    assert_same(lambda p: F.binary_cross_entropy(p, t.to(p.device), weight=w.to(p.device),
                                                 reduction=reduction), p, atol=1e-4)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_over_a_spatial_map_matches_cpu(mode, reduction):
    torch.manual_seed(0)
    x = torch.randn(2, 4, 3, 5)
    t = torch.randint(0, 4, (2, 3, 5))
    t[0, 0, 0] = -100  # ignored
    w = torch.rand(4)
    assert_same(lambda x: F.cross_entropy(x, t.to(x.device), weight=w.to(x.device),
                                          reduction=reduction), x)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_with_masked_minus_inf_logits_stays_finite_like_cpu(mode, reduction, weighted):
    # A class masked to -inf (a constrained vocabulary) is never a target: its log-probability
    # is -inf, and a loss that multiplied every log-probability by a one-hot mask made
    # 0 * -inf = NaN there. Ignored samples (-100) may sit on a -inf class too.
    torch.manual_seed(0)
    x = torch.randn(5, 7)
    x[:, 2] = float("-inf")
    x[3, 0] = float("-inf")
    t = torch.tensor([0, 1, 3, -100, 6])
    w = torch.rand(7) if weighted else None
    want = F.cross_entropy(x, t, weight=w, reduction=reduction)
    assert torch.isfinite(want).all()
    got = F.cross_entropy(x.to("tpu"), t.to("tpu"), reduction=reduction,
                          weight=None if w is None else w.to("tpu"))
    check(got, want)
    assert_same(lambda x: F.cross_entropy(x, t.to(x.device), reduction=reduction,
                                          weight=None if w is None else w.to(x.device)), x)


def test_nll_loss_of_a_single_sample_matches_cpu(mode):
    torch.manual_seed(0)
    x = torch.randn(6).log_softmax(0)
    for t in [torch.tensor(4), torch.tensor(-100)]:
        for reduction in ["mean", "sum", "none"]:
            assert_same(lambda x: F.nll_loss(x, t.to(x.device), reduction=reduction), x)


def test_masked_fill_scalar_and_tensor_values_match_cpu(mode):
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    mask = torch.rand(4) > 0.5
    assert_same(lambda x: x.masked_fill(mask.to(x.device), -1.5) * 2, x)
    assert_same(lambda x: x.masked_fill(mask.to(x.device), torch.tensor(3.0)) * 2, x)
    xt = x.to("tpu")
    deferfuse_torch.reset_fallback_counts()
    xt.masked_fill_(mask.to("tpu"), float("-inf"))
    xt[0].masked_fill_(mask.to("tpu"), torch.tensor(7.0).to("tpu"))
    ints = torch.arange(4).to("tpu").masked_fill(mask.to("tpu"), 2.7)
    assert deferfuse_torch.fallback_counts() == {}
    want = x.masked_fill(mask, float("-inf"))
    want[0].masked_fill_(mask, 7.0)
    check(xt, want)
    check(ints, torch.arange(4).masked_fill(mask, 2.7))


def test_masked_fill_broadcasts_self_with_a_larger_mask_as_cpu_does(mode):
    # Falcon's alibi scores: a [b, h, 1, s] tensor filled through a [b, 1, s, s] mask gives
    # [b, h, s, s]; gradients sum back to the input's shape.
    torch.manual_seed(0)
    x = torch.randn(2, 3, 1, 5)
    mask = torch.rand(2, 1, 5, 5) > 0.5
    assert_same(lambda x: x.masked_fill(mask.to(x.device), -2.0) * 3, x)
    assert_same(lambda x: x.masked_fill(mask.to(x.device), torch.tensor(1.5)) * 3, x)


def test_in_place_masked_fill_rejects_a_mask_larger_than_self_with_cpus_message():
    x, mask = torch.zeros(2, 1, 5), torch.ones(2, 4, 5, dtype=torch.bool)
    with pytest.raises(RuntimeError) as cpu:
        x.masked_fill_(mask, 1.0)
    with pytest.raises(RuntimeError) as tpu:
        x.to("tpu").masked_fill_(mask.to("tpu"), 1.0)
    assert str(tpu.value).split("\n")[0] == str(cpu.value).split("\n")[0]


def test_masked_fill_rejects_a_non_bool_mask():
    with pytest.raises(RuntimeError, match="boolean masks"):
        torch.zeros(3).to("tpu").masked_fill(torch.ones(3, dtype=torch.long).to("tpu"), 1.0)


NORM_ORDS = [2, 1, float("inf"), float("-inf"), 0, 3, 0.5]


@pytest.mark.parametrize("ord", NORM_ORDS)
def test_vector_norm_matches_cpu_over_all_and_some_dims(mode, ord):
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5)
    x[0, 0, :2] = 0.0
    for kw in [dict(), dict(dim=1), dict(dim=(0, 2), keepdim=True)]:
        deferfuse_torch.reset_fallback_counts()
        got = torch.linalg.vector_norm(x.to("tpu"), ord, **kw)
        assert deferfuse_torch.fallback_counts() == {}
        check(got, torch.linalg.vector_norm(x, ord, **kw))


def test_vector_norm_with_a_dtype_matches_cpu(mode):
    x = torch.randn(5, 3)
    check(torch.linalg.vector_norm(x.to("tpu"), dtype=torch.float64),
          torch.linalg.vector_norm(x, dtype=torch.float64))


def test_normalize_and_clip_grad_norm_match_cpu_without_fallbacks(mode):
    torch.manual_seed(0)
    assert_same(lambda x: F.normalize(x, dim=1), torch.randn(4, 6))
    model = nn.Linear(6, 3)
    dev = copy.deepcopy(model).to("tpu")
    x = torch.randn(4, 6)
    model(x).square().sum().backward()
    deferfuse_torch.reset_fallback_counts()
    dev(x.to("tpu")).square().sum().backward()
    total = nn.utils.clip_grad_norm_(dev.parameters(), 0.5)
    assert deferfuse_torch.fallback_counts() == {}
    check(total, nn.utils.clip_grad_norm_(model.parameters(), 0.5))
    for p, q in zip(model.parameters(), dev.parameters()):
        check(q.grad, p.grad)


DISTANCES = {
    "pairwise_distance": lambda a, b: F.pairwise_distance(a, b),
    "pairwise_distance_p1_keepdim": lambda a, b: F.pairwise_distance(a, b, p=1.0, keepdim=True),
    "cosine_similarity": lambda a, b: F.cosine_similarity(a, b, dim=1),
    "triplet_margin_loss": lambda a, b: F.triplet_margin_loss(a[:3], b[:3], a[3:6]),
    "legacy_norm_dim": lambda a, b: torch.norm(a - b, p=3, dim=1),
    "legacy_norm_all": lambda a, b: torch.ops.aten.norm.Scalar(a * b, 2),
}


@pytest.mark.parametrize("case", sorted(DISTANCES))
def test_distance_matches_cpu_forward_and_backward_with_no_fallback(mode, case):
    # at::norm (the legacy norm) and clamp_min with a tensor bound ran on the CPU fallback.
    torch.manual_seed(0)
    a, b = torch.randn(6, 5), torch.randn(6, 5)
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    out = DISTANCES[case](ac, bc)
    grad = torch.randn_like(out)
    out.backward(grad)
    at, bt = a.to("tpu").requires_grad_(), b.to("tpu").requires_grad_()
    deferfuse_torch.reset_fallback_counts()
    dout = DISTANCES[case](at, bt)
    dout.backward(grad.to("tpu"))
    assert deferfuse_torch.fallback_counts() == {}
    check(dout, out.detach())
    check(at.grad, ac.grad, atol=2e-5)
    check(bt.grad, bc.grad, atol=2e-5)


def test_clamp_min_and_max_take_tensor_bounds_in_place_and_not(mode):
    x = torch.randn(4, 6)
    lo, hi = torch.full((6,), -0.3), torch.full((4, 1), 0.4, dtype=torch.float64)
    xt = x.to("tpu")
    deferfuse_torch.reset_fallback_counts()
    check(torch.clamp_min(xt, lo.to("tpu")), torch.clamp_min(x, lo))
    check(torch.clamp_max(xt, hi.to("tpu")), torch.clamp_max(x, hi))  # promotes to float64
    y, yt = x.clone(), xt.clone()
    y.clamp_min_(lo)
    yt.clamp_min_(lo.to("tpu"))
    check(yt, y)
    y.clamp_max_(lo + 0.5)
    yt.clamp_max_((lo + 0.5).to("tpu"))
    check(yt, y)
    assert deferfuse_torch.fallback_counts() == {}


class _Reparametrized(nn.Module):
    """Weight norm over the first dim (a Linear), the last (a Conv1d's kernel, as wav2vec2's
    positional convolution), the legacy hook form, and spectral norm (its power iteration's
    vdot)."""

    def __init__(self):
        super().__init__()
        from torch.nn.utils import parametrizations, weight_norm
        self.a = parametrizations.weight_norm(nn.Linear(8, 16))
        self.conv = parametrizations.weight_norm(nn.Conv1d(1, 1, 3, padding=1), dim=2)
        self.b = parametrizations.spectral_norm(nn.Linear(16, 16))
        self.c = weight_norm(nn.Linear(16, 3))

    def forward(self, x):
        h = torch.tanh(self.a(x))
        h = self.conv(h.unsqueeze(1)).squeeze(1)
        return self.c(F.silu(self.b(h)))


@pytest.mark.filterwarnings("ignore:.*weight_norm.*:FutureWarning")
def test_weight_and_spectral_norm_train_with_cpus_losses_and_no_fallback(mode):
    # _weight_norm_interface (and its backward) and vdot ran on the CPU fallback. Built per
    # device from one seed: the legacy weight_norm's module cannot be deep-copied.
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 0])
    trains_like_cpu(lambda dev: _Reparametrized().to(dev),
                    lambda model, dev: F.cross_entropy(model(x.to(dev)), y.to(dev)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", [
    lambda x, w, b: torch.softmax(x, -1),
    lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
    lambda x, w, b: F.layer_norm(x, (x.shape[-1],)),
], ids=["softmax", "layer_norm", "layer_norm_no_affine"])
def test_half_softmax_and_layer_norm_compute_in_float32_and_round_once_as_cpu(mode, fn, dtype):
    # Rounding every op in the half type put softmax up to 6 ulps and layer_norm's outputs
    # near 0 hundreds of ulps off CPU's; computed in float32 they are CPU's bits (within one
    # rounding for float16).
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 64, generator=g).to(dtype)
    w, b = torch.randn(64, generator=g).to(dtype), torch.randn(64, generator=g).to(dtype)
    want = fn(x, w, b)
    got = fn(x.to("tpu"), w.to("tpu"), b.to("tpu"))
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want, rtol=2 ** -10, atol=1e-5)
    xg = x.clone().requires_grad_()
    xt = x.to("tpu").requires_grad_()
    up = torch.randn(16, 64, generator=g).to(dtype)
    fn(xg, w, b).backward(up)
    fn(xt, w.to("tpu"), b.to("tpu")).backward(up.to("tpu"))
    assert xt.grad.dtype == dtype
    torch.testing.assert_close(xt.grad.cpu(), xg.grad, rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax, F.softmin],
                         ids=["softmax", "log_softmax", "softmin"])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_softmax_of_an_empty_tensor_is_empty_as_on_cpu(mode, fn, dim):
    # The reduced dim may be the empty one: amax of nothing is an error, CPU's softmax is not.
    x = torch.randn(5, 0, 0)
    got = fn(x.to("tpu").requires_grad_(), dim)
    check(got, fn(x, dim))
    got.sum().backward()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", [
    lambda x, w, b: F.group_norm(x, 2, w, b),
    lambda x, w, b: F.adaptive_avg_pool2d(x, (3, 2)),
    lambda x, w, b: F.avg_pool2d(x, 3, 2, 1),
    lambda x, w, b: F.interpolate(x, scale_factor=2, mode="bilinear"),
], ids=["group_norm", "adaptive_avg_pool2d", "avg_pool2d", "bilinear"])
def test_half_group_norm_pooling_and_resize_compute_in_float32_and_round_once(mode, fn, dtype):
    # Rounding each op in the half dtype put group norm and the pooling up to a few ulps off
    # CPU's kernels, which compute in float32 and round once (bilinear already did): now within
    # one rounding of the dtype (uneven adaptive windows average by a matrix product, so a sum
    # may round differently).
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 7, 6, generator=g).to(dtype)
    w, b = torch.randn(4, generator=g).to(dtype), torch.randn(4, generator=g).to(dtype)
    want = fn(x, w, b)
    got = fn(x.to("tpu"), w.to("tpu"), b.to("tpu"))
    assert got.dtype == want.dtype
    one_ulp = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
    torch.testing.assert_close(got.cpu(), want, rtol=one_ulp, atol=1e-5)
    xg, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    up = torch.randn(want.shape, generator=g).to(dtype)
    fn(xg, w, b).backward(up)
    fn(xt, w.to("tpu"), b.to("tpu")).backward(up.to("tpu"))
    assert xt.grad.dtype == dtype
    torch.testing.assert_close(xt.grad.cpu(), xg.grad, rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_vector_norm_and_clip_grad_norm_compute_in_float32_and_round_once(mode, dtype):
    # |x|^p was rounded to the half dtype before the sum: ord=6 of -8.5 gave 8.5625 in bfloat16.
    x = torch.tensor(-8.5, dtype=dtype)
    check(torch.linalg.vector_norm(x.to("tpu"), 6), torch.linalg.vector_norm(x, 6), atol=0, rtol=0)
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(64, 64, generator=g).to(dtype) for _ in range(3)]
    norms, clipped = {}, {}
    for dev in ("cpu", "tpu"):
        ps = [torch.zeros(64, 64, dtype=dtype, device=dev, requires_grad=True) for _ in grads]
        for p, gr in zip(ps, grads):
            p.grad = gr.clone().to(dev)  # clipping scales the grads in place
        norms[dev] = torch.nn.utils.clip_grad_norm_(ps, 1.0).cpu()
        clipped[dev] = [p.grad.cpu() for p in ps]
    one_ulp = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
    torch.testing.assert_close(norms["tpu"], norms["cpu"], rtol=one_ulp, atol=0)
    for a, b in zip(clipped["tpu"], clipped["cpu"]):
        torch.testing.assert_close(a, b, rtol=one_ulp, atol=1e-5)


@pytest.mark.parametrize("p,weighted,reduction", [(1, False, "mean"), (2, True, "sum"),
                                                  (1, True, "none")])
def test_multi_margin_loss_and_its_gradient_are_cpus(mode, p, weighted, reduction):
    # It ran on the CPU fallback, forward and backward.
    x, y = torch.randn(6, 5), torch.tensor([0, 4, 2, 2, 1, 3])
    w = torch.rand(5) if weighted else None
    assert_same(lambda t: F.multi_margin_loss(t, y.to(t.device), p=p, margin=0.7,
                                              weight=None if w is None else w.to(t.device),
                                              reduction=reduction), x)


@pytest.mark.parametrize("value", [1.5, -0.5, float("nan")])
def test_binary_cross_entropy_of_an_input_outside_0_1_raises_in_debug_mode(value):
    # CPU checks the input's range; debug mode reads it back to do the same, strict and defer
    # give the formula's NaN (README table).
    x, y = torch.tensor([0.5, value]), torch.tensor([1.0, 1.0])
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(x, y)
    with deferfuse_torch.mode("debug"), pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(x.to("tpu"), y.to("tpu"))
    with deferfuse_torch.mode("defer"):
        assert F.binary_cross_entropy(x.to("tpu"), y.to("tpu")).isnan().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_sigmoid_backward_gives_cpus_bits(mode, dtype):
    # CPU computes (g * (1 - y)) * y; the other association differs in a third of the
    # elements' last bit.
    torch.manual_seed(0)
    y, g = torch.rand(4096, dtype=dtype), torch.randn(4096, dtype=dtype)
    want = torch.ops.aten.sigmoid_backward(g, y)
    got = torch.ops.aten.sigmoid_backward(g.to("tpu"), y.to("tpu"))
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("backward, ops", [
    (lambda g, y: torch.ops.aten.sigmoid_backward(g, y), 3),
    (lambda g, y: torch.ops.aten.tanh_backward(g, y), 3),
])
def test_one_minus_y_in_a_backward_formula_is_one_recorded_op(backward, ops):
    # `1.0 - y` in the C++ formulas was ATen's scalar-first operator: empty_like, fill_ and
    # sub_, three recorded ops (three programs in strict mode) for one subtraction.
    g, y = torch.rand(8, device="tpu"), torch.rand(8, device="tpu")
    before = deferfuse_torch.stats()["ops_recorded"]
    backward(g, y)
    assert deferfuse_torch.stats()["ops_recorded"] - before == ops



def test_tanh_backward_rounds_one_minus_y_squared_where_cpu_contracts_it():
    # README table: CPU's compiler contracts `1 - y * y` into a fused multiply-add (rounded
    # once); the runtime rounds y * y first. Within one rounding of 1 - y^2, times |g|.
    torch.manual_seed(0)
    y, g = torch.rand(4096) * 2 - 1, torch.randn(4096)
    want = torch.ops.aten.tanh_backward(g, y)
    got = torch.ops.aten.tanh_backward(g.to("tpu"), y.to("tpu")).cpu()
    assert torch.equal(want, g * (1 - y.double() * y.double()).float())
    assert torch.equal(got, g * (1 - y * y))
    assert ((got - want).abs() <= g.abs() * 2 ** -24 * 2 + 1e-30).all()


@pytest.mark.parametrize("training", [False, True])
def test_rrelu_of_a_channels_last_input_is_dense_as_on_cpu(mode, training):
    x = torch.randn(2, 4, 6, 5).contiguous(memory_format=torch.channels_last)
    want = F.rrelu(x, training=training)
    got = F.rrelu(x.to("tpu"), training=training)
    assert got.stride() == want.stride() == (120, 30, 5, 1)
    if not training:
        check(got, want)
