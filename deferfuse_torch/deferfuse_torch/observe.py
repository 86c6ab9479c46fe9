"""Seeing where the time goes: `trace(path)` records the runtime's timeline (Chrome trace /
Perfetto JSON), and `explain(fn, *args)` runs fn once and says what it recorded, ran and
compiled, which source lines forced each sync point and CPU fallback, and which regions took
the time. `report(path, fn, *args)` (report.py) draws the same as one HTML page."""

import atexit
import collections
import contextlib
import json
import os
import tempfile

import torch

from . import device as _device

_ops = torch.ops.deferfuse

# Frames under these directories are not the user's: the first frame outside them is the
# source line a sync point or fallback is blamed on.
_SKIP = "\n".join([os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
                   os.path.dirname(os.path.abspath(__file__)) + os.sep,
                   os.path.dirname(os.path.abspath(contextlib.__file__)) + os.sep + "contextlib"])


# Which frames are the user's is known from import on: DEFERFUSE_LOG's lines name source lines
# without explain or trace running. A whole-run DEFERFUSE_TRACE notes them from import on, so
# its sync points, fallbacks and cuts name their lines as trace() does.
_ops.observe_set(bool(os.environ.get("DEFERFUSE_TRACE")), _SKIP)


@contextlib.contextmanager
def _noting():
    """Notes the source line of each sync point and fallback while the block runs."""
    prev = _ops.observe_set(True, _SKIP)
    try:
        yield
    finally:
        _ops.observe_set(prev, _SKIP)


def _take_notes():
    """The sync and fallback notes since the last call: (kind, what, where) tuples."""
    out = []
    for line in _ops.observe_take().splitlines():
        kind, what, where = line.split("\t", 2)
        out.append((kind, what, where))
    return out


def _write_env_trace():
    """DEFERFUSE_TRACE's file is written when the runtime is dropped, which the device never
    does (tensors may be freed during interpreter shutdown): the trace is stopped, and so
    written, at exit instead."""
    if not os.environ.get("DEFERFUSE_TRACE"):
        return
    # This synchronize is the trace's own sync point, not the user's: not noted.
    _ops.observe_set(False, _SKIP)
    try:
        _device.synchronize()
        _ops.trace_control("", 0)
    except RuntimeError:
        pass  # the user stopped it already (or a block's error left nothing to write)


atexit.register(_write_env_trace)


@contextlib.contextmanager
def trace(path, max_events=0):
    """`with deferfuse_torch.trace("step.json"): ...` records the runtime's timeline while the
    block runs and writes it to `path` (open it in ui.perfetto.dev or chrome://tracing):
    flushes with their reason, plan lookups, compiles, program runs (region, shapes, bytes,
    threads), host copies, sync waits, and the source line of each sync point and fallback.
    Pending work is run at both ends so the file holds the block's work. At most `max_events`
    events are kept, the oldest dropped (0: DEFERFUSE_TRACE_EVENTS, else 262144)."""
    path = os.fspath(path)
    _device.synchronize()
    _ops.trace_control(os.path.abspath(path), int(max_events))
    try:
        with _noting():
            yield path
        # Outside the noting: this is the trace's own sync point, not the user's.
        _device.synchronize()
    finally:
        _ops.trace_control("", 0)


class Report:
    """What one run of a function did on the tpu device (see `explain`). `print(report)` reads
    as text; `report.as_dict()` gives the same as plain data."""

    def __init__(self, stats, notes, timeline, result):
        self.stats = stats
        self.result = result
        self.timeline = timeline
        runs = [e for e in timeline["traceEvents"] if e.get("cat") == "run"]
        compiles = [e for e in timeline["traceEvents"] if e.get("cat") == "compile"]
        self.ops_recorded = stats["ops_recorded"]
        self.programs_run = len(runs)
        self.programs_compiled = stats["programs_compiled"]
        self.compile_ms = sum(e["args"]["ms"] for e in compiles)
        self.sync_points = {k: v for k, v in stats["sync_points"].items() if v}
        # Defer-mode traces handed to the worker while recording went on (not sync points).
        self.pipelined_flushes = stats["pipelined_flushes"]
        self.sync_lines = _lines(n for n in notes if n[0] == "sync")
        self.fallbacks = _lines(n for n in notes if n[0] == "fallback")
        self.regions = _regions(runs, timeline.get("deferfuse_regions", []))
        self.device_ms = device_ms_by_kind(runs)
        self.cuts = {k: v for k, v in stats["cuts"].items() if v}
        # The op that started each new region, by reason (the planner's cut log), and the
        # source line that recorded it: a cut event's tag carries the line's id in its high
        # half (csrc/observe.h), which a "line" note names.
        line_of = {int(what): where for kind, what, where in notes if kind == "line"}
        self.cut_ops = {}
        self.cut_lines = {}
        for e in timeline["traceEvents"]:
            if e.get("cat") == "cut":
                reason = e["name"][len("cut ("):-1]
                self.cut_ops.setdefault(reason, []).append(e["args"]["op"])
                where = line_of.get(e["args"].get("tag", 0) >> 32, "(no source line)")
                self.cut_lines.setdefault(reason, collections.Counter())[where] += 1

    def as_dict(self):
        return {
            "ops_recorded": self.ops_recorded,
            "programs_run": self.programs_run,
            "programs_compiled": self.programs_compiled,
            "compile_ms": self.compile_ms,
            "sync_points": dict(self.sync_points),
            "pipelined_flushes": self.pipelined_flushes,
            "sync_lines": {k: dict(v) for k, v in self.sync_lines.items()},
            "fallbacks": {k: dict(v) for k, v in self.fallbacks.items()},
            "regions": [dict(r) for r in self.regions],
            "device_ms": dict(self.device_ms),
            "cuts": dict(self.cuts),
            "cut_ops": {k: list(v) for k, v in self.cut_ops.items()},
            "cut_lines": {k: dict(v) for k, v in self.cut_lines.items()},
        }

    def __str__(self):
        out = [f"ops recorded {self.ops_recorded}, programs run {self.programs_run}, "
               f"compiled {self.programs_compiled} ({self.compile_ms:.1f} ms)"]
        if self.sync_points:
            out.append("sync points: " + ", ".join(
                f"{k} {v}" for k, v in sorted(self.sync_points.items())))
        if self.pipelined_flushes:
            out.append(f"pipelined flushes: {self.pipelined_flushes} (traces that started "
                       "running while recording went on: set_pipeline_ops)")
        for what, lines in self.sync_lines.items():
            out.append(f"  {what}:")
            out += [f"    {n}x {where}" for where, n in lines.most_common(5)]
        if self.fallbacks:
            out.append("CPU fallbacks:")
            for op, lines in self.fallbacks.items():
                out.append(f"  {op} ({sum(lines.values())}x)")
                out += [f"    {n}x {where}" for where, n in lines.most_common(5)]
        if self.cuts:
            out.append("fusion cuts: " + ", ".join(f"{k} {v}" for k, v in self.cuts.items()))
            for reason, ops in self.cut_ops.items():
                more = f" (+{len(ops) - 3} more)" if len(ops) > 3 else ""
                out.append(f"  {reason}, at: " + "; ".join(ops[:3]) + more)
                out += [f"    {n}x {where}" for where, n in self.cut_lines[reason].most_common(5)]
        if self.device_ms:
            total = sum(self.device_ms.values())
            out.append(f"program time {total:.3f} ms: " + ", ".join(
                f"{k} {v:.3f} ({100 * v / total:.0f}%)" for k, v in self.device_ms.items()))
        if self.regions:
            out.append("largest regions by time:")
            for r in self.regions[:10]:
                out.append(f"  {r['ms']:8.3f} ms  {r['runs']}x  {r['label']}  [{r['shapes']}]")
        return "\n".join(out)

    __repr__ = __str__


