"""F.scaled_dot_product_attention on tpu: one autograd node (csrc/attention.cpp) whose forward
and backward match CPU's flash attention within float32 rounding, in every mode; the cases it
does not cover take PyTorch's own math path and still match CPU."""

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same, check

ATOL = RTOL = 2e-5


def qkv(b=2, h=3, lq=5, lk=7, e=8, ev=6, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, lq, e, generator=g, dtype=dtype),
            torch.randn(b, h, lk, e, generator=g, dtype=dtype),
            torch.randn(b, h, lk, ev, generator=g, dtype=dtype))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_and_its_gradients_match_cpu(mode, causal):
    q, k, v = qkv()
    assert_same(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                q, k, v, atol=ATOL, rtol=RTOL)


def test_a_causal_square_attention_as_a_gpt_block_calls_it_matches_cpu(mode):
    q, k, v = qkv(lq=16, lk=16, e=32, ev=32)
    assert_same(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                q, k, v, atol=ATOL, rtol=RTOL)


def test_a_given_scale_and_float64_match_cpu(mode):
    q, k, v = qkv(dtype=torch.float64)
    assert_same(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3),
                q, k, v, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("shape", [(5, 7), (1, 7), (2, 1, 5, 7)])
def test_a_boolean_mask_of_any_broadcast_shape_matches_cpu(mode, shape):
    q, k, v = qkv()
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[..., 0] = True  # no fully masked row: CPU's flash kernel and the math path disagree there
    assert_same(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask.to(q.device)), q, k, v, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_a_query_with_every_key_masked_gets_zeros_and_finite_gradients_as_on_cpu(mode, kind):
    # A padded query under a padding mask: CPU's flash kernel gives it zero weights (output 0,
    # no gradient from it), where a softmax over -inf would make NaNs that the backward spreads
    # into every gradient.
    q, k, v = qkv()
    keep = torch.rand(5, 7, generator=torch.Generator().manual_seed(3)) > 0.3
    keep[:, 0] = True
    keep[2] = False
    mask = keep if kind == "bool" else torch.zeros(5, 7).masked_fill(~keep, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (out[:, :, 2] == 0).all() and torch.isfinite(out).all()
    assert_same(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask.to(q.device)), q, k, v, atol=ATOL, rtol=RTOL)


def test_an_additive_float_mask_matches_cpu(mode):
    q, k, v = qkv()
    bias = torch.randn(5, 7, generator=torch.Generator().manual_seed(2))
    assert_same(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=bias.to(q.device)), q, k, v, atol=ATOL, rtol=RTOL)


def test_a_three_dim_batch_matches_cpu(mode):
    q, k, v = (t[0] for t in qkv())
    assert_same(F.scaled_dot_product_attention, q, k, v, atol=ATOL, rtol=RTOL)


def test_the_covered_call_is_one_autograd_node_and_dropout_keeps_the_math_path(mode):
    q, k, v = (t.to("tpu").requires_grad_() for t in qkv())
    fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert "Attention" in fused.grad_fn.name(), fused.grad_fn.name()
    dropped = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert "Attention" not in dropped.grad_fn.name(), dropped.grad_fn.name()


@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_attention_and_its_gradients_match_cpu(mode, causal):
    q, _, _ = qkv(h=4)
    _, k, v = qkv(h=2, seed=3)
    assert_same(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=causal, enable_gqa=True), q, k, v, atol=ATOL, rtol=RTOL)


def test_grouped_query_attention_is_one_attention_node_after_the_head_repeat(mode):
    q = qkv(h=4)[0].to("tpu").requires_grad_()
    k, v = (t.to("tpu").requires_grad_() for t in qkv(h=2, seed=3)[1:])
    y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert "Attention" in y.grad_fn.name(), y.grad_fn.name()


