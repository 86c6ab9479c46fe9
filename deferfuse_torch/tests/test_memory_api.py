"""torch.tpu's memory queries behave like torch.cuda's: allocated bytes follow the tensors
alive, peaks and their reset, reserved = allocated + the runtime's cached blocks, empty_cache
releases that cache, and the device describes itself (name, total memory). Under
torch.use_deterministic_algorithms, new memory is filled as CPU fills it."""
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



@pytest.fixture
def no_memory_cap_after():
    yield
    torch.ops.deferfuse.set_memory_limit(0)


def test_a_memory_fraction_cap_raises_out_of_memory_and_the_device_stays_usable(
        mode, no_memory_cap_after):
    keep = torch.ones(1024, device="tpu")
    settle()
    torch.tpu.set_per_process_memory_fraction(1e-9)  # about a few bytes of the host's memory
    assert torch.tpu.get_per_process_memory_fraction() < 1e-6
    with pytest.raises(torch.OutOfMemoryError, match="over the limit of"):
        torch.ones(1 << 20, device="tpu").sum().item()
    torch.ops.deferfuse.set_memory_limit(0)
    assert torch.tpu.get_per_process_memory_fraction() == 1.0
    assert (keep * 2).sum().item() == 2048.0


def test_a_tensor_whose_update_was_lost_to_out_of_memory_is_usable_after_a_reload(
        no_memory_cap_after):
    # Catch the error, shrink the batch, retry: a tensor's lost in-place update is reported
    # when it is read, and reloading it whole (fill_, copy_, load_state_dict) makes it usable
    # again; it stayed unusable for good.
    w = torch.ones(4 << 20, device="tpu")
    settle()
    torch.ops.deferfuse.set_memory_limit(torch.tpu.memory_allocated() + (32 << 20))
    with deferfuse_torch.mode("defer"):
        with pytest.raises(torch.OutOfMemoryError):
            w.mul_(2)
            ys = [w * i for i in range(5)]
            sum(y.sum() for y in ys).item()
    torch.ops.deferfuse.set_memory_limit(0)
    with pytest.raises(torch.OutOfMemoryError, match="never ran"):
        w[0].item()
    w.copy_(torch.full((4 << 20,), 3.0))
    assert w.sum().item() == 3.0 * (4 << 20)
    w.fill_(1.0)
    assert w[:2].cpu().tolist() == [1.0, 1.0]


def test_a_memory_fraction_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match=r"fraction in \[0, 1\]"):
        torch.tpu.set_per_process_memory_fraction(1.5)


def test_the_memory_limit_environment_variable_caps_a_new_process():
    import subprocess
    import sys
    code = ("import torch, deferfuse_torch\n"
            "try:\n"
            "    torch.ones(1 << 22, device='tpu').sum().item()\n"
            "except torch.OutOfMemoryError as e:\n"
            "    print('OOM', 'DEFERFUSE_MEMORY_LIMIT' in str(e))\n")
    env = dict(__import__("os").environ, DEFERFUSE_MEMORY_LIMIT="1M")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "OOM True", out.stderr[-2000:]


def test_the_runtimes_own_memory_peak_follows_its_buffers(mode):
    settle()
    torch.tpu.reset_peak_memory_stats()
    live0, peak0, _, _ = torch.ops.deferfuse.runtime_memory()
    assert peak0 == live0
    x = torch.ones(1 << 18, device="tpu")
    x.sum().item()
    live1, peak1, _, _ = torch.ops.deferfuse.runtime_memory()
    assert live1 >= live0 + (1 << 20) and peak1 >= live1


def test_the_runtime_allocators_counters_are_in_memory_stats(mode):
    settle()
    torch.tpu.reset_peak_memory_stats()
    x = torch.ones(1 << 18, device="tpu")
    x.sum().item()
    s = torch.tpu.memory_stats()
    live, peak, limit, _ = torch.ops.deferfuse.runtime_memory()
    assert s["device_bytes.all.current"] >= 1 << 20
    assert s["device_bytes.all.peak"] >= s["device_bytes.all.current"]
    assert s["device_bytes.limit"] == limit
    del x


