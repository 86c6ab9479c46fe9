"""Puts an optimizer-like graph in the order the runtime's planner fuses best.

The planner fuses consecutive elementwise ops over one shape. A compiled optimizer step comes
out of AOTAutograd "horizontal": each `_foreach_*` op does one step of the update for every
parameter, so consecutive ops alternate between parameters of different shapes and nothing
fuses; and the functionalized graph computes each new value into a fresh tensor, then copies
all of them into the parameters and states at the end, so each value is stored, then read
back. Here each foreach op becomes one op per tensor (as Inductor's own lowering of them
does), and the graph is reordered depth first from its results, so each parameter's update is
one chain of ops ending with its copies: one fused program per parameter that writes the
parameter in place.

The order keeps every dependency, keeps ops with side effects (copies into inputs, random
ops, anything FX calls impure) in their original order, and puts a copy into an input after
every op that reads that input."""

import operator

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

aten = torch.ops.aten

# Foreach op -> the op it applies to each tensor, and the name the per-tensor op gives a
# trailing scalar that the foreach op takes positionally (addcmul's `value` is keyword-only).
_PER_TENSOR = {
    aten._foreach_add.List: (aten.add.Tensor, None),
    aten._foreach_add.Scalar: (aten.add.Tensor, None),
    aten._foreach_add.ScalarList: (aten.add.Tensor, None),
    aten._foreach_add.Tensor: (aten.add.Tensor, None),
    aten._foreach_sub.List: (aten.sub.Tensor, None),
    aten._foreach_sub.Scalar: (aten.sub.Tensor, None),
    aten._foreach_sub.ScalarList: (aten.sub.Tensor, None),
    aten._foreach_mul.List: (aten.mul.Tensor, None),
    aten._foreach_mul.Scalar: (aten.mul.Tensor, None),
    aten._foreach_mul.ScalarList: (aten.mul.Tensor, None),
    aten._foreach_mul.Tensor: (aten.mul.Tensor, None),
    aten._foreach_div.List: (aten.div.Tensor, None),
    aten._foreach_div.Scalar: (aten.div.Tensor, None),
    aten._foreach_div.ScalarList: (aten.div.Tensor, None),
    aten._foreach_div.Tensor: (aten.div.Tensor, None),
    aten._foreach_pow.List: (aten.pow.Tensor_Tensor, None),
    aten._foreach_pow.Scalar: (aten.pow.Tensor_Scalar, None),
    aten._foreach_pow.ScalarAndTensor: (aten.pow.Scalar, None),
    aten._foreach_lerp.List: (aten.lerp.Tensor, None),
    aten._foreach_lerp.Scalar: (aten.lerp.Scalar, None),
    aten._foreach_addcmul.Scalar: (aten.addcmul.default, "value"),
    aten._foreach_addcmul.ScalarList: (aten.addcmul.default, "value"),
    aten._foreach_addcdiv.Scalar: (aten.addcdiv.default, "value"),
    aten._foreach_addcdiv.ScalarList: (aten.addcdiv.default, "value"),
    aten._foreach_maximum.List: (aten.maximum.default, None),
    aten._foreach_minimum.List: (aten.minimum.default, None),
    aten._foreach_neg.default: (aten.neg.default, None),
    aten._foreach_abs.default: (aten.abs.default, None),
    aten._foreach_sqrt.default: (aten.sqrt.default, None),
    aten._foreach_rsqrt.default: (aten.rsqrt.default, None),
    aten._foreach_exp.default: (aten.exp.default, None),
    aten._foreach_sign.default: (aten.sign.default, None),
    aten._foreach_reciprocal.default: (aten.reciprocal.default, None),
}


def _is_call(node, targets) -> bool:
    return node.op == "call_function" and node.target in targets


def _tensor_count(node):
    lists = [a for a in node.args if isinstance(a, (list, tuple))]
    return len(lists[0]) if lists else None


def split_foreach(graph: torch.fx.Graph) -> bool:
    """Replaces each foreach op of `_PER_TENSOR` whose results are only indexed by one op
    per tensor. Returns whether any was replaced."""
    changed = False
    for node in list(graph.nodes):
        if not _is_call(node, _PER_TENSOR):
            continue
        n = _tensor_count(node)
        users = list(node.users)
        if n is None or any(u.target is not operator.getitem for u in users):
            continue
        op, scalar_kwarg = _PER_TENSOR[node.target]

        def pick(a, i):
            return a[i] if isinstance(a, (list, tuple)) and len(a) == n else a

        parts = []
        with graph.inserting_before(node):
            for i in range(n):
                args = [pick(a, i) for a in node.args]
                kwargs = {k: pick(v, i) for k, v in node.kwargs.items()}
                if scalar_kwarg is not None and len(args) == 4:
                    kwargs[scalar_kwarg] = args.pop()
                parts.append(graph.call_function(op, tuple(args), kwargs))
                # Its example value: what later passes read (host_split, its devices).
                vals = node.meta.get("val")
                if isinstance(vals, (list, tuple)) and len(vals) == n:
                    parts[-1].meta["val"] = vals[i]
        for u in users:
            u.replace_all_uses_with(parts[u.args[1]])
            graph.erase_node(u)
        graph.erase_node(node)
        changed = True
    return changed


