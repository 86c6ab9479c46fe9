"""Indexing, sorting and scan ops on tpu against CPU, in every eager mode, with no CPU fallback:
index_select, gather, scatter (all reductions), index_add, index_fill, embedding and its
backward, advanced indexing (get and put, also with masks and negative indices), masked_select,
nonzero, isin, cumsum/cumprod, sort, topk, median, kthvalue, unique, out-of-range indices
raising instead of returning a value, data-dependent output sizes syncing under their own
reason, and index tensors on the CPU (taken as CUDA takes them)."""

import pytest
import torch
import torch.nn.functional as F

import deferfuse_torch
from conftest import assert_same, check


@pytest.fixture(autouse=True)
def no_fallback():
    deferfuse_torch.reset_fallback_counts()
    yield
    assert deferfuse_torch.fallback_counts() == {}


def tpu(t):
    return t.to("tpu")


def test_index_select_matches_cpu_on_every_dim(mode):
    x = torch.randn(4, 5, 6)
    idx = torch.tensor([3, 0, 3, 1])
    for dim in range(3):
        i = idx % x.shape[dim]
        check(tpu(x).index_select(dim, tpu(i)), x.index_select(dim, i))


def test_index_select_of_a_transposed_view(mode):
    x = torch.randn(5, 7)
    i = torch.tensor([6, 2, 2])
    check(tpu(x).t().index_select(0, tpu(i)), x.t().index_select(0, i))



@pytest.mark.parametrize("index", [[0], 0], ids=["one_element_vector", "0-dim"])
def test_index_select_of_a_0_dim_tensor_is_0_dim(mode, index):
    x, i = torch.tensor(2.5), torch.tensor(index)
    got, want = tpu(x).index_select(0, tpu(i)), x.index_select(0, i)
    assert got.shape == want.shape == torch.Size([])
    check(got, want)
    with pytest.raises(RuntimeError, match="Index to scalar can have only 1 value"):
        tpu(x).index_select(0, tpu(torch.tensor([0, 0])))

def test_gather_and_take_along_dim(mode):
    x = torch.randn(3, 5)
    i = torch.randint(0, 5, (3, 4))
    check(torch.gather(tpu(x), 1, tpu(i)), torch.gather(x, 1, i))
    check(torch.take_along_dim(tpu(x), tpu(i), 1), torch.take_along_dim(x, i, 1))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(mode, reduce, include_self):
    x = torch.randn(4, 6)
    src = torch.randn(4, 6)
    i = torch.randint(0, 6, (4, 6))
    want = x.scatter_reduce(1, i, src, reduce, include_self=include_self)
    got = tpu(x).scatter_reduce(1, tpu(i), tpu(src), reduce, include_self=include_self)
    check(got, want)


def test_scatter_src_value_and_in_place(mode):
    x = torch.zeros(3, 5)
    i = torch.tensor([[0, 1, 2], [4, 3, 2], [1, 1, 1]])[:, :2]
    src = torch.arange(15.0).view(3, 5)
    check(tpu(x).scatter(1, tpu(i), tpu(src)), x.scatter(1, i, src))
    check(tpu(x).scatter(1, tpu(i), 7.0), x.scatter(1, i, 7.0))
    t = tpu(x.clone())
    t.scatter_add_(1, tpu(i), tpu(src))
    check(t, x.clone().scatter_add_(1, i, src))


def test_index_add_and_index_fill(mode):
    x = torch.randn(5, 3)
    src = torch.randn(4, 3)
    i = torch.tensor([0, 4, 0, 2])
    check(tpu(x).index_add(0, tpu(i), tpu(src), alpha=2.0), x.index_add(0, i, src, alpha=2.0))
    t = tpu(x.clone())
    t.index_fill_(1, tpu(torch.tensor([2, 0])), -1.0)
    check(t, x.clone().index_fill_(1, torch.tensor([2, 0]), -1.0))


@pytest.mark.parametrize("op", ["index_add_", "index_copy_", "scatter_", "scatter_add_",
                                "scatter_reduce_", "index_fill_"])