@pytest.fixture
def deterministic():
    """torch.use_deterministic_algorithms(True) for one test (what transformers'
    enable_full_determinism() sets), restored after it."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


CREATIONS = {
    "empty_float32": lambda dev: torch.empty(3, device=dev),
    "empty_int64": lambda dev: torch.empty(3, dtype=torch.long, device=dev),
    "empty_bfloat16": lambda dev: torch.empty(3, dtype=torch.bfloat16, device=dev),
    "empty_like": lambda dev: torch.empty_like(torch.ones(3, device=dev)),
    "new_empty": lambda dev: torch.ones(1, device=dev).new_empty(3),
    "empty_strided": lambda dev: torch.empty_strided((3,), (1,), device=dev),
    "channels_last": lambda dev: torch.empty(1, 2, 1, 2, device=dev,
                                             memory_format=torch.channels_last),
    "resize_grown": lambda dev: torch.ones(2, device=dev).resize_(4),
}


@pytest.mark.parametrize("name", sorted(CREATIONS))
def test_deterministic_mode_fills_uninitialized_memory_as_cpu_does(mode, deterministic, name):
    # NaN for floats, the dtype's largest value for integers, the grown part of a resize_ only:
    # a read of memory nothing wrote shows, as on CPU (tpu's read as zeros).
    got, want = CREATIONS[name]("tpu").cpu(), CREATIONS[name]("cpu")
    torch.testing.assert_close(got, want, equal_nan=True)


def test_fill_and_zero_of_an_expanded_view_write_every_element_it_stands_for(mode):
    # CPU fills a view with repeated elements (x.expand(...)): each storage element once.
    for fill in (lambda v: v.fill_(2.5), lambda v: v.zero_()):
        want = torch.ones(2, 1)
        got = want.to("tpu")
        fill(got.expand(2, 3))
        fill(want.expand(2, 3))
        assert torch.equal(got.cpu(), want)


def test_fill_of_an_expanded_view_by_a_tensor_raises_cpus_overlap_error(mode):
    # CPU's fill_ by a number takes repeated elements, its fill_ by a tensor refuses them.
    for value in (torch.tensor(3.0), torch.tensor(4.0, device="tpu")):
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            torch.ones(2, 1, device="tpu").expand(2, 3).fill_(value)


@pytest.mark.parametrize("fill", ["fill_", "full_like", "masked_fill", "index_fill_", "setitem"])
def test_a_fill_value_that_does_not_fit_the_dtype_raises_cpus_overflow_error(mode, fill):
    # uint8 300 wrapped to 44 on the device, inf into int32 became -1: CPU raises.
    calls = {"fill_": lambda t, v: t.fill_(v), "full_like": lambda t, v: torch.full_like(t, v),
             "masked_fill": lambda t, v: t.masked_fill(torch.ones(2, dtype=torch.bool, device=t.device), v),
             "index_fill_": lambda t, v: t.index_fill_(0, torch.tensor([0], device=t.device), v),
             "setitem": lambda t, v: t.__setitem__(0, v)}
    for dtype, value in [(torch.uint8, 300), (torch.uint8, -2.7), (torch.int32, float("inf")),
                         (torch.float16, 1e6)]:
        if fill == "setitem" and dtype == torch.float16:
            # CPU fills a one-element float16 view unchecked: `t[0] = 1e6` stores inf.
            want, t = torch.zeros(2, dtype=dtype), torch.zeros(2, dtype=dtype, device="tpu")
            want[0], t[0] = value, value
            assert torch.equal(t.cpu(), want) and want[0].isinf()
            continue
        with pytest.raises(RuntimeError, match="without overflow"):
            calls[fill](torch.zeros(2, dtype=dtype), value)
        with pytest.raises(RuntimeError, match="without overflow"):
            calls[fill](torch.zeros(2, dtype=dtype, device="tpu"), value)
    calls[fill](torch.zeros(2, dtype=torch.uint8, device="tpu"), 255)  # fits: no error


def test_masked_fill_by_a_host_0_dim_value_that_does_not_fit_raises_cpus_overflow_error(mode):
    mask = torch.ones(2, dtype=torch.bool, device="tpu")
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.zeros(2, dtype=torch.uint8, device="tpu").masked_fill(mask, torch.tensor(70000.))


def test_device_arguments_of_another_device_type_or_index_raise_as_cuda_does():
    T = torch.tpu
    for call in (lambda: T.get_device_name("cpu"), lambda: T.set_device("cuda:0"),
                 lambda: T.device("cpu")):
        with pytest.raises(ValueError, match="Expected a tpu device, but got"):
            call()
    for call in (lambda: T.synchronize(1), lambda: T.get_rng_state("tpu:1"),
                 lambda: T.set_rng_state(T.get_rng_state(), "tpu:1")):
        with pytest.raises(RuntimeError, match="device index 1 does not exist"):
            call()
    T.synchronize("tpu:0")
    assert T.get_device_name(0) == T.get_device_name("tpu")


def test_initial_seed_is_unsigned_as_torch_s():
    before = torch.initial_seed()
    torch.manual_seed(2**64 - 1)
    try:
        assert torch.tpu.initial_seed() == 2**64 - 1 == torch.initial_seed()
    finally:
        torch.manual_seed(before)
