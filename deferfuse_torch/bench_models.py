"""One training step of each model-zoo model (tests/model_zoo.py: GPT-2, Llama, BERT, ViT,
resnet18, nanoGPT, LSTM LM) and of the two MLPs (784-1024-1024-10 and 784-256-256-10, batch
64), timed four ways: torch CPU eager, torch.compile (inductor) on CPU, "tpu" strict and "tpu"
defer.

A step is forward, loss, backward, (clip_grad_norm_ for nanoGPT,) optimizer step, and ends with
the loss read on the host (loss.item()), as a training loop that logs its loss does. A round
is --steps-per-round such steps and, on tpu, one torch.tpu.synchronize() after them, so all
their work is in the round's time, but a step's work after its loss (the backward and the
optimizer, which `loss.item()` does not wait for) may run while the host records the next
step, as on any asynchronous device. A step's time is its round's time over the steps in it.
After the warm-up the runners take rounds in turn, so load from other processes hits them
alike; each column is the median over --steps rounds. Before each round the previous runner's
threads are let go quiet (bench_settle.settle: torch's OpenMP workers spin ~10 ms after a
parallel region) and the runner takes one untimed step, so a round measures the runner as a
program running only it would see it. For the defer runner the table also shows
what one step did, from deferfuse_torch.stats() and fallback_counts() deltas around a round
(over its steps; medians over the rounds): ops recorded, programs run, sync points, and ops
that ran on the CPU fallback (listed by name under the table). A runner that
raises (e.g. an op with neither a kernel nor a fallback) is reported and skipped; the others
go on.

With --more, the models beyond the zoo follow it (tests/model_zoo_more.py: MobileNetV2,
EfficientNet-B0, DistilBERT, T5, Qwen2, nn.TransformerEncoder, a bidirectional GRU, a 1-D
convolution audio encoder, a U-Net); with --hf, fifteen Hugging Face architectures the zoo
does not have (tests/hf_architectures.py: RoBERTa, ALBERT, ELECTRA, GPT-Neo, OPT, Mistral,
Phi, BLOOM, GPT-BigCode, BART, DeiT, Swin, ConvNeXt, RegNet, MobileViT, 2 layers or stages,
d 128, AdamW); with --tv, fourteen torchvision architectures the zoo does not have
(tests/vision_architectures.py: densenet121, shufflenet_v2_x1_0, squeezenet1_1, mnasnet0_5,
googlenet, regnet_y_400mf, mobilenet_v3_small, resnext50_32x4d, convnext_tiny, swin_t,
swin_v2_t, efficientnet_v2_s as published, small MaxViT and ViT; 64x64 images, batch 8, SGD
with momentum); --models may name any model of these lists.

Sizes: by default the zoo's "bench" sizes (nanoGPT: 4 layers, d 128, seq 64, batch 16, AdamW);
--quick uses the tests' tiny sizes.

With --no-pipeline-too, one more tpu runner takes its turn: defer with pipelining off
(deferfuse_torch.set_pipeline_ops(0) around its rounds), so the table shows what defer's
pipelining gains on each model side by side ("nopipe/def").

With --breakdown, one more step per tpu mode runs under deferfuse_torch.explain() (its
timeline on, which adds a little per program) and a second table says where it went: the
host's recording (the step's Python up to its loss.item()), and the programs' time by kind
(GEMM, reductions, elementwise loops, copies, kernels: observe.program_kind). Both modes run
the same products, so a step's GEMM time bounds what fusion can gain: "str/def max" is the
strict step's ms over the defer step's GEMM ms, the str/def ratio defer would reach if
everything else cost nothing.

Usage: python bench_models.py [--models gpt2,mlp] [--steps N] [--warmup N] [--threads N]
                              [--steps-per-round K] [--quick] [--no-compile] [--json]
                              [--breakdown] [--no-pipeline-too] [--more] [--hf] [--tv]
                              [--autocast bfloat16|float16]"""