def test_in_place_scatters_write_into_self_and_keep_its_views_and_untouched_values(mode, op):
    # The runtime writes these into self itself (only the indexed elements): a view of self
    # taken before sees the new values, a non-contiguous self keeps its layout, and what no
    # index names keeps its old value.
    base = torch.randn(6, 8)  # self: its transpose's rows 1-4, [4, 6] with strides (1, 8)
    i1, src = torch.tensor([5, 0, 5]), torch.randn(4, 3)
    i2 = torch.randint(0, 6, (4, 3))
    calls = {
        "index_add_": lambda t, d: t.index_add_(1, d(i1[:2]), d(src[:, :2]), alpha=3.0),
        "index_copy_": lambda t, d: t.index_copy_(1, d(torch.tensor([2, 0])), d(src[:, :2])),
        "scatter_": lambda t, d: t.scatter_(1, d(i2), d(src)),
        "scatter_add_": lambda t, d: t.scatter_add_(1, d(i2), d(src)),
        "scatter_reduce_": lambda t, d: t.scatter_reduce_(1, d(i2), d(src), "amax",
                                                          include_self=False),
        "index_fill_": lambda t, d: t.index_fill_(1, d(torch.tensor([3, 1])), -2.0),
    }
    results = []
    for d in (lambda t: t, tpu):
        t = d(base.clone()).t()[1:5]  # a strided view of a bigger buffer
        alias = t[:, 2]
        out = calls[op](t, d)
        assert out is t
        results.append((t, alias))
    (want, want_alias), (got, got_alias) = results
    assert got.stride() == want.stride()
    check(got, want)
    check(got_alias, want_alias)


def test_in_place_scatter_of_self_into_self_reads_the_old_values(mode):
    x = torch.randn(4, 5)
    i = torch.tensor([[1, 0, 2, 0, 1]])
    want = x.clone().scatter_add_(0, i, x.clone()[:1])
    t = tpu(x.clone())
    t.scatter_add_(0, tpu(i), t[:1])
    check(t, want)
    want = x.clone()
    want.index_add_(1, torch.tensor([4, 0]), want[:, 1:3].clone())
    t = tpu(x.clone())
    t.index_add_(1, tpu(torch.tensor([4, 0])), t[:, 1:3])
    check(t, want)


def test_embedding_forward_and_backward_with_padding_idx(mode):
    w = torch.randn(10, 4, requires_grad=True)
    wt = tpu(w.detach()).requires_grad_()
    idx = torch.tensor([[1, 2, 0], [2, 9, 0]])
    out = F.embedding(idx, w, padding_idx=0)
    out_t = F.embedding(tpu(idx), wt, padding_idx=0)
    check(out_t, out.detach())
    g = torch.randn(2, 3, 4)
    out.backward(g)
    out_t.backward(tpu(g))
    check(wt.grad, w.grad)


@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_embedding_max_norm_renormalizes_the_named_rows_on_the_device_as_cpu(mode, norm_type):
    # F.embedding(max_norm=...) rescales, in place, the rows it looks up whose norm is above
    # max_norm (embedding_renorm_); a row named twice is rescaled once.
    torch.manual_seed(0)
    w = torch.randn(10, 4) * torch.linspace(0.2, 1.5, 10).unsqueeze(1)
    wt = tpu(w)
    idx = torch.tensor([[1, 3, 3], [7, 1, 0], [9, 5, 8]])
    norms = w.norm(p=norm_type, dim=1)
    assert (norms[idx.flatten()] > 1).any() and (norms[idx.flatten()] < 1).any()
    deferfuse_torch.reset_fallback_counts()
    out_t = F.embedding(tpu(idx), wt, max_norm=1.0, norm_type=norm_type)
    out = F.embedding(idx, w, max_norm=1.0, norm_type=norm_type)
    check(out_t, out)
    check(wt, w)
    assert deferfuse_torch.fallback_counts() == {}


def test_advanced_indexing_get(mode):
    x = torch.randn(4, 5, 6)
    i = torch.tensor([0, -1, 2])
    j = torch.tensor([1, 1, 4])
    check(tpu(x)[tpu(i)], x[i])
    check(tpu(x)[:, tpu(j)], x[:, j])
    check(tpu(x)[tpu(i), tpu(j)], x[i, j])
    check(tpu(x)[tpu(i), :, tpu(j)], x[i, :, j])
    mask = x[:, :, 0] > 0
    check(tpu(x)[tpu(mask)], x[mask])


