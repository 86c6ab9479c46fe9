"""torch.compile on the device, timed.

1. Training steps of the MLPs (784-1024-1024-10 and 784-256-256-10, batch 64, AdamW) and
   nanoGPT (the zoo's transformer: 4 layers, d 128, seq 64, batch 16, sdpa, AdamW and
   clip_grad_norm_), three ways: "tpu compiled" (the model and opt.step each through
   torch.compile(backend="tpu")), "tpu defer" (eager in defer mode) and "inductor" (the model
   and opt.step through torch.compile on CPU tensors). A step ends with loss.item() and, on
   tpu, torch.tpu.synchronize(). After the warm-up the runners step in turn, one step each
   per round; each column is the median over --steps rounds.

2. What replaying a compiled graph costs beyond its programs: a graph of --ops elementwise
   ops on a 16-element tensor (so the programs' own work is negligible), called over and
   over. Shown: the whole call (the call, then torch.tpu.synchronize()) and its two halves:
   the Python call (Dynamo's guards, AOTAutograd's wrapper and the captured graph's launch,
   which queues its programs on the stream) and the synchronize (the programs running, and
   the wait for them); then the runtime's launch alone (torch.ops.deferfuse.graph_launch on a
   graph captured by hand: no Dynamo, no AOTAutograd), and the same ops run eagerly in defer
   mode (each op dispatched from Python and recorded, then a flush with a plan-cache hit).

Usage: python bench_compile.py [--models mlp,mlp_small,nanogpt] [--steps N] [--warmup N]
                               [--threads N] [--ops N] [--calls N] [--no-train]
                               [--capturable]"""

import argparse
import os
import sys


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,mlp_small,nanogpt")
    ap.add_argument("--steps", type=int, default=20, help="timed rounds (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads and DEFERFUSE_NUM_THREADS (default 1)")
    ap.add_argument("--ops", type=int, default=1000, help="ops in the replay graph")
    ap.add_argument("--calls", type=int, default=200, help="timed replays (default 200)")
    ap.add_argument("--no-train", action="store_true", help="only the replay measurement")
    ap.add_argument("--capturable", action="store_true",
                    help="tpu compiled: the optimizer's step counts on the device")
    return ap.parse_args(argv)


# The runtime reads DEFERFUSE_NUM_THREADS when it starts, so it is set before the import that
# may start it.
ARGS = parse_args(sys.argv[1:]) if __name__ == "__main__" else None
if ARGS is not None:
    os.environ["DEFERFUSE_NUM_THREADS"] = str(ARGS.threads)

import copy  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import deferfuse_torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))
import model_zoo  # noqa: E402

BATCHES = 4  # distinct batches each runner cycles through


class CompiledStep:
    """An optimizer whose step() is torch.compile'd (model_zoo.train_step calls zero_grad()
    and step()). With capturable (--capturable, tpu only) its step counts are kept on the
    device, as CUDA graphs need; by default PyTorch keeps them on the CPU, and the compiled
    step's CPU arithmetic runs in Python at each call before its device part is launched
    (the README's torch.compile section)."""

    def __init__(self, opt, backend, capturable=False):
        self.opt = opt
        if backend == "tpu" and capturable:
            for group in opt.param_groups:
                group["capturable"] = True
        self.step = torch.compile(opt.step, backend=backend)

    def zero_grad(self):
        self.opt.zero_grad()


