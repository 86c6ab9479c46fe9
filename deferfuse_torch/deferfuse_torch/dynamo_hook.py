"""Registers the torch.compile integration (the "tpu" Dynamo backend, `compile_backend`, and
the Inductor refusal, `inductor_refusal`) when torch._dynamo is loaded.

Importing torch._dynamo takes seconds, and most users of the device never compile, so
`import deferfuse_torch` does not import it: if Dynamo is already loaded this registers at
once, otherwise a one-shot import hook registers right after torch._dynamo has been imported
(which torch.compile does on its first call), before any graph can be compiled."""

import importlib.abc
import importlib.machinery
import sys

_DYNAMO = "torch._dynamo"


def _register() -> None:
    from . import compile_backend, inductor_refusal
    compile_backend.register()
    inductor_refusal.register()


class _AfterDynamoImport(importlib.abc.MetaPathFinder):
    """Finds torch._dynamo with the ordinary path finder and runs `_register` once its
    module has executed."""

    def find_spec(self, name, path, target=None):
        if name != _DYNAMO:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register()

        spec.loader.exec_module = exec_then_register
        return spec


def install() -> None:
    if _DYNAMO in sys.modules:
        _register()
    elif not any(isinstance(f, _AfterDynamoImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterDynamoImport())
