"""The torch.compile backend "tpu": `torch.compile(model, backend="tpu")`.

Dynamo captures the Python code as FX graphs (guards, recompiles and graph breaks are Dynamo's
own); AOTAutograd turns each into a functionalized forward graph and, when gradients are
needed, a backward graph. Each of those graphs is captured by the runtime as a graph at its
first call for each input layout (`CapturedGraph`): its ops are recorded once, in defer mode
whatever the caller's eager mode is, and the runtime plans the whole graph once. Every later
call with inputs of the same sizes, strides and dtypes (and the same non-tensor arguments) is
one `graph_launch`: the plan's programs run on the new inputs with no per-op dispatch through
PyTorch. A graph the runtime cannot replay (a random op, a host read, a CPU fallback op) runs
as before: its ops are dispatched one by one into one deferred trace. A graph that computes on
CPU tensors too (a default optimizer's step counts) has its CPU ops run in Python at each call
and only its device part captured (`host_split`). Each graph keeps at most MAX_CAPTURES
captures, dropping the least recently called.

This module imports torch._dynamo; the package registers the backend without importing it
(`compile_hooks`)."""

import collections
import os

import torch
from torch._dynamo.backends.common import aot_autograd

from . import graph_order, host_split
from .device import MODES

_ops = torch.ops.deferfuse

_DEFER = MODES["defer"]
_DEBUG = MODES["debug"]

def op_name(op: torch._ops.OpOverload) -> str:
    """The dispatcher's name of an overload, e.g. "aten::add.Tensor" or "aten::sinh"."""
    schema = op._schema
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


def _has_kernel(name: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)


def _out_overload(op: torch._ops.OpOverload):
    """The out= overload a generated functional kernel calls (sinh -> sinh.out,
    add.Tensor -> add.out), or None."""
    packet = getattr(torch.ops.aten, op._schema.name.split("::")[1], None)
    base = op._schema.overload_name
    for name in ("out", f"{base}_out") if base else ("out",):
        if packet is not None and name in packet.overloads():
            return getattr(packet, name)
    return None


def has_device_kernel(op: torch._ops.OpOverload) -> bool:
    """Whether the op runs on the device rather than through the CPU fallback: it has a tpu
    kernel, or a composite kernel (which calls other ops; those are not followed), except
    the functional kernels PyTorch generates from an op's out= form, which only call that
    form: they run on the device if the out= form has a tpu kernel."""
    name = op_name(op)
    if _has_kernel(name, "PrivateUse1"):
        return True
    if _has_kernel(name, "CompositeExplicitAutograd") or _has_kernel(
            name, "CompositeImplicitAutograd"):
        return True
    if _has_kernel(name, "CompositeExplicitAutogradNonFunctional"):
        out = _out_overload(op)
        return out is not None and _has_kernel(op_name(out), "PrivateUse1")
    return False


def fallback_ops(gm: torch.fx.GraphModule) -> list:
    """The names of the graph's ops that have no tpu kernel, in graph order, each once."""
    names = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if not has_device_kernel(node.target):
            name = op_name(node.target)
            if name not in names:
                names.append(name)
    return names


# What the captured graphs did in this process (tests and benches read it).
counts = {"captures": 0, "launches": 0, "refused": 0, "fallback_calls": 0, "evicted": 0}

# False: every compiled call dispatches its graph's ops one by one, as before graphs were
# captured (DEFERFUSE_COMPILE_CAPTURE=0): rules the capture out when a compiled model
# misbehaves, and is what bench_compile.py compares the launch with. Read at each first call.
capture_enabled = os.environ.get("DEFERFUSE_COMPILE_CAPTURE", "1") != "0"


def _key(args) -> tuple:
    """What a capture is valid for: each tensor's device, dtype, sizes, strides and offset,
    and every other argument's value (the graph's ops were recorded with them)."""
    return tuple(
        (a.device.type, a.dtype, a.shape, a.stride(), a.storage_offset())
        if isinstance(a, torch.Tensor) else (type(a), a)
        for a in args)


class _Launch:
    """One capture of a graph: its runtime graph, which arguments are its inputs, and how
    each of the FX graph's outputs is made (a launch output, an argument, a constant)."""

    def __init__(self, graph: int, inputs: list, outputs: list, as_tuple: bool):
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs
        self.as_tuple = as_tuple

    def __call__(self, args):
        res = _ops.graph_launch(self.graph, [args[i] for i in self.inputs])
        counts["launches"] += 1
        out = [res[v] if kind == "launch" else args[v] if kind == "arg" else v
               for kind, v in self.outputs]
        return tuple(out) if self.as_tuple else out

    def release(self):
        """Destroys the runtime graph (and what it holds) now; the launch is unusable after."""
        graph, self.graph = self.graph, 0
        if graph:
            _ops.graph_destroy(graph)

    def __del__(self):
        try:
            self.release()
        except Exception:  # the runtime went first, at interpreter exit
            pass


# The captures one compiled graph keeps (one per input layout). Each holds a runtime graph:
# its plan, and the tensors it holds. A graph called with more layouts (a batch size that
# keeps changing) drops the one called least recently; that layout is captured again when it
# comes back, its call dispatching the ops as any capture does.
MAX_CAPTURES = 8


