"""torch.tpu's streams and events, named and shaped like torch.cuda's.

A tpu stream is one of the runtime's streams (each runs its programs in order on a worker
thread); the current stream is per thread, as in PyTorch, and every op a thread records goes to
its current stream. Stream id 0 is the default stream; torch.tpu.Stream() hands out a pool of
eight runtime streams round robin (as CUDA's stream pool does), because each owns a thread.

One difference from CUDA, in the user's favour: when a stream reads a tensor another stream has
not produced yet, the runtime orders the two itself (a cross_stream sync point), so a missing
wait_stream gives the right values instead of a race. wait_stream/wait_event still order work
the runtime cannot see (e.g. a write another stream must not overtake)."""

import contextlib

import torch

from .memory import _check as _check_device


def _check(device):
    _check_device(device, "tpu streams")


class Stream(torch.Stream):
    """A tpu stream (torch.cuda.Stream's counterpart). `priority` is accepted and ignored: the
    runtime's streams have no priorities."""

    def __new__(cls, device=None, priority=0, **kwargs):
        if "stream_id" in kwargs:  # re-wrapping an existing stream (current_stream below)
            return super().__new__(cls, **kwargs)
        _check(device)
        return super().__new__(cls, device="tpu", priority=priority)

    def __repr__(self):
        return f"<torch.tpu.Stream device=tpu:0 stream_id={self.stream_id}>"


def _wrap(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device=None) -> Stream:
    """The calling thread's current tpu stream (the default stream unless one was set)."""
    _check(device)
    return _wrap(torch.accelerator.current_stream(torch.device("tpu", 0)))


def default_stream(device=None) -> Stream:
    """The runtime's default stream (stream id 0)."""
    _check(device)
    cur = torch.accelerator.current_stream(torch.device("tpu", 0))
    return Stream(stream_id=0, device_index=cur.device_index, device_type=cur.device_type)


def set_stream(stream: torch.Stream) -> None:
    """Makes `stream` the calling thread's current tpu stream."""
    if stream is None:
        return
    if stream.device.type != "tpu":
        raise ValueError(f"torch.tpu.set_stream: expected a tpu stream, got {stream}")
    torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(s):
    """Context manager: ops recorded inside go to stream `s` (None: no change)."""
    if s is None:
        yield
        return
    prev = current_stream()
    set_stream(s)
    try:
        yield
    finally:
        set_stream(prev)


class _TpuEventType(type):
    """isinstance(e, torch.tpu.Event) holds for every tpu torch.Event."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Event) and obj.device.type == "tpu"


class Event(metaclass=_TpuEventType):
    """A tpu event (torch.cuda.Event's counterpart): constructing one returns a plain
    torch.Event on the tpu device, because torch.Event's methods (elapsed_time, Stream.wait_event)
    accept only that exact type. With enable_timing=True, elapsed_time(end) gives the
    milliseconds between the two points as the stream's worker reached them (it waits for
    both). `blocking` is accepted; interprocess events are not supported."""

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        if interprocess:
            raise NotImplementedError("torch.tpu.Event: interprocess events are not supported")
        return torch.Event(device="tpu", enable_timing=enable_timing, blocking=blocking)
