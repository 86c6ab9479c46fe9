// The Python-facing calls of the device (torch.ops.deferfuse.*), wrapped by the deferfuse_torch
// package into torch.tpu.*: synchronize, modes, stats, pending dump, materialization state and
// the fallback counters.
#include "common.h"
#include "streams.h"
#include "observe.h"
#include "tables.h"

#include <torch/library.h>

namespace dft {
std::string fallback_counts_text();
void reset_fallback_counts();

namespace {

void synchronize() {
  note_sync("synchronize");
  check(dfuse_device_synchronize(rt()), "synchronize");
}

int64_t get_mode_op() { return get_mode(); }

int64_t set_mode_op(int64_t mode) {
  TORCH_CHECK(mode >= 0 && mode <= DFUSE_MODE_DEFER, "tpu: unknown mode ", mode,
              "; expected 0 (strict), 1 (debug) or 2 (defer)");
  return set_mode(static_cast<uint32_t>(mode));
}

int64_t set_pipeline_ops_op(int64_t ops) {
  TORCH_CHECK(ops >= 0, "tpu: set_pipeline_ops expects a count of ops >= 0 (0 turns pipelining "
              "off), got ", ops);
  uint64_t previous = 0;
  check(dfuse_pipeline_ops_set(rt(), uint64_t(ops), &previous), "set_pipeline_ops");
  return int64_t(previous);
}

// The DfuseStats fields in declaration order (the Python side names them).
std::vector<int64_t> stats() {
  DfuseStats s{};
  check(dfuse_stats(rt(), &s), "stats");
  std::vector<int64_t> v = {
      int64_t(s.ops_recorded),   int64_t(s.programs_compiled), int64_t(s.programs_run),
      int64_t(s.cache_hits),     int64_t(s.cache_misses),      int64_t(s.cache_evictions),
      int64_t(s.compile_ns),     int64_t(s.bytes_allocated),   int64_t(s.dead_nodes),
      int64_t(s.unmaterialized), int64_t(s.plans_reused),      int64_t(s.host_cache_hits),
      int64_t(s.host_cache_misses), int64_t(s.host_cached_bytes), int64_t(s.pipelined_flushes)};
  for (auto c : s.cuts) v.push_back(int64_t(c));
  for (auto c : s.sync_points) v.push_back(int64_t(c));
  return v;
}

std::string dump_pending() {
  size_t need = 0;
  check(dfuse_pending_dump(rt(), current_stream(), nullptr, 0, &need), "dump_pending");
  std::string buf(need, '\0');
  check(dfuse_pending_dump(rt(), current_stream(), buf.data(), need, &need),
        "dump_pending");
  buf.resize(need > 0 ? need - 1 : 0);
  return buf;
}

bool is_materialized(const at::Tensor& t) {
  Ref r = ref(t);
  uint32_t st = 0;
  check(dfuse_tensor_state(rt(), r.get(), &st), "is_materialized");
  return st == DFUSE_BUFFER_STATE_MATERIALIZED;
}

int64_t release_cached_memory() {
  clear_uploaded_tables();
  uint64_t freed = 0;
  check(dfuse_release_cached_memory(rt(), &freed), "release_cached_memory");
  return int64_t(freed);
}

std::string fallback_counts() { return fallback_counts_text(); }
void reset_fallbacks() { reset_fallback_counts(); }
std::string version() { return dfuse_version(); }

}  // namespace
}  // namespace dft

TORCH_LIBRARY(deferfuse, m) {
  m.def("synchronize() -> ()", &dft::synchronize);
  m.def("get_mode() -> int", &dft::get_mode_op);
  m.def("set_mode(int mode) -> int", &dft::set_mode_op);
  m.def("stats() -> int[]", &dft::stats);
  m.def("set_pipeline_ops(int ops) -> int", &dft::set_pipeline_ops_op);
  m.def("dump_pending() -> str", &dft::dump_pending);
  m.def("is_materialized(Tensor t) -> bool", &dft::is_materialized);
  m.def("release_cached_memory() -> int", &dft::release_cached_memory);
  m.def("fallback_counts() -> str", &dft::fallback_counts);
  m.def("reset_fallback_counts() -> ()", &dft::reset_fallbacks);
  m.def("version() -> str", &dft::version);
}
