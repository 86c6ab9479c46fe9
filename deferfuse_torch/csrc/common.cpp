// Runtime access, mode propagation, handle <-> tensor conversion and op recording.
#include "common.h"

#include "indexed_grad.h"
#include "observe.h"
#include "streams.h"

#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/FuncTorchTLS.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/AutogradState.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <string>

namespace dft {

// memory.cpp: the live-bytes accounting behind torch.tpu.memory_allocated().
void note_storage_alloc(int64_t bytes);
void note_storage_free(int64_t bytes);

namespace {

DfuseRuntime* create_runtime() {
  DfuseRuntime* r = nullptr;
  // NULL config: the mode comes from TORCH_TPU_DEFER_AND_FUSE / TORCH_TPU_LAUNCH_BLOCKING.
  check(dfuse_runtime_create(nullptr, &r), "creating the runtime");
  return r;
}

DfuseRuntime* raw_runtime() {
  // Never destroyed: tensors may be freed during interpreter shutdown after any static
  // destructor would have run, and releasing into a live runtime is always safe.
  static DfuseRuntime* r = create_runtime();
  return r;
}

// A storage's handle is dense over its sizes (make_storage, wrap, the allocator): its bytes.
int64_t handle_bytes(const StorageCtx& c) {
  return c10::multiply_integers(c.sizes) * int64_t(c10::elementSize(from_dtype(c.dtype)));
}

std::atomic<uint32_t> g_mode{UINT32_MAX};
std::atomic<uint64_t> g_mode_gen{0};
thread_local uint64_t tl_mode_gen = 0;
thread_local bool tl_backward_on_this_thread = false;

// PyTorch's autograd engine runs the backward of a non-CPU device on a worker thread of its own
// while the caller waits, and that worker lets go of a finished graph's tensors whenever it gets
// to it, possibly after the caller's backward returned and it records the next ops. A release
// of a tensor that a deferred op writes makes that op's value dead, so whether it is written
// depended on timing: MAML's autograd.grad(create_graph=True) steps compiled 1-3 new programs
// every step in steady state (regions with and without the output). Running the backward on
// the calling thread, as PyTorch does for CPU tensors, makes each step record, release and
// plan the same way every time, saves a thread hand-off per backward, and gives CPU's
// behaviour (hooks and the errors they raise run on the caller). PyTorch keeps that choice per
// thread (torch.autograd.set_multithreading_enabled), so it is made on each thread's first
// use of the device; a user's own `set_multithreading_enabled(True)` block still takes the
// worker.
void run_backward_on_this_thread() {
  tl_backward_on_this_thread = true;
  c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
}

void delete_ctx(void* p) {
  auto* c = static_cast<StorageCtx*>(p);
  note_storage_free(handle_bytes(*c));
  // A failure here (e.g. the handle is already gone) must not throw out of a deleter.
  dfuse_tensor_release(raw_runtime(), c->handle);
  delete c;
}

c10::DataPtr make_data_ptr(uint64_t handle, uint32_t dtype, DimVec sizes, DimVec strides) {
  auto* ctx = new StorageCtx{handle, dtype, std::move(sizes), std::move(strides)};
  note_storage_alloc(handle_bytes(*ctx));
  return c10::DataPtr(reinterpret_cast<void*>(handle), ctx, &delete_ctx,
                      c10::Device(c10::DeviceType::PrivateUse1, 0));
}

DimVec dense_strides(at::IntArrayRef sizes) {
  DimVec st(sizes.size());
  int64_t acc = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(sizes[i], 1);
  }
  return st;
}

// A Python number PyTorch wrapped as a 0-dim CPU tensor, read from its one element: x.item()
// goes through the dispatcher (two op calls) for what is one load, on every `x + 1`.
at::Scalar wrapped_value(const at::Tensor& x) {
  const void* p = x.const_data_ptr();
  switch (x.scalar_type()) {
    case at::kDouble: return at::Scalar(*static_cast<const double*>(p));
    case at::kLong: return at::Scalar(*static_cast<const int64_t*>(p));
    case at::kBool: return at::Scalar(*static_cast<const bool*>(p));
    default: return x.item();  // complex: Operands::s reports it
  }
}

}  // namespace

