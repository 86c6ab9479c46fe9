// The device itself: allocator, device guard, hooks (autograd needs them), tensor creation,
// resize, and the metadata-only view kernels.
#include "common.h"
#include "observe.h"
#include "random.h"
#include "streams.h"

#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/alias_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/strides.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_set>

namespace dft {
namespace {

// Raw storages (torch.UntypedStorage(n, device="tpu")) are byte buffers. Tensors are made by
// the empty kernels below instead, which give each storage its element dtype: the runtime's
// buffers are typed, so a typed view of a byte storage is reported as an error at use.
struct TpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    int64_t size = static_cast<int64_t>(n);
    uint64_t h = 0;
    check(dfuse_tensor_empty(rt(), DFUSE_DTYPE_U8, &size, 1, &h), "allocating a storage");
    return data_ptr_for(h, DFUSE_DTYPE_U8, {size}, {1});
  }
  // Storage clones: a device-side copy of the first `count` bytes, as 1-D views of each
  // buffer's own dtype (both must have the same dtype, which clones of one storage do).
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    uint64_t d = reinterpret_cast<uint64_t>(dest), s = reinterpret_cast<uint64_t>(src);
    uint32_t dd = 0, sd = 0;
    check(dfuse_tensor_dtype(rt(), d, &dd), "copy_data destination");
    check(dfuse_tensor_dtype(rt(), s, &sd), "copy_data source");
    TORCH_CHECK(dd == sd, "tpu: copying storage bytes between buffers of different dtypes");
    int64_t n = static_cast<int64_t>(count / c10::elementSize(from_dtype(dd))), one = 1;
    uint64_t dv = 0, sv = 0;
    check(dfuse_as_strided(rt(), d, &n, &one, 1, 0, &dv), "copy_data destination view");
    Ref dref(dv, true);
    check(dfuse_as_strided(rt(), s, &n, &one, 1, 0, &sv), "copy_data source view");
    Ref sref(sv, true);
    copy_handle(sv, dv, "copy_data");
  }
};

TpuAllocator g_allocator;

// Host memory for `pin_memory()`: deferfuse uploads from and downloads to any host pointer
// with a plain memcpy (the CPU backend's buffers are host memory; PJRT stages through host
// buffers itself), so page-locking buys nothing. A pinned tensor is an ordinary block from
// PyTorch's CPU allocator, remembered so is_pinned() is true for exactly these blocks, which
// is what DataLoader(pin_memory=True) and `.to("tpu", non_blocking=True)` check.
struct PinnedAllocator final : c10::Allocator {
  struct Block {
    c10::DataPtr host;
  };
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr host = c10::GetCPUAllocator()->allocate(n);
    void* p = host.get();
    {
      std::lock_guard<std::mutex> g(mu_);
      live_.insert(p);
    }
    return c10::DataPtr(p, new Block{std::move(host)}, &release, c10::Device(c10::kCPU));
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  bool is_pinned(const void* p) const {
    std::lock_guard<std::mutex> g(mu_);
    return live_.count(p) != 0;
  }

 private:
  static void release(void* ctx);
  mutable std::mutex mu_;
  std::unordered_set<const void*> live_;
};

PinnedAllocator g_pinned;

void PinnedAllocator::release(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  {
    std::lock_guard<std::mutex> g(g_pinned.mu_);
    g_pinned.live_.erase(b->host.get());
  }
  delete b;  // frees the block through the CPU allocator's own deleter
}

