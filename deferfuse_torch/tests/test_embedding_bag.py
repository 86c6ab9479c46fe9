"""nn.EmbeddingBag / F.embedding_bag on tpu (csrc/embedding_bag.cpp): sum, mean and max bags
give CPU's outputs and weight gradients with no CPU fallback, in every mode, including
padding_idx, per_sample_weights, include_last_offset, empty bags and 2-D input."""
import pytest
import torch
import torch.nn.functional as F

import deferfuse_torch
from conftest import check, trains_like_cpu


def both(fn, weight, *args, psw=None):
    """fn(weight, *args) on CPU and on tpu; the output and the weight's gradient (and the
    per-sample weights' when given), after a backward with the same grad_output."""
    results = []
    for dev in ("cpu", "tpu"):
        w = weight.detach().to(dev).requires_grad_()
        p = psw.detach().to(dev).requires_grad_() if psw is not None else None
        moved = [a.to(dev) if isinstance(a, torch.Tensor) else a for a in args]
        deferfuse_torch.reset_fallback_counts()
        out = fn(w, *moved, p) if psw is not None else fn(w, *moved)
        torch.manual_seed(0)
        out.backward(torch.randn(out.shape).to(dev))
        if dev == "tpu":
            assert deferfuse_torch.fallback_counts() == {}
        results.append((out.detach(), w.grad, p.grad if p is not None else None))
    (out, wg, pg), (dout, dwg, dpg) = results
    check(dout, out)
    check(dwg, wg)
    if pg is not None:
        check(dpg, pg)


@pytest.mark.parametrize("bag_mode", ["sum", "mean", "max"])
def test_bags_from_offsets_match_cpu_with_an_empty_bag(mode, bag_mode):
    torch.manual_seed(0)
    weight = torch.randn(10, 4)
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offsets = torch.tensor([0, 2, 2, 5])  # the second bag is empty
    both(lambda w, i, o: F.embedding_bag(i, w, o, mode=bag_mode), weight, indices, offsets)


@pytest.mark.parametrize("bag_mode", ["sum", "mean", "max"])
def test_two_dimensional_input_and_padding_idx_match_cpu(mode, bag_mode):
    torch.manual_seed(0)
    weight = torch.randn(12, 5)
    indices = torch.tensor([[0, 3, 3, 7], [7, 7, 7, 7], [2, 1, 0, 11]])  # bag 1: padding only
    both(lambda w, i: F.embedding_bag(i, w, mode=bag_mode, padding_idx=7), weight, indices)


def test_per_sample_weights_and_include_last_offset_match_cpu(mode):
    torch.manual_seed(0)
    weight, psw = torch.randn(8, 3), torch.randn(6)
    indices, offsets = torch.tensor([0, 1, 7, 7, 2, 3]), torch.tensor([0, 3, 3, 6])
    both(lambda w, i, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p,
                                            include_last_offset=True),
         weight, indices, offsets, psw=psw)


def test_max_bags_send_the_gradient_to_the_first_maximum_as_cpu_does(mode):
    weight = torch.tensor([[1.0, 5.0], [1.0, 2.0], [0.5, 5.0]])
    indices, offsets = torch.tensor([0, 1, 2, 1]), torch.tensor([0, 3])
    both(lambda w, i, o: F.embedding_bag(i, w, o, mode="max"), weight, indices, offsets)


def test_the_module_trains_with_cpus_losses_and_scale_grad_by_freq(mode):
    x, y = torch.randint(0, 20, (8, 5)), torch.randint(0, 2, (8,))
    trains_like_cpu(
        lambda dev: torch.nn.Sequential(
            torch.nn.EmbeddingBag(20, 6, mode="mean", scale_grad_by_freq=True),
            torch.nn.Linear(6, 2)).to(dev),
        lambda model, dev: F.cross_entropy(model(x.to(dev)), y.to(dev)))


def test_sparse_gradients_are_refused_with_a_clear_error():
    bag = torch.nn.EmbeddingBag(5, 2, sparse=True).to("tpu")
    with pytest.raises(RuntimeError, match="sparse=True is not supported"):
        bag(torch.tensor([[0, 1]]).to("tpu"))