extern c10::Allocator* tpu_allocator();

DfuseRuntime* rt() {
  DfuseRuntime* r = raw_runtime();
  if (!tl_backward_on_this_thread) run_backward_on_this_thread();
  uint64_t gen = g_mode_gen.load(std::memory_order_acquire);
  if (tl_mode_gen != gen) {
    check(dfuse_mode_set(r, g_mode.load(std::memory_order_acquire)), "setting the mode");
    tl_mode_gen = gen;
  }
  return r;
}

uint32_t get_mode() {
  uint32_t m = g_mode.load();
  if (m == UINT32_MAX) check(dfuse_mode_get(raw_runtime(), &m), "reading the mode");
  return m;
}

uint32_t set_mode(uint32_t mode) {
  TORCH_CHECK(mode <= DFUSE_MODE_DEFER, "tpu: unknown mode ", mode,
              "; expected 0 (strict), 1 (debug) or 2 (defer)");
  uint32_t prev = get_mode();
  g_mode.store(mode, std::memory_order_release);
  g_mode_gen.fetch_add(1, std::memory_order_acq_rel);
  rt();  // apply it to this thread now, so pending work is flushed at the right op
  return prev;
}

void check(DfuseStatus s, const char* what) {
  if (s != DFUSE_STATUS_OK) {
    // Copy first: the string lives only until the next dfuse_* call on this thread.
    std::string msg = dfuse_last_error();
    // Python sees torch.OutOfMemoryError, as with CUDA, so `except torch.OutOfMemoryError`
    // (e.g. a batch-size search) works on tpu too.
    TORCH_CHECK_WITH(OutOfMemoryError, s != DFUSE_STATUS_OUT_OF_MEMORY, "deferfuse (", what,
                     "): ", msg);
    TORCH_CHECK(false, "deferfuse (", what, "): ", msg);
  }
}

void copy_handle(uint64_t src, uint64_t dst, const char* what) {
  DfuseOperand in{};
  in.kind = DFUSE_OPERAND_KIND_TENSOR;
  in.tensor = src;
  uint64_t res = 0;
  check(dfuse_op(rt(), current_stream(), DFUSE_OP_KIND_COPY, nullptr, &in, 1, dst, &res), what);
}

OpGroup::OpGroup() {
  if (get_mode() != DFUSE_MODE_STRICT) return;
  check(dfuse_op_group_begin(rt()), "opening an op group");
  open_ = true;
}

void OpGroup::end() {
  if (!open_) return;
  open_ = false;
  check(dfuse_op_group_end(raw_runtime(), current_stream()), "running an op's group");
}

OpGroup::~OpGroup() {
  if (open_) dfuse_op_group_end(raw_runtime(), current_stream());
}

Ref::~Ref() {
  if (owned_) dfuse_tensor_release(raw_runtime(), h_);
}

Ref& Ref::operator=(Ref&& o) noexcept {
  if (this != &o) {
    if (owned_) dfuse_tensor_release(raw_runtime(), h_);
    h_ = o.h_;
    owned_ = o.owned_;
    o.owned_ = false;
  }
  return *this;
}

void check_value_fits(const at::Scalar& value, at::ScalarType dtype) {
  if (at::isComplexType(dtype)) return;
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, dtype, "fill_", [&] {
    (void)value.to<scalar_t>();
  });
}

uint32_t to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DFUSE_DTYPE_F32;
    case at::kDouble: return DFUSE_DTYPE_F64;
    case at::kHalf: return DFUSE_DTYPE_F16;
    case at::kBFloat16: return DFUSE_DTYPE_BF16;
    case at::kInt: return DFUSE_DTYPE_I32;
    case at::kLong: return DFUSE_DTYPE_I64;
    case at::kByte: return DFUSE_DTYPE_U8;
    case at::kBool: return DFUSE_DTYPE_BOOL;
    case at::kComplexFloat:
      TORCH_CHECK(false, "tpu: this op does not take complex64 tensors on tpu (",
                  kComplex64Supports, "); compute it on the CPU");
    default:
      TORCH_CHECK(false, "tpu: dtype ", t, " is not supported by deferfuse (supported: float32, "
                  "float64, float16, bfloat16, int32, int64, uint8, bool, and complex64 for a "
                  "few ops)");
  }
}

