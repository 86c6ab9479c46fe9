"""One nn.Linear + ReLU forward, relu(addmm(b, x, W.t())) with x 64x1024 and W 1024x1024, in
tpu strict and tpu defer (where the bias and ReLU run as the matmul's epilogue), next to torch
CPU eager. This is the layer that dominates the mlp workload; it isolates the cost of the
runtime's fused matmul-epilogue path.

Usage: python bench_linear.py [--reps N]"""

import argparse
import statistics
import time

import torch

import deferfuse_torch


def median_ms(f, device, reps):
    keep = [f() for _ in range(3)]  # results are kept alive: a dead result would not run
    if device == "tpu":
        torch.tpu.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        keep.append(f())
        if device == "tpu":
            torch.tpu.synchronize()
        times.append(time.perf_counter() - t0)
        keep.clear()
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(64, 1024, generator=g), torch.randn(1024, 1024, generator=g),
               torch.randn(1024, generator=g))
    base = median_ms(lambda: torch.relu(torch.addmm(b, x, w.t())), "cpu", a.reps)
    print(f"relu(addmm(b, x, W.t())) 64x1024 @ 1024x1024, median of {a.reps}")
    print(f"  torch cpu eager  {base:6.2f} ms")
    xt, wt, bt = x.to("tpu"), w.to("tpu"), b.to("tpu")
    for mode in ("strict", "defer"):
        with deferfuse_torch.mode(mode):
            for name, rhs in (("W.t() (nn.Linear)", wt.t()), ("contiguous", wt.t().contiguous())):
                ms = median_ms(lambda: torch.relu(torch.addmm(bt, xt, rhs)), "tpu", a.reps)
                print(f"  tpu {mode:6s} rhs {name:18s} {ms:6.2f} ms  x{base / ms:5.2f} vs torch")


if __name__ == "__main__":
    main()
