"""GEMM on the layouts nn.Linear, attention and their backwards hand the device, tpu vs torch
CPU eager, 1 thread, one run (issue 17's target: tpu >= torch on every one).

For a Linear with weight W [out, in] and input x [batch, in]:
  forward   x @ W.t()      B is W transposed (column-major)
  grad_x    g @ W          both contiguous
  grad_W    g.t() @ x      A is g transposed
and for attention over [batch * heads, seq, head_dim] views:
  q @ k^T, p @ v, dO @ v^T, p^T @ dO.
Each row times torch.mm/bmm on CPU and on tpu (the op and a synchronize, so a tpu time includes
one launch, ~10-50 us), interleaved round by round; the medians and tpu/torch speed ratio are
printed. Usage: python bench_gemm.py [--reps N] [--quick]"""

import argparse
import statistics
import time

import torch

import deferfuse_torch  # noqa: F401  (registers the device)


def cases(quick):
    batches = [16, 256, 1024] if quick else [1, 16, 64, 256, 1024, 4096]
    for (k, n) in ([(128, 384), (1024, 1024)] if not quick else [(128, 384)]):
        for b in batches:
            yield f"Linear {k}->{n} fwd x@W.t()", b, lambda b=b, k=k, n=n: (
                torch.randn(b, k), torch.randn(n, k), lambda x, w: torch.mm(x, w.t()))
            yield f"Linear {k}->{n} grad_x g@W", b, lambda b=b, k=k, n=n: (
                torch.randn(b, n), torch.randn(n, k), torch.mm)
            yield f"Linear {k}->{n} grad_W g.t()@x", b, lambda b=b, k=k, n=n: (
                torch.randn(b, n), torch.randn(b, k), lambda g, x: torch.mm(g.t(), x))
    for (bh, s, e) in [(64, 64, 32)] + ([] if quick else [(96, 256, 64)]):
        yield f"attn q@k^T [{bh},{s},{e}]", bh, lambda bh=bh, s=s, e=e: (
            torch.randn(bh, s, e), torch.randn(bh, s, e),
            lambda q, k: torch.bmm(q, k.transpose(1, 2)))
        yield f"attn p@v [{bh},{s},{e}]", bh, lambda bh=bh, s=s, e=e: (
            torch.randn(bh, s, s), torch.randn(bh, s, e), torch.bmm)
        yield f"attn p^T@dO [{bh},{s},{e}]", bh, lambda bh=bh, s=s, e=e: (
            torch.randn(bh, s, s), torch.randn(bh, s, e),
            lambda p, d: torch.bmm(p.transpose(1, 2), d))


def time_once(f, a, b, sync):
    t0 = time.perf_counter()
    r = f(a, b)
    if sync:
        torch.tpu.synchronize()
    dt = time.perf_counter() - t0
    del r
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print("| layout | rows | torch CPU ms | tpu ms | tpu speed / torch |")
    print("| --- | --- | --- | --- | --- |")
    worst = None
    for name, rows, make in cases(a.quick):
        x, y, f = make()
        xt, yt = x.to("tpu"), y.to("tpu")
        for _ in range(2):
            time_once(f, x, y, False)
            time_once(f, xt, yt, True)
        cpu, tpu = [], []
        for _ in range(a.reps):
            cpu.append(time_once(f, x, y, False))
            tpu.append(time_once(f, xt, yt, True))
        c, t = statistics.median(cpu) * 1e3, statistics.median(tpu) * 1e3
        ratio = c / t
        worst = ratio if worst is None else min(worst, ratio)
        print(f"| {name} | {rows} | {c:.3f} | {t:.3f} | {ratio:.2f} |", flush=True)
    print(f"\nslowest layout: tpu at {worst:.2f}x torch's speed (target: >= 1.0 on every row)")


if __name__ == "__main__":
    main()
