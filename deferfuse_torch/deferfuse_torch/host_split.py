"""Splits a compiled graph into the part that computes on CPU tensors and the device part.

PyTorch keeps a default optimizer's step counts (and a tensor learning rate) as CPU tensors,
so the graph of a compiled `opt.step` increments the step counts and computes the bias
corrections on CPU 0-dim tensors, and the device ops read those values. Replaying the device
ops as a captured graph would bake the values of the capture into every launch. So the graph
is cut in two: the host part (every op whose inputs and results are CPU tensors: the step
count increments and their copies back, the bias corrections, the learning rate arithmetic)
runs op by op in Python at every call, and the device part takes the CPU values it reads as
device inputs, uploaded each call, so a captured device part replays with the new values.

The 0-dim values are uploaded packed, one 1-D tensor per dtype (one host copy per call instead
of one per value, with no op recorded), and the device part selects each value from it: a device op then reads a
0-dim device tensor where it read a 0-dim CPU tensor, which has the same type promotion and
gives the same values (`tests/test_compile_host_split.py`).

A graph is not split (and `split` returns None) when it has no CPU tensors, or when a CPU
tensor depends on a device value (a host read: the graph cannot be replayed then anyway)."""

import operator

import torch

aten = torch.ops.aten


def _val_devices(val):
    """The device types of the tensors in a node's example value (a tensor, or a list of
    them), or None for a value with no tensor (a SymInt, None)."""
    vals = val if isinstance(val, (list, tuple)) else [val]
    devices = {v.device.type for v in vals if isinstance(v, torch.Tensor)}
    return devices or None


def _is_host(node, host) -> bool:
    """Whether a node computes on CPU tensors only: its value is CPU tensors and every node it
    reads is a host node or `_shared`."""
    if node.op not in ("placeholder", "call_function"):
        return False
    if _val_devices(node.meta.get("val")) != {"cpu"}:
        return False
    if node.op == "call_function" and node.target is not operator.getitem and not isinstance(
            node.target, torch._ops.OpOverload):
        return False
    return all(d in host or _shared(d) for d in node.all_input_nodes)


def _shared(node) -> bool:
    """Nodes both parts have: constants of the graph module (the same tensor at every call)
    and arguments with no tensor (sizes)."""
    return node.op == "get_attr" or (
        node.op == "placeholder" and _val_devices(node.meta.get("val")) is None)


def _copy_constants(gm, g, env):
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            env[n] = g.node_copy(n)


class Split:
    """A graph cut into its host part and its device part.

    `host(*args)` runs the host ops on the graph's arguments and returns the values the
    device part reads and the graph's host outputs; `device_args(args, host_values)` makes
    the device part's arguments (the graph's device arguments and the uploaded values);
    `outputs(device_out, host_values)` puts the graph's outputs back in order."""

    def __init__(self, host: torch.fx.GraphModule, device: torch.fx.GraphModule, kept: list,
                 packs: list, singles: list, host_outputs: dict, as_tuple: bool):
        self.host = host.forward
        self.device = device
        self._kept = kept
        self._packs = packs
        self._singles = singles
        self._host_outputs = host_outputs
        self._as_tuple = as_tuple

    def device_args(self, args, host_values) -> list:
        # graph_upload copies the values into a new device buffer now: no op is recorded
        # and no copy program runs before the launch (as `.to("tpu")` would).
        upload = torch.ops.deferfuse.graph_upload
        out = [args[i] for i in self._kept]
        for idx in self._packs:
            out.append(upload(torch.stack([host_values[i] for i in idx])))
        out.extend(upload(host_values[i]) for i in self._singles)
        return out

    def outputs(self, device_out, host_values):
        out = list(device_out)
        for pos, i in self._host_outputs.items():
            out[pos] = host_values[i]
        return tuple(out) if self._as_tuple else out


