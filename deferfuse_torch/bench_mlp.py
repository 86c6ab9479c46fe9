"""The mlp workload (shared/notes/workloads.md): forward + backward + AdamW of a 3-layer MLP
784-1024-1024-10, batch 64, f32. Times torch CPU eager, "tpu" strict and "tpu" defer in one
run and prints the medians and their ratios to torch CPU eager.

Usage: python bench_mlp.py [--steps N] [--warmup N] [--threads N]"""

import argparse
import copy
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import deferfuse_torch


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


def time_steps(device, mode, steps, warmup):
    net = copy.deepcopy(model()).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 784, generator=g).to(device)
    y = torch.randint(0, 10, (64,), generator=g).to(device)
    times = []
    ctx = deferfuse_torch.mode(mode) if device == "tpu" else None
    if ctx:
        ctx.__enter__()
    try:
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            if device == "tpu":
                torch.tpu.synchronize()  # the step is done only when its work has run
            times.append(time.perf_counter() - t0)
        final = loss.item()
    finally:
        if ctx:
            ctx.__exit__(None, None, None)
    return statistics.median(times[warmup:]), final


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rows = [("torch cpu eager", "cpu", None), ("tpu strict", "tpu", "strict"),
            ("tpu defer", "tpu", "defer")]
    deferfuse_torch.reset_fallback_counts()
    res = {}
    for name, dev, mode in rows:
        res[name] = time_steps(dev, mode, a.steps, a.warmup)
    base = res["torch cpu eager"][0]
    print(f"mlp 784-1024-1024-10 batch 64, fwd+bwd+AdamW, median of {a.steps} steps "
          f"(torch threads: {a.threads})")
    for name, _, _ in rows:
        ms, loss = res[name]
        print(f"  {name:16s} {ms * 1e3:8.2f} ms/step  x{base / ms:5.2f} vs torch cpu eager"
              f"  (final loss {loss:.5f})")
    print(f"  tpu defer vs tpu strict: x{res['tpu strict'][0] / res['tpu defer'][0]:.2f}")
    print(f"  CPU-fallback ops during the tpu runs: {deferfuse_torch.fallback_counts() or 0}")


if __name__ == "__main__":
    main()
