"""Mixture-of-experts ops on tpu against CPU, in every eager mode, with no CPU fallback:
torch._grouped_mm / F.grouped_mm (all four operand cases, forward and both gradients, Linear-
layout expert weights, PyTorch's checks and output strides), histc of integer expert ids (which
CUDA counts and PyTorch's CPU kernel refuses: a difference the README states), tril_indices and
triu_indices, and a Hugging Face Mixtral that trains with CPU's losses."""

import pytest
import torch
import torch.nn.functional as F

import deferfuse_torch
from conftest import assert_same, check, trains_like_cpu


@pytest.fixture(autouse=True)
def no_fallback():
    deferfuse_torch.reset_fallback_counts()
    yield
    assert deferfuse_torch.fallback_counts() == {}


def offs_like(x, ends):
    return torch.tensor(ends, dtype=torch.int32, device=x.device)


def test_tokens_grouped_by_expert_match_cpu_forward_and_backward(mode):
    # 2-D x 3-D: one expert with no tokens; the input and weight gradients are the rows and
    # contraction cases.
    x, w = torch.randn(12, 16), torch.randn(4, 16, 8)
    assert_same(lambda x, w: F.grouped_mm(x, w, offs=offs_like(x, [3, 3, 9, 12])), x, w)


def test_linear_layout_expert_weights_are_read_transposed(mode):
    # Hugging Face keeps expert weights as [experts, out, in] and passes weight.transpose(-2, -1).
    x, w = torch.randn(10, 16), torch.randn(3, 12, 16)
    assert_same(lambda x, w: F.grouped_mm(x, w.transpose(-2, -1), offs=offs_like(x, [4, 6, 10])),
                x, w)


def test_the_column_and_contraction_cases_match_cpu(mode):
    a, b = torch.randn(3, 4, 16), torch.randn(16, 12)
    assert_same(lambda a, b: torch._grouped_mm(a, b, offs=offs_like(a, [4, 4, 12])), a, b)
    a, b = torch.randn(8, 20), torch.randn(20, 4)
    assert_same(lambda a, b: torch._grouped_mm(a, b, offs=offs_like(a, [5, 5, 20])), a, b)


def test_two_batched_operands_are_a_batched_product(mode):
    a, b = torch.randn(3, 5, 16), torch.randn(3, 16, 8)
    assert_same(lambda a, b: F.grouped_mm(a, b), a, b)


def test_bfloat16_operands_match_cpu(mode):
    x, w = torch.randn(12, 16).bfloat16(), torch.randn(2, 16, 8).bfloat16()
    assert_same(lambda x, w: F.grouped_mm(x, w, offs=offs_like(x, [5, 12])), x, w,
                atol=2e-2, rtol=2e-2)


def test_the_result_has_cpus_padded_strides(mode):
    # Five outputs per row (Linear-layout weights, so the operand's strides are aligned).
    x, w = torch.randn(6, 8), torch.randn(2, 5, 8).transpose(-2, -1)
    want = F.grouped_mm(x, w, offs=offs_like(x, [2, 6]))
    got = F.grouped_mm(x.to("tpu"), w.to("tpu"), offs=offs_like(x.to("tpu"), [2, 6]))
    assert got.stride() == want.stride() == (8, 1)
    check(got, want)


def test_rows_past_the_last_offset_are_zero_where_cpu_leaves_them_uninitialised(mode):
    x, w = torch.randn(6, 8), torch.randn(2, 8, 4)
    want = F.grouped_mm(x, w, offs=offs_like(x, [2, 4]))
    got = F.grouped_mm(x.to("tpu"), w.to("tpu"), offs=offs_like(x.to("tpu"), [2, 4]))
    check(got[:4], want[:4])
    assert torch.equal(got[4:].cpu(), torch.zeros(2, 4))


def test_offsets_on_the_device_are_no_sync_point():
    x, w = torch.randn(12, 16), torch.randn(4, 16, 8)
    with deferfuse_torch.mode("defer"):
        ids = torch.randint(0, 4, (12,)).to("tpu").int()
        dx, dw = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
        before = deferfuse_torch.stats()["sync_points"]
        counts = torch.histc(ids.sort().values, bins=4, min=0, max=3)
        y = F.grouped_mm(dx, dw, offs=torch.cumsum(counts, 0, dtype=torch.int32))
        y.square().sum().backward()
        after = deferfuse_torch.stats()["sync_points"]
    assert after == before
    ends = torch.cumsum(torch.bincount(ids.cpu(), minlength=4), 0).int()
    check(y, F.grouped_mm(x, w, offs=ends))


@pytest.mark.parametrize("case", ["unaligned stride", "float64", "int64 offsets", "bias",
                                  "no offsets for 2-D"])
def test_bad_calls_raise_cpus_error(case):
    def call(d):
        x, w = torch.randn(10, 8, device=d), torch.randn(3, 8, 8, device=d)
        offs = torch.tensor([3, 3, 10], dtype=torch.int32, device=d)
        if case == "unaligned stride":
            return F.grouped_mm(x, torch.randn(3, 8, 5, device=d), offs=offs)
        if case == "float64":
            return F.grouped_mm(x.double(), w.double(), offs=offs)
        if case == "int64 offsets":
            return F.grouped_mm(x, w, offs=offs.long())
        if case == "bias":
            return F.grouped_mm(x, w, offs=offs, bias=torch.zeros(3, 8, device=d))
        return F.grouped_mm(x, w)
    with pytest.raises(RuntimeError) as cpu:
        call("cpu")
    with pytest.raises(RuntimeError) as tpu:
        call("tpu")
    assert str(tpu.value).split("\n")[0] == str(cpu.value).split("\n")[0]


def test_histc_counts_integer_ids_as_cuda_does_where_cpu_refuses(mode):
    ids = torch.tensor([0, 1, 1, 3, 2, 5, -1, 3], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="not implemented for 'Int'"):
        torch.histc(ids, bins=4, min=0, max=3)
    got = torch.histc(ids.to("tpu"), bins=4, min=0, max=3)
    # The same bins as the float ids', in the ids' dtype.
    check(got, torch.histc(ids.float(), bins=4, min=0, max=3).int())
    # min == max: the data's own range.
    check(torch.histc(ids.to("tpu").long(), bins=7), torch.histc(ids.double(), bins=7).long())


def test_histc_of_bools_still_raises():
    with pytest.raises(RuntimeError, match="not implemented for 'Bool'"):
        torch.histc(torch.ones(3, dtype=torch.bool, device="tpu"), bins=2)


@pytest.mark.parametrize("fn", [torch.tril_indices, torch.triu_indices])
@pytest.mark.parametrize("args", [(5, 5, -1), (3, 6, 2), (4, 3, 0), (0, 3, 0)])
def test_tril_and_triu_indices_match_cpu(mode, fn, args):
    check(fn(*args, device="tpu"), fn(*args))
    check(fn(*args, dtype=torch.int32, device="tpu"), fn(*args, dtype=torch.int32))


def test_a_hugging_face_mixtral_trains_with_cpus_losses():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=1, num_attention_heads=2,
                                     num_key_value_heads=1, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=32)
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))

    def build(dev):
        return transformers.MixtralForCausalLM(cfg).to(dev)

    def loss(m, dev):
        t = tokens.to(dev)
        return m(input_ids=t, labels=t).loss

    trains_like_cpu(build, loss)