at::ScalarType from_dtype(uint32_t d) {
  static const at::ScalarType map[] = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                       at::kInt,   at::kLong,   at::kByte, at::kBool};
  TORCH_CHECK(d < 8, "tpu: the runtime returned unknown dtype ", d);
  return map[d];
}

StorageCtx* find_storage_ctx(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1 || !t.has_storage()) {
    return nullptr;
  }
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &delete_ctx) return nullptr;
  return static_cast<StorageCtx*>(dp.get_context());
}

const StorageCtx& storage_ctx(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1,
              "tpu: expected a tensor on device tpu, got one on ", t.device());
  const c10::DataPtr& dp = t.storage().data_ptr();
  TORCH_CHECK(dp.get_deleter() == &delete_ctx && dp.get_context() != nullptr,
              "tpu: this tensor's storage was not created by the tpu device. pickle.dumps of a "
              "tpu tensor and torch.save(..., _use_new_zipfile_serialization=False) make such a "
              "tensor from a storage's pointer, which tpu cannot read back: pickle t.cpu(), or "
              "use torch.save's default format (torch.load(..., map_location=\"tpu\") brings "
              "it back)");
  return *static_cast<const StorageCtx*>(dp.get_context());
}

bool recordable(const at::Tensor& t) {
  auto keys = t.key_set();
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 &&
         !keys.has(c10::DispatchKey::Python) && !keys.has(c10::DispatchKey::Functionalize);
}

Ref ref(const at::Tensor& t) {
  const StorageCtx* cp = &storage_ctx(t);
  if (cp->dtype != to_dtype(t.scalar_type())) {
    retype_byte_storage(t);
    cp = &storage_ctx(t);  // the storage has a new context now
  }
  const StorageCtx& c = *cp;
  if (t.storage_offset() == 0 && t.sizes().equals(c.sizes) && t.strides().equals(c.strides)) {
    return Ref(c.handle, false);
  }
  uint64_t h = 0;
  check(dfuse_as_strided(rt(), c.handle, t.sizes().data(), t.strides().data(), t.dim(),
                         t.storage_offset(), &h),
        "as_strided view of an operand");
  return Ref(h, true);
}

c10::Storage make_storage(at::ScalarType dtype, at::IntArrayRef sizes, at::IntArrayRef strides,
                          size_t nbytes) {
  if (dtype == at::kComplexFloat) {
    // complex64 is held as float32 pairs (complex.cpp): a flat float32 storage, which the
    // pairs' views (view_as_real) read.
    int64_t n = int64_t(nbytes / sizeof(float));
    uint64_t h = 0;
    check(dfuse_tensor_empty(rt(), DFUSE_DTYPE_F32, &n, 1, &h), "allocating a tensor");
    return c10::Storage(c10::Storage::use_byte_size_t(), nbytes,
                        make_data_ptr(h, DFUSE_DTYPE_F32, DimVec{n}, DimVec{1}), tpu_allocator(),
                        /*resizable=*/true);
  }
  uint32_t dt = to_dtype(dtype);
  size_t item = c10::elementSize(dtype);
  auto cont = dense_strides(sizes);
  bool dense = strides.equals(cont) &&
               static_cast<size_t>(c10::multiply_integers(sizes)) * item == nbytes;
  DimVec hs = dense ? DimVec(sizes.begin(), sizes.end()) : DimVec{int64_t(nbytes / item)};
  DimVec hst = dense ? cont : DimVec{1};
  uint64_t h = 0;
  check(dfuse_tensor_empty(rt(), dt, hs.data(), hs.size(), &h), "allocating a tensor");
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes,
                      make_data_ptr(h, dt, std::move(hs), std::move(hst)), tpu_allocator(),
                      /*resizable=*/true);
}

c10::DataPtr data_ptr_for(uint64_t handle, uint32_t dtype, std::vector<int64_t> sizes,
                          std::vector<int64_t> strides) {
  return make_data_ptr(handle, dtype, DimVec(sizes.begin(), sizes.end()),
                       DimVec(strides.begin(), strides.end()));
}