import argparse
import os
import sys


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="", help="comma-separated names (default: all)")
    ap.add_argument("--steps", type=int, default=10, help="timed rounds (default 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    ap.add_argument("--steps-per-round", type=int, default=3,
                    help="training steps per timed round, one synchronize after them (default 3)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads and DEFERFUSE_NUM_THREADS (default 1)")
    ap.add_argument("--quick", action="store_true", help="the tests' tiny sizes")
    ap.add_argument("--no-compile", action="store_true",
                    help="skip torch.compile (compiling each model takes a while)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON only")
    ap.add_argument("--no-pipeline-too", action="store_true",
                    help="one more runner: tpu defer with pipelining off (set_pipeline_ops(0)), "
                         "and its ms over defer's as 'nopipe/def'")
    ap.add_argument("--more", action="store_true",
                    help="after the zoo, the models beyond it (tests/model_zoo_more.py)")
    ap.add_argument("--hf", action="store_true",
                    help="after those, Hugging Face architectures the zoo does not have "
                         "(tests/hf_architectures.py)")
    ap.add_argument("--tv", action="store_true",
                    help="after those, torchvision architectures the zoo does not have "
                         "(tests/vision_architectures.py)")
    ap.add_argument("--autocast", choices=["bfloat16", "float16"], default=None,
                    help="every runner's forward and loss under torch.autocast(device, dtype): "
                         "CPU's op policy on cpu, CUDA's on tpu (the README's autocast row)")
    ap.add_argument("--breakdown", action="store_true",
                    help="after the timing, one more step per tpu mode under explain(): where "
                         "its time went (host recording, programs by kind)")
    return ap.parse_args(argv)


# The runtime reads DEFERFUSE_NUM_THREADS when it starts, so it is set before the import that
# may start it.
ARGS = parse_args(sys.argv[1:]) if __name__ == "__main__" else None
if ARGS is not None:
    os.environ["DEFERFUSE_NUM_THREADS"] = str(ARGS.threads)

import contextlib  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import deferfuse_torch  # noqa: E402
from bench_settle import settle  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))
import model_zoo  # noqa: E402
import model_zoo_more  # noqa: E402
import hf_architectures  # noqa: E402
import vision_architectures  # noqa: E402

BATCHES = 4  # distinct batches each runner cycles through


class Runner:
    """One way of running a workload: its own copy of the model, optimizer and batches."""

    def __init__(self, label, w, device, mode=None, compiled=False, pipeline_ops=None,
                 autocast=None):
        self.label, self.w, self.device, self.mode = label, w, device, mode
        # The forward's and loss's torch.autocast dtype (--autocast), or None.
        self.autocast = autocast
        # None: the runtime's setting; else set for this runner's rounds only.
        self.pipeline_ops = pipeline_ops
        self.model = copy.deepcopy(w.model).to(device)
        # Only the module is compiled; the optimizer step stays eager in every column.
        self.forward = torch.compile(self.model, backend="inductor") if compiled else self.model
        self.opt = w.make_opt(self.model.parameters())
        self.batches = [model_zoo.to_device(b, device) for b in w.batches]
        self.times, self.error, self.step_stats = [], None, []

    def round(self, i, steps, timed):
        """Round i: `steps` training steps, each reading its loss, then (tpu) a synchronize."""
        if self.error is not None:
            return
        ctx = deferfuse_torch.mode(self.mode) if self.mode else contextlib.nullcontext()
        try:
            with ctx, deferfuse_torch.pipeline_ops(self.pipeline_ops):
                settle()
                lead = self.batches[(i * steps) % len(self.batches)]
                self._train_step(lead).item()
                if self.device == "tpu":
                    torch.tpu.synchronize()
                before = self._counters()
                t0 = time.perf_counter()
                for k in range(steps):
                    batch = self.batches[(i * steps + k) % len(self.batches)]
                    self._train_step(batch).item()
                if self.device == "tpu":
                    torch.tpu.synchronize()
                dt = (time.perf_counter() - t0) / steps
                after = self._counters()
        except Exception as e:  # reported in the table; the other runners go on
            self.error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            return
        if timed:
            self.times.append(dt)
            if before is not None:
                self.step_stats.append(_delta(before, after, steps))

    def breakdown(self, i):
        """One step under explain(): {"record_ms": the host's time up to the loss read,
        "device_ms": {kind: ms}, "programs": programs run}."""
        record = []

        def step():
            batch = self.batches[i % len(self.batches)]
            t0 = time.perf_counter()
            loss = self._train_step(batch)
            record.append((time.perf_counter() - t0) * 1e3)
            loss.item()

        with deferfuse_torch.mode(self.mode):
            r = deferfuse_torch.explain(step)
        return {"record_ms": record[0], "device_ms": r.device_ms, "programs": r.programs_run}

    def _train_step(self, batch):
        """One training step (model_zoo's), its forward and loss under --autocast's dtype."""
        autocast = (self.device, self.autocast) if self.autocast is not None else None
        return model_zoo.train_step(self.w, self.forward, self.opt, batch, autocast)

    def _counters(self):
        if self.mode is None:
            return None
        return deferfuse_torch.stats(), deferfuse_torch.fallback_counts()

    def median_ms(self):
        return statistics.median(self.times) * 1e3 if self.times and not self.error else None