def _lines(notes):
    """{what: Counter(where)} in order of first appearance."""
    out = {}
    for _, what, where in notes:
        out.setdefault(what, collections.Counter())[where] += 1
    return out


def _regions(runs, regions):
    """The regions that ran, largest total time first."""
    by = {}
    for e in runs:
        fp = e["args"]["region"]
        r = by.setdefault(fp, {"fingerprint": fp, "label": e["name"], "runs": 0, "ms": 0.0,
                               "bytes": 0, "shapes": e["args"]["shapes"]})
        r["runs"] += 1
        r["ms"] += e["dur"] / 1000.0
        r["bytes"] += e["args"]["bytes"]
    for g in regions:
        if g["fingerprint"] in by:
            by[g["fingerprint"]]["text"] = g["text"]
            by[g["fingerprint"]]["dot"] = g["dot"]
    return sorted(by.values(), key=lambda r: -r["ms"])


# The kinds of program a step's time is split into (`device_ms_by_kind`), in print order.
KINDS = ("gemm", "reduce", "elementwise", "copy", "kernel", "graph")


def program_kind(label):
    """The kind of a program run from its timeline label (runtime/src/timeline/label.rs):
    "gemm" (a matrix product, with or without a fused epilogue; convolutions run as one),
    "reduce" (a loop with reductions: sums, softmax, norms), "elementwise" (a loop without
    one), "copy" (a loop that only moves elements: a layout change, a gather of windows),
    "graph" (a backend's whole-flush program or a captured graph) or "kernel" (gather,
    scatter, sort...).
    GEMM time is what fusion cannot remove: both modes run the same products."""
    if label.startswith("matmul"):
        return "gemm"
    if label.startswith("row kernel"):
        return "reduce"
    if label == "fused copy":
        return "copy"
    if label.startswith("fused"):
        return "elementwise"
    if label.startswith("graph of"):
        return "graph"
    return "kernel"


def device_ms_by_kind(runs):
    """{kind: ms} of the timeline's program runs (see `program_kind`), kinds with no run left
    out, in `KINDS` order."""
    ms = collections.Counter()
    for e in runs:
        ms[program_kind(e["name"])] += e["dur"] / 1000.0
    return {k: ms[k] for k in KINDS if ms[k]}


def _delta(after, before):
    out = {}
    for k, v in after.items():
        out[k] = _delta(v, before[k]) if isinstance(v, dict) else v - before[k]
    return out


def explain(fn, *args, **kwargs):
    """Runs `fn(*args, **kwargs)` once (pending work before it runs first, pending work after
    it runs before the report is made) and returns a `Report`: ops recorded, programs run and
    compiled, sync points by reason with the source lines that forced them, CPU fallback ops
    with their source lines, fusion cuts with the ops and source lines they cut at, the
    regions that took the most time and the programs' time by kind (`device_ms`: GEMM,
    reductions, elementwise loops, copies, kernels). fn's return
    value is `report.result`. Fails if a trace is already running (DEFERFUSE_TRACE)."""
    _device.synchronize()
    _take_notes()
    fd, path = tempfile.mkstemp(suffix=".json", prefix="deferfuse-explain-")
    os.close(fd)
    try:
        before = _device.stats()
        with trace(path):
            result = fn(*args, **kwargs)
        stats = _delta(_device.stats(), before)
        notes = _take_notes()
        with open(path) as f:
            timeline = json.load(f)
    finally:
        os.unlink(path)
    return Report(stats, notes, timeline, result)
