// Device activities for torch.profiler (Kineto): torch.profiler.profile(activities=[CPU,
// PrivateUse1]) runs PyTorch's KINETO_PRIVATEUSE1 state, which hands Kineto the
// IActivityProfiler registered with PrivateUse1ProfilerRegistry. Kineto makes a session of it
// per profile; the session collects the runtime's program runs (stream, start, duration,
// region label) and gives each to Kineto as a device kernel linked to the aten op that
// launched it. That link makes key_averages() show each op's device time and
// export_chrome_trace() draw the programs on a "tpu" process, one row per stream.
//
// The link: Kineto tells each session the correlation id of every op it enters and leaves;
// the session sets it as the low half of the runtime's tag on that thread (dfuse_profiler_tag,
// through observe.h's set_correlation_tag), and each run carries the tag of the thread that
// prepared it. In strict and debug modes that is the op
// itself; in defer mode it is the sync point that ran the fused programs (.item(),
// synchronize), as the PrivateUse1 stubs in profiler.cpp report too.
#ifndef USE_KINETO
#define USE_KINETO 1  // libtorch is built with Kineto; its PrivateUse1 registry needs this
#endif

#include "common.h"
#include "observe.h"

#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <libkineto.h>
#include <output_base.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace dft {
namespace {

// Runs one profile keeps (the oldest dropped beyond): about 25 MB.
constexpr uint64_t kMaxRuns = 1 << 17;
// Resource ids of CPU workers, above any stream id.
constexpr int64_t kWorkerBase = int64_t(1) << 40;
// The device process in the trace (Kineto draws GPU 0..15 likewise).
constexpr int32_t kDevicePid = 0;

// The correlation ids of the ops this thread is in, innermost last.
thread_local std::vector<uint64_t> t_ops;

class Session : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    check(dfuse_profiler_capture(rt(), kMaxRuns, nullptr), "torch.profiler start");
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    // Programs already launched finish first (deferred ops are not flushed: that would
    // change what fuses), so every run the profile launched is in.
    uint64_t busy = 0, dropped = 0;
    check(dfuse_profiler_point(rt(), &busy), "torch.profiler stop");
    check(dfuse_profiler_capture(rt(), 0, &dropped), "torch.profiler stop");
    set_correlation_tag(0);
    t_ops.clear();
    std::vector<DfuseProfiledRun> chunk(4096);
    for (;;) {
      uint64_t n = 0;
      check(dfuse_profiler_take(rt(), chunk.data(), chunk.size(), &n), "torch.profiler stop");
      runs_.insert(runs_.end(), chunk.begin(), chunk.begin() + n);
      if (n < chunk.size()) break;
    }
    if (dropped) {
      errors_.push_back("tpu: " + std::to_string(dropped) +
                        " oldest program runs were dropped; profile fewer steps");
    }
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return errors_; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; },
                 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback linked, int64_t, int64_t) override {
    for (const auto& r : runs_) {
      buffer_.emplace_activity(buffer_.span, libkineto::ActivityType::CONCURRENT_KERNEL,
                               std::string(r.label[0] ? r.label : "tpu program"));
      auto& a = libkineto::CpuTraceBuffer::toRef(buffer_.activities.back());
      a.startTime = r.start_unix_ns;
      a.endTime = r.start_unix_ns + int64_t(r.dur_ns);
      a.device = kDevicePid;
      a.resource = r.worker >= 0 ? kWorkerBase + r.worker : int64_t(r.stream);
      // The low half of the tag is the op's correlation id (observe.h).
      auto correlation = int32_t(uint32_t(r.tag));
      a.id = correlation;
      a.linked = correlation ? linked(correlation) : nullptr;
      a.addMetadataQuoted("stream", std::to_string(r.stream));
      tracks_[a.resource] = r.worker >= 0 ? "cpu worker " + std::to_string(r.worker)
                                          : "stream " + std::to_string(r.stream);
      a.log(logger);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(
        libkineto::DeviceInfo{kDevicePid, kDevicePid, "tpu", "tpu 0"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [id, name] : tracks_) {
      out.push_back(libkineto::ResourceInfo{id, id, kDevicePid, name});
    }
    return out;
  }

  // Kineto keeps the activities it was given alive through this buffer.
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    auto out = std::make_unique<libkineto::CpuTraceBuffer>();
    out->span = buffer_.span;
    out->gpuOpCount = -1;
    out->activities = std::move(buffer_.activities);
    return out;
  }

  void pushCorrelationId(uint64_t id) override {
    t_ops.push_back(id);
    set_correlation_tag(uint32_t(id));
  }

  void popCorrelationId() override {
    if (!t_ops.empty()) t_ops.pop_back();
    set_correlation_tag(t_ops.empty() ? 0 : uint32_t(t_ops.back()));
  }

 private:
  std::vector<DfuseProfiledRun> runs_;
  std::vector<std::string> errors_;
  libkineto::CpuTraceBuffer buffer_;
  std::map<int64_t, std::string> tracks_;
};

class TpuActivityProfiler : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<libkineto::ActivityType>& availableActivities() const override {
    return activities_;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& types, const libkineto::Config&) override {
    // Kineto asks every registered profiler; the runs are device kernels, wanted only when
    // the profile collects those (ProfilerActivity.PrivateUse1).
    if (!types.count(libkineto::ActivityType::CONCURRENT_KERNEL)) return nullptr;
    return std::make_unique<Session>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t, int64_t, const std::set<libkineto::ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"tpu"};
  std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::CONCURRENT_KERNEL};
};

}  // namespace

REGISTER_PRIVATEUSE1_PROFILER(TpuActivityProfiler);

}  // namespace dft