def test_advanced_indexing_put_and_accumulate(mode):
    x = torch.randn(4, 5)
    i = torch.tensor([0, 2, 0])
    v = torch.randn(3, 5)
    t = tpu(x.clone())
    t[tpu(i)] = tpu(v[[1, 1, 2]])  # duplicate-free rows get one value each
    want = x.clone()
    want[i] = v[[1, 1, 2]]
    check(t, want)
    t = tpu(x.clone())
    t.index_put_((tpu(i),), tpu(v), accumulate=True)
    check(t, x.clone().index_put_((i,), v, accumulate=True))
    t = tpu(x.clone())
    t[tpu(x > 0)] = 0.5
    want = x.clone()
    want[x > 0] = 0.5
    check(t, want)


def test_masked_select_and_nonzero(mode):
    x = torch.randn(3, 4)
    m = x > 0.2
    check(torch.masked_select(tpu(x), tpu(m)), torch.masked_select(x, m))
    check(torch.nonzero(tpu(m)), torch.nonzero(m))


def test_isin(mode):
    e = torch.tensor([1, 5, 3, 7, 5])
    t = torch.tensor([5, 7])
    check(torch.isin(tpu(e), tpu(t)), torch.isin(e, t))
    check(torch.isin(tpu(e), tpu(t), invert=True), torch.isin(e, t, invert=True))


def test_cumsum_and_cumprod_dtypes(mode):
    x = torch.randn(3, 6)
    check(tpu(x).cumsum(1), x.cumsum(1))
    check(tpu(x).cumprod(0), x.cumprod(0))
    b = torch.tensor([[True, False, True], [True, True, False]])
    check(tpu(b).cumsum(1), b.cumsum(1))
    check(tpu(x).cumsum(1, dtype=torch.float64), x.cumsum(1, dtype=torch.float64))


def test_sort_topk_median_kthvalue(mode):
    x = torch.randn(4, 7)
    x[1, 3] = x[1, 5]  # a tie: a stable sort keeps index order
    v, i = torch.sort(tpu(x), dim=1, stable=True)
    wv, wi = torch.sort(x, dim=1, stable=True)
    check(v, wv)
    check(i, wi)
    v, i = torch.sort(tpu(x), dim=0, descending=True, stable=True)
    wv, wi = torch.sort(x, dim=0, descending=True, stable=True)
    check(v, wv)
    check(i, wi)
    check(torch.topk(tpu(x), 3, dim=1).values, torch.topk(x, 3, dim=1).values)
    check(torch.argsort(tpu(x), dim=1), torch.argsort(x, dim=1))
    check(tpu(x).median(), x.median())
    check(tpu(x).median(dim=1).values, x.median(dim=1).values)
    check(torch.kthvalue(tpu(x), 2, dim=1).values, torch.kthvalue(x, 2, dim=1).values)


def test_unique_with_inverse_and_counts(mode):
    x = torch.tensor([3, 1, 3, 2, 1, 3])
    u, inv, cnt = torch.unique(tpu(x), return_inverse=True, return_counts=True)
    wu, winv, wcnt = torch.unique(x, return_inverse=True, return_counts=True)
    check(u, wu)
    check(inv, winv)
    check(cnt, wcnt)


@pytest.mark.parametrize("x", [
    torch.tensor([1, 1, 2, 2, 3, 1, 1]),
    torch.tensor([[1.0, 1.0, float("nan")], [float("nan"), 0.0, -0.0]]),
    torch.tensor([True, True, False]),
    torch.tensor([5]),
    torch.empty(0),
], ids=["ints", "nan_and_signed_zeros_2d", "bools", "one", "empty"])
def test_unique_consecutive_runs_on_the_device_as_on_cpu(mode, x):
    deferfuse_torch.reset_fallback_counts()
    got = torch.unique_consecutive(tpu(x), return_inverse=True, return_counts=True)
    want = torch.unique_consecutive(x, return_inverse=True, return_counts=True)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.cpu().nan_to_num(7.0), w.nan_to_num(7.0))
    assert deferfuse_torch.fallback_counts() == {}


def test_unique_consecutive_over_a_dim_runs_on_the_counted_fallback(mode):
    m = torch.tensor([[1, 2], [1, 2], [3, 4]])
    deferfuse_torch.reset_fallback_counts()
    check(torch.unique_consecutive(tpu(m), dim=0), torch.unique_consecutive(m, dim=0))
    assert deferfuse_torch.fallback_counts() == {"aten::unique_consecutive": 1}
    deferfuse_torch.reset_fallback_counts()  # expected here; the file's fixture checks none


