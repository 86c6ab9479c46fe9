// torch's tpu streams (see streams.h), and record_stream.
#include "streams.h"

#include "common.h"

#include <torch/library.h>

#include <array>
#include <atomic>
#include <mutex>

namespace dft {

namespace {

constexpr c10::StreamId kStreamPoolSize = 8;

// The pool's runtime handles, 0 until the slot's stream is created.
std::array<std::atomic<uint64_t>, kStreamPoolSize> g_pool{};
std::mutex g_pool_create;
std::atomic<uint32_t> g_next_slot{0};

thread_local c10::StreamId tls_current = 0;

c10::Device tpu() { return c10::Device(c10::DeviceType::PrivateUse1, 0); }

uint64_t handle_of(c10::StreamId id) {
  if (id == 0) return 0;
  TORCH_CHECK(id >= 1 && id <= kStreamPoolSize, "tpu: stream id ", id,
              " names no tpu stream (0 is the default stream, 1..", kStreamPoolSize,
              " the pool); make streams with torch.tpu.Stream()");
  auto& slot = g_pool[id - 1];
  uint64_t h = slot.load(std::memory_order_acquire);
  if (h != 0) return h;
  std::lock_guard<std::mutex> g(g_pool_create);
  h = slot.load(std::memory_order_relaxed);
  if (h == 0) {
    check(dfuse_stream_create(rt(), &h), "creating a tpu stream");
    slot.store(h, std::memory_order_release);
  }
  return h;
}

}  // namespace

uint64_t current_stream() { return tls_current == 0 ? 0 : handle_of(tls_current); }

uint64_t stream_handle(const c10::Stream& s) {
  TORCH_CHECK(s.device_type() == c10::DeviceType::PrivateUse1, "tpu: expected a tpu stream, got ",
              s);
  return handle_of(s.id());
}

c10::Stream current_torch_stream() {
  return c10::Stream(c10::Stream::UNSAFE, tpu(), tls_current);
}

c10::Stream exchange_stream(const c10::Stream& s) {
  stream_handle(s);  // checks the id
  c10::Stream old = current_torch_stream();
  tls_current = s.id();
  return old;
}

c10::Stream stream_from_pool() {
  auto slot = g_next_slot.fetch_add(1, std::memory_order_relaxed) % kStreamPoolSize;
  return c10::Stream(c10::Stream::UNSAFE, tpu(), static_cast<c10::StreamId>(slot) + 1);
}

namespace {

// Tensor.record_stream(s): the runtime holds a reference to every buffer a queued or deferred
// op uses until the op has run, so a storage freed while another stream still reads it is never
// handed out again early. Nothing to record; checking the stream keeps a bad argument an error.
void record_stream(at::Tensor& self, at::Stream s) { stream_handle(s); }

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("record_stream", record_stream); }

}  // namespace dft
