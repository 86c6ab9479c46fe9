#!/usr/bin/env python3
"""deferfuse against its Python peers on the workloads of shared/notes/workloads.md.

Runs chain10, gelu, softmax, layernorm, adamw and tiny (the exact op sequences of
benches/workloads.rs) through:

  deferfuse-defer   libdeferfuse.so over its C ABI via ctypes, DFUSE_MODE_DEFER (ops recorded,
                    fused and compiled at the sync point)
  deferfuse-strict  the same, DFUSE_MODE_STRICT (each op its own program)
  numpy             one numpy call per op (temporaries), single-threaded
  numexpr           chain10 and gelu as one numexpr expression; tiny as 1000 evaluate calls
  torch             torch eager on CPU, the same op sequence (adamw with torch._foreach_* ops)
  torch.compile     Inductor on CPU (chain10, gelu, softmax, layernorm); compiled and warmed up
                    before timing, so compile time is excluded

A peer that is not installed is printed as "skipped (not installed: pip install X)".
Install all peers with:  pip install numpy numexpr torch
Build the library with:  cargo build --release -p deferfuse-ffi   (in the repository root)

What one timed iteration is, per peer:
  * deferfuse: recording every op (ctypes calls included, as a Python front end pays them),
    releasing the intermediates exactly as workloads.rs does, then dfuse_stream_synchronize on
    the default stream, so the work has really run, then releasing the output handle. Inputs
    were copied in with dfuse_tensor_from_host before timing; the output is NOT copied back,
    except for tiny, whose iteration ends by reading its 8 elements with dfuse_tensor_to_host
    (as workloads.rs does: that read is the sync point).
  * numpy / numexpr / torch / torch.compile: one call computing the output (CPU work is
    synchronous, so returning means it ran). Outputs are freshly allocated, as in deferfuse.
  * adamw updates p, m and v in place (every peer has its own copy of the state).

Every peer's result is checked against numpy (np.allclose, rtol=1e-4, atol=1e-5, float32)
before any timing; a mismatch aborts the run with exit status 1. The check iteration and one
more warm-up iteration (which compile, for deferfuse and torch.compile) are not timed.

Reps are interleaved: each round runs every peer once, in a rotating order, and the table
shows the median over the rounds. Effective GB/s counts each input and output once (the
`bytes` of workloads.rs). "X/defer" is X's median time / deferfuse-defer's median time: above
1 means deferfuse defer mode is faster than X. For deferfuse rows, "alloc B/it" is the buffer
bytes the runtime allocated per timed iteration (from dfuse_stats): in defer mode it shows
that dead intermediates were never materialized.

Threads: --threads N (default: every core this process may use) is applied to every peer:
deferfuse's DfuseConfig.num_threads, torch.set_num_threads, numexpr.set_num_threads; numpy's
elementwise ops are single-threaded. OMP_WAIT_POLICY defaults to PASSIVE here (set it to
override): by default torch's OpenMP threads spin after each parallel region, holding the cores
the next peer in the rotation needs. Measured at 2 threads on 2 cores: deferfuse softmax 6.2 ->
3.6 ms and layernorm 1.8 -> 1.2 ms with PASSIVE, torch.compile's own times unchanged.

Usage:  python3 benches/peers/peers.py [--quick] [--json] [--threads N] [--reps N]
            [--peers deferfuse,numpy,numexpr,torch,torch.compile] [--only chain10,gelu,...]
            [--lib PATH]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# Before torch (and its OpenMP runtime) is imported; see "Threads" above.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_LIB = REPO / "target" / "release" / "libdeferfuse.so"

# Tolerance of the correctness check (float32; summation order and tanh/exp/sqrt
# implementations differ between peers).
RTOL, ATOL = 1e-4, 1e-5

ALL_PEERS = ["deferfuse", "numpy", "numexpr", "torch", "torch.compile"]
ALL_WORKLOADS = ["chain10", "gelu", "softmax", "layernorm", "adamw", "tiny"]
DEFER, STRICT = "deferfuse-defer", "deferfuse-strict"

from dfuse_ctypes import *  # noqa: F401,F403
from impls import *  # noqa: F401,F403

# ---------------------------------------------------------------------------------------------
# Workloads, cases, timing
# ---------------------------------------------------------------------------------------------

@dataclass
class Workload:
    name: str
    size_label: str
    bytes: int          # each input and output counted once (workloads.rs `bytes`)
    inputs: list        # float32 numpy arrays
    mutates: bool = False  # adamw: each peer needs its own copy of the state
    elems: int = 0         # elements per input, to pick fewer reps for the 16M cases


@dataclass
class Case:
    """One peer's prepared workload: `run` is one timed iteration, `result` one untimed
    iteration returning host arrays (the check), `close` frees what it holds."""
    peer: str
    run: Callable[[], None]
    result: Callable[[], list]
    close: Callable[[], None] = lambda: None
    runtime: DfuseRuntime | None = None
    times: list = field(default_factory=list)


def data(shape, seed: int, nonneg: bool = False) -> np.ndarray:
    """Deterministic f32 data in [-2, 2) like workloads.rs (a different generator)."""
    x = np.random.default_rng(seed).uniform(-2.0, 2.0, shape).astype(np.float32)
    return np.abs(x) if nonneg else x


def size_label(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"


def make_workloads(quick: bool, only: list[str]):
    """Yields workloads one at a time, so only one workload's arrays are alive at once."""
    elems = [1 << 16, 1 << 20] if quick else [1 << 20, 1 << 24]
    rows, cols = (512 if quick else 4096), 1024
    if "chain10" in only:
        for n in elems:
            yield Workload("chain10", size_label(n), 4 * n * 4, [data(n, i) for i in range(3)],
                           elems=n)
    if "gelu" in only:
        for n in elems:
            yield Workload("gelu", size_label(n), 2 * n * 4, [data(n, 7)], elems=n)
    if "softmax" in only:
        yield Workload("softmax", f"{rows}x{cols}", 2 * rows * cols * 4, [data((rows, cols), 3)])
    if "layernorm" in only:
        yield Workload("layernorm", f"{rows}x{cols}", 2 * rows * cols * 4,
                       [data((rows, cols), 4), data(cols, 5), data(cols, 6)])
    if "adamw" in only:
        state, elems_total = [], 0
        for k in range(8, 18):
            for j in range(10):
                n = 1 << k
                elems_total += n
                for part in range(4):
                    # v (part 3) is a second moment: non-negative, so sqrt(v) is not NaN.
                    state.append(data(n, k * 100 + j * 4 + part, nonneg=(part == 3)))
        # One pass reads p, g, m, v and writes p, m, v.
        yield Workload("adamw", "100 params", elems_total * 4 * 7, state, mutates=True)
    if "tiny" in only:
        yield Workload("tiny", "1000 ops x 8", 0, [data(8, 9)])


