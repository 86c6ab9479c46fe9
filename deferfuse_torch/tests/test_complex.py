"""complex64 on "tpu" (csrc/complex.cpp): held as float32 pairs, so view_as_real and
view_as_complex are views of one storage; copies, fill, add, sub, mul, div, ==, !=, where,
neg, abs, sgn, exp, conj, polar, sum, mean, cat, flip and matrix products computed by the
device's float ops in CPU's order; every other op refuses complex64 with an error naming what
complex64 supports (complex128 is refused everywhere). What a model's
rotary embeddings written with complex numbers (Meta's LLaMA reference code) need, and its
training against CPU."""
import copy
import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import deferfuse_torch

from conftest import check, run_both


def cx(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.complex(torch.randn(*shape, generator=g), torch.randn(*shape, generator=g))


def test_a_complex64_tensor_round_trips_to_the_host_bit_for_bit(mode):
    c = cx(3, 5)
    t = c.to("tpu")
    assert t.dtype == torch.complex64 and t.device.type == "tpu"
    assert torch.equal(t.cpu(), c)


def test_view_as_real_and_view_as_complex_share_one_storage(mode):
    t = cx(2, 3).to("tpu")
    pairs = torch.view_as_real(t)
    assert pairs.dtype == torch.float32 and pairs.shape == (2, 3, 2)
    pairs[1, 2, 1] = 7.0
    assert t.cpu()[1, 2].imag == 7.0
    back = torch.view_as_complex(pairs)
    back[0, 0] = 1 + 2j
    assert t.cpu()[0, 0] == 1 + 2j
    check(t.real, t.cpu().real)
    check(t.imag, t.cpu().imag)


def test_clones_and_layout_copies_keep_every_value(mode):
    c = cx(4, 6)
    t = c.to("tpu")
    for got, want in [(t.t().contiguous(), c.t().contiguous()), (t.t().clone(), c.t().clone()),
                      (t[:, ::2].clone(), c[:, ::2].clone())]:
        assert torch.equal(got.cpu(), want)
    assert t.t().clone().stride() == c.t().clone().stride()


def test_fill_and_zeros_write_both_parts(mode):
    assert torch.equal(torch.full((2, 3), 1.5 - 2j, device="tpu").cpu(),
                       torch.full((2, 3), 1.5 - 2j))
    assert torch.equal(torch.zeros(2, dtype=torch.complex64, device="tpu").cpu(),
                       torch.zeros(2, dtype=torch.complex64))


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_arithmetic_with_complex_real_and_scalar_operands_matches_cpu(mode, op):
    # 64 elements: CPU's vectorized complex kernels, whose order (each product rounded, no
    # fused multiply-add) the device follows bit for bit; CPU's scalar tail (a length not a
    # multiple of its vector) may round a product's sum once less (within 1 ulp).
    a, b, r = cx(8, 8), cx(8, 8, seed=1), torch.randn(8, 8)
    f = getattr(torch, op)
    pairs = [(a, b), (a, r), (r, a), (a, 2.5), (a, 1 - 3j)]
    for x, y in pairs:
        dx = x.to("tpu") if isinstance(x, torch.Tensor) else x
        dy = y.to("tpu") if isinstance(y, torch.Tensor) else y
        assert torch.equal(f(dx, dy).cpu(), f(x, y)), (op, x, y)


@pytest.mark.parametrize("op", ["add", "sub"])
@pytest.mark.parametrize("alpha", [2, -0.1, 1 - 2j])
def test_add_and_sub_with_alpha_scale_the_other_operand_as_cpu(mode, op, alpha):
    # alpha * other is CPU's complex product, a real operand or alpha taking part as (x, 0)
    # (SGD's `p.add_(grad, alpha=-lr)` on complex parameters raised).
    a, b, r = cx(8, 8), cx(8, 8, seed=1), torch.randn(8, 8)
    f = getattr(torch, op)
    for x, y in [(a, b), (a, r), (a, 1 + 1j)]:
        dy = y.to("tpu") if isinstance(y, torch.Tensor) else y
        assert torch.equal(f(x.to("tpu"), dy, alpha=alpha).cpu(), f(x, y, alpha=alpha)), (x, y)


def test_sgd_with_momentum_trains_complex_parameters_as_on_cpu(mode):
    p0, g = cx(16), cx(16, seed=2)
    want, got = p0.clone().requires_grad_(), p0.to("tpu").requires_grad_()
    for p in (want, got):
        opt = torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=0.01)
        for _ in range(3):
            p.grad = g.to(p.device)
            opt.step()
    assert torch.equal(got.detach().cpu(), want.detach())


