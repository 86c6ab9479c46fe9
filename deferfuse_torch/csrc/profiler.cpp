// Device time for PyTorch's profiler: the PrivateUse1 profiler stubs, which PyTorch's
// KINETO_PRIVATEUSE1_FALLBACK state calls around every op (torch.autograd.profiler.profile(
// use_device="tpu")). An event is a reading of the runtime's device clock: the nanoseconds
// programs have run, after the work launched so far has finished (nothing deferred is
// flushed). elapsed() of an op's two events is then the device time of the programs that op
// launched (strict, debug), or that ran at its sync point (defer: a step's fused programs run
// at the .item() or synchronize that needed them, and show there).
#include "common.h"

#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <atomic>
#include <memory>

namespace dft {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

struct TpuProfilerStubs : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    // The clock runs from the first event on: timing programs costs two clock reads each,
    // which a process that never profiles should not pay.
    static std::atomic<bool> started{false};
    if (!started.exchange(true)) check(dfuse_profiler_enable(rt(), 1), "profiler");
    if (device) *device = 0;
    uint64_t busy = 0;
    check(dfuse_profiler_point(rt(), &busy), "profiler");
    if (cpu_ns) *cpu_ns = c10::getTime();
    *event = std::make_shared<uint64_t>(busy);
  }

  // Microseconds between two events, as PyTorch's privateuse1_elapsed_us expects.
  float elapsed(const ProfilerVoidEventStub* a, const ProfilerVoidEventStub* b) const override {
    if (!a || !*a || !b || !*b) return 0.0f;
    auto t0 = *static_cast<const uint64_t*>(a->get());
    auto t1 = *static_cast<const uint64_t*>(b->get());
    return t1 > t0 ? float(t1 - t0) / 1000.0f : 0.0f;
  }

  // No markers: the runtime's own timeline (deferfuse_torch.trace) shows ranges.
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override { op(0); }
  void synchronize() const override { check(dfuse_device_synchronize(rt()), "profiler"); }
};

struct Register {
  Register() {
    static TpuProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} g_register;

}  // namespace
}  // namespace dft
