"""Plain `torch.compile(model)` on tpu tensors: a clear error instead of Inductor's JAX one.

Inductor (torch.compile's default backend) picks a code generator by device type, and PyTorch
registers its own one for the type "tpu": Pallas, which needs JAX and targets Google's TPUs,
not this device. Left alone, compiling a graph of tpu tensors fails deep inside Inductor with
`ModuleNotFoundError: No module named 'jax'`.

Inductor's supported hook for an out-of-tree device, `register_backend_for_device`, can only
replace the code generator: Inductor still lowers the graph to its loop-level IR and asks the
device for kernels over it (the Pallas backend is thousands of lines of that), and nothing in
Dynamo or Inductor lets a device hand the whole graph to another Dynamo backend. So this
package registers (`compile_hooks`), through that hook, a code generator that refuses at once
with a message saying to pass `backend="tpu"` (`compile_backend`), which runs the graph on
deferfuse. CPU and other devices' graphs are untouched: the registration is for the device
type "tpu" only."""

MESSAGE = (
    "torch.compile: Inductor, the default backend, has no code generator for the deferfuse "
    "device \"tpu\" (PyTorch's own \"tpu\" target is Pallas/JAX for Google TPUs); compile "
    "with the device's backend instead: torch.compile(model, backend=\"tpu\")")


class RefusingCodegen:
    """Stands in for both Inductor's Scheduling and its wrapper code generator for "tpu":
    Inductor constructs one of them (or calls `create`) before it generates any code for
    the device, and that raises."""

    # Read on the class before compiling: nothing of a refused graph goes to Inductor's cache.
    supports_caching = False

    def __init__(self, *args, **kwargs):
        raise RuntimeError(MESSAGE)

    @classmethod
    def create(cls, *args, **kwargs):
        raise RuntimeError(MESSAGE)