def test_an_out_of_range_index_raises_and_the_runtime_stays_usable(mode):
    x = tpu(torch.randn(3, 5))
    with pytest.raises(RuntimeError, match="out of bounds"):
        y = x.index_select(1, tpu(torch.tensor([1, 7])))
        y.cpu()
    with pytest.raises(RuntimeError, match="out of bounds"):
        F.cross_entropy(tpu(torch.zeros(2, 5)), tpu(torch.tensor([1, 7]))).item()
    check(x * 2, x.cpu() * 2)


@pytest.mark.parametrize("op", ["nonzero", "mask_index", "masked_select", "unique", "bincount"])
def test_a_data_dependent_output_size_syncs_with_its_own_reason(op):
    """The host read that sizes the output counts as data_dependent_size, not host_read."""
    fns = {"nonzero": lambda x: torch.nonzero(x > 0), "mask_index": lambda x: x[x > 0],
           "masked_select": lambda x: torch.masked_select(x, x > 0),
           "unique": lambda x: torch.unique(x),
           "bincount": lambda x: torch.bincount((x + 2).long())}
    x = torch.tensor([1.0, -2.0, 3.0, 1.0])
    with deferfuse_torch.mode("defer"):
        dx = tpu(x) * 1.0  # deferred: the read also runs the pending work
        before = deferfuse_torch.stats()["sync_points"]
        got = fns[op](dx)
        after = deferfuse_torch.stats()["sync_points"]
        check(got, fns[op](x))
    assert after["data_dependent_size"] > before["data_dependent_size"]
    assert after["host_read"] == before["host_read"]


def test_bincount_of_a_negative_value_raises_as_on_cpu(mode):
    x = torch.tensor([1, -1, 2])
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.bincount(x)
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.bincount(tpu(x))


def test_histc_with_a_range_and_searchsorted_stay_on_the_device_without_a_sync():
    x = torch.randn(50)
    with deferfuse_torch.mode("defer"):
        dx = tpu(x) * 1.0
        before = deferfuse_torch.stats()["sync_points"]
        h = torch.histc(dx, 7, -2.0, 2.0)
        s = torch.searchsorted(torch.arange(-2.0, 2.0, 0.5).to("tpu"), dx)
        after = deferfuse_torch.stats()["sync_points"]
    assert after == before
    check(h, torch.histc(x, 7, -2.0, 2.0))
    check(s, torch.searchsorted(torch.arange(-2.0, 2.0, 0.5), x))


def test_histc_without_a_range_bins_over_the_data_range(mode):
    x = torch.randn(50)
    check(torch.histc(tpu(x), 7), torch.histc(x, 7))


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_histc_of_data_with_a_non_finite_value_raises_as_on_cpu(mode, bad):
    x = torch.tensor([1.0, bad])
    with pytest.raises(RuntimeError, match="is not finite"):
        torch.histc(x)
    with pytest.raises(RuntimeError, match="is not finite"):
        torch.histc(tpu(x))


def test_histc_with_an_infinite_bound_raises_as_on_cpu(mode):
    x = torch.tensor([1.0, 2.0])
    with pytest.raises(RuntimeError, match=r"range of \[0, inf\] is not finite"):
        torch.histc(tpu(x), 3, 0, float("inf"))


@pytest.mark.parametrize("boundaries", [[-1, 0, 0, 1, 2], [-1.0, 0.0, 0.0, 1.0, 2.0]])
@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("value", [0.5, -0.5, 1.5, 0, 2, 1.00000001, 0.99999999])
def test_a_python_scalar_is_placed_as_a_python_number_by_searchsorted_and_bucketize(
        mode, boundaries, right, value):
    b = torch.tensor(boundaries)
    got = torch.searchsorted(tpu(b), value, right=right).cpu()
    assert got.dtype == torch.int64 and got.shape == ()
    assert got.item() == torch.searchsorted(b, value, right=right).item()
    assert (torch.bucketize(value, tpu(b), right=right).item()
            == torch.bucketize(value, b, right=right).item())


def test_index_tensors_on_the_cpu_index_a_tpu_tensor_as_cuda_allows(mode):
    # BEiT builds its relative position index on the host and indexes a device table with it.
    x = torch.randn(6, 5)
    idx = torch.tensor([[4, 0], [2, 2]])
    mask = torch.tensor([True, False, True, True, False, False])
    check(tpu(x)[idx], x[idx])
    check(tpu(x)[:, idx], x[:, idx])
    check(tpu(x)[mask], x[mask])
    got, want = tpu(x), x.clone()
    got[idx[0]] = 7.0
    want[idx[0]] = 7.0
    check(got, want)


