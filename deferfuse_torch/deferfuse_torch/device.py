"""The `torch.tpu` device module: device queries, synchronization, eager modes, runtime
counters, the pending-computation dump, the CPU-fallback counters, memory queries and what
torch.autocast needs."""

import collections
import contextlib
import os

import torch

from .streams import (  # noqa: F401
    Event, Stream, current_stream, default_stream, set_stream, stream)
from .memory import (  # noqa: F401
    empty_cache, get_per_process_memory_fraction, max_memory_allocated, max_memory_reserved,
    mem_get_info, memory_allocated, memory_reserved, memory_stats, reset_max_memory_allocated,
    reset_peak_memory_stats, set_per_process_memory_fraction)

_ops = torch.ops.deferfuse

# Eager modes by name; the numbers are deferfuse's DfuseMode values.
MODES = {"strict": 0, "debug": 1, "defer": 2}
_MODE_NAMES = {v: k for k, v in MODES.items()}

# DfuseStats fields in the order the extension returns them.
_STAT_FIELDS = [
    "ops_recorded", "programs_compiled", "programs_run", "cache_hits", "cache_misses",
    "cache_evictions", "compile_ns", "bytes_allocated", "dead_nodes", "unmaterialized",
    "plans_reused", "host_cache_hits", "host_cache_misses", "host_cached_bytes",
    "pipelined_flushes",
]
_CUT_REASONS = ["unfusable", "shape", "layout", "reduction", "max_ops"]
_SYNC_REASONS = ["host_read", "synchronize", "event", "max_pending", "cross_stream",
                 "mode_switch", "memory_bound", "data_dependent_size"]


def is_available() -> bool:
    return True


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


class device:
    """`with torch.tpu.device(0):` (PyTorch's storage and serialization code uses it); there
    is one tpu device, so it only checks the index."""

    def __init__(self, dev):
        if isinstance(dev, (str, torch.device)):
            d = torch.device(dev)
            # As CUDA's: another device type is an error, not the current device.
            if d.type not in ("tpu", "privateuseone"):
                raise ValueError(f"Expected a tpu device, but got: {d}")
            idx = d.index
        else:
            idx = dev
        if idx not in (None, -1, 0):
            raise RuntimeError(f"tpu: device index {idx} does not exist (there is one tpu "
                               "device, index 0)")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def set_device(dev) -> None:
    device(dev)


def _is_in_bad_fork() -> bool:
    return False


# Read as an attribute (not through is_initialized()) by torch.utils.checkpoint: without it,
# a checkpointed block's recomputation did not restore the tpu generator and drew a
# different dropout mask than its forward.
_initialized = True


def is_initialized() -> bool:
    """The runtime is created on first use; the device is always ready for it."""
    return True


def _lazy_init() -> None:
    pass


def get_device_name(device=None) -> str:
    _check_device(device)
    return _DEVICE_NAME


def get_device_capability(device=None):
    """CUDA's compute capability has no counterpart; (0, 0) as for devices without one."""
    _check_device(device)
    return (0, 0)


_DeviceProperties = collections.namedtuple(
    "_DeviceProperties", ["name", "total_memory", "multi_processor_count"])


def get_device_properties(device=None):
    """name, total_memory (the host's memory, where tpu buffers live) and
    multi_processor_count (the host's CPU count, the backend's threads' ceiling)."""
    _check_device(device)
    from .memory import _host_memory
    return _DeviceProperties(_DEVICE_NAME, _host_memory()[1], os.cpu_count() or 1)


_DEVICE_NAME = "deferfuse"


def _check_device(dev) -> None:
    """Raises for any device but tpu:0 (None means the current device)."""
    if dev is None:
        return
    device(dev)


def get_amp_supported_dtype():
    """The autocast dtypes torch.autocast(device_type="tpu") accepts."""
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def manual_seed_all(seed: int) -> None:
    """Seeds the tpu generator (one device, so the same as manual_seed); torch.manual_seed
    calls it too."""
    seed = int(seed)
    # torch accepts seeds up to 2**64 - 1; the op takes them as the same 64 bits, signed.
    _ops.manual_seed(seed - (1 << 64) if seed >= (1 << 63) else seed)


