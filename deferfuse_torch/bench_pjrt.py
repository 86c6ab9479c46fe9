"""PJRT vs the CPU backend vs CPU eager, one row per model, in one run: bench_models.py runs
once per backend in its own process (the device's runtime reads DEFERFUSE_BACKEND when it
starts) and the rows are merged.

    DEFERFUSE_PJRT_PLUGIN=.../xla_cpu_pjrt.so python3 deferfuse_torch/bench_pjrt.py \\
        --models mlp_small,gpt2,llama --quick

Columns: CPU eager ms, the CPU backend's defer ms, PJRT defer ms, PJRT strict ms, per step
(medians); XLA programs per PJRT defer step; strict's cost per op on PJRT (its step time over
the ops a step records). Set DEFERFUSE_CACHE_DIR to keep the compiled steps between runs."""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp_small,gpt2,llama",
                    help="comma-separated names (default: mlp_small,gpt2,llama)")
    ap.add_argument("--steps", type=int, default=10, help="timed rounds (default 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    ap.add_argument("--quick", action="store_true", help="the tests' tiny sizes")
    return ap.parse_args(argv)


def run_backend(backend, args):
    """bench_models.py's JSON rows with DEFERFUSE_BACKEND=backend, by model."""
    env = dict(os.environ, DEFERFUSE_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    cmd = [sys.executable, os.path.join(HERE, "bench_models.py"), "--json", "--no-compile",
           "--models", args.models, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.quick:
        cmd.append("--quick")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench_pjrt: the {backend} run failed:\n{out.stderr[-3000:]}")
    text = out.stdout[out.stdout.index("{"):]
    return {r["model"]: r for r in json.loads(text)["models"]}


def fmt(v, spec):
    return "-".rjust(int(spec.split(".")[0])) if v is None else format(v, spec)


def main(args):
    if not os.path.isfile(os.environ.get("DEFERFUSE_PJRT_PLUGIN", "")):
        sys.exit("bench_pjrt: set DEFERFUSE_PJRT_PLUGIN to the plugin .so (pip install "
                 "xla-cpu-pjrt; see README, PJRT backend)")
    cpu, pjrt = run_backend("cpu", args), run_backend("pjrt", args)
    print(f"one training step, median of {args.steps} rounds after {args.warmup} warm-up; "
          f"sizes: {'tiny (--quick)' if args.quick else 'bench'}")
    head = (f"{'model':10s} {'cpu eager':>9s} {'cpu defer':>9s} {'pjrt defer':>10s} "
            f"{'pjrt strict':>11s} {'progs/step':>10s} {'ops/step':>8s} {'strict us/op':>12s}")
    print(head)
    print("-" * len(head))
    for name, c in cpu.items():
        p = pjrt[name]
        d = p["defer_step"] or {}
        ops = d.get("ops_recorded")
        strict = p["ms"]["strict"]
        per_op = strict * 1e3 / ops if strict and ops else None
        print(f"{name:10s} {fmt(c['ms']['cpu'], '9.2f')} {fmt(c['ms']['defer'], '9.2f')} "
              f"{fmt(p['ms']['defer'], '10.2f')} {fmt(strict, '11.2f')} "
              f"{fmt(d.get('programs_run'), '10.0f')} {fmt(ops, '8.0f')} {fmt(per_op, '12.0f')}")
        for label, err in {**c["errors"], **p["errors"]}.items():
            print(f"  {name}: {label} failed: {err}")


if __name__ == "__main__":
    main(parse_args(sys.argv[1:]))