def test_a_cpu_mask_needs_no_device_read():
    x = torch.randn(6, 5)
    mask = torch.tensor([True, False, True, True, False, False])
    with deferfuse_torch.mode("defer"):
        dx = tpu(x) * 2.0
        before = deferfuse_torch.stats()["sync_points"]
        picked = dx[mask]
        after = deferfuse_torch.stats()["sync_points"]
    assert after == before
    check(picked, (x * 2.0)[mask])


def test_index_copy_writes_source_slices_at_the_indexed_positions(mode):
    # It ran on the CPU fallback; HF's static KV cache writes every step through it.
    x, src = torch.zeros(3, 5, 2), torch.randn(3, 2, 2)
    idx = torch.tensor([4, 1])
    check(x.to("tpu").index_copy(1, idx.to("tpu"), src.to("tpu")), x.index_copy(1, idx, src))
    got = x.to("tpu")
    got.index_copy_(1, idx.to("tpu"), src.to("tpu"))
    check(got, x.clone().index_copy_(1, idx, src))
    with pytest.raises(IndexError, match="same slice shapes"):
        x.to("tpu").index_copy(1, idx.to("tpu"), torch.randn(3, 2, 3).to("tpu"))


def test_llama_generate_with_a_static_cache_gives_cpus_tokens_with_no_fallback(mode):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 100, (1, 5))
    kw = dict(max_new_tokens=6, do_sample=False, cache_implementation="static", pad_token_id=0)
    with torch.no_grad():
        want = model.generate(ids, **kw)
        deferfuse_torch.reset_fallback_counts()
        got = model.to("tpu").generate(ids.to("tpu"), **kw)
    assert deferfuse_torch.fallback_counts() == {}
    assert torch.equal(got.cpu(), want)


def test_gather_and_scatter_with_an_empty_index_of_any_dtype_or_rank_are_cpus(mode):
    # CPU checks the index only when it has elements (gather's backward scatters through it).
    x = torch.randn(5)
    for idx in (torch.empty(0, dtype=torch.uint8), torch.empty(2, 0, dtype=torch.long)):
        check(torch.gather(x.to("tpu"), 0, idx.to("tpu")), torch.gather(x, 0, idx))
        check(x.to("tpu").scatter_add(0, idx.to("tpu"), torch.empty(idx.shape).to("tpu")),
              x.scatter_add(0, idx, torch.empty(idx.shape)))
    xt = x.to("tpu").requires_grad_()
    torch.gather(xt, 0, torch.empty(2, 0, dtype=torch.long).to("tpu")).sum().backward()
    check(xt.grad, torch.zeros(5))


def test_gather_of_a_0_dim_input_takes_a_one_element_index_forward_and_backward(mode):
    assert_same(lambda t: torch.gather(t, 0, torch.tensor([0]).to(t.device)), torch.tensor(2.5))


def test_index_add_of_another_dtype_raises_as_on_cpu(mode):
    with pytest.raises(RuntimeError, match=r"self \(Float\) and source \(Double\) must have the same"):
        torch.zeros(3, device="tpu").index_add(
            0, torch.tensor([0], device="tpu"), torch.ones(1, dtype=torch.float64, device="tpu"))


def test_index_add_in_place_from_an_overlapping_source_raises_as_on_cpu(mode):
    x = torch.arange(4.0, device="tpu")
    with pytest.raises(RuntimeError, match="unsupported operation"):
        x.index_add_(0, torch.tensor([0, 1], device="tpu"), x[1:3])
    # Out of place the result is a new tensor: CPU computes it, and so does tpu.
    y = torch.arange(4.0)
    check(x.index_add(0, torch.tensor([0, 1], device="tpu"), x[1:3]),
          y.index_add(0, torch.tensor([0, 1]), y[1:3]))


@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_takes_max_and_min_as_cpu_does(mode, reduce, include_self):
    src, idx = torch.tensor([1.0, 2.0, -3.0, 5.0]), torch.tensor([0, 0, 1, 1])
    want = torch.zeros(3).scatter_reduce(0, idx, src, reduce, include_self=include_self)
    got = torch.zeros(3, device="tpu").scatter_reduce(0, idx.to("tpu"), src.to("tpu"), reduce,
                                                      include_self=include_self)
    check(got, want)