namespace {

// Wraps handle h (taking over its one reference) as a tpu tensor of dtype `dt` and `sizes`
// (dense), as the runtime described it.
at::Tensor wrap_described(uint64_t h, uint32_t dt, DimVec sizes) {
  at::ScalarType st = from_dtype(dt);
  auto strides = dense_strides(sizes);
  size_t nbytes = static_cast<size_t>(c10::multiply_integers(sizes)) * c10::elementSize(st);
  c10::DataPtr dp = make_data_ptr(h, dt, std::move(sizes), std::move(strides));
  // The context now owns the dims; the tensor's sizes are read from there.
  at::IntArrayRef shape = static_cast<const StorageCtx*>(dp.get_context())->sizes;
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(dp), tpu_allocator(),
                       true);
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      caffe2::TypeMeta::fromScalarType(st));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  return t;
}

}  // namespace

at::Tensor wrap(uint64_t h) {
  // Take ownership first so an error below still releases the handle.
  uint32_t dt = 0;
  size_t nd = 0;
  DfuseRuntime* r = raw_runtime();
  auto fail = [&](DfuseStatus s, const char* what) {
    if (s != DFUSE_STATUS_OK) {
      std::string msg = dfuse_last_error();
      dfuse_tensor_release(r, h);
      TORCH_CHECK(false, "deferfuse (", what, "): ", msg);
    }
  };
  // One call for dtype, rank and sizes (rank <= kInlineDims, nearly always); a larger rank
  // asks again with room for it.
  DimVec sizes(kInlineDims);
  fail(dfuse_tensor_meta(r, h, &dt, sizes.data(), sizes.size(), &nd), "result dtype and shape");
  if (nd > sizes.size()) {
    sizes.resize(nd);
    fail(dfuse_tensor_shape(r, h, sizes.data(), nd), "result shape");
  }
  sizes.resize(nd);
  return wrap_described(h, dt, std::move(sizes));
}

Operands& Operands::t(const at::Tensor& x) {
  return add(c10::MaybeOwned<at::Tensor>::borrowed(x));
}

Operands& Operands::t(at::Tensor&& x) {
  return add(c10::MaybeOwned<at::Tensor>::owned(std::move(x)));
}

Operands& Operands::add(c10::MaybeOwned<at::Tensor> kept) {
  {
    const at::Tensor& x = *kept;
    TORCH_CHECK(x.defined(), "tpu: an operand is an undefined tensor");
    if (x.device().is_cpu()) {
      TORCH_CHECK(x.dim() == 0, "tpu: expected all tensors on device tpu, got a CPU tensor of "
                  "shape ", x.sizes(), " (only 0-dim CPU tensors may mix with tpu tensors)");
      if (x.unsafeGetTensorImpl()->is_wrapped_number()) return s(wrapped_value(x));
    }
  }
  tensors_.emplace_back(ops_.size(), std::move(kept));
  const at::Tensor& x = *tensors_.back().second;
  if (x.device().is_cpu()) {
    auto c = x.contiguous();
    uint64_t h = 0;
    check(dfuse_tensor_from_host(rt(), c.data_ptr(), c.nbytes(), to_dtype(c.scalar_type()),
                                 nullptr, 0, &h),
          "uploading a 0-dim CPU operand");
    keep_.emplace_back(h, true);
  } else {
    keep_.push_back(ref(x));
    const int64_t item = int64_t(x.itemsize());
    Footprint f{x.storage(), x.storage_offset() * item, x.storage_offset() * item,
                x.is_non_overlapping_and_dense(), DimVec(x.strides().begin(), x.strides().end())};
    if (x.numel() > 0) f.end += x.numel() * item;
    tpu_.push_back(std::move(f));
  }
  DfuseOperand o{};
  o.kind = DFUSE_OPERAND_KIND_TENSOR;
  o.tensor = keep_.back().get();
  ops_.push_back(o);
  return *this;
}