def manual_seed(seed: int) -> None:
    manual_seed_all(seed)


def seed() -> None:
    """Seeds the tpu generator with a non-deterministic number."""
    _ops.seed()


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    """The seed the tpu generator was last seeded with (0 to 2**64 - 1, as torch's)."""
    seed = _ops.initial_seed()
    return seed + (1 << 64) if seed < 0 else seed


def get_rng_state(device="tpu") -> torch.Tensor:
    """The tpu generator's state (16 bytes: seed, offset) as a CPU uint8 tensor."""
    _check_device(device)
    return _ops.get_rng_state()


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    _check_device(device)
    _ops.set_rng_state(new_state)


def get_rng_state_all() -> list:
    return [get_rng_state()]


def set_rng_state_all(new_states) -> None:
    for s in new_states:
        set_rng_state(s)


def synchronize(device=None) -> None:
    """Runs all pending work and waits for it; raises the first error of that work that
    belongs to the stream (out of memory). An op's error about its own values (an index out
    of range) stays with the tensor it made, and is raised where that tensor is next used."""
    _check_device(device)
    _ops.synchronize()


def get_mode() -> str:
    return _MODE_NAMES[_ops.get_mode()]


def set_mode(name: str) -> str:
    """Sets the eager mode for every thread (autograd's backward thread included); returns the
    previous mode's name."""
    if name not in MODES:
        raise ValueError(f"unknown mode {name!r}; expected one of {sorted(MODES)}")
    return _MODE_NAMES[_ops.set_mode(MODES[name])]


@contextlib.contextmanager
def mode(name: str):
    """`with deferfuse_torch.mode("defer"): ...` runs the block in that eager mode."""
    prev = set_mode(name)
    try:
        yield
    finally:
        set_mode(prev)


def set_pipeline_ops(ops: int) -> int:
    """Sets after how many deferred ops a stream starts running them while Python records on
    (defer mode's pipelining, at the next matmul or kernel op; 0: only at sync points) and
    returns the previous value. The default is 48, or DEFERFUSE_PIPELINE_OPS when set at
    start-up."""
    if isinstance(ops, bool) or not isinstance(ops, int) or ops < 0:
        raise ValueError(f"set_pipeline_ops expects an int >= 0 (0 turns pipelining off), "
                         f"got {ops!r}")
    return _ops.set_pipeline_ops(ops)


@contextlib.contextmanager
def pipeline_ops(ops):
    """`set_pipeline_ops(ops)` for a `with` block, the previous value restored after it (even
    when the block raises); `None` leaves the setting as it is."""
    if ops is None:
        yield
        return
    prev = set_pipeline_ops(ops)
    try:
        yield
    finally:
        set_pipeline_ops(prev)


def stats() -> dict:
    """The runtime's counters: ops, programs, cache, fusion, cuts and sync points by reason."""
    v = list(_ops.stats())
    n = len(_STAT_FIELDS)
    out = dict(zip(_STAT_FIELDS, v[:n]))
    out["cuts"] = dict(zip(_CUT_REASONS, v[n:n + len(_CUT_REASONS)]))
    out["sync_points"] = dict(zip(_SYNC_REASONS, v[n + len(_CUT_REASONS):]))
    return out


def is_materialized(t: torch.Tensor) -> bool:
    """Whether the tensor's buffer holds its values (False while its op is still deferred or
    running)."""
    return bool(_ops.is_materialized(t))


def dump_pending() -> str:
    """The deferred ops recorded and not yet run, one per line ("" when none)."""
    return _ops.dump_pending()


def fallback_counts() -> dict:
    """How many times each ATen op ran through the CPU fallback (ops with no tpu kernel)."""
    out = {}
    for line in _ops.fallback_counts().splitlines():
        name, count = line.rsplit(" ", 1)
        out[name] = int(count)
    return out


def reset_fallback_counts() -> None:
    _ops.reset_fallback_counts()


def release_cached_memory() -> int:
    """Returns the runtime's cached free buffers to the system; the bytes freed."""
    return _ops.release_cached_memory()


def version() -> str:
    return _ops.version()
