"""torch.tpu's memory queries behave like torch.cuda's: allocated bytes follow the tensors
alive, peaks and their reset, reserved = allocated + the runtime's cached blocks, empty_cache
releases that cache, and the device describes itself (name, total memory)."""
import gc

import pytest
import torch

import deferfuse_torch  # noqa: F401


def settle():
    gc.collect()
    torch.tpu.synchronize()


def test_allocated_bytes_follow_live_tensors(mode):
    settle()
    before = torch.tpu.memory_allocated()
    x = torch.empty(1000, device="tpu")
    assert torch.tpu.memory_allocated() == before + 4000
    y = (x.fill_(1.0) * 2).to(torch.float64)
    assert torch.tpu.memory_allocated() >= before + 4000 + 8000
    del x, y
    settle()
    assert torch.tpu.memory_allocated() == before


def test_views_do_not_allocate(mode):
    x = torch.zeros(64, 64, device="tpu")
    before = torch.tpu.memory_allocated()
    v = x.t()[3:]
    assert torch.tpu.memory_allocated() == before
    del v, x


def test_peak_tracks_the_high_water_mark_until_reset(mode):
    settle()
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    assert torch.tpu.max_memory_allocated() == base
    big = torch.empty(10_000, device="tpu")
    del big
    settle()
    assert torch.tpu.max_memory_allocated() >= base + 40_000
    assert torch.tpu.memory_allocated() == base
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == base


def test_reserved_covers_allocated_and_empty_cache_releases_the_cache(mode):
    x = torch.ones(100_000, device="tpu") * 3
    x.cpu()
    del x
    settle()
    assert torch.tpu.memory_reserved() >= torch.tpu.memory_allocated()
    assert torch.tpu.max_memory_reserved() >= torch.tpu.memory_reserved()
    assert torch.tpu.max_memory_reserved() >= torch.tpu.max_memory_allocated()
    torch.tpu.empty_cache()
    assert torch.tpu.memory_reserved() == torch.tpu.memory_allocated()
    assert deferfuse_torch.stats()["host_cached_bytes"] == 0


def test_memory_stats_has_the_keys_users_read(mode):
    x = torch.ones(10, device="tpu")
    s = torch.tpu.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                "reserved_bytes.all.current", "reserved_bytes.all.peak",
                "active_bytes.all.current", "allocation.all.current"):
        assert isinstance(s[key], int), key
    assert s["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    assert s["allocation.all.current"] >= 1
    assert s["allocated_bytes.all.allocated"] - s["allocated_bytes.all.freed"] == \
        s["allocated_bytes.all.current"]
    del x


def test_queries_take_the_device_argument():
    assert torch.tpu.memory_allocated("tpu") == torch.tpu.memory_allocated(0)
    assert torch.tpu.memory_allocated(torch.device("tpu:0")) >= 0
    with pytest.raises(ValueError, match="tpu memory queries"):
        torch.tpu.memory_allocated("tpu:1")


def test_mem_get_info_is_the_hosts_memory():
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    assert torch.tpu.get_device_properties(0).total_memory == total


def test_device_name_and_properties():
    assert torch.tpu.get_device_name() == torch.tpu.get_device_name(0) == "deferfuse"
    props = torch.tpu.get_device_properties(0)
    assert props.name == "deferfuse" and props.total_memory > 0
    assert props.multi_processor_count >= 1
    with pytest.raises(RuntimeError, match="does not exist"):
        torch.tpu.get_device_properties(1)

