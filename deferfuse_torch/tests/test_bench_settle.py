"""bench_settle.settle waits out another thread's busy spin, as torch's OpenMP workers spin
after a parallel region, before the benches time the next runner."""
import ctypes
import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_settle  # noqa: E402

pytestmark = pytest.mark.skipif(
    not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat"),
    reason="needs Linux's per-thread schedstat")

_libc = ctypes.CDLL(None)
_buf = ctypes.create_string_buffer(8 << 20)


def _busy_thread(seconds):
    """A thread that keeps a core busy for `seconds` outside the GIL (a Python loop would hold
    the GIL and stall the waiting thread instead), as an OpenMP worker spins."""
    def busy():
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            _libc.memset(_buf, 1, len(_buf))  # ctypes releases the GIL around the call

    t = threading.Thread(target=busy)
    t.start()
    return t


def test_settle_waits_until_a_busy_thread_stops():
    t = _busy_thread(0.1)
    waited = bench_settle.settle(limit_s=5.0)
    t.join()
    # Not the whole 0.1 s: a busy thread kept off the cores for 8 ms looks quiet.
    assert waited >= 0.05


def test_settle_gives_up_after_its_limit_when_a_thread_stays_busy():
    t = _busy_thread(1.5)
    waited = bench_settle.settle(limit_s=0.2)
    t.join()
    assert 0.2 <= waited < 1.2