def _copies_into_inputs(graph):
    return [n for n in graph.nodes if _is_call(n, (aten.copy_.default,))
            and isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "placeholder"]


def _is_ordered(node, copies) -> bool:
    """Ops whose order among themselves is part of the result: random draws and writes, but
    not the copies into inputs (distinct inputs never alias in an AOTAutograd graph; each
    copy is ordered against the readers of its input instead)."""
    if node.op != "call_function" or node in copies:
        return False
    if isinstance(node.target, torch._ops.OpOverload) and (
            torch.Tag.nondeterministic_seeded in node.target.tags):
        return True
    return node.is_impure()


def _scalar_nodes(nodes):
    """Nodes computing one-element values from one-element inputs only (an optimizer's step
    counts and bias corrections)."""
    scalar = set()
    for n in nodes:
        if n.op == "placeholder":
            val = n.meta.get("val")
            # Sizes may be symbolic: asking "is it 1" must not add a guard.
            if not isinstance(val, torch.Tensor) or statically_known_true(val.numel() == 1):
                scalar.add(n)
        elif n.op == "call_function" and all(d in scalar for d in n.all_input_nodes):
            scalar.add(n)
    return scalar


def _descendants(node):
    seen, stack = set(), [node]
    while stack:
        for u in stack.pop().users:
            if u not in seen:
                seen.add(u)
                stack.append(u)
    return seen


def _is_view(node) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    schema = node.target._schema
    return bool(schema.returns) and schema.returns[0].alias_info is not None and not (
        schema.is_mutable)


def _readers(node):
    """The ops that read a value: its users, and the users of views of it."""
    readers, stack = set(), [node]
    while stack:
        for u in stack.pop().users:
            if u not in readers:
                readers.add(u)
                if _is_view(u):
                    stack.append(u)
    return readers


def _constraints(nodes, copies):
    """Per node, the nodes that must run before it beyond its inputs."""
    extra = {n: [] for n in nodes}
    prev = None
    for n in nodes:
        if _is_ordered(n, copies):
            if prev is not None:
                extra[n].append(prev)
            prev = n
    index = {n: i for i, n in enumerate(nodes)}
    for copy in copies:
        # Readers of the input before the copy stay before it, those after it stay after
        # (every extra dependency points back in the original order, so none makes a cycle).
        after_copy = _descendants(copy)
        for r in _readers(copy.args[0]):
            if r is copy or r in after_copy or r.op == "output":
                continue
            if index[r] < index[copy]:
                extra[copy].append(r)
            else:
                extra[r].append(copy)
    return extra


def _depth_first(nodes, deps, eager):
    """Post-order from the sinks (nodes nobody uses), then from any node not reached; a node
    of `eager` (a copy into an input) goes right after the last of its dependencies, so the
    value it copies is still in the fused program that computes it."""
    order, done = [], set()
    waiting = {c: set(deps(c)) for c in eager}
    waits_on = {}
    for c, ds in waiting.items():
        for d in ds:
            waits_on.setdefault(d, []).append(c)

    def emit(n):
        ready = [n]
        while ready:
            m = ready.pop()
            done.add(m)
            order.append(m)
            for c in waits_on.get(m, ()):
                waiting[c].discard(m)
                if not waiting[c] and c not in done:
                    ready.append(c)

    for root in [n for n in nodes if not n.users] + nodes:
        stack = [(root, False)]
        while stack:
            n, expanded = stack.pop()
            if n in done:
                continue
            if expanded:
                emit(n)
                continue
            stack.append((n, True))
            # Reversed, so the first input is visited (and placed) first.
            stack.extend((d, False) for d in reversed(deps(n)) if d not in done)
    return order


def chain_order(graph: torch.fx.Graph) -> None:
    """Reorders the graph depth first from its sinks (the output, the copies into inputs),
    one-element computations first (between a parameter's ops, a step-count op would cut its
    fused program), keeping the constraints of the module docstring."""
    nodes = list(graph.nodes)
    copies = _copies_into_inputs(graph)
    extra = _constraints(nodes, set(copies))
    order = _depth_first(nodes, lambda n: n.all_input_nodes + extra[n], copies)
    scalar = _scalar_nodes(nodes)
    first = set()
    for n in order:
        if n in scalar and all(d in first for d in n.all_input_nodes + extra[n]):
            first.add(n)
    output = next(n for n in nodes if n.op == "output")
    for n in [n for n in order if n in first] + [n for n in order if n not in first]:
        if n.op not in ("placeholder", "output"):
            output.prepend(n)


def reorder_for_fusion(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Splits foreach ops and reorders, for graphs that have foreach ops or copy into their
    inputs (optimizer steps); other graphs (a model's forward and backward) are left in
    the order eager code would run them."""
    split = split_foreach(gm.graph)
    if split or _copies_into_inputs(gm.graph):
        chain_order(gm.graph)
        gm.graph.lint()
        gm.recompile()
    return gm