def test_index_put_into_a_contiguous_tensor_scatters_in_place(mode):
    # Each `buf[idx] = row` writes its row into buf: scattering into a copy of buf and writing
    # the copy back allocated and passed over the whole buffer per call (a loop filling a
    # buffer row by row was O(T^2)).
    buf, want = torch.zeros(64, 256, device="tpu"), torch.zeros(64, 256)
    deferfuse_torch.synchronize()
    before = deferfuse_torch.stats()["bytes_allocated"]
    for t in range(8):
        buf.index_put_((torch.tensor([t], device="tpu"),), torch.ones(1, 256, device="tpu") * t)
        want.index_put_((torch.tensor([t]),), torch.ones(1, 256) * t)
    deferfuse_torch.synchronize()
    assert deferfuse_torch.stats()["bytes_allocated"] - before < buf.numel() * 4
    check(buf, want)


def same_ints(got, want):
    assert got.dtype == want.dtype and torch.equal(got.cpu(), want)


@pytest.mark.parametrize("repeats", [[1, 0, 3], [0, 0, 2], [2, 0, 0], [5], [], [3, 1, 0, 2]])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_repeat_interleave_by_a_tensor_runs_on_the_device(mode, repeats, dtype):
    r = torch.tensor(repeats, dtype=dtype)
    x = torch.arange(2.0 * len(repeats)).view(len(repeats), 2)
    deferfuse_torch.reset_fallback_counts()
    same_ints(torch.repeat_interleave(r.to("tpu")), torch.repeat_interleave(r))
    check(x.to("tpu").repeat_interleave(r.to("tpu"), dim=0), x.repeat_interleave(r, dim=0))
    assert deferfuse_torch.fallback_counts() == {}


def test_repeat_interleave_takes_output_size_and_refuses_negative_repeats(mode):
    r = torch.tensor([1, 0, 3])
    same_ints(torch.repeat_interleave(r.to("tpu"), output_size=4),
              torch.repeat_interleave(r, output_size=4))
    with pytest.raises(RuntimeError, match="repeats can not be negative"):
        torch.repeat_interleave(torch.tensor([1, -1], device="tpu"))


def test_index_put_of_values_of_another_dtype_raises_as_on_cpu(mode):
    x = torch.zeros(4, device="tpu")
    with pytest.raises(RuntimeError, match="Index put requires the source and destination dtypes"):
        x[torch.tensor([1], device="tpu")] = torch.ones(1, dtype=torch.float64, device="tpu")


def test_searchsorted_with_nan_among_the_boundaries_counts_the_boundaries_before_a_value():
    # README table: CPU's binary search over boundaries holding NaN gives an index that depends
    # on where it probes; tpu counts the boundaries b with !(b >= v), as CPU's predicate reads
    # them, NaN included. Without NaN both give the same insertion index.
    b = torch.tensor([0.0, 1.0, 2.0, float("nan")])
    v = torch.tensor([1.5, 0.0, 5.0])
    got = torch.searchsorted(b.to("tpu"), v.to("tpu")).cpu()
    assert got.tolist() == [3, 1, 4]
    assert torch.searchsorted(b, v).tolist() == [2, 0, 4]
    finite = b[:3]
    assert torch.equal(torch.searchsorted(finite.to("tpu"), v.to("tpu")).cpu(),
                       torch.searchsorted(finite, v))


@pytest.mark.parametrize("index", [
    lambda x, d: x[..., torch.tensor([0, 2], device=d)],
    lambda x, d: x[:, torch.tensor([True, False, True], device=d)],
])
def test_an_advanced_index_result_is_dense_as_on_cpu(mode, index):
    # Its index dims moved after the others: a permuted view, which `.view(-1)` refused.
    x = torch.arange(24.0).reshape(2, 3, 4)
    want = index(x, "cpu")
    got = index(x.to("tpu"), "tpu")
    assert got.stride() == want.stride()
    assert torch.equal(got.view(-1).cpu(), want.view(-1))


def test_index_fill_counts_negative_indices_from_the_end(mode):
    want = torch.zeros(2, 3).index_fill(1, torch.tensor([-1, 0]), 5.0)
    got = torch.zeros(2, 3, device="tpu").index_fill(1, torch.tensor([-1, 0], device="tpu"), 5.0)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("size,fill", [(4, -1), (1, 0), (0, 0), (2, 7)])