class Runner:
    """One column: its own copy of the model, optimizer and batches."""

    def __init__(self, label, w, device, backend=None, capturable=False):
        self.label, self.w, self.device = label, w, device
        self.model = copy.deepcopy(w.model).to(device)
        opt = w.make_opt(self.model.parameters())
        if backend is None:
            self.forward, self.opt = self.model, opt
        else:
            self.forward = torch.compile(self.model, backend=backend)
            self.opt = CompiledStep(opt, backend, capturable)
        self.batches = [model_zoo.to_device(b, device) for b in w.batches]
        self.times, self.losses, self.ops, self.programs = [], [], [], []

    def step(self, i, timed):
        batch = self.batches[i % len(self.batches)]
        s0 = deferfuse_torch.stats()
        t0 = time.perf_counter()
        loss = model_zoo.train_step(self.w, self.forward, self.opt, batch).item()
        if self.device == "tpu":
            torch.tpu.synchronize()
        dt = time.perf_counter() - t0
        s1 = deferfuse_torch.stats()
        self.losses.append(loss)
        if timed:
            self.times.append(dt)
            self.ops.append(s1["ops_recorded"] - s0["ops_recorded"])
            self.programs.append(s1["programs_run"] - s0["programs_run"])

    def median_ms(self):
        return statistics.median(self.times) * 1e3

    def per_step(self):
        """Median ops recorded and programs run per step, as "ops/programs"."""
        return f"{statistics.median(self.ops):.0f}/{statistics.median(self.programs):.0f}"


def bench_training(name, args):
    w = model_zoo.build(name, "bench", BATCHES)
    with deferfuse_torch.mode("defer"):
        runners = [Runner("tpu compiled", w, "tpu", "tpu", args.capturable),
                   Runner("tpu defer", w, "tpu"),
                   Runner("inductor", w, "cpu", "inductor")]
        for i in range(args.warmup + args.steps):
            for r in runners:
                r.step(i, timed=i >= args.warmup)
    ms = {r.label: r.median_ms() for r in runners}
    counts = {r.label: r.per_step() for r in runners[:2]}
    # The runners train the same model on the same batches: a loss far off means a runner
    # computes something else, which would make its time meaningless.
    worst = max(abs(a - b) / max(abs(b), 1e-6)
                for r in runners[:2] for a, b in zip(r.losses, runners[2].losses))
    return name, w.description, ms, counts, worst


