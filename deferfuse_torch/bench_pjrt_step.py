"""One model's training step on PJRT against the CPU backend and CPU eager, each PJRT setting in
its own process (the runtime reads its backend settings when it starts), the configurations in
turn in each pass so that load from other processes hits them alike (issue 18's MLP target).

    DEFERFUSE_PJRT_PLUGIN=.../xla_cpu_pjrt.so DEFERFUSE_CACHE_DIR=~/.cache/deferfuse \\
        python3 deferfuse_torch/bench_pjrt_step.py --model mlp_small --passes 3 --rounds 30

Configurations: CPU eager and the CPU backend's defer (one process), PJRT defer (the default:
one program per flush, split at a host read), PJRT defer with DEFERFUSE_PJRT_SPLIT_READS=0,
PJRT defer with DEFERFUSE_PJRT_WHOLE_FLUSH=0 (the CPU backend's loop regions as programs) and
PJRT strict. A round is --steps-per-round training steps, each ending with loss.item(), and
one synchronize; a pass prints each configuration's median and best round (ms per step) and
the programs per step, and the end prints the median over the passes of both."""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# (label, DEFERFUSE_BACKEND, runners in the process, extra environment)
CONFIGS = [
    ("cpu", "cpu", ["cpu", "defer"], {}),
    ("pjrt", "pjrt", ["defer"], {}),
    ("pjrt, one program per flush", "pjrt", ["defer"], {"DEFERFUSE_PJRT_SPLIT_READS": "0"}),
    ("pjrt, loop regions", "pjrt", ["defer"], {"DEFERFUSE_PJRT_WHOLE_FLUSH": "0"}),
    ("pjrt", "pjrt", ["strict"], {}),
]


def child(args):
    """One process: the runners' rounds in turn; prints their round times as JSON."""
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, "tests"))
    import torch

    import bench_models
    import model_zoo

    torch.set_num_threads(1)
    w = model_zoo.build(args.model, args.size, bench_models.BATCHES)
    runners = [bench_models.Runner("cpu", w, "cpu") if r == "cpu"
               else bench_models.Runner(r, w, "tpu", r) for r in args.child.split(",")]
    for i in range(args.warmup + args.rounds):
        for r in runners:
            r.round(i, args.steps_per_round, timed=i >= args.warmup)
    out = {}
    for r in runners:
        if r.error:
            sys.exit(f"{r.label}: {r.error}")
        progs = [s["programs_run"] for s in r.step_stats]
        out[r.label] = {"ms": [t * 1e3 for t in r.times],
                        "programs": statistics.median(progs) if progs else None}
    print(json.dumps(out))


def main(args):
    if not os.path.isfile(os.environ.get("DEFERFUSE_PJRT_PLUGIN", "")):
        sys.exit("bench_pjrt_step: set DEFERFUSE_PJRT_PLUGIN to the plugin .so (pip install "
                 "xla-cpu-pjrt; see README, PJRT backend)")
    results = {}
    for p in range(args.passes):
        for label, backend, runners, extra in CONFIGS:
            env = dict(os.environ, **extra, DEFERFUSE_BACKEND=backend, DEFERFUSE_NUM_THREADS="1",
                       TF_CPP_MIN_LOG_LEVEL="2")
            cmd = [sys.executable, os.path.abspath(__file__), "--child", ",".join(runners),
                   "--model", args.model, "--size", args.size, "--rounds", str(args.rounds),
                   "--warmup", str(args.warmup), "--steps-per-round", str(args.steps_per_round)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"bench_pjrt_step: {label} failed:\n{out.stderr[-3000:]}")
            for runner, r in json.loads(out.stdout.strip().splitlines()[-1]).items():
                name = "cpu eager" if runner == "cpu" else f"{label} {runner}"
                med, best = statistics.median(r["ms"]), min(r["ms"])
                results.setdefault(name, []).append((med, best, r["programs"]))
                progs = "-" if r["programs"] is None else f"{r['programs']:.0f}"
                print(f"pass {p}  {name:34s} median {med:7.2f}  best {best:7.2f}  "
                      f"programs/step {progs}", flush=True)
    print(f"\n{args.model}, ms per step: median of {args.passes} passes' medians (of their best)")
    for name, v in results.items():
        print(f"  {name:34s} {statistics.median(m for m, _, _ in v):7.2f} "
              f"({statistics.median(b for _, b, _ in v):.2f})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mlp_small", help="a bench_models.py name")
    ap.add_argument("--size", default="tiny", choices=("tiny", "bench"))
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=30, help="timed rounds per process")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps-per-round", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    child(a) if a.child else main(a)