def _delta(before, after, steps):
    """Per step: the counters' change over a round of `steps` steps, divided by `steps`."""
    (s0, f0), (s1, f1) = before, after
    fallbacks = {k: (v - f0.get(k, 0)) / steps for k, v in f1.items() if v != f0.get(k, 0)}
    syncs = sum(s1["sync_points"].values()) - sum(s0["sync_points"].values())
    return {"ops_recorded": (s1["ops_recorded"] - s0["ops_recorded"]) / steps,
            "programs_run": (s1["programs_run"] - s0["programs_run"]) / steps,
            "programs_compiled": (s1["programs_compiled"] - s0["programs_compiled"]) / steps,
            # The round's closing synchronize finds nothing left to flush: it is not counted.
            "sync_points": syncs / steps,
            "pipelined_flushes": (s1["pipelined_flushes"] - s0["pipelined_flushes"]) / steps,
            "fallback_ops": sum(fallbacks.values()), "fallbacks": fallbacks}


def _median_stats(steps):
    if not steps:
        return None
    out = {k: statistics.median(s[k] for s in steps) for k in steps[0] if k != "fallbacks"}
    out["fallbacks"] = steps[-1]["fallbacks"]  # the last step's, by op name
    return out


def build(name, size):
    """The workload `name` of the zoo or of the models beyond it."""
    if name in model_zoo_more.MORE:
        return model_zoo_more.build(name, size, BATCHES)
    if name in hf_architectures.NAMES:
        return hf_architectures.build(name, size, BATCHES)
    if name in vision_architectures.NAMES:
        return vision_architectures.build(name, size, BATCHES)
    return model_zoo.build(name, size, BATCHES)


def bench(name, args):
    w = build(name, "tiny" if args.quick else "bench")
    ac = dict(autocast=getattr(torch, args.autocast) if args.autocast else None)
    runners = [Runner("cpu", w, "cpu", **ac)]
    if not args.no_compile:
        runners.append(Runner("compile", w, "cpu", compiled=True, **ac))
    if args.no_pipeline_too:
        runners.append(Runner("nopipe", w, "tpu", "defer", pipeline_ops=0, **ac))
    runners += [Runner("strict", w, "tpu", "strict", **ac),
                Runner("defer", w, "tpu", "defer", **ac)]
    for i in range(args.warmup + args.steps):
        for r in runners:
            r.round(i, args.steps_per_round, timed=i >= args.warmup)
    ms = {r.label: r.median_ms() for r in runners}
    ms.setdefault("compile", None)
    ms.setdefault("nopipe", None)
    strict, defer = runners[-2], runners[-1]
    breakdown = {}
    if args.breakdown:
        i = args.warmup + args.steps
        breakdown = {r.label: r.breakdown(i) for r in (strict, defer) if r.error is None}

    def ratio(a, b):
        return ms[a] / ms[b] if ms[a] and ms[b] else None

    return {"model": name, "description": w.description, "ms": ms,
            "cpu/defer": ratio("cpu", "defer"), "strict/defer": ratio("strict", "defer"),
            "cpu/strict": ratio("cpu", "strict"), "nopipe/defer": ratio("nopipe", "defer"),
            "defer_step": _median_stats(defer.step_stats),
            "strict_step": _median_stats(strict.step_stats), "breakdown": breakdown,
            "errors": {r.label: r.error for r in runners if r.error}}


def _fmt(v, spec):
    """v formatted by spec ("8.2f"), or "-" right-aligned to the same width when missing."""
    return "-".rjust(int(spec.split(".")[0])) if v is None else format(v, spec)