Operands& Operands::s(const at::Scalar& v) {
  DfuseOperand o{};
  if (v.isBoolean()) {
    o.kind = DFUSE_OPERAND_KIND_BOOL;
    o.i = v.toBool();
  } else if (v.isIntegral(false)) {
    o.kind = DFUSE_OPERAND_KIND_INT;
    o.i = v.toLong();
  } else {
    TORCH_CHECK(v.isFloatingPoint(), "tpu: complex scalars are not supported");
    o.kind = DFUSE_OPERAND_KIND_FLOAT;
    o.f = v.toDouble();
  }
  ops_.push_back(o);
  return *this;
}

Operands& Operands::f(double v) { return s(at::Scalar(v)); }

DimVec Operands::result_shape() const {
  DimVec shape;
  for (const auto& [i, x] : tensors_) {
    if (x->dim() > 0) shape = DimVec(at::infer_size(shape, x->sizes()));
  }
  return shape;
}

DimVec Operands::result_order() const {
  bool all_contiguous = true;
  for (const auto& [i, x] : tensors_) all_contiguous = all_contiguous && x->is_contiguous();
  if (all_contiguous) return {};
  const DimVec shape = result_shape();
  const int64_t nd = int64_t(shape.size());
  if (nd < 2) return {};
  // Each operand's strides over the result's dims: 0 where it is broadcast (TensorIterator's
  // compute_strides).
  c10::SmallVector<DimVec, kInline> strides;
  for (const auto& [i, xp] : tensors_) {
    const at::Tensor& x = *xp;
    if (x.dim() == 0) continue;
    DimVec st(nd, 0);
    const int64_t off = nd - x.dim();
    for (int64_t d = 0; d < x.dim(); ++d) {
      st[off + d] = (x.size(d) == 1 && shape[off + d] != 1) ? 0 : x.stride(d);
    }
    strides.push_back(std::move(st));
  }
  // TensorIterator's reorder_dimensions: perm[0] the fastest dim, an insertion sort where the
  // first operand that orders two dims (neither broadcast, strides unequal, or equal strides
  // with the first dim larger) decides.
  auto should_swap = [&](int64_t d0, int64_t d1) {
    for (const auto& st : strides) {
      int64_t s0 = st[d0], s1 = st[d1];
      if (s0 == 0 || s1 == 0) continue;
      if (s0 < s1) return -1;
      if (s0 > s1) return 1;
      if (shape[d0] > shape[d1]) return 1;
    }
    return 0;
  };
  DimVec perm(nd);
  for (int64_t d = 0; d < nd; ++d) perm[d] = nd - 1 - d;
  for (int64_t i = 1; i < nd; ++i) {
    int64_t d1 = i;
    for (int64_t d0 = i - 1; d0 >= 0; --d0) {
      int c = should_swap(perm[d0], perm[d1]);
      if (c > 0) {
        std::swap(perm[d0], perm[d1]);
        d1 = d0;
      } else if (c < 0) {
        break;
      }
    }
  }
  DimVec order(perm.rbegin(), perm.rend());
  for (int64_t d = 0; d < nd; ++d) {
    if (order[d] != d) return order;
  }
  return {};
}

Operands Operands::permuted(at::IntArrayRef order) const {
  const DimVec shape = result_shape();
  Operands p;
  size_t next = 0;
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (next < tensors_.size() && tensors_[next].first == i) {
      const at::Tensor& x = *tensors_[next++].second;
      if (x.dim() == 0) {
        p.t(x);
      } else {
        p.t((x.sizes().equals(shape) ? x : x.expand(shape)).permute(order));
      }
    } else {
      p.ops_.push_back(ops_[i]);
    }
  }
  return p;
}

Operands& Operands::absent() {
  DfuseOperand o{};
  o.kind = DFUSE_OPERAND_KIND_ABSENT;
  ops_.push_back(o);
  return *this;
}

DfuseAttrs attrs_sub(uint32_t sub_op) {
  DfuseAttrs a{};
  a.sub_op = sub_op;
  return a;
}