DF_FUNCS = dict(chain10=df_chain10, gelu=df_gelu, softmax=df_softmax, layernorm=df_layernorm,
                adamw=df_adamw, tiny=df_tiny)
NP_FUNCS = dict(chain10=np_chain10, gelu=np_gelu, softmax=np_softmax, layernorm=np_layernorm,
                adamw=np_adamw, tiny=np_tiny)
COMPILED_WORKLOADS = ("chain10", "gelu", "softmax", "layernorm")


def state_outputs(w: Workload, arrays) -> list:
    """What adamw is checked on: every p, m and v (g is read only)."""
    return [a for i, a in enumerate(arrays) if i % 4 != 1]


def dfuse_case(peer: str, rt: DfuseRuntime, w: Workload) -> Case:
    fn = DF_FUNCS[w.name]
    handles = [rt.from_host(a) for a in w.inputs]
    tiny_out = np.empty(8, np.float32)

    def record() -> int:
        r = Recorder(rt)
        return r.finish(fn(r, *handles))

    def run():
        out = record()
        if w.name == "tiny":
            rt.to_host(out, tiny_out)  # the workload's sync point: read its 8 elements
        else:
            rt.sync()
        rt.release(out)

    def result():
        out = record()
        rt.sync()
        if w.mutates:
            rt.release(out)
            return [rt.to_host(h) for h in state_outputs(w, handles)]
        res = rt.to_host(out)
        rt.release(out)
        return [res]

    def close():
        for h in handles:
            rt.release(h)
        rt.sync()
        rt.release_cached_memory()

    return Case(peer, run, result, close, runtime=rt)


def host_case(peer: str, fn: Callable, args: list, w: Workload, to_np=np.asarray) -> Case:
    def run():
        fn(*args)

    def result():
        out = fn(*args)
        if w.mutates:
            return [to_np(a) for a in state_outputs(w, args)]
        return [to_np(out)]

    return Case(peer, run, result)


