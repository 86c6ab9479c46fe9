"""The torch.compile backend "tpu": `torch.compile(model, backend="tpu")`.

Dynamo captures the Python code as FX graphs (guards, recompiles and graph breaks are Dynamo's
own); AOTAutograd turns each into a functionalized forward graph and, when gradients are
needed, a backward graph. Each of those graphs runs as one deferred trace: its ops are recorded
in defer mode whatever the caller's eager mode is, so the runtime plans the whole graph as one
flush (fusing across what eager code would have run op by op), and from the second call on the
stream's plan cache hands back the same plan, so a replay is not planned again.

The graphs' ops still reach the runtime one by one through PyTorch's dispatcher (the FX
graph's Python code calls each ATen op), which is what a replay costs beyond its programs.

This module imports torch._dynamo; the package registers the backend without importing it
(`compile_hooks`)."""

import torch
from torch._dynamo.backends.common import aot_autograd

from . import graph_order
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


class DeferredGraph:
    """One AOTAutograd graph, run as one deferred trace.

    AOTAutograd calls it with the boxed calling convention (one list of arguments). Debug
    mode is kept rather than
    forced to defer: it exists to make each op wait and report its own error, which is what
    someone debugging a compiled graph wants."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        # The generated code itself: GraphModule.__call__ adds nn.Module's hook handling.
        self.forward = gm.forward
        # An instance attribute: AOTAutograd wraps the backward in torch._dynamo.disable,
        # whose functools.wraps copies the instance's __dict__ (not class attributes).
        self._boxed_call = True

    def __call__(self, args: list):
        prev = _ops.get_mode()
        if prev == _DEFER or prev == _DEBUG:
            return self.forward(*args)
        _ops.set_mode(_DEFER)
        try:
            return self.forward(*args)
        finally:
            _ops.set_mode(prev)


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
        return DeferredGraph(graph_order.reorder_for_fusion(gm))
    return compile_graph


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The Dynamo backend: AOTAutograd (functionalized forward and backward graphs, no
    decompositions beyond eager's own, so the graphs call the ops the device's kernels
    cover), each graph run as a `DeferredGraph`."""
    fullgraph = _compiling_fullgraph()
    return aot_autograd(
        fw_compiler=_graph_compiler(fullgraph, "forward"),
        bw_compiler=_graph_compiler(fullgraph, "backward"),
        inference_compiler=_graph_compiler(fullgraph, "inference"),
        # Copies into mutated inputs (an optimizer's parameters) stay in the graph, so they
        # are recorded in defer mode with the rest and fuse with what computes them.
        keep_inference_input_mutations=True,
    )(gm, example_inputs, **kwargs)
