"""PyTorch's profiler sees tpu device time, through both of its PrivateUse1 paths:
torch.autograd.profiler.profile(use_device="tpu") (PyTorch's KINETO_PRIVATEUSE1_FALLBACK state,
which calls the device's PrivateUse1 profiler stubs around every op), and
torch.profiler.profile(activities=[CPU, PrivateUse1]) (the KINETO_PRIVATEUSE1 state: Kineto
asks the device's registered IActivityProfiler for its program runs, each linked to the op
that launched it). Both report each op's device time in key_averages()."""

import json

import torch
from torch.profiler import ProfilerActivity

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


def kineto_profile(fn, activities=(ProfilerActivity.CPU, ProfilerActivity.PrivateUse1)):
    x = torch.randn(256, 256).to("tpu")
    torch.tpu.synchronize()
    with torch.profiler.profile(activities=list(activities)) as prof:
        fn(x)
    return prof


def device_times(prof):
    return {e.key: e.self_device_time_total for e in prof.key_averages()}


def kernels(trace):
    return [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]


def test_torch_profiler_shows_strict_ops_device_time_from_their_own_programs():
    with deferfuse_torch.mode("strict"):
        t = device_times(kineto_profile(lambda x: (x @ x).relu().sum().item()))
    assert t["aten::mm"] > 0 and t["aten::relu"] > 0, t
    assert t["aten::mm"] > t["aten::sum"], "the GEMM is the biggest program"


def test_torch_profiler_shows_deferred_programs_under_the_sync_point_that_ran_them():
    with deferfuse_torch.mode("defer"):
        t = device_times(kineto_profile(lambda x: (x @ x).relu().sum().item()))
    assert t.get("aten::mm", 0) == 0, "recorded, not run, when mm was called"
    assert t["aten::_local_scalar_dense"] > 0, t


def test_torch_profiler_chrome_trace_draws_each_program_on_the_tpu_process(tmp_path):
    with deferfuse_torch.mode("strict"):
        prof = kineto_profile(lambda x: (x @ x).relu().sum().item())
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    runs = kernels(trace)
    assert any("matmul" in e["name"] for e in runs), [e["name"] for e in runs]
    assert {e["pid"] for e in runs} == {0}, "one device process"
    names = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert (0, "tpu") in names, names
    mm = next(e for e in trace["traceEvents"] if e.get("name") == "aten::mm")
    gemm = next(e for e in runs if "matmul" in e["name"])
    assert mm["ts"] <= gemm["ts"] <= mm["ts"] + mm["dur"] + 1e5, \
        "the program runs on the profile's clock, when its op launched it"


def test_torch_profiler_without_the_privateuse1_activity_collects_no_device_events(tmp_path):
    with deferfuse_torch.mode("strict"):
        prof = kineto_profile(lambda x: (x @ x).sum().item(), activities=[ProfilerActivity.CPU])
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    assert kernels(json.loads(path.read_text())) == []
    assert all(v == 0 for v in device_times(prof).values())