def numexpr_case(ne, w: Workload) -> Case | None:
    if w.name == "tiny":
        # Per-call cost: 1000 dependent evaluate calls on 8 elements.
        x0 = w.inputs[0]

        def tiny():
            x = x0
            for _ in range(1000):
                x = ne.evaluate("x + one", local_dict={"x": x, "one": NUMEXPR_CONSTS["one"]})
            return x
        return host_case("numexpr", tiny, [], w)
    if w.name not in NUMEXPR_EXPRS:
        return None
    expr, names = NUMEXPR_EXPRS[w.name]
    local = dict(NUMEXPR_CONSTS, **dict(zip(names, w.inputs)))
    return host_case("numexpr", lambda: ne.evaluate(expr, local_dict=local), [], w)


def copies(w: Workload) -> list:
    return [a.copy() for a in w.inputs] if w.mutates else w.inputs


def build_cases(w: Workload, peers: dict, runtimes: dict) -> list[Case]:
    cases = []
    for peer, rt in runtimes.items():
        cases.append(dfuse_case(peer, rt, w))
    if "numpy" in peers:
        cases.append(host_case("numpy", NP_FUNCS[w.name], copies(w), w))
    if "numexpr" in peers:
        c = numexpr_case(peers["numexpr"], w)
        if c:
            cases.append(c)
    if "torch" in peers or "torch.compile" in peers:
        torch, impls = peers.get("torch") or peers["torch.compile"]
        to_np = lambda t: t.numpy()
        if "torch" in peers:
            args = [torch.from_numpy(a) for a in copies(w)]  # shares memory; no copy
            cases.append(host_case("torch", impls[w.name], args, w, to_np))
        if "torch.compile" in peers and w.name in COMPILED_WORKLOADS:
            # One compiled function per workload and size: static shapes, as a model would use.
            fn = torch.compile(impls[w.name], dynamic=False)
            args = [torch.from_numpy(a) for a in copies(w)]
            cases.append(host_case("torch.compile", fn, args, w, to_np))
    return cases


def check(w: Workload, cases: list[Case]) -> list[Case]:
    """Checks every case's result against numpy; returns the cases that can be timed.
    Exits on a mismatch. A torch.compile failure (e.g. no C++ compiler) skips that peer."""
    if w.mutates:
        state = copies(w)
        NP_FUNCS[w.name](*state)
        ref = state_outputs(w, state)
    else:
        ref = [NP_FUNCS[w.name](*w.inputs)]
    ok = []
    for c in cases:
        try:
            got = c.result()
        except Exception as e:  # noqa: BLE001 - reported, then the run continues without it
            if c.peer == "torch.compile":
                print(f"torch.compile: skipped for {w.name} (compile failed: "
                      f"{str(e).strip().splitlines()[0][:200]})", file=sys.stderr)
                continue
            raise
        if len(got) != len(ref):
            fail(w, c, f"{len(got)} outputs, numpy has {len(ref)}")
        for g, r in zip(got, ref):
            if g.shape != r.shape:
                fail(w, c, f"shape {g.shape}, numpy has {r.shape}")
            if not np.allclose(g, r, rtol=RTOL, atol=ATOL):
                err = np.abs(g.astype(np.float64) - r)
                i = int(np.nanargmax(err)) if np.isfinite(err).any() else 0
                fail(w, c, f"max |diff| {np.nanmax(err):.3g} at flat index {i} "
                           f"(got {g.ravel()[i]!r}, numpy {r.ravel()[i]!r}); "
                           f"tolerance rtol={RTOL} atol={ATOL}")
        ok.append(c)
    return ok


def fail(w: Workload, c: Case, why: str) -> None:
    print(f"MISMATCH: {c.peer} on {w.name} {w.size_label} disagrees with numpy: {why}",
          file=sys.stderr)
    sys.exit(1)


def time_cases(cases: list[Case], reps: int) -> dict:
    """Interleaved timing: each round runs every case once, the order rotating per round.
    Returns deferfuse buffer bytes allocated per timed iteration, by peer."""
    for c in cases:
        c.run()  # one more warm-up (compiles deferfuse programs for this exact trace)
    before = {c.peer: c.runtime.stats().bytes_allocated for c in cases if c.runtime}
    gc.collect()
    gc.disable()  # a collection inside a timed iteration would be charged to one peer
    try:
        for rep in range(reps):
            k = rep % len(cases)
            for c in cases[k:] + cases[:k]:
                t0 = time.perf_counter()
                c.run()
                c.times.append((time.perf_counter() - t0) * 1e3)
    finally:
        gc.enable()
    return {c.peer: (c.runtime.stats().bytes_allocated - before[c.peer]) / reps
            for c in cases if c.runtime}