def test_offsets_are_not_validated_a_difference_the_readme_states():
    # CPU reads offsets[0] to check it is 0; on tpu that read would be a sync point, so the
    # device takes the offsets as given (README, "nn.EmbeddingBag").
    weight, indices, offsets = torch.randn(4, 2), torch.tensor([0, 1, 2]), torch.tensor([1, 2])
    with pytest.raises(RuntimeError, match="offsets"):
        F.embedding_bag(indices, weight, offsets)
    out = F.embedding_bag(indices.to("tpu"), weight.to("tpu"), offsets.to("tpu"))
    assert out.shape == (2, 2)


@pytest.mark.parametrize("offsets,match", [
    ([0, 2, 1], "non-decreasing"),
    ([1, 2], "offsets\\[0\\] has to be 0"),
    ([0, 4], "can not be greater than input's length"),
])
def test_bad_offsets_raise_in_debug_mode(offsets, match):
    # CPU checks the offsets' values; debug mode reads them back to do the same (README table).
    ids = torch.tensor([1, 2, 3], device="tpu")
    w = torch.arange(8.0, device="tpu").view(4, 2)
    with deferfuse_torch.mode("debug"), pytest.raises(RuntimeError, match=match):
        F.embedding_bag(ids, w, torch.tensor(offsets, device="tpu"))


@pytest.mark.parametrize("bag_mode", ["mean", "max"])
def test_compiled_bags_of_changing_sizes_match_cpu(bag_mode):
    # torch.compile with dynamic shapes traces the kernel with symbolic sizes (a size read as a
    # number failed the trace at the second batch).
    torch.manual_seed(0)
    weight = torch.randn(30, 4)
    compiled = torch.compile(lambda w, i, o: F.embedding_bag(i, w, o, mode=bag_mode),
                             backend="tpu", dynamic=True)
    for n, bags in ((7, 3), (11, 4), (16, 6)):
        indices = torch.randint(0, 30, (n,))
        offsets = torch.cat([torch.zeros(1, dtype=torch.long),
                             torch.randint(0, n, (bags - 1,)).sort().values])
        want = F.embedding_bag(indices, weight, offsets, mode=bag_mode)
        got = compiled(weight.to("tpu"), indices.to("tpu"), offsets.to("tpu"))
        check(got, want)


@pytest.mark.parametrize("bag_mode", ["sum", "mean"])
def test_include_last_offset_with_one_offset_gives_no_bags_in_every_mode(mode, bag_mode):
    # One offset and include_last_offset: no bags. CPU returns an empty result (debug mode's
    # bounds check refused positions that belong to no bag). CPU's weight gradient here reads
    # uninitialised memory (3.0 or 4e-45 where nothing flowed; its mode="max" crashes the
    # process, so it is no oracle there); the device's is zero.
    w = torch.randn(10, 3)
    idx, off = torch.tensor([1, 2, 3]), torch.tensor([0])
    want = F.embedding_bag(idx, w, off, include_last_offset=True, mode=bag_mode)
    wt = w.to("tpu").requires_grad_()
    got = F.embedding_bag(idx.to("tpu"), wt, off.to("tpu"), include_last_offset=True, mode=bag_mode)
    check(got, want)
    got.sum().backward()
    assert torch.equal(wt.grad.cpu(), torch.zeros(10, 3))


def test_max_mode_takes_nan_only_where_a_bag_starts_with_it_as_cpus_loop(mode):
    # CPU's loop starts each bag from its first row and takes a later value only where it is
    # greater: a NaN first stays, a NaN later is passed over. tpu gave zeros for both columns.
    w = torch.tensor([[float("nan"), 1.0], [2.0, float("nan")], [0.0, 0.0]])
    i, o = torch.tensor([0, 1, 2, 1, 2]), torch.tensor([0, 3])
    want = F.embedding_bag(i, w, o, mode="max")
    got = F.embedding_bag(i.to("tpu"), w.to("tpu"), o.to("tpu"), mode="max").cpu()
    torch.testing.assert_close(got, want, equal_nan=True)


def test_max_mode_of_an_empty_input_gives_cpus_zero_bags(mode):
    w = torch.randn(5, 2, requires_grad=True)
    i, o = torch.tensor([], dtype=torch.long), torch.tensor([0, 0])
    want = F.embedding_bag(i, w, o, mode="max")
    dw = w.detach().to("tpu").requires_grad_()
    got = F.embedding_bag(i.to("tpu"), dw, o.to("tpu"), mode="max")
    assert torch.equal(got.cpu(), want)
    got.sum().backward()
    assert torch.equal(dw.grad.cpu(), torch.zeros(5, 2))
