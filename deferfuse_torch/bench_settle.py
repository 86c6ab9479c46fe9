"""Lets one benchmark runner's threads go quiet before the next runner's round is timed.

The benches time several runners in one process, in turn (CPU eager, torch.compile, tpu strict,
tpu defer), so that load from other processes hits them alike. But a runner leaves threads
behind that keep a core busy after its round: torch's OpenMP workers spin for ~10 ms after each
parallel region before they sleep. With more than one thread on a 2-core machine that spin took
a core from whichever runner came next (the small MLP's strict step: 1.45 ms alone, 2.3-2.9 ms
right after a CPU eager round), so each round is now preceded by `settle()` and one untimed step
of its own: the round then measures the runner as a program running it alone would see it.
"""
import os
import threading
import time

_TASKS = "/proc/self/task"


def _others_run_ns():
    """Nanoseconds every other thread of this process has run so far (Linux's schedstat)."""
    me = str(threading.get_native_id())
    total = 0
    for tid in os.listdir(_TASKS):
        if tid == me:
            continue
        try:
            with open(f"{_TASKS}/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile
            pass
    return total


def settle(quiet_s=0.008, limit_s=0.25):
    """Waits until no other thread of this process has run for `quiet_s`, at most `limit_s`;
    returns the seconds waited. A running thread's time is accounted at scheduler ticks (every
    4 ms at 250 Hz), so `quiet_s` spans two of them. Where /proc has no schedstat (not Linux)
    it returns at once."""
    if not os.path.exists(f"{_TASKS}/{threading.get_native_id()}/schedstat"):
        return 0.0
    start = time.perf_counter()
    last, since = _others_run_ns(), start
    while True:
        time.sleep(0.001)
        now, ran = time.perf_counter(), _others_run_ns()
        if now - start >= limit_s:
            return now - start
        if ran != last:
            last, since = ran, now
        elif now - since >= quiet_s:
            return now - start