def chain(n_ops):
    """A function of n_ops elementwise ops (n_ops even), each depending on the last."""
    def f(x):
        for _ in range(n_ops // 2):
            x = x * 1.0001 + 0.0001
        return x
    return f


def captured_launch(f, x):
    """f's ops on x captured as a runtime graph by hand: a function launching it on its
    input (what a compiled call does below Dynamo and AOTAutograd)."""
    ops = torch.ops.deferfuse
    with deferfuse_torch.mode("defer"):
        ops.graph_capture_begin()
        y = f(x)
        graph, why = ops.graph_capture_end([x], [y])
    assert graph != 0, why
    return lambda x: ops.graph_launch(graph, [x])[0]


def program_time_us(fn, x, calls=50):
    """The programs' own run time per call of fn(x), in microseconds: the runtime's timeline
    times each program run (the "run" events)."""
    import json
    import tempfile
    path = os.path.join(tempfile.mkdtemp(), "replay.json")
    with deferfuse_torch.mode("strict"), deferfuse_torch.trace(path):
        for _ in range(calls):
            y = fn(x)
            torch.tpu.synchronize()
            del y
    with open(path) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    return sum(e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") == "run") / calls


def bench_replay(args):
    from deferfuse_torch import compile_backend
    f = chain(args.ops)
    compiled = torch.compile(f, backend="tpu")
    # The same graph compiled again (another code object), dispatched op by op: the compiled
    # path before graphs were captured.
    dispatched = torch.compile(chain(args.ops), backend="tpu")
    x = torch.randn(16).to("tpu")
    launch = captured_launch(f, x)
    results = {}
    for label, fn, mode in [("compiled (caller strict)", compiled, "strict"),
                            ("compiled, op by op", dispatched, "strict"),
                            ("graph_launch alone", launch, "strict"),
                            ("eager defer", f, "defer")]:
        compile_backend.capture_enabled = fn is not dispatched
        with deferfuse_torch.mode(mode):
            for _ in range(5):
                y = fn(x)
                torch.tpu.synchronize()
            s0 = deferfuse_torch.stats()
            calls, syncs, totals = [], [], []
            for _ in range(args.calls):
                t0 = time.perf_counter()
                y = fn(x)  # kept alive: a result nobody holds would be dropped unrun
                t1 = time.perf_counter()
                torch.tpu.synchronize()
                t2 = time.perf_counter()
                del y
                calls.append(t1 - t0)
                syncs.append(t2 - t1)
                totals.append(t2 - t0)
            s1 = deferfuse_torch.stats()
        per_call = {k: (s1[k] - s0[k]) / args.calls
                    for k in ("ops_recorded", "programs_run", "plans_reused",
                              "programs_compiled")}
        compile_backend.capture_enabled = True
        results[label] = ({k: statistics.median(v) * 1e6 for k, v in
                           (("total", totals), ("call", calls), ("sync", syncs))}, per_call)
    return results


def time_per_op_dispatch(n=2000):
    """The cost of one elementwise op through PyTorch's dispatcher into the device, from
    Python, in defer mode (so it is recorded, not run), in microseconds."""
    x = torch.randn(16).to("tpu")
    mul = torch.ops.aten.mul.Tensor
    with deferfuse_torch.mode("defer"):
        for _ in range(100):
            mul(x, 1.0001)
        torch.tpu.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            mul(x, 1.0001)
        dt = time.perf_counter() - t0
        torch.tpu.synchronize()
    return dt / n * 1e6


def main(args):
    torch.set_num_threads(args.threads)
    if not args.no_train:
        print(f"one training step, median of {args.steps} interleaved rounds after "
              f"{args.warmup} warm-up; threads: {args.threads} (torch and deferfuse)")
        head = (f"{'model':10s} {'tpu compiled':>12s} {'tpu defer':>10s} {'inductor':>10s} "
                f"{'ind/tpu-c':>9s} {'defer/tpu-c':>11s} {'loss diff':>9s} | "
                f"{'ops/progs compiled':>18s} {'ops/progs defer':>15s}")
        print(head)
        print("-" * len(head))
        notes = []
        for name in [n for n in args.models.split(",") if n]:
            name, desc, ms, counts, worst = bench_training(name, args)
            c = ms["tpu compiled"]
            print(f"{name:10s} {c:12.2f} {ms['tpu defer']:10.2f} {ms['inductor']:10.2f} "
                  f"{ms['inductor'] / c:9.2f} {ms['tpu defer'] / c:11.2f} {worst:9.1e} | "
                  f"{counts['tpu compiled']:>18s} {counts['tpu defer']:>15s}")
            notes.append(f"  {name}: {desc}")
        print("ms per step; ind/tpu-c above 1: compiled tpu beats inductor on CPU; loss diff: "
              "the largest relative difference of a tpu loss from inductor's; ops/progs: ops "
              "recorded and programs run per step (medians)")
        print("\n".join(notes))
        print()
    print(f"replaying a graph of {args.ops} elementwise ops on 16 floats, median of "
          f"{args.calls} calls, microseconds")
    for label, (us, per_call) in bench_replay(args).items():
        print(f"  {label:26s} total {us['total']:9.1f}  call {us['call']:9.1f}  sync "
              f"{us['sync']:8.1f}  | per call: ops {per_call['ops_recorded']:.0f}, programs "
              f"{per_call['programs_run']:.0f}, plans reused {per_call['plans_reused']:.0f}, "
              f"programs compiled {per_call['programs_compiled']:.0f}")
    print(f"  one op dispatched from Python into the device (defer, recorded): "
          f"{time_per_op_dispatch():.2f} us")
    x = torch.randn(16).to("tpu")
    f = chain(args.ops)
    print(f"  the launched programs' own run time (timeline): "
          f"{program_time_us(captured_launch(f, x), x):.1f} us per call")


if __name__ == "__main__":
    main(ARGS)
