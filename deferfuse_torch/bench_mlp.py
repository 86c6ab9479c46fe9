"""The mlp workload (shared/notes/workloads.md): forward + backward + AdamW of a 3-layer MLP
784-1024-1024-10, batch 64, f32. Times torch CPU eager, "tpu" strict and "tpu" defer in one
run and prints the medians and their ratios to torch CPU eager.

The three configurations step in turn (one step each per round), so load from other processes
hits them alike. A tpu step ends with torch.tpu.synchronize(): its work has run.

Usage: python bench_mlp.py [--steps N] [--warmup N] [--threads N]"""

import argparse
import copy
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import deferfuse_torch


class Run:
    def __init__(self, name, device, mode, net, batches):
        self.name, self.device, self.mode = name, device, mode
        self.net = copy.deepcopy(net).to(device)
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=1e-3, weight_decay=0.01)
        self.batches = [(x.to(device), y.to(device)) for x, y in batches]
        self.times, self.loss, self.i = [], None, 0

    def step(self):
        x, y = self.batches[self.i % len(self.batches)]
        self.i += 1
        ctx = deferfuse_torch.mode(self.mode) if self.device == "tpu" else None
        t0 = time.perf_counter()
        if ctx:
            ctx.__enter__()
        self.opt.zero_grad()
        self.loss = F.cross_entropy(self.net(x), y)
        self.loss.backward()
        self.opt.step()
        if ctx:
            torch.tpu.synchronize()
            ctx.__exit__(None, None, None)
        self.times.append(time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                        nn.Linear(1024, 10))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g))
               for _ in range(8)]
    runs = [Run("torch cpu eager", "cpu", None, net, batches),
            Run("tpu strict", "tpu", "strict", net, batches),
            Run("tpu defer", "tpu", "defer", net, batches)]
    deferfuse_torch.reset_fallback_counts()
    for _ in range(a.warmup + a.steps):
        for r in runs:
            r.step()
    med = {r.name: statistics.median(r.times[a.warmup:]) for r in runs}
    base = med["torch cpu eager"]
    print(f"mlp 784-1024-1024-10 batch 64, fwd+bwd+AdamW, median of {a.steps} steps "
          f"(torch threads: {a.threads})")
    for r in runs:
        print(f"  {r.name:16s} {med[r.name] * 1e3:8.2f} ms/step  x{base / med[r.name]:5.2f} "
              f"vs torch cpu eager  (last loss {r.loss.item():.5f})")
    print(f"  tpu defer vs tpu strict: x{med['tpu strict'] / med['tpu defer']:.2f}")
    print(f"  CPU-fallback ops during the tpu runs: {deferfuse_torch.fallback_counts() or 0}")


if __name__ == "__main__":
    main()