struct TpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType T = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return T; }
  c10::Device exchangeDevice(c10::Device d) const override {
    check_index(d);
    return c10::Device(T, 0);
  }
  c10::Device getDevice() const override { return c10::Device(T, 0); }
  void setDevice(c10::Device d) const override { check_index(d); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  // Streams map onto the runtime's (streams.h): the current one is per thread.
  c10::Stream getStream(c10::Device d) const override {
    check_index(d);
    return current_torch_stream();
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    check_index(d);
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(T, 0));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    check_index(d);
    return stream_from_pool();
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    check_index(d);
    return stream_from_pool();
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return exchange_stream(s); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  // An event is a runtime event handle; torch.Event(enable_timing=True) asks for
  // BACKEND_DEFAULT and gets a timing event (elapsedTime below).
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex,
              const c10::EventFlag flag) const override {
    uint64_t e = reinterpret_cast<uint64_t>(*event);
    if (e == 0) {
      if (flag == c10::EventFlag::BACKEND_DEFAULT) {
        check(dfuse_event_create_timing(rt(), &e), "creating a timing event");
      } else {
        check(dfuse_event_create(rt(), &e), "creating an event");
      }
      *event = reinterpret_cast<void*>(e);
    }
    check(dfuse_event_record(rt(), e, stream_handle(s)), "recording an event");
  }
  void block(void* event, const c10::Stream& s) const override {
    if (event) {
      check(dfuse_event_wait(rt(), stream_handle(s), reinterpret_cast<uint64_t>(event)),
            "event wait");
    }
  }
  bool queryEvent(void* event) const override {
    if (!event) return true;
    bool done = false;
    check(dfuse_event_query(rt(), reinterpret_cast<uint64_t>(event), &done), "event query");
    return done;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    // noexcept: a failure to destroy (e.g. during shutdown) is ignored, never thrown.
    try {
      if (event) dfuse_event_destroy(rt(), reinterpret_cast<uint64_t>(event));
    } catch (...) {
    }
  }
  void synchronizeEvent(void* event) const override {
    if (event) check(dfuse_event_synchronize(rt(), reinterpret_cast<uint64_t>(event)), "event sync");
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "tpu: elapsed_time needs both events recorded first");
    double ms = 0;
    check(dfuse_event_elapsed_ms(rt(), reinterpret_cast<uint64_t>(start),
                                 reinterpret_cast<uint64_t>(end), &ms),
          "elapsed_time");
    return ms;
  }
  bool queryStream(const c10::Stream& s) const override {
    bool done = false;
    check(dfuse_stream_query(rt(), stream_handle(s), &done), "stream query");
    return done;
  }
  void synchronizeStream(const c10::Stream& s) const override {
    note_sync("stream synchronize");
    check(dfuse_stream_synchronize(rt(), stream_handle(s)), "stream synchronize");
  }
  void synchronizeDevice(const c10::DeviceIndex) const override {
    note_sync("device synchronize");
    check(dfuse_device_synchronize(rt()), "device synchronize");
  }

 private:
  static void check_index(c10::Device d) {
    TORCH_CHECK(d.index() <= 0, "tpu: device index ", int(d.index()),
                " does not exist (there is one tpu device, index 0)");
  }
};

struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(c10::DeviceType::PrivateUse1, 0);
  }
  // Random ops draw from the device's Philox generator (random.h).
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return default_generator();
  }
  at::Generator getNewGenerator(c10::DeviceIndex) const override {
    return new_generator(c10::default_rng_seed_val);
  }
  bool isPinnedPtr(const void* p) const override { return g_pinned.is_pinned(p); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned; }
  void resizePrivateUse1Bytes(const c10::Storage& s, size_t n) const override {
    TORCH_CHECK(n <= s.nbytes(), "tpu: growing a raw storage is not supported");
  }
};

at::Tensor make_tensor(c10::Storage storage, at::ScalarType dtype) {
  return at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      caffe2::TypeMeta::fromScalarType(dtype));
}

void check_device(std::optional<at::Device> device, std::optional<at::Layout> layout) {
  TORCH_CHECK(!device || device->type() == c10::DeviceType::PrivateUse1,
              "tpu: empty called for device ", *device);
  TORCH_CHECK(!device || device->index() <= 0, "tpu: device index ", int(device->index()),
              " does not exist");
  TORCH_CHECK(!layout || *layout == at::kStrided, "tpu: only strided tensors are supported");
}

