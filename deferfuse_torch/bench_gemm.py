"""GEMM on the layouts nn.Linear, attention and their backwards hand the device, tpu (strict and
defer) vs torch CPU eager, 1 thread each, one run (issue 17's target: tpu >= torch on every one).

For a Linear with weight W [out, in] and input x [batch, in]:
  forward   x @ W.t()      B is W transposed (column-major)
  grad_x    g @ W          both contiguous
  grad_W    g.t() @ x      A is g transposed
and for attention over [batch * heads, seq, head_dim] views:
  q @ k^T, p @ v, p^T @ dO.

Two measurements per row, runners interleaved round by round, medians:
  op+sync  one torch.mm/bmm; on tpu the op and a synchronize, so it includes one launch and
           one wait (tens of us), which a model pays once per sync point, not per GEMM.
  chain    `--chain` GEMMs of that layout (fewer for large ones: ~20 ms of torch work) and one
           synchronize at the end, in us per GEMM: what a model's GEMMs cost.
Columns: the times in us, and in brackets tpu's speed relative to torch (torch time / tpu time,
>= 1.00 means tpu is as fast or faster). `--clock cpu` times CPU seconds instead of wall seconds
(on a machine shared with other work, wall times measure the scheduler more than the GEMM):
torch's thread alone, and tpu's whole process, so the stream's worker and the spinning waits
count (which overstates tpu: spinning overlaps work in wall time); each run starts after a
1 ms pause, so the worker's spin after the previous run is not counted.
`--rows 1,4` keeps only the rows with those batch sizes (the Linear layouts' rows; attention's
rows are its batch of heads). `--dtype bfloat16` (or float16) times the same products in that
dtype on both sides, as torch.autocast runs them (torch's own bf16 GEMM, oneDNN's, uses
AVX512-BF16 where the core has it, as the runtime's does).
Usage: python bench_gemm.py [--reps N] [--quick] [--clock wall|cpu] [--rows 1,4]
                            [--dtype float32|bfloat16|float16]"""

import argparse
import os
import statistics
import time

os.environ.setdefault("DEFERFUSE_NUM_THREADS", "1")

import torch  # noqa: E402

import deferfuse_torch  # noqa: E402  (registers the device)

MODES = ("strict", "defer")


def cases(quick):
    batches = [16, 256, 1024] if quick else [1, 4, 8, 16, 64, 256, 1024, 4096]
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


CPU_CLOCK = False


def time_run(f, a, b, n, mode):
    """Seconds per GEMM for `n` GEMMs and one synchronize (none on CPU: `mode` is None). The
    results stay alive until the synchronize: a deferred op whose result is dropped unread
    need not run at all."""
    if mode is not None:
        deferfuse_torch.set_mode(mode)
    if CPU_CLOCK:
        time.sleep(1e-3)
        clock = time.thread_time if mode is None else time.process_time
    else:
        clock = time.perf_counter
    t0 = clock()
    rs = [f(a, b) for _ in range(n)]
    if mode is not None:
        torch.tpu.synchronize()
    dt = clock() - t0
    del rs
    return dt / n


def measure(f, x, y, xt, yt, reps, max_chain):
    """Medians in us: {(runner, kind): time}, runner "torch" or a mode, kind "op" or "chain"."""
    runners = [("torch", x, y, None)] + [(m, xt, yt, m) for m in MODES]
    for _, a, b, m in runners:  # warm-up: program caches, allocator pools
        time_run(f, a, b, 2, m)
    one = time_run(f, x, y, 1, None)
    chain = max(2, min(max_chain, int(0.02 / max(one, 1e-7))))
    times = {}
    for _ in range(reps):
        for name, a, b, m in runners:
            times.setdefault((name, "op"), []).append(time_run(f, a, b, 1, m))
            times.setdefault((name, "chain"), []).append(time_run(f, a, b, chain, m))
    return {key: statistics.median(v) * 1e6 for key, v in times.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--chain", type=int, default=50, help="most GEMMs per chain")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--rows", default="", help="comma-separated batch sizes to keep")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    global CPU_CLOCK
    CPU_CLOCK = a.clock == "cpu"
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"torch {torch.get_num_threads()} thread, tpu DEFERFUSE_NUM_THREADS="
          f"{os.environ['DEFERFUSE_NUM_THREADS']}; {a.dtype}; {a.clock} clock, median of {a.reps}; "
          "us, [tpu speed / torch]")
    print("| layout | rows | torch op | strict op+sync | defer op+sync "
          "| torch chain/GEMM | strict chain/GEMM | defer chain/GEMM |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    worst = {}
    prev = deferfuse_torch.get_mode()
    try:
        keep = {int(r) for r in a.rows.split(",") if r}
        for name, rows, make in cases(a.quick):
            if keep and rows not in keep:
                continue
            x, y, f = make()
            x, y = x.to(dtype), y.to(dtype)
            xt, yt = x.to("tpu"), y.to("tpu")
            t = measure(f, x, y, xt, yt, a.reps, a.chain)
            cells = []
            for kind in ("op", "chain"):
                base = t[("torch", kind)]
                cells.append(f"{base:.1f}")
                for m in MODES:
                    ratio = base / t[(m, kind)]
                    worst[(m, kind)] = min(worst.get((m, kind), ratio), ratio)
                    cells.append(f"{t[(m, kind)]:.1f} [{ratio:.2f}]")
            print(f"| {name} | {rows} | " + " | ".join(cells) + " |", flush=True)
    finally:
        deferfuse_torch.set_mode(prev)
    print("\nslowest row, tpu speed / torch (target: >= 1.00):")
    for kind, label in (("op", "op+sync"), ("chain", "chain")):
        print(f"  {label}: " + ", ".join(f"{m} {worst[(m, kind)]:.2f}" for m in MODES))


if __name__ == "__main__":
    main()
