"""Hooks the device into torch.compile when PyTorch's compiler modules load: the Dynamo
backend "tpu" (`compile_backend`) and the Inductor refusal (`inductor_refusal`).

Importing torch._dynamo takes seconds and most users of the device never compile, so
`import deferfuse_torch` imports neither module. Each registration runs when its module is
loaded: at once if it already is, otherwise from a one-shot import hook right after the
module has executed (torch.compile imports both before it compiles anything). The callbacks
only call functions of the module just loaded: these modules load in the middle of each
other's imports (torch._inductor imports torch._dynamo, which imports parts of Inductor), so
importing anything more from a callback could meet a partially initialized module."""

import importlib.abc
import sys


def _tpu_backend(gm, example_inputs, **kwargs):
    """The backend as Dynamo registers it; the real one is imported on the first compile."""
    from .compile_backend import tpu_backend
    return tpu_backend(gm, example_inputs, **kwargs)


def _register_dynamo_backend(dynamo) -> None:
    dynamo.register_backend(_tpu_backend, name="tpu")


def _register_inductor_refusal(codegen_common) -> None:
    from .inductor_refusal import RefusingCodegen  # this package only: no torch import
    # Inductor fills in its built-in code generators only for device types nobody has
    # registered, so this holds whichever runs first.
    codegen_common.register_backend_for_device(
        "tpu", RefusingCodegen, RefusingCodegen, RefusingCodegen, RefusingCodegen)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds one module with the other finders and calls `callback(module)` once the module
    has executed; then leaves sys.meta_path."""

    def __init__(self, name, callback):
        self.name, self.callback = name, callback

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_call(module):
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_call
        return spec


def _after_import(name, callback) -> None:
    if name in sys.modules:
        callback(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))


_installed = False


def install() -> None:
    global _installed
    if not _installed:
        _installed = True
        _after_import("torch._dynamo", _register_dynamo_backend)
        _after_import("torch._inductor.codegen.common", _register_inductor_refusal)