# ---------------------------------------------------------------------------------------------
# Peers, output, main
# ---------------------------------------------------------------------------------------------

def try_import(name: str, emit_note, peer_names: list[str]):
    """Imports an installed but possibly broken module; a failure skips its peers."""
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any import failure means "peer unavailable"
        for p in peer_names:
            emit_note(p, f"skipped (import failed: {type(e).__name__}: {e}; "
                         f"reinstall: pip install {name})")
        return None


def load_peers(wanted: list[str], threads: int, emit_note) -> dict:
    """Imports the optional peers; returns {name: module or (torch, impls)}."""
    peers = {}
    if "numpy" in wanted:
        peers["numpy"] = np
    if "numexpr" in wanted:
        if importlib.util.find_spec("numexpr") is None:
            emit_note("numexpr", "skipped (not installed: pip install numexpr)")
        else:
            ne = try_import("numexpr", emit_note, ["numexpr"])
            if ne is not None:
                ne.set_num_threads(threads)
                peers["numexpr"] = ne
    if "torch" in wanted or "torch.compile" in wanted:
        if importlib.util.find_spec("torch") is None:
            for p in ("torch", "torch.compile"):
                if p in wanted:
                    emit_note(p, "skipped (not installed: pip install torch)")
        elif (torch := try_import("torch", emit_note,
                                  [p for p in ("torch", "torch.compile") if p in wanted])):
            torch.set_num_threads(threads)
            impls = torch_impls(torch)
            if "torch" in wanted:
                peers["torch"] = (torch, impls)
            if "torch.compile" in wanted:
                if hasattr(torch, "compile"):
                    peers["torch.compile"] = (torch, impls)
                else:
                    emit_note("torch.compile", "skipped (needs torch >= 2.0: pip install -U torch)")
    return peers


def peer_versions(peers: dict, lib: DfuseLib | None) -> str:
    parts = []
    if lib:
        parts.append(f"deferfuse {lib.version}")
    for name, p in peers.items():
        mod = p[0] if isinstance(p, tuple) else p
        if name != "torch.compile" or "torch" not in peers:
            parts.append(f"{name} {getattr(mod, '__version__', '?')}")
    return ", ".join(parts)


def find_lib(path: Path) -> DfuseLib:
    if not path.exists():
        print(f"error: {path} not found. Build it with:\n  {BUILD_HINT}\n"
              f"or pass --lib PATH (or leave deferfuse out: --peers numpy,numexpr,torch)",
              file=sys.stderr)
        sys.exit(2)
    if path.resolve() == DEFAULT_LIB.resolve():
        # A library older than its sources measures old code: say so (the build is quick).
        srcs = [p for d in ("ffi/src", "runtime/src", "fusion/src", "src", "cache/src")
                for p in (REPO / d).rglob("*.rs")]
        if srcs and max(p.stat().st_mtime for p in srcs) > path.stat().st_mtime:
            print(f"warning: {path} is older than the Rust sources; rebuild with:\n  {BUILD_HINT}",
                  file=sys.stderr)
    return DfuseLib(path)


