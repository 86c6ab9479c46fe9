"""torch.tpu's memory queries, named and shaped like torch.cuda's.

"Allocated" is the bytes of tpu storages PyTorch holds now, counted by the extension where
storages are created and freed: the quantity torch.cuda.memory_allocated reports (bytes held by
tensors). The runtime's allocator keeps its own counters (dfuse_memory_info: buffers in use,
including a running program's intermediates and excluding a deferred tensor not yet
materialized, their peak, the cap); memory_stats() reports them as "device_bytes.*". "Reserved" adds the freed blocks the runtime keeps for reuse
(DfuseStats.host_cached_bytes), which empty_cache() returns to the system. The runtime's
buffers are host memory (the CPU backend), so mem_get_info() and total_memory describe the
host's memory."""

import collections
import os

import torch

_ops = torch.ops.deferfuse

_COUNTER_NAMES = [
    "allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed", "allocation.all.current", "allocation.all.peak",
    "allocation.all.allocated", "reserved_bytes.all.current", "reserved_bytes.all.peak",
]


def _check(device, what="tpu memory queries"):
    """Refuses a device other than tpu:0 (None means the current one), naming `what`."""
    if device is None:
        return
    dev = torch.device(device) if isinstance(device, (str, torch.device)) else \
        torch.device("tpu", device)
    if dev.type != "tpu" or dev.index not in (None, 0):
        raise ValueError(f"{what}: expected the tpu device (index 0), got {dev}")


def memory_stats(device=None) -> dict:
    """The counters as torch.cuda.memory_stats names them (the subset that has a meaning
    here: bytes and allocations of tensors, reserved bytes), plus the runtime allocator's own
    "device_bytes.all.{current,peak}" (buffers in use with a program's intermediates) and
    "device_bytes.limit" (the cap, 0 for none), in an OrderedDict sorted by name.
    active_bytes equals allocated_bytes: a tpu storage is active as long as it lives."""
    _check(device)
    stats = dict(zip(_COUNTER_NAMES, _ops.memory_counters()))
    live, peak, limit, _cached = _ops.runtime_memory()
    stats["device_bytes.all.current"] = live
    stats["device_bytes.all.peak"] = peak
    stats["device_bytes.limit"] = limit
    stats["active_bytes.all.current"] = stats["allocated_bytes.all.current"]
    stats["active_bytes.all.peak"] = stats["allocated_bytes.all.peak"]
    return collections.OrderedDict(sorted(stats.items()))


def memory_allocated(device=None) -> int:
    """Bytes of tpu tensors' storages alive now."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    """Peak of memory_allocated() since the start or the last reset_peak_memory_stats()."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None) -> int:
    """memory_allocated() plus the freed blocks the runtime holds for reuse."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    """Peak of memory_reserved(): the runtime keeps no peak of its block cache, so this is the
    largest reserved value seen by a memory query, and never less than the allocated peak."""
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None) -> None:
    _check(device)
    _ops.reset_peak_memory()


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    """Returns the runtime's cached free blocks to the system (release_cached_memory)."""
    _ops.release_cached_memory()


def _host_memory():
    """(available, total) bytes of the host's memory, from /proc/meminfo where it exists."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info["MemAvailable"], info["MemTotal"]
    except (OSError, KeyError, ValueError):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def mem_get_info(device=None):
    """(free, total) bytes: the host's available and total memory, where tpu buffers live."""
    _check(device)
    return _host_memory()


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Caps the runtime's buffers in use at `fraction` of the host's memory (where they live):
    an allocation past it raises torch.OutOfMemoryError naming the limit, as CUDA's does.
    DEFERFUSE_MEMORY_LIMIT (bytes, with an optional K/M/G suffix) sets a cap at start."""
    _check(device)
    if not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"set_per_process_memory_fraction: expected a fraction in [0, 1], "
                         f"got {fraction!r}")
    _ops.set_memory_limit(max(1, int(fraction * _host_memory()[1])))


def get_per_process_memory_fraction(device=None) -> float:
    """The cap set by set_per_process_memory_fraction (or DEFERFUSE_MEMORY_LIMIT) as a fraction
    of the host's memory; 1.0 when there is none."""
    _check(device)
    limit = _ops.runtime_memory()[2]
    return 1.0 if limit == 0 else limit / _host_memory()[1]