def test_nonzero_static_pads_or_cuts_nonzeros_positions_to_size(mode, size, fill):
    deferfuse_torch.reset_fallback_counts()
    x = torch.tensor([[0, 1], [2, 0]])
    check(torch.nonzero_static(tpu(x), size=size, fill_value=fill),
          torch.nonzero_static(x, size=size, fill_value=fill))
    assert deferfuse_torch.fallback_counts() == {}


@pytest.mark.parametrize("r", [0, 1, 2, 3])
@pytest.mark.parametrize("with_replacement", [False, True])
def test_combinations_run_on_the_device(mode, r, with_replacement):
    deferfuse_torch.reset_fallback_counts()
    a = torch.arange(5)
    check(torch.combinations(tpu(a), r, with_replacement),
          torch.combinations(a, r, with_replacement))
    assert deferfuse_torch.fallback_counts() == {}


def test_a_uint8_mask_indexes_as_a_bool_one_with_cpus_deprecation_warning(mode):
    x = torch.arange(6.).reshape(2, 3)
    mask = torch.tensor([[1, 0, 1], [0, 0, 1]], dtype=torch.uint8)
    with pytest.warns(UserWarning, match="indexing with dtype torch.uint8 is now deprecated"):
        got = x.to("tpu")[mask.to("tpu")]
    torch.testing.assert_close(got.cpu(), x[mask.bool()])


def test_masked_fill_with_a_uint8_mask_raises_cpus_message(mode):
    mask = torch.tensor([1, 0], dtype=torch.uint8, device="tpu")
    with pytest.raises(RuntimeError, match="only supports boolean masks, but got mask with "
                                           "dtype unsigned char"):
        torch.zeros(2, device="tpu").masked_fill(mask, 1.0)


HALF = [torch.bfloat16, torch.float16]

# One op on (self dtype, many duplicate indices): how CPU accumulates half-precision values.
SUM_OPS = {
    "scatter_add": lambda z, i, v: z.scatter_add(0, i, v),
    "scatter_add_": lambda z, i, v: z.clone().scatter_add_(0, i, v),
    "scatter_reduce_sum": lambda z, i, v: z.scatter_reduce(0, i, v, "sum"),
    "scatter_reduce_mean": lambda z, i, v: z.scatter_reduce(0, i, v, "mean", include_self=False),
    "scatter_reduce_prod": lambda z, i, v: (z + 1).scatter_reduce(0, i, v / 10 + 1, "prod"),
    "scatter_value_add": lambda z, i, v: z.scatter(0, i, 0.1, reduce="add"),
    "index_add_2d": lambda z, i, v: z.unsqueeze(1).expand(-1, 3).contiguous().index_add(
        0, i, v.unsqueeze(1).expand(-1, 3).contiguous()),
    # These round every step on CPU, as the runtime's scatter does: a 1-D index_add, one with
    # an alpha or along a middle dim (CPU's float32 path is its scatter_add's, first or last
    # dim with alpha 1 only), index_put_'s accumulate.
    "index_add_1d": lambda z, i, v: z.index_add(0, i, v),
    "index_add_2d_alpha": lambda z, i, v: z.unsqueeze(1).expand(-1, 3).contiguous().index_add(
        0, i, v.unsqueeze(1).expand(-1, 3).contiguous(), alpha=2),
    "index_add_middle_dim": lambda z, i, v: z.view(1, 4, 1).expand(2, 4, 2).contiguous()
        .index_add(1, i, v.view(1, -1, 1).expand(2, -1, 2).contiguous()),
    "index_put_accumulate": lambda z, i, v: z.index_put((i,), v, accumulate=True),
}


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("op", list(SUM_OPS))
def test_half_precision_sums_accumulate_as_cpus(mode, op, dtype):
    # CPU's scatter_add, scatter_reduce (sum, mean, prod), scatter's reduce and a many-dim
    # index_add sum half values in float32 and round once: 2000 x 0.1 into one element is 200,
    # where rounding every step stalls at 32 in bfloat16 (tpu's did); a 1-D index_add and
    # index_put_'s accumulate round every step on CPU too.
    g = torch.Generator().manual_seed(0)
    i = torch.cat([torch.zeros(2000, dtype=torch.long), torch.randint(0, 4, (500,), generator=g)])
    v = torch.cat([torch.full((2000,), 0.1), torch.rand(500, generator=g)]).to(dtype)
    z = torch.zeros(4, dtype=dtype)
    want = SUM_OPS[op](z, i, v)
    got = SUM_OPS[op](z.to("tpu"), i.to("tpu"), v.to("tpu")).cpu()
    assert got.dtype == want.dtype
    assert torch.equal(got, want), (got, want)