def split(gm: torch.fx.GraphModule):
    """The graph's `Split`, or None when it has no host part or cannot be cut (see the module
    doc)."""
    nodes = list(gm.graph.nodes)
    host = set()
    for n in nodes:
        if _is_host(n, host):
            host.add(n)
    if not host:
        return None
    output = next(n for n in nodes if n.op == "output")
    device_nodes = [n for n in nodes if n.op == "call_function" and n not in host]
    # A CPU value computed from a device value is a host read; leave such a graph whole.
    if any(_val_devices(n.meta.get("val")) == {"cpu"} for n in device_nodes):
        return None
    feeds = []
    for n in device_nodes:
        for d in n.all_input_nodes:
            if d in host and d not in feeds:
                feeds.append(d)
    results = output.args[0]
    as_tuple = isinstance(results, tuple)
    results = list(results) if isinstance(results, (list, tuple)) else [results]
    host_results = {pos: r for pos, r in enumerate(results) if r in host}
    if not any((_val_devices(n.meta.get("val")) or set()) - {"cpu"} for n in nodes):
        return None  # a CPU graph: nothing to capture

    host_gm, host_index = _host_module(gm, nodes, host, feeds, list(host_results.values()))
    pack_groups, singles = _groups(feeds)
    device_gm, kept = _device_module(gm, nodes, host, feeds, pack_groups, singles, results,
                                     host_results, as_tuple)
    return Split(host_gm, device_gm, kept,
                 [[host_index[feeds[i]] for i in g] for g in pack_groups],
                 [host_index[feeds[i]] for i in singles],
                 {pos: host_index[r] for pos, r in host_results.items()}, as_tuple)


def _mutated(nodes, host):
    """Host placeholders a host op copies into (an optimizer's step counts)."""
    return {n.args[0] for n in nodes if n in host and n.op == "call_function"
            and n.target is aten.copy_.default and n.args[0].op == "placeholder"}


def _host_module(gm, nodes, host, feeds, host_results):
    """The host ops as a graph of all the arguments, returning the feeds and host results
    (each once). A placeholder read by the device part that the host part also copies into
    is cloned first: the device ops read it as it was when the graph was called."""
    g = torch.fx.Graph()
    env = {}
    for n in nodes:
        if n.op == "placeholder":
            env[n] = g.placeholder(n.name)
            env[n].meta = dict(n.meta)
    _copy_constants(gm, g, env)
    # A functionalized graph's reads of an input mean its value at the call (reads after a
    # copy into it read the copied value's node instead).
    at_call = {n: g.call_function(aten.clone.default, (env[n],))
               for n in _mutated(nodes, host) if n in feeds}
    for n in nodes:
        if n.op == "call_function" and n in host:
            env[n] = g.node_copy(n, lambda d: env[d])
    wanted = list(dict.fromkeys(list(feeds) + list(host_results)))
    g.output(tuple(at_call.get(n, env[n]) for n in wanted))
    return torch.fx.GraphModule(gm, g), {n: i for i, n in enumerate(wanted)}


def _groups(feeds):
    """Feeds packed into one tensor per dtype (0-dim ones, by index) and the others."""
    packs, singles = {}, []
    for i, f in enumerate(feeds):
        val = f.meta["val"]
        if val.dim() == 0:
            packs.setdefault(val.dtype, []).append(i)
        else:
            singles.append(i)
    return list(packs.values()), singles


def _device_module(gm, nodes, host, feeds, pack_groups, singles, results, host_results,
                   as_tuple):
    """The device ops as a graph of the device arguments, then one packed tensor per group of
    0-dim feeds, then the other feeds; the host results' places in its output hold None.
    Returns it and the indices of the graph arguments it keeps."""
    g = torch.fx.Graph()
    env, kept = {}, []
    for i, n in enumerate(x for x in nodes if x.op == "placeholder"):
        if n not in host:
            env[n] = g.placeholder(n.name)
            env[n].meta = dict(n.meta)
            kept.append(i)
    for k, group in enumerate(pack_groups):
        packed = g.placeholder(f"host_scalars_{k}")
        for j, i in enumerate(group):
            env[feeds[i]] = g.call_function(aten.select.int, (packed, 0, j))
    for i in singles:
        env[feeds[i]] = g.placeholder(f"host_value_{i}")
    _copy_constants(gm, g, env)
    for n in nodes:
        if n.op == "call_function" and n not in host:
            env[n] = g.node_copy(n, lambda d: env[d])
    out = [None if pos in host_results else env[r] if isinstance(r, torch.fx.Node) else r
           for pos, r in enumerate(results)]
    g.output(tuple(out) if as_tuple else out)
    return torch.fx.GraphModule(gm, g), kept
