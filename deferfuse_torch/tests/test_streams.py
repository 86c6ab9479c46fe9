"""Streams and events (issue: the device keeps PyTorch's contract, item 6): torch.tpu.Stream,
torch.tpu.stream(s), current_stream, default_stream, wait_stream, Tensor.record_stream and
torch.tpu.Event(enable_timing=True).elapsed_time, on the runtime's streams and events, with
cross-stream order kept in strict, debug and defer."""
import threading

import pytest
import torch

import deferfuse_torch
from conftest import check


def test_the_current_stream_is_the_default_stream_until_one_is_set():
    s = torch.tpu.current_stream()
    assert isinstance(s, torch.tpu.Stream)
    assert s.stream_id == 0 and s.device == torch.device("tpu", 0)
    assert torch.tpu.default_stream() == s


def test_a_new_stream_is_a_tpu_stream_other_than_the_default():
    s = torch.tpu.Stream()
    assert isinstance(s, torch.Stream) and s.device.type == "tpu"
    assert s.stream_id != 0
    assert s != torch.tpu.default_stream()


def test_the_stream_context_sets_and_restores_the_current_stream():
    s = torch.tpu.Stream()
    with torch.tpu.stream(s):
        assert torch.tpu.current_stream() == s
    assert torch.tpu.current_stream() == torch.tpu.default_stream()


def test_the_current_stream_is_per_thread():
    s = torch.tpu.Stream()
    seen = []
    with torch.tpu.stream(s):
        t = threading.Thread(target=lambda: seen.append(torch.tpu.current_stream().stream_id))
        t.start()
        t.join()
    assert seen == [0]


def test_work_on_a_side_stream_is_waited_for_by_wait_stream(mode):
    x = torch.randn(256, 256)
    d = x.to("tpu")
    side = torch.tpu.Stream()
    side.wait_stream(torch.tpu.current_stream())
    with torch.tpu.stream(side):
        y = (d @ d).relu() + 1
    torch.tpu.current_stream().wait_stream(side)
    check(y * 2, ((x @ x).relu() + 1) * 2, atol=1e-3, rtol=1e-4)


def test_a_read_of_another_streams_pending_result_is_ordered_by_the_runtime(mode):
    # No wait_stream: on CUDA a race; here the runtime orders the read after the producer.
    x = torch.randn(64, 64)
    side = torch.tpu.Stream()
    with torch.tpu.stream(side):
        y = x.to("tpu").exp() * 3
    check(y.sum(0), (x.exp() * 3).sum(0), atol=1e-3, rtol=1e-5)


def test_in_place_writes_on_two_streams_keep_the_order_wait_event_gives(mode):
    a = torch.zeros(1000, device="tpu")
    s1, s2 = torch.tpu.Stream(), torch.tpu.Stream()
    s1.wait_stream(torch.tpu.current_stream())
    with torch.tpu.stream(s1):
        a.add_(1)
        done = s1.record_event()
    s2.wait_event(done)
    with torch.tpu.stream(s2):
        a.mul_(5)
    torch.tpu.current_stream().wait_stream(s2)
    check(a, torch.full((1000,), 5.0))


def test_a_tensor_freed_after_record_stream_keeps_its_value_for_the_other_stream(mode):
    side = torch.tpu.Stream()
    x = torch.randn(512)
    d = x.to("tpu")
    with torch.tpu.stream(side):
        y = d * 2
    d.record_stream(side)
    del d
    z = torch.zeros(512, device="tpu")  # may reuse freed memory; must not clobber y's input
    torch.tpu.current_stream().wait_stream(side)
    check(y + z, x * 2)


def test_record_stream_refuses_a_stream_of_another_device():
    d = torch.ones(4, device="tpu")
    with pytest.raises(RuntimeError, match="expected a tpu stream"):
        d.record_stream(torch.Stream(device="cpu"))


def test_stream_synchronize_and_query_finish_the_streams_work(mode):
    s = torch.tpu.Stream()
    with torch.tpu.stream(s):
        y = torch.ones(1000, device="tpu").cumsum(0)
    s.synchronize()
    assert s.query()
    assert deferfuse_torch.is_materialized(y)


def test_timing_events_give_the_milliseconds_between_them(mode):
    start = torch.tpu.Event(enable_timing=True)
    end = torch.tpu.Event(enable_timing=True)
    x = torch.randn(512, 512, device="tpu")
    start.record()
    for _ in range(5):
        x = (x @ x).tanh()
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    assert isinstance(ms, float) and ms > 0.0
    assert isinstance(start, torch.tpu.Event) and not isinstance(torch.Event("cpu"), torch.tpu.Event)
    assert end.query()


def test_elapsed_time_needs_events_created_with_timing():
    a, b = torch.tpu.Event(), torch.tpu.Event()
    a.record()
    b.record()
    with pytest.raises(ValueError, match="enable_timing=True"):
        a.elapsed_time(b)


def test_an_event_recorded_on_a_side_stream_orders_the_default_stream(mode):
    side = torch.tpu.Stream()
    x = torch.randn(128)
    d = x.to("tpu")
    with torch.tpu.stream(side):
        y = d.sin() * 4
    e = torch.tpu.Event()
    e.record(side)
    torch.tpu.current_stream().wait_event(e)
    check(y - 1, x.sin() * 4 - 1)


def test_a_stream_of_another_device_index_is_refused():
    with pytest.raises(ValueError, match="tpu device"):
        torch.tpu.Stream(device="tpu:1")
