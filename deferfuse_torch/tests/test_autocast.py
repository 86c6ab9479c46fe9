"""torch.autocast(device_type="tpu") follows CUDA's op policy (matmul-like ops in the autocast
dtype; softmax, log_softmax, layer_norm, losses and sums in float32; mixed inputs promoted),
and torch.amp.GradScaler("tpu") trains with its unscale and scale-update ops on the device."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import deferfuse_torch
from conftest import check

LOW = [torch.bfloat16, torch.float16]
LOOSE = dict(atol=2e-2, rtol=2e-2)


@pytest.fixture
def counts():
    deferfuse_torch.reset_fallback_counts()
    yield deferfuse_torch.fallback_counts


@pytest.mark.parametrize("dtype", LOW)
def test_linear_runs_in_the_autocast_dtype_like_cpu_autocast(mode, dtype, counts):
    torch.manual_seed(0)
    lin, x = nn.Linear(8, 4), torch.randn(3, 8)
    dlin = nn.Linear(8, 4).to("tpu")
    dlin.load_state_dict(lin.state_dict())
    with torch.autocast("cpu", dtype=dtype):
        want = lin(x)
    with torch.autocast("tpu", dtype=dtype):
        got = dlin(x.to("tpu"))
    assert dlin.weight.dtype == torch.float32
    check(got, want, **LOOSE)
    assert counts() == {}


@pytest.mark.parametrize("op", ["mm", "bmm", "matmul"])
def test_matmul_family_in_low_precision(mode, op, counts):
    torch.manual_seed(0)
    a = torch.randn(2, 3, 4) if op == "bmm" else torch.randn(3, 4)
    b = torch.randn(2, 4, 5) if op == "bmm" else torch.randn(4, 5)
    f = getattr(torch, op)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = f(a, b)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        got = f(a.to("tpu"), b.to("tpu"))
    check(got, want, **LOOSE)


FP32_OPS = {
    "softmax": lambda x: F.softmax(x, -1),
    "log_softmax": lambda x: F.log_softmax(x, -1),
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "sum": lambda x: x.sum(),
    "sum_dim": lambda x: x.sum(1),
    "mse_loss": lambda x: F.mse_loss(x, torch.zeros_like(x)),
    "exp": lambda x: x.exp(),
}


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("op", list(FP32_OPS))
def test_sensitive_ops_of_a_low_precision_input_run_in_float32(mode, op, dtype, counts):
    torch.manual_seed(0)
    x = torch.randn(3, 6).to(dtype)
    want = FP32_OPS[op](x.float())  # CUDA's policy: cast to float32 first
    with torch.autocast("tpu", dtype=dtype):
        got = FP32_OPS[op](x.to("tpu"))
    check(got, want, atol=1e-4, rtol=1e-4)


def test_linear_then_softmax_gives_float32_probabilities(mode, counts):
    torch.manual_seed(0)
    lin, x = nn.Linear(8, 5), torch.randn(4, 8)
    dlin = nn.Linear(8, 5).to("tpu")
    dlin.load_state_dict(lin.state_dict())
    with torch.autocast("tpu", dtype=torch.bfloat16):
        logits = dlin(x.to("tpu"))
        probs = F.softmax(logits, -1)
    assert logits.dtype == torch.bfloat16 and probs.dtype == torch.float32
    want = F.softmax(F.linear(x.bfloat16(), lin.weight.bfloat16(), lin.bias.bfloat16()).float(), -1)
    check(probs, want, **LOOSE)
    assert counts() == {}


def test_mixed_inputs_are_promoted(mode):
    a = torch.randn(4).to(torch.bfloat16)
    b, c = torch.randn(4), torch.randn(4)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        got = torch.addcmul(a.to("tpu"), b.to("tpu"), c.to("tpu"))
    check(got, torch.addcmul(a.float(), b, c), atol=1e-5, rtol=1e-5)


def test_ops_outside_the_policy_and_outside_the_region_are_untouched(mode):
    x = torch.randn(3, 4).to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert (x + 1).dtype == torch.float32
        with torch.autocast("tpu", enabled=False):
            assert torch.mm(x, x.t()).dtype == torch.float32
    assert torch.mm(x, x.t()).dtype == torch.float32


def test_binary_cross_entropy_is_refused_as_on_cuda():
    p = torch.rand(4).to("tpu")
    with torch.autocast("tpu", dtype=torch.float16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, torch.ones(4).to("tpu"))


def test_unsupported_autocast_dtype_disables_autocast_with_a_warning():
    with pytest.warns(UserWarning, match="not supported"):
        with torch.autocast("tpu", dtype=torch.float64):
            pass


def train(device, steps, poison_step=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**8, growth_interval=2)
    x, y = torch.randn(5, 6).to(device), torch.randint(0, 3, (5,)).to(device)
    for step in range(steps):
        opt.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        if step == poison_step:
            with torch.no_grad():
                model[0].weight.grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
    return model, scaler


def test_grad_scaler_training_step_matches_cpu_and_stays_on_the_device(mode, counts):
    model, scaler = train("tpu", 3)
    ref, ref_scaler = train("cpu", 3)
    assert counts() == {}
    assert scaler.get_scale() == ref_scaler.get_scale() == 2.0**9
    for p, q in zip(model.parameters(), ref.parameters()):
        check(p.detach(), q.detach(), **LOOSE)


def test_grad_scaler_skips_a_step_with_inf_gradients_and_backs_off(mode):
    model, scaler = train("tpu", 2, poison_step=1)
    ref, ref_scaler = train("cpu", 2, poison_step=1)
    assert scaler.get_scale() == ref_scaler.get_scale() == 2.0**7
    assert scaler._growth_tracker.item() == 0
    for p, q in zip(model.parameters(), ref.parameters()):
        check(p.detach(), q.detach(), **LOOSE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [None, float("inf"), float("-inf"), float("nan")])
def test_unscale_matches_cpu(mode, dtype, bad, counts):
    grads = [torch.randn(5).to(dtype), torch.randn(2, 3).to(dtype), torch.empty(0, dtype=dtype)]
    if bad is not None:
        grads[1][1, 2] = bad
    found, inv = torch.zeros(()), torch.full((), 0.25)
    dgrads = [g.to("tpu") for g in grads]
    dfound, dinv = found.to("tpu"), inv.to("tpu")
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
    torch._amp_foreach_non_finite_check_and_unscale_(dgrads, dfound, dinv)
    check(dfound, found)
    for g, w in zip(dgrads, grads):
        check(g, w)
    assert counts() == {}


def test_unscale_keeps_an_earlier_found_inf(mode):
    found = torch.ones(1).to("tpu")
    torch._amp_foreach_non_finite_check_and_unscale_([torch.ones(3).to("tpu")], found,
                                                     torch.ones(1).to("tpu"))
    check(found, torch.ones(1))


@pytest.mark.parametrize("found_inf,tracker,scale", [
    (0.0, 0, 4.0),       # counts up
    (0.0, 2, 4.0),       # reaches the interval: grows, restarts
    (1.0, 2, 4.0),       # inf: backs off, restarts
    (0.0, 2, 3e38),      # growth would overflow: scale kept, restarts
])
def test_update_scale_matches_cpu(mode, found_inf, tracker, scale, counts):
    def run(dev):
        s = torch.full((), scale).to(dev)
        t = torch.full((), tracker, dtype=torch.int32).to(dev)
        torch._amp_update_scale_(s, t, torch.full((), found_inf).to(dev), 2.0, 0.5, 3)
        return s, t
    (s, t), (ws, wt) = run("tpu"), run("cpu")
    check(s, ws)
    check(t, wt)
    assert counts() == {}


# Products big enough for the runtime's own bf16 kernel (five rows or more; on AVX512-BF16
# cores, vdpbf16ps pair dot products) and for its vector f16/bf16 loops; the tests above use
# a few rows, which take the widening path.
@pytest.mark.parametrize("dtype", LOW)
def test_a_wide_linear_and_its_gradients_match_cpu_autocast(mode, dtype, counts):
    torch.manual_seed(0)
    lin, x, g = nn.Linear(256, 96), torch.randn(64, 256), torch.randn(64, 96)
    dlin = nn.Linear(256, 96).to("tpu")
    dlin.load_state_dict(lin.state_dict())
    dx = x.to("tpu").requires_grad_()
    x.requires_grad_()
    with torch.autocast("cpu", dtype=dtype):
        want = lin(x)
    want.backward(g)
    with torch.autocast("tpu", dtype=dtype):
        got = dlin(dx)
    got.backward(g.to("tpu"))
    assert got.dtype == dtype
    check(got, want, **LOOSE)
    check(dx.grad, x.grad, **LOOSE)
    check(dlin.weight.grad, lin.weight.grad, **LOOSE)
    check(dlin.bias.grad, lin.bias.grad, **LOOSE)
    assert counts() == {}


@pytest.mark.parametrize("dtype", LOW)
def test_a_convolution_under_autocast_matches_cpu_autocast(mode, dtype, counts):
    torch.manual_seed(0)
    conv, x = nn.Conv2d(16, 32, 3, padding=1), torch.randn(4, 16, 12, 12)
    dconv = nn.Conv2d(16, 32, 3, padding=1).to("tpu")
    dconv.load_state_dict(conv.state_dict())
    with torch.autocast("cpu", dtype=dtype):
        want = conv(x)
    want.float().square().sum().backward()
    with torch.autocast("tpu", dtype=dtype):
        got = dconv(x.to("tpu"))
    got.float().square().sum().backward()
    check(got, want, **LOOSE)
    check(dconv.weight.grad, conv.weight.grad, atol=0.5, rtol=2e-2)
    assert counts() == {}


@pytest.mark.parametrize("dtype", LOW)
def test_a_convolution_with_few_output_channels_sums_in_float32_and_rounds_once(mode, dtype,
                                                                                counts):
    # 16 output channels: the forward and weight gradient run on the float32 conv op (bfloat16
    # operands summed by the op in float32, float16 ones and the weight gradient's widened
    # exactly), the bias added before the one rounding (csrc/conv.cpp, widened_on_conv_op). So
    # each result is the float32 convolution of the half-precision values rounded once, to
    # within one unit in the last place (float32 sums in another order may round the other way
    # at a tie's edge).
    torch.manual_seed(0)
    x, w, b = (torch.randn(4, 8, 12, 12).to(dtype), (torch.randn(16, 8, 3, 3) * 0.3).to(dtype),
               torch.randn(16).to(dtype))
    g = torch.randn(4, 16, 12, 12).to(dtype)
    want = F.conv2d(x.float(), w.float(), b.float(), padding=1)
    want_gw = torch.ops.aten.convolution_backward(g.float(), x.float(), w.float(), None, [1, 1],
                                                  [1, 1], [1, 1], False, [0, 0], 1,
                                                  [False, True, False])[1]
    dx, dw, db, dg = (t.to("tpu") for t in (x, w, b, g))
    report = deferfuse_torch.explain(lambda: F.conv2d(dx, dw, db, padding=1).cpu())
    got = report.result
    got_gw = torch.ops.aten.convolution_backward(dg, dx, dw, None, [1, 1], [1, 1], [1, 1], False,
                                                 [0, 0], 1, [False, True, False])[1].cpu()
    assert got.dtype == dtype and got_gw.dtype == dtype
    ulp = torch.finfo(dtype).eps
    torch.testing.assert_close(got.float(), want, rtol=ulp, atol=1e-6)
    torch.testing.assert_close(got_gw.float(), want_gw, rtol=ulp, atol=1e-6)
    labels = [r["label"] for r in report.regions]
    assert "conv" in labels and not any(lab.startswith("matmul") for lab in labels), labels
    assert counts() == {}


def test_a_bfloat16_convolution_of_many_channels_runs_on_the_conv_op_and_rounds_once(
        mode, counts):
    # 64 output channels: bfloat16 takes the conv op at any channel count (float16 only up to
    # 16, where widening its operands still beats the half-precision GEMM), forward and weight
    # gradient each the float32 sums of the bf16 values rounded once, with no im2col copy or
    # GEMM.
    torch.manual_seed(2)
    x, w = torch.randn(2, 32, 12, 12).bfloat16(), (torch.randn(64, 32, 3, 3) * 0.2).bfloat16()
    g = torch.randn(2, 64, 12, 12).bfloat16()

    def weight_grad(g, x, w):
        return torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [1, 1], [1, 1], False,
                                                   [0, 0], 1, [False, True, False])[1]

    want = F.conv2d(x.float(), w.float(), padding=1)
    want_gw = weight_grad(g.float(), x.float(), w.float())
    dx, dw, dg = (t.to("tpu") for t in (x, w, g))
    report = deferfuse_torch.explain(
        lambda: (F.conv2d(dx, dw, padding=1).cpu(), weight_grad(dg, dx, dw).cpu()))
    got, got_gw = report.result
    assert got.dtype == torch.bfloat16 and got_gw.dtype == torch.bfloat16
    ulp = torch.finfo(torch.bfloat16).eps
    torch.testing.assert_close(got.float(), want, rtol=ulp, atol=1e-6)
    torch.testing.assert_close(got_gw.float(), want_gw, rtol=ulp, atol=1e-5)
    labels = [r["label"] for r in report.regions]
    assert "conv" in labels and not any(lab.startswith("matmul") for lab in labels), labels
    assert counts() == {}


@pytest.mark.parametrize("dtype", LOW)
def test_a_half_convolutions_input_gradient_on_the_conv_op_sums_in_float32_and_rounds_once(
        mode, dtype, counts):
    # Stride 1 over a 12x12 map: the input gradient is the conv op's mirrored convolution, its
    # bfloat16 operands summed by the op in float32 on the bf16 dot-product instruction (no
    # widening casts), float16 ones widened first; rounded once either way.
    torch.manual_seed(1)
    x, w = torch.randn(2, 32, 12, 12).to(dtype), (torch.randn(24, 32, 3, 3) * 0.3).to(dtype)
    g = torch.randn(2, 24, 12, 12).to(dtype)

    def input_grad(g, x, w):
        return torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [1, 1], [1, 1], False,
                                                   [0, 0], 1, [True, False, False])[0]

    want = input_grad(g.float(), x.float(), w.float())
    report = deferfuse_torch.explain(
        lambda: input_grad(*(t.to("tpu") for t in (g, x, w))).cpu())
    got = report.result
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want, rtol=torch.finfo(dtype).eps, atol=1e-6)
    convs = [e["args"]["shapes"] for e in report.timeline["traceEvents"]
             if e.get("ph") == "X" and e.get("name") == "conv"]
    operands = "bfloat16[2, 24, 12, 12]" if dtype == torch.bfloat16 else "float32[2, 24, 12, 12]"
    assert len(convs) == 1 and convs[0].startswith(operands), convs
    assert counts() == {}


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("oc, size, stride", [(16, 20, 1), (32, 20, 1), (32, 6, 1), (32, 33, 2)])
def test_a_half_convolution_adds_its_bias_before_the_one_rounding(mode, dtype, oc, size,
                                                                  stride):
    # A bias of -3 that the sums nearly cancel: rounded before the bias was added, the result
    # was off by up to 256 units in its last place. Every path adds it inside the float32 sum:
    # the widened conv op (16 output channels), the products per sample (a 20x20 map), folded
    # over the batch (6x6) and strided.
    torch.manual_seed(0)
    x, w = torch.randn(2, 8, size, size).to(dtype), torch.randn(oc, 8, 3, 3).to(dtype)
    b = torch.full((oc,), -3.0).to(dtype)
    exact = F.conv2d(x.double(), w.double(), b.double(), stride=stride)
    got = F.conv2d(x.to("tpu"), w.to("tpu"), b.to("tpu"), stride=stride).cpu()
    assert got.dtype == dtype
    ulp = (exact.abs() * torch.finfo(dtype).eps).clamp_min(torch.finfo(dtype).tiny)
    assert ((got.double() - exact).abs() / ulp).max() <= 1.0


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.bfloat16, torch.float32),
                                             (torch.bfloat16, torch.float16),
                                             (torch.float16, torch.bfloat16)])
def test_a_few_channel_half_convolution_with_a_weight_of_another_dtype_raises_as_on_cpu(
        mode, x_dtype, w_dtype):
    # 16 output channels on a 20x20 map: the geometry that widens to float32 (a cast of both
    # operands there would have hidden the mismatch).
    x, w = torch.randn(1, 2, 20, 20).to(x_dtype), torch.randn(16, 2, 3, 3).to(w_dtype)
    with pytest.raises(RuntimeError):
        F.conv2d(x, w, padding=1)
    with pytest.raises(RuntimeError):
        F.conv2d(x.to("tpu"), w.to("tpu"), padding=1).cpu()


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_products_are_the_same_bits_in_strict_and_defer(dtype):
    torch.manual_seed(0)
    x, w = torch.randn(64, 256).to(dtype), torch.randn(96, 256).to(dtype)
    outs = []
    for m in ("strict", "defer"):
        with deferfuse_torch.mode(m):
            outs.append((x.to("tpu") @ w.to("tpu").t() + 1).cpu())
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("dtype", LOW)
def test_half_elementwise_arithmetic_is_cpus_bit_for_bit(mode, dtype):
    torch.manual_seed(0)
    x, y = torch.randn(1001).to(dtype), torch.randn(1001).to(dtype)
    x[::97] = float("inf")
    want = (x * y + 1) / 3
    got = ((x.to("tpu") * y.to("tpu") + 1) / 3).cpu()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~want.isnan()], want[~want.isnan()])


HALF_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "softplus": F.softplus,
    "elu": F.elu,
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "mish": F.mish,
}


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", list(HALF_ACTIVATIONS))
def test_half_activations_and_their_gradients_round_once_as_cpus_do(mode, name, dtype):
    # CPU computes these in float32 and rounds once; tpu composes them from ops, which must
    # not each round in the half type (a bf16 GELU backward was up to hundreds of ulps off).
    f = HALF_ACTIVATIONS[name]
    torch.manual_seed(0)
    x, g = (torch.randn(4096) * 3).to(dtype), torch.randn(4096).to(dtype)
    xc = x.clone().requires_grad_()
    want = f(xc)
    want.backward(g)
    xd = x.to("tpu").requires_grad_()
    got = f(xd)
    got.backward(g.to("tpu"))
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    assert got.dtype == dtype and xd.grad.dtype == dtype
    check(got, want, atol=2e-5, rtol=2 * ulp)
    check(xd.grad, xc.grad, atol=2e-5, rtol=2 * ulp)