def main() -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes and 5 reps (smoke run)")
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--threads", type=int, default=cores, help=f"threads per peer (default {cores})")
    ap.add_argument("--reps", type=int, default=None, help="timed rounds (default 9, quick 5, 16M 3)")
    ap.add_argument("--peers", default=",".join(ALL_PEERS), help="comma list of " + ",".join(ALL_PEERS))
    ap.add_argument("--only", default=",".join(ALL_WORKLOADS), help="comma list of workloads")
    ap.add_argument("--lib", type=Path, default=DEFAULT_LIB, help="libdeferfuse.so path")
    args = ap.parse_args()
    wanted = [p.strip() for p in args.peers.split(",") if p.strip()]
    only = [o.strip() for o in args.only.split(",") if o.strip()]
    for bad in set(wanted) - set(ALL_PEERS):
        ap.error(f"unknown peer {bad!r}; choose from {','.join(ALL_PEERS)}")
    for bad in set(only) - set(ALL_WORKLOADS):
        ap.error(f"unknown workload {bad!r}; choose from {','.join(ALL_WORKLOADS)}")
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    check_layouts()

    def emit_note(peer: str, text: str) -> None:
        if args.json:
            print(json.dumps({"peer": peer, "status": text}), flush=True)
        else:
            print(f"{peer}: {text}", flush=True)

    lib, runtimes = None, {}
    if "deferfuse" in wanted:
        lib = find_lib(args.lib)
        # Defer first: it is the baseline of every ratio.
        runtimes = {DEFER: DfuseRuntime(lib, DFUSE_MODE_DEFER, args.threads),
                    STRICT: DfuseRuntime(lib, DFUSE_MODE_STRICT, args.threads)}
    peers = load_peers(wanted, args.threads, emit_note)

    header = ("{:<10} {:<13} {:<17} {:>10} {:>8} {:>9} {:>12}"
              .format("workload", "size", "peer", "median ms", "GB/s", "X/defer", "alloc B/it"))
    if not args.json:
        print(f"peers.py: {peer_versions(peers, lib)}; threads={args.threads}; "
              f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}; "
              f"{'quick sizes' if args.quick else 'full sizes'}; medians of interleaved reps")
        print("X/defer = peer median / deferfuse-defer median (>1: deferfuse defer is faster)")
        print(header)
        print("-" * len(header))
    judged = []  # (workload, size, peer, X/defer) for the targets summary
    try:
        for w in make_workloads(args.quick, only):
            reps = args.reps or (3 if w.elems >= 1 << 24 else 5 if args.quick else 9)
            cases = build_cases(w, peers, runtimes)
            try:
                cases = check(w, cases)
                alloc = time_cases(cases, reps)
            finally:
                for c in cases:
                    c.close()
            judged += report(args, w, cases, alloc, reps)
    finally:
        for rt in runtimes.values():
            rt.destroy()
    if not args.json:
        print_targets(judged, args.threads)


# Issue 4's targets against torch, as (peer, least X/defer), on these workloads.
TARGETS = {"torch.compile": 1.2, "torch": 5.0}
TARGET_SIZES = {"chain10": ("1M", "16M"), "gelu": ("1M", "16M"),
                "softmax": ("4096x1024",), "layernorm": ("4096x1024",)}


def print_targets(judged: list, threads: int) -> None:
    """Prints each target against torch this run could judge, with its ratio: met or not."""
    lines = [(f"{peer} X/defer >= {least:g}x: {name} {size}, {threads} thread(s)", x, x >= least)
             for name, size, peer, x in judged
             if size in TARGET_SIZES.get(name, ()) and peer in TARGETS
             for least in (TARGETS[peer],)]
    if not lines:
        return
    print("targets (issue 4) judged in this run:")
    for what, x, met in lines:
        print(f"  {what:<60} {x:>6.2f}x  {'met' if met else 'NOT met'}")


def report(args, w: Workload, cases: list[Case], alloc: dict, reps: int) -> list:
    """Prints the workload's rows; returns (workload, size, peer, X/defer) of each peer."""
    med = {c.peer: statistics.median(c.times) for c in cases}
    base = med.get(DEFER)
    ratios = [(w.name, w.size_label, c.peer, med[c.peer] / base)
              for c in cases if base and c.peer != DEFER]
    for c in cases:
        ms = med[c.peer]
        gbps = w.bytes / (ms * 1e-3) / 1e9 if w.bytes else None
        ratio = ms / base if base else None
        if args.json:
            print(json.dumps({
                "workload": w.name, "size": w.size_label, "peer": c.peer,
                "threads": args.threads, "reps": reps, "median_ms": round(ms, 5),
                "min_ms": round(min(c.times), 5),
                "gbps": round(gbps, 3) if gbps is not None else None,
                "defer_speedup": round(ratio, 3) if ratio is not None else None,
                "alloc_bytes_per_iter": alloc.get(c.peer),
            }), flush=True)
        else:
            print("{:<10} {:<13} {:<17} {:>10.3f} {:>8} {:>9} {:>12}".format(
                w.name, w.size_label, c.peer, ms,
                f"{gbps:.2f}" if gbps is not None else "-",
                f"{ratio:.2f}x" if ratio is not None and c.peer != DEFER else "-",
                human_bytes(alloc[c.peer]) if c.peer in alloc else ""), flush=True)
    return ratios


def human_bytes(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


if __name__ == "__main__":
    main()