class CapturedGraph:
    """One AOTAutograd graph: captured by the runtime at its first call per input layout and
    launched on later ones (see the module doc).

    A graph that computes on CPU tensors too (a default optimizer's step counts) is split
    (`host_split`): its host part runs op by op at every call, and only its device part is
    captured and launched, taking the host values it reads as inputs.

    AOTAutograd calls it with the boxed calling convention (one list of arguments). Debug
    mode keeps dispatching op by op: it exists to make each op wait and report its own error,
    which is what someone debugging a compiled graph wants."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        # The generated code itself: GraphModule.__call__ adds nn.Module's hook handling.
        self.forward = gm.forward
        self.split = host_split.split(gm)
        self.device_forward = self.forward if self.split is None else self.split.device.forward
        # By `_key`, least recently called first (at most MAX_CAPTURES): a `_Launch`, or a
        # string saying why the capture was refused.
        self.captures = collections.OrderedDict()
        # An instance attribute: AOTAutograd wraps the backward in torch._dynamo.disable,
        # whose functools.wraps copies the instance's __dict__ (not class attributes).
        self._boxed_call = True

    def __call__(self, args: list):
        prev = _ops.get_mode()
        if prev == _DEBUG:
            return self.forward(*args)
        if not capture_enabled:
            return self._deferred(self.forward, args, prev)
        key = _key(args)
        launch = self.captures.get(key)
        if launch is not None:
            self.captures.move_to_end(key)
        if isinstance(launch, str):
            counts["fallback_calls"] += 1
            return self._deferred(self.forward, args, prev)
        split = self.split
        if split is not None:
            host_values = split.host(*args)
            args = split.device_args(args, host_values)
        if launch is None:
            out = self._capture(key, args, prev)
        else:
            try:
                out = launch(args)
            except ValueError:  # inputs aliased otherwise than at capture
                counts["fallback_calls"] += 1
                out = self._deferred(self.device_forward, args, prev)
        return out if split is None else split.outputs(out, host_values)

    def _deferred(self, forward, args, prev):
        """The graph's ops dispatched one by one into one deferred trace."""
        if prev == _DEFER:
            return forward(*args)
        _ops.set_mode(_DEFER)
        try:
            return forward(*args)
        finally:
            _ops.set_mode(prev)

    def _capture(self, key, args, prev):
        inputs = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        if any(args[i].device.type != "tpu" for i in inputs):
            # A CPU tensor's value would be uploaded into the trace as a constant.
            self._refuse(key, "a graph input is not on the tpu device")
            return self._deferred(self.device_forward, args, prev)
        _ops.set_mode(_DEFER)
        try:
            _ops.graph_capture_begin()
            try:
                out = self.device_forward(*args)
            except BaseException:
                _ops.graph_capture_abort()
                raise
            self._end_capture(key, args, inputs, out)
            return out
        finally:
            _ops.set_mode(prev)

    def _end_capture(self, key, args, inputs, out):
        by_id = {id(args[i]): i for i in inputs}
        tensors, plan = [], []
        for o in out:
            if isinstance(o, torch.Tensor):
                if id(o) in by_id:
                    plan.append(("arg", by_id[id(o)]))
                    continue
                if o.device.type != "tpu":
                    _ops.graph_capture_abort()
                    return self._refuse(key, "a graph output is not on the tpu device")
                plan.append(("launch", len(tensors)))
                tensors.append(o)
            else:
                plan.append(("value", o))
        graph, why = _ops.graph_capture_end([args[i] for i in inputs], tensors)
        if graph == 0:
            return self._refuse(key, why)
        counts["captures"] += 1
        self._remember(key, _Launch(graph, inputs, plan, isinstance(out, tuple)))

    def _refuse(self, key, why: str):
        counts["refused"] += 1
        self._remember(key, why)

    def _remember(self, key, entry):
        """Keeps `entry` for `key`, dropping the least recently called capture past
        MAX_CAPTURES (its runtime graph destroyed now, not when Python collects it)."""
        self.captures[key] = entry
        while len(self.captures) > MAX_CAPTURES:
            _, old = self.captures.popitem(last=False)
            counts["evicted"] += 1
            if isinstance(old, _Launch):
                old.release()


def _compiling_fullgraph() -> bool:
    """Whether the frame being compiled was asked for fullgraph=True. Dynamo passes backends
    only the graph and its example inputs, so this reads the translator that is compiling."""
    from torch._dynamo.symbolic_convert import InstructionTranslator
    try:
        tx = InstructionTranslator.current_tx()
    except AttributeError:  # no frame is being translated (the backend called directly)
        return False
    return bool(tx is not None and tx.one_graph)


def _graph_compiler(fullgraph: bool, which: str):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        if fullgraph:
            missing = fallback_ops(gm)
            if missing:
                raise RuntimeError(
                    f"torch.compile(backend=\"tpu\", fullgraph=True): the {which} graph calls "
                    f"{', '.join(missing)} with no tpu kernel: it would run on the CPU fallback, "
                    "outside the graph's device program; compile without fullgraph=True to "
                    "let it run there")
        return CapturedGraph(graph_order.reorder_for_fusion(gm))
    return compile_graph


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The Dynamo backend: AOTAutograd (functionalized forward and backward graphs, no
    decompositions beyond eager's own, so the graphs call the ops the device's kernels
    cover), each graph run as a `CapturedGraph`."""
    fullgraph = _compiling_fullgraph()
    return aot_autograd(
        fw_compiler=_graph_compiler(fullgraph, "forward"),
        bw_compiler=_graph_compiler(fullgraph, "backward"),
        inference_compiler=_graph_compiler(fullgraph, "inference"),
        # Copies into mutated inputs (an optimizer's parameters) stay in the graph, so they
        # are recorded in defer mode with the rest and fuse with what computes them.
        keep_inference_input_mutations=True,
    )(gm, example_inputs, **kwargs)
