"""PyTorch's profiler sees tpu device time: torch.autograd.profiler.profile(use_device="tpu")
(PyTorch's KINETO_PRIVATEUSE1_FALLBACK state, which calls the device's PrivateUse1 profiler
stubs around every op) reports each op's device time in key_averages()."""

import torch

import deferfuse_torch


def profile(fn):
    x = torch.randn(256, 256).to("tpu")
    torch.tpu.synchronize()
    with torch.autograd.profiler.profile(use_device="tpu") as prof:
        fn(x)
    return {e.key: e.self_device_time_total for e in prof.key_averages()}


def test_strict_ops_show_the_device_time_of_their_own_programs():
    with deferfuse_torch.mode("strict"):
        t = profile(lambda x: (x @ x).relu().sum().item())
    assert t["aten::mm"] > 0 and t["aten::relu"] > 0, t
    assert t["aten::mm"] > t["aten::sum"], "the GEMM is the biggest program"


def test_deferred_ops_show_their_device_time_at_the_sync_point_that_ran_them():
    with deferfuse_torch.mode("defer"):
        t = profile(lambda x: (x @ x).relu().sum().item())
    assert t.get("aten::mm", 0) == 0, "recorded, not run, when mm was called"
    assert t["aten::_local_scalar_dense"] > 0, t