def test_heads_that_do_not_divide_raise_cpus_error(mode):
    q = qkv(h=3)[0]
    k, v = qkv(h=2, seed=3)[1:]
    msgs = []
    for dev in ("cpu", "tpu"):
        with pytest.raises(RuntimeError) as e:
            F.scaled_dot_product_attention(q.to(dev), k.to(dev), v.to(dev), enable_gqa=True)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


def test_a_bad_call_raises_cpus_error(mode):
    q, k, v = qkv()
    mask = torch.ones(5, 7, dtype=torch.bool)
    for dev in ("cpu", "tpu"):
        with pytest.raises(RuntimeError) as e:
            F.scaled_dot_product_attention(q.to(dev), k.to(dev), v.to(dev),
                                           attn_mask=mask.to(dev), is_causal=True)
        if dev == "cpu":
            want = str(e.value)
    assert str(e.value) == want


def test_inference_without_grad_matches_cpu(mode):
    q, k, v = qkv()
    with torch.no_grad():
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        got = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"),
                                             is_causal=True)
    check(got, want, atol=ATOL, rtol=RTOL)


def explicit_attention(q, k, v, mask=None, causal=False):
    """softmax(q k^T / sqrt(d), masked) v written out: every op differentiable to any order."""
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1),
                          float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("kind", ["plain", "causal", "mask"])
def test_a_double_backward_through_attention_matches_the_explicit_formula(mode, kind):
    # create_graph=True (gradient penalties, MAML): the second-order gradient reaches q, k and
    # v through the attention probabilities, which the backward computes again with history.
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 2, 5, 8, generator=g)
    w = torch.randn(8, 8, generator=g) * 0.3
    mask = torch.rand(5, 5, generator=g) > 0.3
    mask[:, 0] = True
    coef = torch.linspace(-1, 2, 8)

    def second_order(dev, fn):
        xd, wd = x.to(dev).requires_grad_(), w.to(dev).requires_grad_()
        q = xd @ wd
        kw = dict(attn_mask=mask.to(dev)) if kind == "mask" else dict(is_causal=kind == "causal")
        out = fn(q, xd, xd, **kw)
        loss = (out * coef.to(dev)).sum(-1).pow(2).mean()
        (gx,) = torch.autograd.grad(loss, xd, create_graph=True)
        return torch.autograd.grad(gx.pow(2).sum(), [xd, wd])

    def explicit(q, k, v, attn_mask=None, is_causal=False):
        return explicit_attention(q, k, v, attn_mask, is_causal)

    want = second_order("cpu", explicit)
    got = second_order("tpu", F.scaled_dot_product_attention)
    for a, b in zip(got, want):
        check(a, b, rtol=1e-4, atol=1e-4)


def test_torch_func_grad_and_vmap_through_attention_match_cpu(mode):
    from torch.func import grad, vmap
    q, k, v = qkv(b=3)

    def loss(q, k, v):
        return (F.scaled_dot_product_attention(q, k, v) ** 2).sum()

    want = vmap(grad(loss, argnums=(0, 1, 2)))(q, k, v)
    got = vmap(grad(loss, argnums=(0, 1, 2)))(q.to("tpu"), k.to("tpu"), v.to("tpu"))
    for a, b in zip(got, want):
        check(a, b, rtol=1e-4, atol=1e-5)


def test_forward_mode_ad_through_attention_matches_the_explicit_formula(mode):
    import torch.autograd.forward_ad as fwad
    q, k, v = qkv()
    tq, tk, tv = (torch.randn_like(t) for t in (q, k, v))
    with fwad.dual_level():
        want = fwad.unpack_dual(explicit_attention(
            fwad.make_dual(q, tq), fwad.make_dual(k, tk), fwad.make_dual(v, tv)))
    with fwad.dual_level():
        got = fwad.unpack_dual(F.scaled_dot_product_attention(
            *(fwad.make_dual(a.to("tpu"), b.to("tpu")) for a, b in ((q, tq), (k, tk), (v, tv)))))
    check(got.primal, want.primal, rtol=1e-4, atol=1e-5)
    check(got.tangent, want.tangent, rtol=1e-4, atol=1e-5)