namespace {

at::Tensor run_as_given(uint32_t kind, const DfuseAttrs* attrs, const Operands& in,
                        const char* name) {
  uint64_t h = 0;
  uint32_t dt = 0;
  size_t nd = 0;
  DimVec sizes(kInlineDims);
  note_op();
  // The result described in the same call (dfuse_tensor_meta was a second runtime and handle
  // lookup per op); a rank past kInlineDims is wrapped the long way.
  check(dfuse_op_meta(rt(), current_stream(), kind, attrs, in.data(), in.size(), 0, &h, &dt,
                      sizes.data(), sizes.size(), &nd),
        name);
  if (nd > sizes.size()) return wrap(h);
  sizes.resize(nd);
  return wrap_described(h, dt, std::move(sizes));
}

// Whether an op kind's result takes its operands' layout, as a TensorIterator op's does.
bool keeps_operand_layout(uint32_t kind) {
  return kind == DFUSE_OP_KIND_UNARY || kind == DFUSE_OP_KIND_BINARY ||
         kind == DFUSE_OP_KIND_WHERE || kind == DFUSE_OP_KIND_CLAMP || kind == DFUSE_OP_KIND_CAST;
}

}  // namespace

// An elementwise result on permuted operands (`x.t() * 2`, `x.t().to(torch.bfloat16)`, a
// channels-last activation) has CPU's strides: the op runs on the operands permuted into the
// result's memory order (a dense result in that order), and the result is permuted back. A
// dense result instead made `.view()` raise where CPU's works, and broke torch.compile graphs
// whose traced strides are CPU's (a TransformerEncoderLayer under autocast).
at::Tensor run(uint32_t kind, const DfuseAttrs* attrs, const Operands& in, const char* name) {
  if (keeps_operand_layout(kind)) {
    auto order = in.result_order();
    if (!order.empty()) {
      auto r = run_as_given(kind, attrs, in.permuted(order), name);
      DimVec inverse(order.size());
      for (size_t d = 0; d < order.size(); ++d) inverse[order[d]] = int64_t(d);
      return r.permute(inverse);
    }
  }
  return run_as_given(kind, attrs, in, name);
}

namespace {

// at::assert_no_partial_overlap(out, input) from the input's footprint, by PyTorch's rule
// (get_overlap_status): an input of out's storage spanning part of out's bytes, or all of
// them in other strides, is a partial overlap; empty or not-dense tensors are not checked.
void assert_no_partial_overlap(const at::Tensor& out, const Footprint& in) {
  if (out.numel() == 0 || in.begin == in.end || !out.is_non_overlapping_and_dense() ||
      !in.dense || !out.storage().is_alias_of(in.storage)) {
    return;
  }
  const int64_t item = int64_t(out.itemsize());
  const int64_t begin = out.storage_offset() * item, end = begin + out.numel() * item;
  bool partial = (begin == in.begin && end == in.end) ? !out.strides().equals(in.strides)
                                                      : (begin < in.end && in.begin < end);
  TORCH_CHECK(!partial, "unsupported operation: some elements of the input tensor and the "
              "written-to tensor refer to a single memory location. Please clone() the tensor "
              "before performing the operation.");
}

}  // namespace

void run_into(uint32_t kind, const DfuseAttrs* attrs, const Operands& in, const at::Tensor& out,
              const char* name) {
  for (const auto& f : in.tpu_footprints()) assert_no_partial_overlap(out, f);
  run_into_from_old_values(kind, attrs, in, out, name);
}

void run_into_from_old_values(uint32_t kind, const DfuseAttrs* attrs, const Operands& in,
                              const at::Tensor& out, const char* name) {
  note_storage_write(out);
  Ref o = ref(out);
  uint64_t h = 0;
  note_op();
  check(dfuse_op(rt(), current_stream(), kind, attrs, in.data(), in.size(), o.get(), &h), name);
}

at::Tensor unary(const at::Tensor& x, uint32_t op) {
  auto a = attrs_sub(op);
  return run(DFUSE_OP_KIND_UNARY, &a, Operands().t(x), "unary op");
}

at::Tensor binary(const at::Tensor& x, const at::Tensor& y, uint32_t op) {
  auto a = attrs_sub(op);
  return run(DFUSE_OP_KIND_BINARY, &a, Operands().t(x).t(y), "binary op");
}

at::Tensor binary(const at::Tensor& x, const at::Scalar& y, uint32_t op) {
  auto a = attrs_sub(op);
  return run(DFUSE_OP_KIND_BINARY, &a, Operands().t(x).s(y), "binary op");
}