// Under torch.use_deterministic_algorithms(True) (transformers' enable_full_determinism()) with
// torch.utils.deterministic.fill_uninitialized_memory (its default), a new tensor is filled
// with NaN (floats) or its dtype's largest value (integers), as CPU's and CUDA's empty do, so
// a read of memory nothing wrote shows (ours read as zeros).
bool fills_uninitialized_memory() {
  return C10_UNLIKELY(at::globalContext().deterministicAlgorithms() &&
                      at::globalContext().deterministicFillUninitializedMemory());
}

at::Tensor filled_if_deterministic(at::Tensor t) {
  if (fills_uninitialized_memory()) at::native::fill_empty_deterministic_(t);
  return t;
}

// Pinning is for host memory: a device factory asked to pin raises, as CUDA's does (silently
// ignored, `torch.empty(n, device="tpu", pin_memory=True)` looked like it had worked).
void check_not_pinned(std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
}

at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<at::MemoryFormat> mf) {
  check_device(device, layout);
  check_not_pinned(pin_memory);
  auto st = dtype.value_or(at::get_default_dtype_as_scalartype());
  auto fmt = mf.value_or(at::MemoryFormat::Contiguous);
  for (auto s : size) TORCH_CHECK(s >= 0, "tpu: negative dimension ", s, " in size ", size);
  size_t nbytes = at::detail::computeStorageNbytesContiguous(size, c10::elementSize(st));
  if (fmt == at::MemoryFormat::ChannelsLast || fmt == at::MemoryFormat::ChannelsLast3d) {
    // `model.to(memory_format=torch.channels_last)`: the same bytes, channels innermost. Ops
    // read any strides; their results are contiguous (README: *Where tpu differs*).
    TORCH_CHECK(size.size() == (fmt == at::MemoryFormat::ChannelsLast ? 4u : 5u),
                "tpu: memory format ", fmt, " needs a ",
                fmt == at::MemoryFormat::ChannelsLast ? 4 : 5, "-d size, got ", size);
    auto strides = fmt == at::MemoryFormat::ChannelsLast ? c10::get_channels_last_strides_2d(size)
                                                         : c10::get_channels_last_strides_3d(size);
    auto t = make_tensor(make_storage(st, size, strides, nbytes), st);
    t.unsafeGetTensorImpl()->set_sizes_and_strides(size, strides);
    return filled_if_deterministic(t);
  }
  TORCH_CHECK(fmt == at::MemoryFormat::Contiguous || fmt == at::MemoryFormat::Preserve,
              "tpu: memory format ", fmt, " is not supported (contiguous, channels_last and ",
              "channels_last_3d are)");
  auto strides = c10::contiguous_strides(size);
  auto t = make_tensor(make_storage(st, size, strides, nbytes), st);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(size);
  return filled_if_deterministic(t);
}

// Autograd's zero gradients (sign's, sgn's): CPU makes a storage-less "ZeroTensor"; here a
// tensor of zeros, which every op reads as such (it ran on the CPU fallback).
at::Tensor efficient_zero_tensor(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                 std::optional<at::Layout> layout,
                                 std::optional<at::Device> device, std::optional<bool>) {
  check_device(device, layout);
  auto st = dtype.value_or(at::get_default_dtype_as_scalartype());
  return at::zeros(size, at::TensorOptions().dtype(st).device(c10::DeviceType::PrivateUse1, 0));
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                         std::optional<at::Device> device, std::optional<bool> pin_memory) {
  check_device(device, layout);
  check_not_pinned(pin_memory);
  auto st = dtype.value_or(at::get_default_dtype_as_scalartype());
  for (auto s : size) TORCH_CHECK(s >= 0, "tpu: negative dimension ", s, " in size ", size);
  size_t nbytes = at::detail::computeStorageNbytes(size, stride, c10::elementSize(st));
  auto t = make_tensor(make_storage(st, size, stride, nbytes), st);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(size, stride);
  return filled_if_deterministic(t);
}

