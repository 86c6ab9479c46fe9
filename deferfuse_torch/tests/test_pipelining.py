"""Defer mode's pipelining: once set_pipeline_ops(n) deferred ops are held (default 48), the next
matmul or kernel op starts running them while Python records on. Pipelined flushes are counted,
are not sync points, and change no result: a training step gives the same bits with pipelining
on or off."""
import copy

import pytest
import torch

import deferfuse_torch


def chain(x, w, n):
    """n layers of `tanh(x @ w)`: a matmul, then an elementwise op."""
    for _ in range(n):
        x = torch.tanh(x @ w)
    return x


def test_set_pipeline_ops_returns_the_previous_value():
    prev = deferfuse_torch.set_pipeline_ops(17)
    try:
        assert deferfuse_torch.set_pipeline_ops(33) == 17
    finally:
        deferfuse_torch.set_pipeline_ops(prev)


def test_the_pipeline_ops_block_restores_the_previous_value_even_when_it_raises():
    prev = deferfuse_torch.set_pipeline_ops(21)
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with deferfuse_torch.pipeline_ops(5):
                assert deferfuse_torch.set_pipeline_ops(5) == 5
                raise RuntimeError("inside")
        with deferfuse_torch.pipeline_ops(None):
            assert deferfuse_torch.set_pipeline_ops(21) == 21
        assert deferfuse_torch.set_pipeline_ops(21) == 21
    finally:
        deferfuse_torch.set_pipeline_ops(prev)


@pytest.mark.parametrize("bad", [-1, 2.5, "64", True])
def test_a_bad_pipeline_ops_value_is_a_value_error(bad):
    with pytest.raises(ValueError, match="set_pipeline_ops expects an int >= 0"):
        deferfuse_torch.set_pipeline_ops(bad)


def inputs():
    x, w = torch.randn(8, 16), torch.randn(16, 16) / 4
    return x, w, x.to("tpu"), w.to("tpu")


def test_a_long_defer_trace_starts_running_before_a_sync_point():
    x, w, xt, wt = inputs()
    torch.tpu.synchronize()
    with deferfuse_torch.mode("defer"), deferfuse_torch.pipeline_ops(4):
        before = deferfuse_torch.stats()
        # 12 ops; 4 held before the 3rd and the 5th matmul: two pipelined flushes.
        y = chain(xt, wt, 6)
        after = deferfuse_torch.stats()
    assert after["pipelined_flushes"] - before["pipelined_flushes"] == 2
    assert after["sync_points"] == before["sync_points"], "a pipelined flush is no sync point"
    torch.testing.assert_close(y.cpu(), chain(x, w, 6))


def test_pipelining_off_defers_until_a_sync_point():
    _, _, xt, wt = inputs()
    torch.tpu.synchronize()
    with deferfuse_torch.mode("defer"), deferfuse_torch.pipeline_ops(0):
        before = deferfuse_torch.stats()["pipelined_flushes"]
        y = chain(xt, wt, 100)
        assert not deferfuse_torch.is_materialized(y)
        assert deferfuse_torch.stats()["pipelined_flushes"] == before


def _train(n_ops, steps=4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.LayerNorm(64), torch.nn.Linear(64, 8)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 32, generator=g), torch.randint(0, 8, (16,), generator=g))
               for _ in range(steps)]
    losses = []
    with deferfuse_torch.mode("defer"), deferfuse_torch.pipeline_ops(n_ops):
        for x, y in batches:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x.to("tpu")), y.to("tpu"))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        weights = [copy.deepcopy(p.detach().cpu()) for p in model.parameters()]
    return losses, weights


def test_a_training_step_gives_the_same_bits_with_pipelining_on_and_off():
    off_losses, off_weights = _train(0)
    for n in (3, 48):
        losses, weights = _train(n)
        assert losses == off_losses, n
        for a, b in zip(weights, off_weights):
            assert torch.equal(a, b), n


def test_explain_counts_pipelined_flushes_apart_from_sync_points():
    _, _, xt, wt = inputs()
    torch.tpu.synchronize()
    with deferfuse_torch.mode("defer"), deferfuse_torch.pipeline_ops(4):
        r = deferfuse_torch.explain(lambda: chain(xt, wt, 6).sum().item())
    assert r.pipelined_flushes == 2
    assert r.sync_points == {"host_read": 1}
    assert "pipelined flushes: 2" in str(r) and r.as_dict()["pipelined_flushes"] == 2