def print_table(rows, args):
    size = "tiny (--quick)" if args.quick else "bench"
    print(f"one training step, median of {args.steps} interleaved rounds of "
          f"{args.steps_per_round} steps after {args.warmup} warm-up; sizes: {size}; "
          f"threads: {args.threads} (torch and deferfuse)"
          + (f"; autocast: {args.autocast}" if args.autocast else ""))
    head = (f"{'model':15s} {'cpu ms':>8s} {'compile':>8s} {'strict':>8s} {'defer':>8s} "
            f"{'cpu/def':>7s} {'str/def':>7s} {'cpu/str':>7s} | {'ops':>5s} {'progs':>5s} "
            f"{'syncs':>5s} {'pipe':>4s} {'fallbk':>6s} {'s.progs':>7s}")
    if args.no_pipeline_too:
        head += f" | {'nopipe':>8s} {'nopipe/def':>10s}"
    print(head)
    print("-" * len(head))
    for r in rows:
        ms, d, st = r["ms"], r["defer_step"] or {}, r["strict_step"] or {}
        print(f"{r['model']:15s} {_fmt(ms['cpu'], '8.2f')} {_fmt(ms['compile'], '8.2f')} "
              f"{_fmt(ms['strict'], '8.2f')} {_fmt(ms['defer'], '8.2f')} "
              f"{_fmt(r['cpu/defer'], '7.2f')} {_fmt(r['strict/defer'], '7.2f')} "
              f"{_fmt(r['cpu/strict'], '7.2f')} | {_fmt(d.get('ops_recorded'), '5.0f')} "
              f"{_fmt(d.get('programs_run'), '5.0f')} {_fmt(d.get('sync_points'), '5.0f')} "
              f"{_fmt(d.get('pipelined_flushes'), '4.0f')} "
              f"{_fmt(d.get('fallback_ops'), '6.0f')} {_fmt(st.get('programs_run'), '7.0f')}"
              + (f" | {_fmt(ms['nopipe'], '8.2f')} {_fmt(r['nopipe/defer'], '10.2f')}"
                 if args.no_pipeline_too else ""))
    print("\nms: per step; cpu/def = cpu ms / defer ms (above 1: defer is faster), likewise "
          "str/def and cpu/str.\nops, progs, syncs, pipe, fallbk: per defer step, ops recorded, "
          "programs run, sync points, pipelined flushes (set_pipeline_ops), ops run on the CPU "
          "fallback; s.progs: programs per strict step\n(one per ATen op, a compound op such as "
          "layer_norm fused into one: see the README's op groups)."
          + ("\nnopipe: tpu defer with pipelining off; nopipe/def: its ms over defer's."
             if args.no_pipeline_too else ""))
    for r in rows:
        notes = [r["description"]]
        if r["defer_step"] and r["defer_step"]["fallbacks"]:
            notes.append("fallbacks per defer step: " + ", ".join(
                f"{k} {v}" for k, v in sorted(r["defer_step"]["fallbacks"].items())))
        notes += [f"{label} failed: {err}" for label, err in r["errors"].items()]
        print(f"  {r['model']}: " + "; ".join(notes))


def print_breakdown(rows):
    kinds = deferfuse_torch.observe.KINDS
    print("\nwhere one step went (one step per mode under explain(); ms)")
    head = (f"{'model':15s} {'mode':6s} {'record':>7s} {'progs':>5s} "
            + " ".join(f"{k[:11]:>11s}" for k in kinds) + f" {'gemm %':>6s} {'str/def max':>11s}")
    print(head)
    print("-" * len(head))
    for r in rows:
        for mode, b in r["breakdown"].items():
            dev = b["device_ms"]
            total = sum(dev.values())
            gemm = dev.get("gemm", 0.0)
            ceiling = r["ms"]["strict"] / gemm if mode == "defer" and gemm and r["ms"]["strict"] else None
            print(f"{r['model']:15s} {mode:6s} {b['record_ms']:7.2f} {b['programs']:5d} "
                  + " ".join(_fmt(dev.get(k), "11.2f") for k in kinds)
                  + f" {_fmt(100 * gemm / total if total else None, '6.0f')} "
                  + _fmt(ceiling, "11.2f"))
    print("record: the host's time to record the step up to its loss.item(); the kinds: "
          "programs' run time\n(observe.program_kind); str/def max: strict ms / defer GEMM ms, "
          "the ratio if all but the\nproducts cost nothing.")


def model_names(args):
    """The models to time, in order: --models's, else the zoo and the MLPs (and with --more the
    models beyond the zoo, with --hf the Hugging Face architectures, with --tv torchvision's).
    Exits naming the known models when --models names another."""
    known = [*model_zoo.ALL, *model_zoo_more.MORE, *hf_architectures.NAMES,
             *vision_architectures.NAMES]
    names = [n for n in args.models.split(",") if n] or list(model_zoo.ALL)
    if args.more and not args.models:
        names += list(model_zoo_more.MORE)
    if args.hf and not args.models:
        names += hf_architectures.NAMES
    if args.tv and not args.models:
        names += vision_architectures.NAMES
    unknown = [n for n in names if n not in known]
    if unknown:
        sys.exit(f"bench_models: unknown model(s) {unknown}; expected some of {sorted(known)}")
    return names


def main(args):
    torch.set_num_threads(args.threads)
    from transformers.utils import logging
    logging.set_verbosity_error()  # config notices, one per model, would break up the table
    names = model_names(args)
    rows = [bench(n, args) for n in names]
    if args.json:
        print(json.dumps({"steps": args.steps, "warmup": args.warmup, "threads": args.threads,
                          "steps_per_round": args.steps_per_round,
                          "quick": args.quick, "models": rows}, indent=1))
    else:
        print_table(rows, args)
        if args.breakdown:
            print_breakdown(rows)


if __name__ == "__main__":
    main(ARGS)