// Grows the storage by swapping in a bigger buffer holding the old bytes (copied on the
// device); every tensor sharing the storage sees the new buffer. at::native::resize_ would
// memcpy through the handle, which is not a host pointer.
const at::Tensor& resize_(const at::Tensor& self, at::IntArrayRef size,
                          std::optional<at::MemoryFormat> mf) {
  TORCH_CHECK(!mf || *mf == at::MemoryFormat::Contiguous || *mf == at::MemoryFormat::Preserve,
              "tpu: resize_ supports only the contiguous memory format");
  for (auto s : size) TORCH_CHECK(s >= 0, "tpu: negative dimension ", s, " in size ", size);
  // As PyTorch's resize_: the same sizes without a memory format leave the tensor as it is
  // (an out= view keeps its strides: `cumsum(x, 1, out=base.t())` writes through them).
  if (!mf && self.sizes().equals(size)) return self;
  size_t item = self.element_size();
  size_t need = (self.storage_offset() + c10::multiply_integers(size)) * item;
  auto storage = self.storage();
  const int64_t old_nbytes = static_cast<int64_t>(storage.nbytes());
  if (need > storage.nbytes()) {
    const StorageCtx& old = storage_ctx(self);
    // A complex64 storage holds float32 pairs (complex.cpp).
    uint32_t dt = self.scalar_type() == at::kComplexFloat ? DFUSE_DTYPE_F32
                                                          : to_dtype(self.scalar_type());
    size_t stored = c10::elementSize(from_dtype(dt));
    int64_t n_new = static_cast<int64_t>(need / stored), one = 1;
    int64_t n_old = static_cast<int64_t>(storage.nbytes() / stored);
    TORCH_CHECK(old.dtype == dt, "tpu: resize_ of a tensor viewing a storage of another dtype");
    uint64_t h = 0;
    check(dfuse_tensor_empty(rt(), dt, &n_new, 1, &h), "resize_ allocation");
    Ref fresh(h, true);
    if (n_old > 0) {
      uint64_t sv = 0, dv = 0;
      check(dfuse_as_strided(rt(), old.handle, &n_old, &one, 1, 0, &sv), "resize_ source");
      Ref s(sv, true);
      check(dfuse_as_strided(rt(), h, &n_old, &one, 1, 0, &dv), "resize_ destination");
      Ref d(dv, true);
      copy_handle(sv, dv, "resize_ copy");
    }
    check(dfuse_tensor_retain(rt(), h), "resize_ retain");
    storage.set_data_ptr_noswap(data_ptr_for(h, dt, {n_new}, {1}));
    storage.set_nbytes(need);
  }
  self.unsafeGetTensorImpl()->set_sizes_contiguous(size);
  // The grown part only, as CPU's resize_ fills it.
  if (fills_uninitialized_memory()) at::native::fill_resize_deterministic_(self, old_nbytes);
  return self;
}

}  // namespace

c10::Allocator* tpu_allocator() { return &g_allocator; }

void register_device_once() {
  static bool done = [] {
    at::RegisterPrivateUse1HooksInterface(new TpuHooks());
    return true;
  }();
  (void)done;
}

}  // namespace dft

C10_REGISTER_GUARD_IMPL(PrivateUse1, dft::TpuGuardImpl);
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &dft::g_allocator);

namespace {
struct HooksInit {
  HooksInit() { dft::register_device_once(); }
} hooks_init;
}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(dft::empty_memory_format));
  m.impl("empty_strided", TORCH_FN(dft::empty_strided));
  m.impl("_efficientzerotensor", TORCH_FN(dft::efficient_zero_tensor));
  m.impl("resize_", TORCH_FN(dft::resize_));
  // Views only change metadata over the shared storage; the CPU implementations touch no data,
  // and kernels later address (storage, offset, strides) through dfuse_as_strided.
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
}
