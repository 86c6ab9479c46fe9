"""Per-op cost through the "tpu" device: a loop of tiny ops (`x = x * y + 1` on 8 floats, two
ops per iteration), timed three ways: torch CPU eager (which also computes), "tpu" defer and "tpu" strict. What
each number measures is everything an eager op pays besides its math: PyTorch's Python
binding and dispatcher and the output tensor's creation, and on tpu the C++ kernel, the C ABI
and the runtime's record path (strict also runs each op's program). (The meta device is no
floor for the first part: its ops run Python meta functions, ~1 ms each here.)

The runners take turns (one timed loop of each per round), so load from other processes hits
them alike; each column is the median over --rounds rounds, in microseconds per op. Issue 17's
targets: defer <= 1.0 us, strict <= 2.0 us.

Usage: python bench_tinyop.py [--iters N] [--rounds N] [--json]"""

import argparse
import json
import statistics
import time

import torch

import deferfuse_torch


def per_op_us(device, mode, iters):
    """Microseconds per op of `iters` iterations of `x = x * y + 1`, on-device work included
    (the loop ends with a host read of the result)."""
    ctx = deferfuse_torch.mode(mode) if mode else None
    if ctx is not None:
        ctx.__enter__()
    try:
        x = torch.ones(8, device=device)
        y = torch.ones(8, device=device)
        for _ in range(100):
            x = x * y + 1
        x.sum().item()
        t = time.perf_counter()
        for _ in range(iters):
            x = x * y + 1
        x.sum().item()
        return (time.perf_counter() - t) / (2 * iters) * 1e6
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)


RUNNERS = {"cpu eager": ("cpu", None), "tpu defer": ("tpu", "defer"),
           "tpu strict": ("tpu", "strict")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=5000, help="loop iterations per timing")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds (median reported)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    times = {name: [] for name in RUNNERS}
    for _ in range(args.rounds):
        for name, (device, mode) in RUNNERS.items():
            times[name].append(per_op_us(device, mode, args.iters))
    med = {name: statistics.median(v) for name, v in times.items()}
    if args.json:
        print(json.dumps(med))
        return
    print("| runner | us per op (median) |")
    print("| --- | --- |")
    for name, v in med.items():
        print(f"| {name} | {v:.2f} |")


if __name__ == "__main__":
    main()
