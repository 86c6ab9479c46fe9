"""Parameters keep their identity, ties and shared buffers through device and dtype conversions.

`nn.Module._apply` (behind `.to()`, `.tpu()`, `.cpu()`, `.half()`...) keeps a Parameter object
only when the converted tensor can be shallow-copied into it (`param.data = new`), which
PyTorch allows between CPU and CUDA but not with a PrivateUse1 device (not even tpu to tpu).
Otherwise it wraps the result in a new `Parameter` per module slot, so an optimizer built before
`model.to("tpu")` would keep stepping the old CPU Parameters (which never get a gradient: the
model trains nothing, with no error), a weight tied between two modules (an embedding and its
output projection) would become two Parameters, a Parameter subclass a plain Parameter, and
attributes set on the Parameter would be lost; a buffer shared by two modules would be
converted twice. CPU<->CUDA users never see this, so code does all of these.

The wrapper below runs the original `_apply` once per top-level call with a conversion function
that converts each tensor object once (so shared tensors convert to one result), then swaps
each converted Parameter's contents into the Parameter object the slot held before
(`torch.utils.swap_tensors`' swap, as `torch.__future__.set_swap_module_params_on_conversion(True)`
does, also where a graph or a view holds the old tensor), keeping its subclass, attributes,
requires_grad and grad, and puts that object back in every slot that held it. Where the swap
cannot be made (a weak reference to the Parameter), the slot gets a new Parameter with a
warning saying what that means. It
changes nothing when the conversion kept the objects (the `.data =` path, or PyTorch's own swap
when that future flag is on), and it leaves new objects where the user asked for them
(`torch.__future__.set_overwrite_module_params_on_conversion(True)`).
"""

import copyreg
import threading
import warnings
import weakref

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


def _poisoned(grad_outputs):
    raise RuntimeError(
        "tpu: this backward reaches a Parameter that .to()/.half() moved after the forward that "
        "recorded it (the graph holds its old tensor); run the backward before converting the "
        "module, or run the forward again after it")


def _swap(old, like):
    """torch.utils.swap_tensors(old, like), also where other references hold old's tensor (a
    graph that saved it for its backward, a view of it): they keep the old tensor, as they do
    across a `.data =` conversion between CPU and CUDA. swap_tensors refuses those (they might
    expect old's object to hold it), and otherwise does the same; a backward that reaches old's
    gradient accumulator raises, as swap_tensors makes it."""
    if weakref.getweakrefs(old) or weakref.getweakrefs(like):
        raise RuntimeError("a weak reference holds it")
    slots = set(copyreg._slotnames(old.__class__))
    if slots != set(copyreg._slotnames(like.__class__)):
        raise RuntimeError("its class has other slots")
    if old.requires_grad and old.is_leaf and old._use_count() > 1:
        torch.autograd.graph.get_gradient_edge(old).node.register_prehook(_poisoned)
    for name in ("__class__", "__dict__"):
        a, b = getattr(old, name), getattr(like, name)
        setattr(old, name, b)
        setattr(like, name, a)
    for name in slots:
        a, b = getattr(old, name, _MISSING), getattr(like, name, _MISSING)
        for t, v in ((old, b), (like, a)):
            if v is _MISSING:
                if hasattr(t, name):
                    delattr(t, name)
            else:
                setattr(t, name, v)
    torch._C._swap_tensor_impl(old, like)


_MISSING = object()


def _kept(old, new, where):
    """old, holding new's converted tensor (new rebuilt as old's class with old's attributes);
    new's rebuild where the swap cannot be made."""
    like = _like(old, new)
    if torch.__future__.get_overwrite_module_params_on_conversion():
        return like
    try:
        _swap(old, like)
    except RuntimeError as e:
        warnings.warn(
            f"tpu: {where} became a new Parameter object in this conversion (it could not be "
            f"swapped in place: {e}); an optimizer or any other code holding the old one keeps "
            "the old tensor, so build the optimizer after the conversion", stacklevel=4)
        return like
    return old


def _retie(slots):
    """Every slot that held one Parameter before holds that Parameter object again, now holding
    the converted tensor."""
    first = {}
    for m, kind, k, old in slots:
        if kind != "param":
            continue
        new = m._parameters[k]
        if new is old:
            continue
        if id(old) not in first:
            first[id(old)] = _kept(old, new, f"{type(m).__name__}.{k}")
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
    # An RNN (nn.LSTM/GRU/RNN) below the top module has just taken weak references to its
    # converted Parameters (RNNBase._apply -> _init_flat_weights), which would make the swap
    # refuse them: drop those, and let each RNN take them again, of the kept objects.
    rnns = list({id(m): m for m, *_ in slots if isinstance(m, nn.RNNBase)}.values())
    for m in rnns:
        m._flat_weight_refs = []
    _retie(slots)
    for m in rnns:
        m._init_flat_weights()
    return result


def install():
    """Replaces nn.Module._apply (idempotent)."""
    if nn.Module._apply is not _apply:
        nn.Module._apply = _apply
