"""PyTorch's transformer inference fast path on tpu: in eval mode under no_grad,
nn.MultiheadAttention calls torch._native_multi_head_attention, nn.TransformerEncoderLayer calls
torch._transformer_encoder_layer_fwd, and nn.TransformerEncoder with a padding mask packs the
batch into a nested tensor first. Each runs on the device (no CPU fallback) and gives CPU's
values within float32 rounding, padded positions included (zeros, as CPU's fast path gives)."""
import pytest
import torch
from torch import nn

import deferfuse_torch

TOL = dict(rtol=1e-5, atol=2e-6)


def on_tpu(module, *args, **kwargs):
    """CPU's result and tpu's for one eval-mode call, and the tpu call's fallbacks."""
    module.eval()
    moved = {}  # one tpu tensor per CPU tensor: the fast path checks query is key is value

    def tpu(v):
        return moved.setdefault(id(v), v.to("tpu")) if torch.is_tensor(v) else v

    with torch.no_grad():
        want = module(*args, **kwargs)
        deferfuse_torch.reset_fallback_counts()
        got = module.to("tpu")(*map(tpu, args), **{k: tpu(v) for k, v in kwargs.items()})
        falls = deferfuse_torch.fallback_counts()
    module.cpu()
    return want, got, falls


def assert_same(want, got):
    if isinstance(want, tuple):
        for w, g in zip(want, got):
            assert_same(w, g)
    elif want is None:
        assert got is None
    else:
        torch.testing.assert_close(got.cpu(), want, equal_nan=True, **TOL)


def mha(embed=32, heads=4):
    torch.manual_seed(0)
    return nn.MultiheadAttention(embed, heads, batch_first=True)


X = torch.randn(3, 6, 32, generator=torch.Generator().manual_seed(1))
PAD = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] + [True] * 5])


@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_self_attention_matches_cpu(mode, need_weights, average):
    want, got, falls = on_tpu(mha(), X, X, X, need_weights=need_weights,
                              average_attn_weights=average)
    assert_same(want, got)
    assert falls == {}


def test_key_padding_mask_matches_cpu(mode):
    want, got, falls = on_tpu(mha(), X, X, X, key_padding_mask=PAD)
    assert_same(want, got)
    assert falls == {}


def test_causal_bool_attention_mask_matches_cpu(mode):
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1)
    want, got, falls = on_tpu(mha(), X, X, X, attn_mask=causal, need_weights=False)
    assert_same(want, got)
    assert falls == {}


def test_float_attention_mask_with_a_padding_mask_matches_cpu(mode):
    causal = nn.Transformer.generate_square_subsequent_mask(6)
    want, got, falls = on_tpu(mha(), X, X, X, attn_mask=causal, key_padding_mask=PAD)
    assert_same(want, got)
    assert falls == {}


def test_a_sample_with_every_key_masked_gets_cpus_nan(mode):
    every = torch.zeros(3, 6, dtype=torch.bool)
    every[1] = True
    want, got, falls = on_tpu(mha(), X, X, X, key_padding_mask=every, need_weights=False)
    assert want[0][1].isnan().all()
    assert_same(want, got)
    assert falls == {}


def test_the_fast_path_op_matches_cpu_where_every_key_is_masked(mode):
    m, every = mha(), torch.zeros(3, 6, dtype=torch.bool)
    every[1] = True
    args = [X, X, X, 32, 4, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias,
            every, True, True, 1]
    with torch.no_grad():
        want = torch._native_multi_head_attention(*args)
        got = torch._native_multi_head_attention(*[a.to("tpu") if torch.is_tensor(a) else a for a in args])
    assert want[0][1].isnan().all()
    assert_same(want, got)


def test_cross_attention_matches_cpu(mode):
    memory = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(2))
    want, got, falls = on_tpu(mha(), X, memory, memory, need_weights=False)
    assert_same(want, got)
    assert falls == {}


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_cpu(mode, activation, norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, activation=activation,
                                       batch_first=True, norm_first=norm_first)
    want, got, falls = on_tpu(layer, X)
    assert_same(want, got)
    assert falls == {}


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_with_a_padding_mask_runs_nested_and_pads_with_zeros_as_cpu(mode, norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=norm_first)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=not norm_first)
    want, got, falls = on_tpu(enc, X, src_key_padding_mask=PAD)
    assert_same(want, got)
    assert falls == {}
    if not norm_first:  # the nested path: padded positions come back as zeros
        assert got.cpu()[2, 1:].abs().max() == 0


def test_encoder_with_a_mask_of_nothing_padded_matches_cpu(mode):
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2)
    want, got, falls = on_tpu(enc, X, src_key_padding_mask=torch.zeros(3, 6, dtype=torch.bool))
    assert_same(want, got)
    assert falls == {}


def test_training_mode_still_takes_the_differentiable_path(mode):
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), 2)
    want = enc(X, src_key_padding_mask=PAD)
    want.sum().backward()
    grads = [p.grad.clone() for p in enc.parameters()]
    enc.zero_grad()
    enc.to("tpu")
    got = enc(X.to("tpu"), src_key_padding_mask=PAD.to("tpu"))
    got.sum().backward()
    torch.testing.assert_close(got.cpu(), want, **TOL)
    for p, g in zip(enc.parameters(), grads):
        torch.testing.assert_close(p.grad.cpu(), g, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("use_gelu", [False, True])
def test_addmm_activation_matches_cpu(mode, use_gelu):
    g = torch.Generator().manual_seed(3)
    b, a, w = torch.randn(8, generator=g), torch.randn(5, 4, generator=g), torch.randn(4, 8, generator=g)
    want = torch._addmm_activation(b, a, w, beta=0.5, alpha=2.0, use_gelu=use_gelu)
    deferfuse_torch.reset_fallback_counts()
    got = torch._addmm_activation(b.to("tpu"), a.to("tpu"), w.to("tpu"), beta=0.5, alpha=2.0,
                                  use_gelu=use_gelu)
    torch.testing.assert_close(got.cpu(), want, **TOL)
    assert deferfuse_torch.fallback_counts() == {}


def test_a_nested_op_without_a_tpu_kernel_runs_on_the_counted_cpu_fallback(mode):
    keep = ~PAD
    want = torch._nested_tensor_from_mask(X, keep).relu().to_padded_tensor(0.0)
    deferfuse_torch.reset_fallback_counts()
    nt = torch._nested_tensor_from_mask(X.to("tpu"), keep.to("tpu"))
    assert nt.is_nested and nt.device.type == "tpu"
    got = nt.relu().to_padded_tensor(0.0)
    torch.testing.assert_close(got.cpu(), want)
    assert deferfuse_torch.fallback_counts() == {"aten::relu": 1}


def test_a_nested_tpu_tensor_copies_to_the_cpu(mode):
    nt = torch._nested_tensor_from_mask(X.to("tpu"), (~PAD).to("tpu"))
    host = nt.cpu()
    assert host.is_nested and host.device.type == "cpu"
    for got, length, want in zip(host.unbind(), [6, 4, 1], X):
        torch.testing.assert_close(got, want[:length])