def test_in_place_arithmetic_writes_the_complex_tensor(mode):
    a, b = cx(64), cx(64, seed=1)
    t = a.to("tpu")
    t.mul_(b.to("tpu"))
    t.add_(1j)
    assert torch.equal(t.cpu(), a * b + 1j)


def test_neg_conj_and_abs_match_cpu(mode):
    c = cx(64)
    t = c.to("tpu")
    assert torch.equal((-t).cpu(), -c)
    assert torch.equal(t.conj().cpu(), c.conj().resolve_conj())
    assert torch.equal(torch.conj_physical(t).cpu(), torch.conj_physical(c))
    # abs: sqrt(re * re + im * im), CPU's vectorized abs (its scalar tail uses hypot).
    check(t.abs(), c.abs(), atol=0, rtol=2e-7)


def test_polar_matches_cpu_within_its_sine_and_cosine(mode):
    mag, angle = torch.rand(64) + 0.5, torch.randn(64) * 3
    got = torch.polar(mag.to("tpu"), angle.to("tpu"))
    want = torch.polar(mag, angle)
    check(torch.view_as_real(got), torch.view_as_real(want), atol=1e-6, rtol=1e-6)


def test_casts_between_real_and_complex_match_cpu(mode):
    x = torch.randn(3, 4)
    assert torch.equal(x.to("tpu").to(torch.complex64).cpu(), x.to(torch.complex64))
    # Complex to real keeps the real part; both devices warn that the imaginary part is
    # discarded, once per process (TORCH_WARN_ONCE, so the test does not wait for it).
    c = cx(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = c.to("tpu").to(torch.float32)
    assert torch.equal(got.cpu(), c.real)


def test_ops_without_a_tpu_kernel_take_complex64_through_the_cpu_fallback(mode):
    # torch.fft has no device kernel: it runs on the CPU fallback, complex results and all
    # (FNet's token mixing: fftn(x).real).
    x = torch.randn(2, 8, 16)
    deferfuse_torch.reset_fallback_counts()
    got = torch.fft.fftn(x.to("tpu"), dim=(1, 2)).real
    check(got, torch.fft.fftn(x, dim=(1, 2)).real)
    assert deferfuse_torch.fallback_counts() == {"aten::_fft_c2c": 1}


def test_other_ops_refuse_complex64_naming_what_it_supports():
    t = cx(4).to("tpu")
    for call in [lambda: torch.log(t), lambda: t.prod(), lambda: torch.sin(t)]:
        with pytest.raises(RuntimeError, match="complex64 supports copies, views, add"):
            call()
    with pytest.raises(RuntimeError, match="ComplexDouble is not supported"):
        torch.randn(2, dtype=torch.complex128).to("tpu")


def rotary(x, freqs):
    """Meta's LLaMA reference apply_rotary_emb: x [B, T, H, D] as D/2 complex numbers, times
    freqs [T, D/2] (complex64), back to real."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs.view(1, x.shape[1], 1, -1)).flatten(3)
    return out.type_as(x)


def freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    return torch.polar(torch.ones(end, dim // 2), torch.outer(torch.arange(end).float(), freqs))


def test_complex_rotary_embeddings_and_their_gradient_match_cpu_bit_for_bit(mode):
    x = torch.randn(2, 8, 4, 16)
    f = freqs_cis(16, 8)
    want_x = x.clone().requires_grad_()
    want = rotary(want_x, f)
    want.pow(2).sum().backward()
    got_x = x.to("tpu").requires_grad_()
    deferfuse_torch.reset_fallback_counts()
    got = rotary(got_x, f.to("tpu"))
    got.pow(2).sum().backward()
    assert deferfuse_torch.fallback_counts() == {}
    assert torch.equal(got.detach().cpu(), want.detach())
    assert torch.equal(got_x.grad.cpu(), want_x.grad)


class TinyLlama(nn.Module):
    """Two pre-norm attention blocks with complex rotary embeddings on q and k, as Meta's
    reference code writes them (freqs_cis moved to the activations' device in forward)."""

    def __init__(self, vocab=64, d=32, heads=4, layers=2, seq=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.heads = heads
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d, bias=False) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(layers))
        self.norm = nn.ModuleList(nn.RMSNorm(d) for _ in range(layers))
        self.head = nn.Linear(d, vocab, bias=False)
        self.freqs_cis = freqs_cis(d // heads, seq)

    def forward(self, tokens):
        x = self.emb(tokens)
        B, T, D = x.shape
        self.freqs_cis = self.freqs_cis.to(x.device)
        for qkv, proj, norm in zip(self.qkv, self.proj, self.norm):
            q, k, v = qkv(norm(x)).view(B, T, 3, self.heads, D // self.heads).unbind(2)
            q, k = rotary(q, self.freqs_cis[:T]), rotary(k, self.freqs_cis[:T])
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)
            x = x + proj(a.transpose(1, 2).reshape(B, T, D))
        return self.head(x)


def test_a_llama_with_complex_rotary_embeddings_trains_like_cpu(mode):
    torch.manual_seed(0)
    model = TinyLlama()
    tokens = torch.randint(0, 64, (4, 17))

    def losses(device):
        m = TinyLlama()
        m.load_state_dict(model.state_dict())
        m.freqs_cis = model.freqs_cis
        m = m.to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        out = []
        for _ in range(3):
            t = tokens.to(device)
            loss = F.cross_entropy(m(t[:, :-1]).flatten(0, 1), t[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        return out

    deferfuse_torch.reset_fallback_counts()
    got = losses("tpu")
    assert deferfuse_torch.fallback_counts() == {}
    for g, w in zip(got, losses("cpu")):
        assert math.isclose(g, w, rel_tol=1e-5), (got, w)


def test_torch_compile_runs_complex_rotary_embeddings_as_eager_does():
    # The device's compile backend captures graphs into runtime graphs; one holding a complex64
    # input or output is refused capture (its handles would carry the pairs' dtype) and runs op
    # by op in defer mode instead, and a complex64 host constant uploads as its pairs.
    torch.manual_seed(0)
    model = TinyLlama().to("tpu")
    tokens = torch.randint(0, 64, (2, 9), device="tpu")
    compiled = torch.compile(model, backend="tpu")
    deferfuse_torch.reset_fallback_counts()
    got = compiled(tokens)
    got.sum().backward()
    got_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want = model(tokens)
    want.sum().backward()
    assert deferfuse_torch.fallback_counts() == {}
    assert torch.equal(got.detach().cpu(), want.detach().cpu())
    for g, p in zip(got_grads, model.parameters()):
        assert torch.equal(g.cpu(), p.grad.cpu())


def test_torch_complex_builds_the_pairs_with_broadcasting_and_gradients_as_on_cpu(mode):
    real, imag = torch.tensor([[1.0, -2.0, 3.5]]), torch.tensor([[0.5], [-1.0]])
    got = {}
    for dev in ("cpu", "tpu"):
        r = real.to(dev).detach().requires_grad_()
        i = imag.to(dev).detach().requires_grad_()
        z = torch.complex(r, i)
        torch.view_as_real(z).pow(2).mul(torch.tensor([1.0, 3.0]).to(dev)).sum().backward()
        got[dev] = (z.detach().cpu(), r.grad.cpu(), i.grad.cpu())
    for a, b in zip(got["tpu"], got["cpu"]):
        assert torch.equal(a, b)
    out = torch.empty(0, dtype=torch.complex64, device="tpu")
    torch.complex(real.to("tpu"), imag.to("tpu"), out=out)
    assert torch.equal(out.cpu(), got["cpu"][0])


def test_torch_complex_of_float64_parts_is_a_clear_error(mode):
    with pytest.raises(RuntimeError, match="complex takes float32 real and imag parts"):
        torch.complex(torch.ones(2, dtype=torch.float64, device="tpu"),
                      torch.ones(2, dtype=torch.float64, device="tpu"))


def test_the_imaginary_part_of_a_conjugate_view_reads_negated_as_on_cpu(mode):
    # z.conj().imag is a negative view: PyTorch leaves its negation to the device's copy and
    # clone, which every read of it goes through (to the host, an op's operand, a reduction).
    c = torch.complex(torch.tensor([1., 2.]), torch.tensor([3., -4.]))
    t = c.to("tpu")
    assert t.conj().imag.is_neg()
    check(t.conj().imag, c.conj().imag)
    check(t.conj().imag > 0, c.conj().imag > 0)
    check(t.conj().imag.sum(), c.conj().imag.sum())
    check(t.conj().imag.resolve_neg(), c.conj().imag.resolve_neg())
    check(t.conj().imag.clone(), c.conj().imag.clone())


def test_a_negative_view_of_a_real_tensor_reads_and_copies_negated(mode):
    x = torch.tensor([1., -2., 0.])
    n, want = torch._neg_view(x.to("tpu")), torch._neg_view(x)
    check(n + 0, want + 0)
    into = torch.zeros(3, device="tpu")
    into.copy_(n)
    check(into, want.resolve_neg())
    # -0.0 where CPU makes it: the sign of the zero survives the round trip.
    assert torch.equal(n.cpu().signbit(), want.resolve_neg().signbit())


@pytest.mark.parametrize("write", ["add_", "fill_", "mul_", "copy_"])
def test_an_in_place_write_through_a_negative_view_stores_the_negation(mode, write):
    calls = {"add_": lambda v: v.add_(1), "fill_": lambda v: v.fill_(7), "mul_": lambda v: v.mul_(2),
             "copy_": lambda v: v.copy_(torch.tensor([5., 6.], device=v.device))}
    c = torch.complex(torch.tensor([1., 2.]), torch.tensor([3., -4.]))
    t = c.to("tpu")
    calls[write](t.conj().imag)
    calls[write](c.conj().imag)
    assert torch.equal(t.cpu(), c)
    x = torch.tensor([1., -2.])
    d = x.to("tpu")
    calls[write](torch._neg_view(d))
    calls[write](torch._neg_view(x))
    assert torch.equal(d.cpu(), x)


@pytest.mark.parametrize("write", ["mul_", "add_", "zero_", "neg_", "fill_", "copy_", "setitem"])
def test_an_in_place_write_through_a_conjugate_view_stores_the_conjugate(mode, write):
    # The conjugate fallback runs the op on a resolved clone and copies the result back into
    # the view: that copy stores the conjugate (it raised "view_as_real doesn't work on
    # unresolved conjugated tensors", naming an op the user never called).
    calls = {"mul_": lambda v: v.mul_(2), "add_": lambda v: v.add_(1), "zero_": lambda v: v.zero_(),
             "neg_": lambda v: v.neg_(), "fill_": lambda v: v.fill_(2 + 1j),
             "copy_": lambda v: v.copy_(torch.tensor([5 + 6j, 7 - 8j], device=v.device)),
             "setitem": lambda v: v.__setitem__(0, 9 + 9j)}
    c = torch.complex(torch.tensor([1., 2.]), torch.tensor([3., -4.]))
    t = c.to("tpu")
    calls[write](t.conj())
    calls[write](c.conj())
    assert torch.equal(t.cpu(), c)


@pytest.mark.parametrize("dim", [None, 0, 1, (0, 1), -1])
def test_complex_sums_and_means_reduce_both_parts_as_on_cpu(mode, dim):
    c = cx(3, 5, seed=4)
    t = c.to("tpu")
    kw = {} if dim is None else {"dim": dim}
    check(t.sum(**kw), c.sum(**kw))
    check(t.mean(**kw), c.mean(**kw))
    if dim is not None:
        check(t.sum(keepdim=True, **kw), c.sum(keepdim=True, **kw))
    # A conjugate view sums its conjugates.
    check(t.conj().sum(**kw), c.conj().sum(**kw))


def test_the_gradient_of_a_complex_sum_flows_back_as_on_cpu(mode):
    # |sum(z)|^2 as a spectral loss would take it: sum's backward expands the gradient.
    re, im = torch.randn(4, 3), torch.randn(4, 3)

    def loss(re, im):
        s = torch.complex(re, im).sum(0)
        return (s * s.conj()).real.sum()

    (cpu, cgrads), (dev, dgrads), fallbacks = run_both(loss, re, im)
    check(dev[0], cpu[0])
    for got, want in zip(dgrads, cgrads):
        check(got, want)
    assert fallbacks == {}


@pytest.mark.parametrize("product", ["mm", "bmm", "matmul_broadcast", "mv", "dot", "einsum", "conj_mm"])
def test_complex_matrix_products_match_cpu(mode, product):
    a, b, v = cx(3, 4, seed=1), cx(4, 5, seed=2), cx(4, seed=3)
    ba, bb = cx(2, 3, 4, seed=5), cx(2, 4, 5, seed=6)
    calls = {"mm": lambda d: a.to(d) @ b.to(d), "bmm": lambda d: torch.bmm(ba.to(d), bb.to(d)),
             "matmul_broadcast": lambda d: ba.to(d) @ b.to(d), "mv": lambda d: a.to(d) @ v.to(d),
             "dot": lambda d: torch.dot(v.to(d), v.to(d)),
             "einsum": lambda d: torch.einsum("bij,bjk->bik", ba.to(d), bb.to(d)),
             "conj_mm": lambda d: a.to(d).conj() @ b.to(d)}
    check(calls[product]("tpu"), calls[product]("cpu"))


def test_a_complex_product_with_a_real_matrix_raises_cpus_dtype_error(mode):
    a, r = cx(3, 4), torch.randn(4, 5)
    with pytest.raises(RuntimeError, match="expected m1 and m2 to have the same dtype"):
        a.to("tpu") @ r.to("tpu")


def test_cat_stack_and_flip_of_complex_tensors_match_cpu(mode):
    a = cx(3, 4, seed=7)
    r = torch.randn(3, 2)
    t = a.to("tpu")
    check(torch.cat([t, t.conj()], 1), torch.cat([a, a.conj()], 1))
    check(torch.cat([t, r.to("tpu")], -1), torch.cat([a, r], -1))
    check(torch.stack([t, t * 2], -1), torch.stack([a, a * 2], -1))
    check(torch.flip(t, [-1, 0]), torch.flip(a, [-1, 0]))


class SpectralConv2d(nn.Module):
    """The Fourier neural operator's layer (Li et al.): rfft2, a complex einsum over the
    lowest modes, irfft2."""

    def __init__(self, channels, modes):
        super().__init__()
        self.modes = modes
        g = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.rand(channels, channels, modes, modes, dtype=torch.cfloat,
                                         generator=g) / channels ** 2)

    def forward(self, x):
        xf = torch.fft.rfft2(x)
        out = torch.zeros(x.size(0), x.size(1), x.size(-2), x.size(-1) // 2 + 1,
                          dtype=torch.cfloat, device=x.device)
        m = self.modes
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", xf[:, :, :m, :m], self.w)
        return torch.fft.irfft2(out, s=x.shape[-2:])


def test_a_fourier_layer_trains_like_cpu_with_only_its_ffts_on_the_fallback(mode):
    torch.manual_seed(0)
    layer, x, y = SpectralConv2d(8, 4), torch.randn(2, 8, 16, 16), torch.randn(2, 8, 16, 16)
    losses = {}
    for dev in ("cpu", "tpu"):
        model = copy.deepcopy(layer).to(dev)
        opt = torch.optim.Adam(model.parameters(), 1e-2)
        deferfuse_torch.reset_fallback_counts()
        losses[dev] = []
        for _ in range(3):
            loss = ((model(x.to(dev)) - y.to(dev)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[dev].append(loss.item())
    assert losses["tpu"] == pytest.approx(losses["cpu"], rel=1e-5)
    assert set(deferfuse_torch.fallback_counts()) <= {"aten::_fft_r2c", "aten::_fft_c2r",
                                                      "aten::_fft_c2c"}


def test_complex_division_matches_cpu_including_by_zero(mode):
    a, b, r = cx(64, seed=8), cx(64, seed=9), torch.randn(64)
    a[5], b[3] = 0, 0  # 0 / x, and x / 0: CPU's infinities (NaN where a part is 0)
    t = a.to("tpu")
    for got, want in [(t / b.to("tpu"), a / b), (t / r.to("tpu"), a / r), (r.to("tpu") / t, r / a),
                      (t / (2 - 1j), a / (2 - 1j))]:
        check(got, want)


def test_complex_exp_and_sgn_match_cpu_and_sign_refuses_complex_as_cpu_does(mode):
    a = cx(64, seed=10)
    a[7] = 0  # sgn(0) = 0
    t = a.to("tpu")
    check(t.exp(), a.exp())
    check(t.sgn(), a.sgn())
    with pytest.raises(RuntimeError, match="torch.sign is not intended to support complex"):
        t.sign()


def test_an_stft_magnitude_loss_trains_like_cpu(mode):
    # Vocoders' multi-resolution STFT losses: |stft(x)|, whose backward multiplies by sgn.
    x = torch.randn(2, 1024)

    def loss(x):
        spec = torch.stft(x, 256, return_complex=True, window=torch.hann_window(256, device=x.device))
        return spec.abs().mean() + (spec / (spec.abs() + 1)).real.mean()

    (cpu, cgrads), (dev, dgrads), fallbacks = run_both(loss, x)
    check(dev[0], cpu[0])
    check(dgrads[0], cgrads[0], atol=1e-6)
    assert set(fallbacks) <= {"aten::_fft_r2c", "aten::_fft_c2c"}


def test_complex_equality_and_where_match_cpu(mode):
    a = cx(16, seed=11)
    b = a.clone()
    b[3], b[4] = 0, a[4].conj()  # equal real parts, different imaginary ones
    mask, r = torch.rand(16, generator=torch.Generator().manual_seed(1)) > 0.5, torch.randn(16)
    t, u = a.to("tpu"), b.to("tpu")
    check(t == u, a == b)
    check(t != u, a != b)
    check(t == (1 + 2j), a == (1 + 2j))
    check(t == r.to("tpu"), a == r)
    check(torch.where(mask.to("tpu"), t, u), torch.where(mask, a, b))
    check(torch.where(mask.to("tpu"), t, r.to("tpu")), torch.where(mask, a, r))


def test_item_of_a_complex_tensor_reads_its_pair(mode):
    z = torch.tensor([1 + 2j, 3 - 4j])
    t = z.to("tpu")
    assert t[0].item() == 1 + 2j
    assert t[1].conj().item() == 3 + 4j


def test_vdot_conjugates_its_first_operand(mode):
    a, b = torch.tensor([1 + 2j, 3 - 1j]), torch.tensor([2 - 1j, 1 + 1j])
    check(torch.vdot(a.to("tpu"), b.to("tpu")), torch.vdot(a, b))
    check(torch.vdot(torch.ones(3).to("tpu"), torch.arange(3.).to("tpu")),
          torch.vdot(torch.ones(3), torch.arange(3.)))


def test_complex_abs_sgn_and_exp_at_extreme_values_match_cpu(mode):
    # Squares of 1e30 overflowed (abs inf) and of 1e-30 underflowed (abs 0, so sgn and abs's
    # gradient 0); exp(inf + 0i) made inf * sin(0) = NaN.
    z = torch.tensor([1e-30 + 0j, 1e30 + 1e30j, 3e19 + 0j, 3 + 4j, 0j])
    check(z.to("tpu").abs(), z.abs())
    check(z.to("tpu").sgn(), z.sgn())
    e = torch.tensor([complex(float("inf"), 0), 800 + 0j, 1 + 2j])
    check(e.to("tpu").exp(), e.exp())


def test_a_complex_sum_of_a_0_dim_tensor_checks_its_dim(mode):
    t = torch.tensor(1 + 1j)
    with pytest.raises(IndexError, match="Dimension out of range"):
        t.to("tpu").sum(1)
    check(t.to("tpu").sum(0), t.sum(0))