@pytest.mark.parametrize("dtype", HALF)
def test_gather_and_index_select_backward_sum_half_gradients_as_cpu(mode, dtype):
    i = torch.zeros(2000, dtype=torch.long)
    grads = {}
    for dev in ("cpu", "tpu"):
        w = torch.full((3, 4), 0.1, dtype=dtype, device=dev, requires_grad=True)
        g = torch.full((3,), 0.1, dtype=dtype, device=dev, requires_grad=True)
        (torch.index_select(w, 0, i.to(dev)).sum() + torch.gather(g, 0, i.to(dev)).sum()).backward()
        grads[dev] = (w.grad.cpu(), g.grad.cpu())
    for got, want in zip(grads["tpu"], grads["cpu"]):
        assert torch.equal(got, want), (got, want)


@pytest.mark.parametrize("dtype", HALF)
def test_where_and_fill_with_a_value_past_the_half_range_give_cpus_inf(mode, dtype):
    # CPU fills a one-element float16/bfloat16 tensor unchecked (torch.where(c, x, 1e40) fills
    # a 0-dim one so) and checks larger ones; tpu raised "value cannot be converted ... without
    # overflow" for both.
    c, x = torch.tensor([True, False]), torch.tensor([1.0, 2.0], dtype=dtype)
    assert torch.equal(torch.where(c.to("tpu"), x.to("tpu"), 1e40).cpu(), torch.where(c, x, 1e40))
    assert torch.equal(torch.zeros((), dtype=dtype, device="tpu").fill_(1e40).cpu(),
                       torch.zeros((), dtype=dtype).fill_(1e40))
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.zeros(2, dtype=dtype).fill_(1e40)
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.zeros(2, dtype=dtype, device="tpu").fill_(1e40)


@pytest.mark.parametrize("dtype", HALF)
def test_a_half_scatter_of_a_value_past_its_range_raises_cpus_overflow_error(mode, dtype):
    i = torch.zeros(3, dtype=torch.long)
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.zeros(2, dtype=dtype).scatter(0, i, 1e40, reduce="add")
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.zeros(2, dtype=dtype, device="tpu").scatter(0, i.to("tpu"), 1e40, reduce="add")


DIM_OPS = {
    "sort": lambda t, d: torch.sort(t, dim=d),
    "topk": lambda t, d: torch.topk(t, 1, dim=d),
    "logcumsumexp": lambda t, d: torch.logcumsumexp(t, d),
    "index_select": lambda t, d: torch.index_select(t, d, torch.tensor([0], device=t.device)),
    "index_fill": lambda t, d: t.index_fill(d, torch.tensor([0], device=t.device), 1.0),
}


@pytest.mark.parametrize("op", list(DIM_OPS))
def test_a_0_dim_input_takes_dim_0_or_minus_1_only_as_on_cpu(mode, op):
    for d in (0, -1):
        want = DIM_OPS[op](torch.tensor(3.0), d)
        got = DIM_OPS[op](torch.tensor(3.0, device="tpu"), d)
        for g, w in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,)):
            assert torch.equal(g.cpu(), w)
    with pytest.raises(IndexError, match="Dimension out of range"):
        DIM_OPS[op](torch.tensor(3.0), 1)
    with pytest.raises(IndexError, match="Dimension out of range"):
        DIM_OPS[op](torch.tensor(3.0, device="tpu"), 1)


def test_gather_and_scatter_on_a_1_d_input_take_a_0_dim_index_as_cpu(mode):
    x, i = torch.tensor([3.0, 4.0]), torch.tensor(1)
    got = torch.gather(x.to("tpu"), 0, i.to("tpu"))
    assert got.shape == () and torch.equal(got.cpu(), torch.gather(x, 0, i))
    src = torch.tensor(5.0)
    assert torch.equal(x.to("tpu").scatter(0, i.to("tpu"), src.to("tpu")).cpu(),
                       x.scatter(0, i, src))
    assert torch.equal(x.to("tpu").scatter(0, i.to("tpu"), 7.0).cpu(), x.scatter(0, i, 7.0))
