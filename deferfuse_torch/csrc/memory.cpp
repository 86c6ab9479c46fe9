// Memory accounting of the "tpu" device, behind torch.tpu.memory_allocated() and friends.
//
// The runtime's allocator counts the buffers in use (dfuse_memory_info), which is not what
// torch.cuda.memory_allocated means: it includes a running program's intermediates and leaves
// out a deferred tensor whose buffer is not materialized yet. Every tpu storage is created and
// freed through common.cpp's data pointers, so the live bytes of PyTorch's tensors are counted
// here, where they are born and die: the same quantity as torch.cuda.memory_allocated (bytes
// held by tensors). memory_stats() reports the runtime's counters beside them.
#include "common.h"

#include <torch/library.h>

#include <atomic>

namespace dft {
namespace {

std::atomic<int64_t> g_live_bytes{0}, g_peak_bytes{0}, g_total_bytes{0}, g_freed_bytes{0};
std::atomic<int64_t> g_live_count{0}, g_peak_count{0}, g_total_count{0};
// The largest reserved value seen by a query (the runtime keeps no peak of its cache).
std::atomic<int64_t> g_peak_reserved{0};

void raise_to(std::atomic<int64_t>& peak, int64_t v) {
  int64_t p = peak.load(std::memory_order_relaxed);
  while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
  }
}

int64_t host_cached_bytes() {
  DfuseStats s{};
  check(dfuse_stats(rt(), &s), "memory stats");
  return int64_t(s.host_cached_bytes);
}

// Reserved = live tensors + freed blocks the runtime holds for reuse (CUDA's caching
// allocator reports the same sum).
int64_t reserved_now() {
  int64_t r = g_live_bytes.load() + host_cached_bytes();
  raise_to(g_peak_reserved, r);
  return r;
}

// [allocated current, allocated peak, allocated total, freed total, allocations current,
//  allocations peak, allocations total, reserved current, reserved peak]
std::vector<int64_t> memory_counters() {
  int64_t reserved = reserved_now();
  int64_t live = g_live_bytes.load();
  return {live,
          g_peak_bytes.load(),
          g_total_bytes.load(),
          g_freed_bytes.load(),
          g_live_count.load(),
          g_peak_count.load(),
          g_total_count.load(),
          reserved,
          std::max(g_peak_reserved.load(), g_peak_bytes.load())};
}

// The runtime's own counters: [bytes in use (with intermediates), their peak, the cap (0:
// none), cached free bytes].
std::vector<int64_t> runtime_memory() {
  DfuseMemoryInfo m{};
  check(dfuse_memory_info(rt(), &m), "memory info");
  return {int64_t(m.live_bytes), int64_t(m.peak_live_bytes), int64_t(m.limit_bytes),
          int64_t(m.cached_bytes)};
}

void set_memory_limit(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "tpu: a memory limit must be >= 0 bytes (0: none), got ", bytes);
  check(dfuse_memory_limit_set(rt(), uint64_t(bytes)), "setting the memory limit");
}

void reset_peak_memory() {
  check(dfuse_memory_peak_reset(rt()), "resetting the memory peak");
  g_peak_bytes.store(g_live_bytes.load());
  g_peak_count.store(g_live_count.load());
  g_peak_reserved.store(0);
  reserved_now();
}

}  // namespace

void note_storage_alloc(int64_t bytes) {
  raise_to(g_peak_bytes, g_live_bytes.fetch_add(bytes) + bytes);
  raise_to(g_peak_count, g_live_count.fetch_add(1) + 1);
  g_total_bytes.fetch_add(bytes, std::memory_order_relaxed);
  g_total_count.fetch_add(1, std::memory_order_relaxed);
}

void note_storage_free(int64_t bytes) {
  g_live_bytes.fetch_sub(bytes);
  g_live_count.fetch_sub(1);
  g_freed_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

}  // namespace dft

TORCH_LIBRARY_FRAGMENT(deferfuse, m) {
  m.def("memory_counters() -> int[]", &dft::memory_counters);
  m.def("reset_peak_memory() -> ()", &dft::reset_peak_memory);
  m.def("runtime_memory() -> int[]", &dft::runtime_memory);
  m.def("set_memory_limit(int bytes) -> ()", &dft::set_memory_limit);
}
