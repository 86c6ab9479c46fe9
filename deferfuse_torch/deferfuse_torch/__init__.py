"""PyTorch device "tpu" backed by deferfuse.

Importing this package loads libdeferfuse and the device extension, renames PyTorch's
PrivateUse1 backend to "tpu" and registers the `torch.tpu` module, so plain PyTorch code runs on
deferfuse with `.to("tpu")`:

    import torch, deferfuse_torch
    x = torch.randn(4, 4).to("tpu")
    with deferfuse_torch.mode("defer"):
        y = (x * 2).relu().sum()
    print(y.item())
"""

import atexit
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
# DEFERFUSE_TORCH_EXT points at another build of the extension (e.g. a development build).
_EXT = os.environ.get("DEFERFUSE_TORCH_EXT", os.path.join(_HERE, "_C.so"))
if not os.path.exists(_EXT):
    raise ImportError(
        f"deferfuse_torch: the device extension {_EXT} is missing; build it with "
        "`deferfuse_torch/install.sh` (or `python deferfuse_torch/build_ext.py`)")
torch.ops.load_library(_EXT)

torch.utils.rename_privateuse1_backend("tpu")

from . import device as _device  # noqa: E402

torch._register_device_module("tpu", _device)
torch.utils.generate_methods_for_privateuse1_backend(
    for_tensor=True, for_module=True, for_storage=True)

from . import module_apply as _module_apply  # noqa: E402

# Tied weights stay tied across .to("tpu") / .to("cpu") (see module_apply).
_module_apply.install()

from . import compile_hooks as _compile_hooks  # noqa: E402

# torch.compile(model, backend="tpu"); plain torch.compile raises a message saying so.
_compile_hooks.install()

class _Probe(torch.autograd.Function):
    # An identity whose backward runs on the tpu device's queue and records no op: the probe
    # leaves no trace in the runtime (no op, no flush, nothing in a timeline).
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def _probe_backward():
    """One backward through the "tpu" device's autograd thread; returns when it ran. (A thread
    that uses the device runs its own backwards itself, see common.cpp, but a thread that only
    calls backward on another thread's tensors still goes through the device thread.)"""
    x = torch.empty((), device="tpu").requires_grad_()
    with torch.autograd.set_multithreading_enabled(True):
        torch.autograd.grad(_Probe.apply(x), x, grad_outputs=torch.empty((), device="tpu"))


def _check_autograd_engine():
    """PyTorch's autograd engine sizes its per-device queues once, at the first backward of the
    process, from the devices registered then: after a backward that ran before this import it
    has no queue for "tpu". A thread that used the device runs its tpu backwards itself and
    needs none (common.cpp), but a backward on the device thread (one inside
    `set_multithreading_enabled(True)`, or from a thread that never used the device) fails
    inside PyTorch with an internal assert ("device_ready_queues_"). A one-element backward
    there finds out, and says what to do instead of leaving the user that assert."""
    import warnings

    try:
        _probe_backward()
    except RuntimeError as e:
        if "device_ready_queues_" not in str(e):
            raise
        warnings.warn(
            "deferfuse_torch was imported after a backward pass already ran in this process: "
            "PyTorch's autograd engine has no queue for the \"tpu\" device. A thread that uses "
            "tpu tensors runs their backward itself, but one inside "
            "torch.autograd.set_multithreading_enabled(True), or from a thread that has not "
            "used the device, will fail with an internal assert. Import deferfuse_torch before "
            "the first .backward() / torch.autograd.grad call (for example at the top of the "
            "script).", RuntimeWarning, stacklevel=3)


_check_autograd_engine()


# The tensors of the exit probe below, kept alive here so that nothing the autograd thread lets
# go of is their last reference (a tensor's release there would take the GIL).
_EXIT_PROBE = []


def _settle_autograd_thread_at_exit():
    """A tpu backward that runs on PyTorch's device thread for "tpu" (one called inside
    `torch.autograd.set_multithreading_enabled(True)`, or from a thread that never used the
    device itself; see common.cpp) may drop a finished graph task's last reference after the
    caller's backward returned. That task holds Python objects
    (`torch.autograd.graph._engine_run_backward` stashes the caller's `contextvars` context in
    thread-local state, which the task captures; `autograd.grad` keeps its result tensors), so
    the release takes the GIL; a script that ends right then has the thread ask for it during
    interpreter shutdown, where Python ends the thread with pthread_exit, and the unwind through
    PyTorch's noexcept frames aborts the process ("terminate called without an active
    exception", exit code 134: ~1 run in 30 of an RNN-cell training loop on this 2-core
    machine). Any device backend's autograd thread has this race. Here, at exit (before
    shutdown), one more backward through the thread runs with the GIL released while it waits,
    so the thread finishes every earlier task, releases included; this one holds no Python
    object the thread could release (the engine is called directly, with nothing to return,
    and its tensors stay referenced from `_EXIT_PROBE`)."""
    try:
        x = torch.empty((), device="tpu").requires_grad_()
        y, g = x.view_as(x), torch.empty((), device="tpu")
        _EXIT_PROBE.extend([x, y, g])
        with torch.autograd.set_multithreading_enabled(True):
            torch.autograd.Variable._execution_engine.run_backward(
                (y,), (g,), False, False, (), True, True)
    except Exception:  # noqa: BLE001 -- at exit nothing may raise; a broken runtime reported its error already
        pass


atexit.register(_settle_autograd_thread_at_exit)


from .device import (  # noqa: E402,F401
    MODES, device_count, dump_pending, fallback_counts, get_mode, is_available,
    is_materialized, mode, release_cached_memory, reset_fallback_counts, set_mode,
    pipeline_ops, set_pipeline_ops, stats, synchronize, current_device, version)
from .observe import Report, explain, trace  # noqa: E402,F401
from .report import report  # noqa: E402,F401

__all__ = [
    "MODES", "current_device", "device_count", "dump_pending", "fallback_counts", "get_mode",
    "is_available", "is_materialized", "mode", "release_cached_memory", "reset_fallback_counts",
    "set_mode", "pipeline_ops", "set_pipeline_ops", "stats", "synchronize", "version", "trace", "explain", "Report", "report",
]
