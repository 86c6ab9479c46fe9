"""Tied parameters and shared buffers survive device and dtype conversions of modules.

`nn.Module._apply` (behind `.to()`, `.tpu()`, `.cpu()`, `.half()`...) keeps a Parameter object
only when the converted tensor can be shallow-copied into it (`param.data = new`), which
PyTorch allows between CPU and CUDA but not between CPU and a PrivateUse1 device. Otherwise it
wraps the result in a new `Parameter` per module slot, so a weight tied between two modules
(an embedding and its output projection) becomes two Parameters, a Parameter subclass becomes a
plain Parameter and attributes set on the Parameter are lost; a buffer shared by two modules is
converted twice. CPU<->CUDA users never see this, so models tie weights with `a.weight =
b.weight` and expect the tie to hold after `.to(device)`.

The wrapper below runs the original `_apply` once per top-level call with a conversion function
that converts each tensor object once (so shared tensors convert to one result), then puts one
Parameter in every slot that held one Parameter before, rebuilt with the original's subclass,
attributes, requires_grad and grad. It changes nothing when the conversion kept the objects
(the `.data =` path): the rebuild happens only for slots whose Parameter was replaced.
"""

import threading

import torch
from torch import nn

_original_apply = nn.Module._apply
_state = threading.local()


def _slots(root):
    """(module, "param" | "buffer", name, tensor) for every tensor slot under root; a module
    reachable by several paths is listed once (its dicts are one object)."""
    out = []
    for m in root.modules():
        for k, p in m._parameters.items():
            if p is not None:
                out.append((m, "param", k, p))
        for k, b in m._buffers.items():
            if b is not None:
                out.append((m, "buffer", k, b))
    return out


def _memoized(fn, memo):
    """fn converting each tensor object once; the memo keeps the inputs alive so their ids
    stay unique for the whole call."""
    def convert(t):
        hit = memo.get(id(t))
        if hit is None:
            hit = (t, fn(t))
            memo[id(t)] = hit
        return hit[1]
    return convert


def _like(old, new):
    """new (the Parameter _apply made) as an instance of old's class with old's attributes."""
    if type(new) is type(old) and not old.__dict__:
        return new
    p = torch.Tensor._make_subclass(type(old), new.detach(), new.requires_grad)
    p.__dict__.update(old.__dict__)
    if new.grad is not None:
        p.grad = new.grad
    return p


def _retie(slots):
    """Every slot that held one Parameter before holds one Parameter again."""
    first = {}
    for m, kind, k, old in slots:
        if kind != "param":
            continue
        new = m._parameters[k]
        if new is old:
            continue
        if id(old) not in first:
            first[id(old)] = _like(old, new)
        m._parameters[k] = first[id(old)]


def _apply(self, fn, recurse=True):
    if getattr(_state, "active", False):
        return _original_apply(self, fn, recurse)
    slots = _slots(self) if recurse else [
        (self, kind, k, t) for kind, d in (("param", self._parameters), ("buffer", self._buffers))
        for k, t in d.items() if t is not None]
    memo = {}
    _state.active = True
    try:
        result = _original_apply(self, _memoized(fn, memo), recurse)
    finally:
        _state.active = False
    _retie(slots)
    return result


def install():
    """Replaces nn.Module._apply (idempotent)."""
    if nn.Module._apply is not _apply:
        nn.Module._apply = _apply