at::Tensor binary(const at::Scalar& x, const at::Tensor& y, uint32_t op) {
  auto a = attrs_sub(op);
  return run(DFUSE_OP_KIND_BINARY, &a, Operands().s(x).t(y), "binary op");
}

namespace {

// One binary op serves `s - t` where ATen's form would reach this device's kernels anyway: a
// float32/float64 tpu tensor, below autograd (a backward formula, a kernel). Above it (a
// composite registered for AutogradPrivateUse1) ATen's form keeps the gradient graph.
bool scalar_first_is_one_op(const at::Tensor& t) {
  return (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble) &&
         t.is_privateuseone() &&
         c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::AutogradFunctionality);
}

}  // namespace

at::Tensor operator-(double s, const at::Tensor& t) {
  if (scalar_first_is_one_op(t)) return binary(at::Scalar(s), t, DFUSE_BINARY_OP_SUB);
  return at::empty_like(t, at::MemoryFormat::Preserve).fill_(s).sub_(t);
}

at::Tensor operator/(double s, const at::Tensor& t) {
  if (scalar_first_is_one_op(t)) return binary(at::Scalar(s), t, DFUSE_BINARY_OP_DIV);
  return at::empty_like(t, at::MemoryFormat::Preserve).fill_(s).div_(t);
}

at::Tensor reduce(const at::Tensor& x, uint32_t op, at::IntArrayRef dims, bool keepdim) {
  TORCH_CHECK(dims.size() <= DFUSE_MAX_REDUCE_DIMS, "tpu: a reduction over ", dims.size(),
              " dims; at most ", DFUSE_MAX_REDUCE_DIMS, " are supported");
  // CPU's IndexError for a dim out of range (the runtime's check raises RuntimeError).
  for (auto d : dims) at::maybe_wrap_dim(d, x.dim());
  DfuseAttrs a = attrs_sub(op);
  for (size_t i = 0; i < dims.size(); ++i) a.dims[i] = dims[i];
  a.n_dims = dims.size();
  a.keepdim = keepdim;
  return run(DFUSE_OP_KIND_REDUCE, &a, Operands().t(x), "reduction");
}

at::Tensor reduce_but_channels(const at::Tensor& t, uint32_t op) {
  std::vector<int64_t> dims{0};
  for (int64_t i = 2; i < t.dim(); ++i) dims.push_back(i);
  return reduce(t, op, dims, false);
}

at::Tensor cast(const at::Tensor& x, at::ScalarType to) {
  if (x.scalar_type() == to) return x;
  DfuseAttrs a{};
  a.dtype = to_dtype(to);
  return run(DFUSE_OP_KIND_CAST, &a, Operands().t(x), "cast");
}

at::Tensor wide_matmul(const at::Tensor& a, const at::Tensor& b) {
  return run(DFUSE_OP_KIND_WIDE_MATMUL, nullptr, Operands().t(a).t(b), "wide_matmul");
}

bool is_reduced_float(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

void check_float_kernel(at::ScalarType t, const char* kernel) {
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(t) || at::isComplexType(t), "\"", kernel,
                              "\" not implemented for '", c10::toString(t), "'");
}

at::ScalarType float_dtype(const at::Tensor& x) {
  return x.is_floating_point() ? x.scalar_type() : at::get_default_dtype_as_scalartype();
}

at::Tensor opmath(const at::Tensor& x) {
  return is_reduced_float(x.scalar_type()) ? cast(x, at::kFloat) : x;
}

std::optional<at::Tensor> opmath(const std::optional<at::Tensor>& x) {
  if (!x || !x->defined()) return x;
  return opmath(*x);
}

at::Tensor where(const at::Tensor& c, const at::Tensor& x, const at::Scalar& y) {
  return run(DFUSE_OP_KIND_WHERE, nullptr, Operands().t(c).t(x).s(y), "where");
}

bool under_functorch_transform() {
  const auto& tls = at::functorch::functorchTLSAccessor();
  if (!tls) return false;
  try {
    tls->checkSupportsCppAutogradFunction();
    return false;
  } catch (const c10::Error&) {
    return true;
  }
}

}  // namespace dft
