// Copies between host and device and within the device, item(), fill_ and zero_.
#include "common.h"
#include "complex.h"
#include "indexed_grad.h"
#include "streams.h"
#include "observe.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/_to_copy_native.h>
#include <torch/library.h>

namespace dft {
namespace {

bool is_tpu(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

// Whether dst's storage can take an uploaded buffer as its own in place of a copy into it:
// dst is the only tensor of a storage only it holds, not yet seen by Python (the fresh result
// of `.to("tpu")`, which PyTorch makes empty and then copy_-s into), in the storage's own
// dense layout and dtype. Nothing else can see the storage change buffers (a tensor Python
// holds keeps its data_ptr() through copy_, as on CPU). The layout may be any dense one
// (`.to("tpu")` keeps a CPU tensor's strides: nonzero's result is column-major): the host
// values are laid out the same way and uploaded as they lie, as one run when dst is not
// contiguous (make_storage's handle for such a storage).
bool can_adopt_upload(const at::Tensor& dst) {
  const StorageCtx* c = find_storage_ctx(dst);
  if (c == nullptr || dst.use_count() != 1 || dst.storage().use_count() != 1 ||
      dst.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj() != nullptr ||
      dst.storage_offset() != 0 || !dst.is_non_overlapping_and_dense() ||
      c->dtype != to_dtype(dst.scalar_type()) || !recordable(dst) ||
      dst.storage().nbytes() != size_t(dst.nbytes())) {
    return false;
  }
  if (dst.is_contiguous()) return dst.sizes().equals(c->sizes) && dst.strides().equals(c->strides);
  return c->sizes.size() == 1 && c->sizes[0] == dst.numel() && c->strides[0] == 1;
}

// Uploads `src` (CPU) laid out as dst and makes the buffer dst's storage's (see above).
void adopt_upload(const at::Tensor& dst, const at::Tensor& src) {
  auto host = src.to(dst.scalar_type()).expand(dst.sizes());
  if (!host.strides().equals(dst.strides()) || !host.is_non_overlapping_and_dense()) {
    host = at::empty_strided(dst.sizes(), dst.strides(), host.options()).copy_(host);
  }
  const bool contiguous = dst.is_contiguous();
  std::vector<int64_t> sizes = contiguous ? dst.sizes().vec() : std::vector<int64_t>{dst.numel()};
  std::vector<int64_t> strides =
      contiguous ? dst.strides().vec() : std::vector<int64_t>{1};
  const uint32_t dt = to_dtype(host.scalar_type());
  uint64_t h = 0;
  check(dfuse_tensor_from_host(rt(), host.data_ptr(), host.nbytes(), dt, sizes.data(),
                               sizes.size(), &h),
        "copy_ from host");
  dst.storage().unsafeGetStorageImpl()->set_data_ptr_noswap(
      data_ptr_for(h, dt, std::move(sizes), std::move(strides)));
}

// A copy with a complex side: as float32 pairs (a real source's imaginary part zero; a complex
// source into a real destination keeps the real part, with CPU's warning). Returns false when
// neither side is complex.
bool copy_complex(const at::Tensor& dst, const at::Tensor& src) {
  if (!dst.is_complex() && !src.is_complex()) return false;
  if (dst.is_complex() && src.is_complex()) {
    auto s = src.scalar_type() == dst.scalar_type() ? src : src.to(dst.scalar_type());
    at::view_as_real(dst).copy_(pairs(s.expand(dst.sizes())));
  } else if (dst.is_complex()) {
    auto p = at::view_as_real(dst);
    p.select(-1, 0).copy_(src);
    p.select(-1, 1).zero_();
  } else {
    TORCH_WARN_ONCE("Casting complex values to real discards the imaginary part");
    dst.copy_(pairs(src).select(-1, 0));
  }
  return true;
}

// dst (tpu, any view) <- src (tpu or CPU), with PyTorch's broadcasting of src and dtype cast.
void copy_to_device(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.numel() == 0 || copy_complex(dst, src)) return;
  at::Tensor s = src;
  if (is_tpu(s) && copy_storage_bytes(dst, s)) return;
  if (!is_tpu(s) && is_byte_view(dst)) {
    // Raw storage bytes from the host: upload them as the storage's own elements.
    at::ScalarType elem;
    Ref d = byte_view_ref(dst, &elem);
    auto host = s.to(at::kByte).expand(dst.sizes()).contiguous();
    int64_t n = host.numel() / int64_t(c10::elementSize(elem));
    uint64_t h = 0;
    check(dfuse_tensor_from_host(rt(), host.data_ptr(), host.nbytes(), to_dtype(elem), &n, 1, &h),
          "copy_ of storage bytes from host");
    Ref up(h, true);
    note_op();
    note_storage_write(dst);
    copy_handle(h, d.get(), "copy_");
    return;
  }
  if (!is_tpu(s)) {
    // Upload the CPU values as one dense block of dst's dtype; the device copy then scatters
    // it into dst's layout.
    if (can_adopt_upload(dst)) {
      // The uploaded buffer becomes dst's: no device copy (a program, and in strict mode a
      // wait for the stream's worker: `.to("tpu")` of 10,000 floats took 94 us, now 5).
      adopt_upload(dst, s);
      return;
    }
    auto host = s.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
    uint64_t h = 0;
    check(dfuse_tensor_from_host(rt(), host.data_ptr(), host.nbytes(), to_dtype(host.scalar_type()),
                                 host.sizes().data(), host.dim(), &h),
          "copy_ from host");
    Ref up(h, true);
    Ref d = ref(dst);
    note_op();
    note_storage_write(dst);
    copy_handle(h, d.get(), "copy_");
    return;
  }
  if (!s.sizes().equals(dst.sizes())) s = s.expand(dst.sizes());
  // copy_ converts between any dtypes; the runtime's in-place write only takes safe casts,
  // so an unsafe one (float -> int, -> bool) is an explicit cast first.
  if (s.scalar_type() != dst.scalar_type()) s = cast(s, dst.scalar_type());
  run_into(DFUSE_OP_KIND_COPY, nullptr, Operands().t(s), dst, "copy_");
}

// dst (CPU) <- src (tpu): waits for src (a sync point), reads it row-major, then lets the CPU
// copy handle dst's dtype, layout and broadcasting.
void copy_to_host(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.numel() == 0 || copy_complex(dst, src)) return;
  at::ScalarType elem;
  // Raw storage bytes (UntypedStorage.cpu(), torch.save): read the elements as bytes.
  Ref r = is_byte_view(src) ? byte_view_ref(src, &elem) : ref(src);
  bool direct = dst.is_contiguous() && dst.scalar_type() == src.scalar_type() &&
                dst.sizes().equals(src.sizes());
  at::Tensor host = direct ? dst : at::empty(src.sizes(), src.options().device(at::kCPU));
  note_sync("copy to host");
  check(dfuse_tensor_to_host(rt(), r.get(), host.data_ptr(), host.nbytes()), "copy to host");
  if (!direct) dst.copy_(host);
}

}  // namespace

at::Tensor read_for_size(const at::Tensor& src) {
  auto host = at::empty(src.sizes(), src.options().device(at::kCPU));
  if (host.numel() == 0) return host;
  Ref r = ref(src);
  check(dfuse_tensor_to_host_for_size(rt(), r.get(), host.data_ptr(), host.nbytes()),
        "read of a data-dependent output size");
  return host;
}

namespace {

// A copy with a negative view on either side (`z.conj().imag`, torch._neg_view): PyTorch
// leaves copy_ and clone to the backend for those (they fall through its Negative dispatch
// key), and every other op's negation goes through them (its fallback clones its operands and
// copies an in-place result back), so this is where the bit becomes values, as CPU's copy
// kernel makes it: a negative source is read negated; a negative destination stores the
// negation of what it is to read (its values cast first, then negated, in its dtype).
at::Tensor& copy_negated(at::Tensor& self, const at::Tensor& src) {
  if (self.is_neg()) {
    auto stored = at::_neg_view(self);  // the same storage, read as it lies
    stored.copy_(src);
    stored.neg_();
    return self;
  }
  return self.copy_(src.resolve_neg());
}

// A copy into a conjugate view (an in-place op on `z.conj()` writes its result back through
// here): its storage takes the conjugate of the values.
at::Tensor& copy_conjugated(at::Tensor& self, const at::Tensor& src) {
  auto stored = self.conj();  // the same storage, not conjugated
  stored.copy_(src.conj());
  return self;
}

at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool) {
  TORCH_CHECK(self.defined() && src.defined(), "tpu: copy_ of an undefined tensor");
  if (self.is_neg() || src.is_neg()) return copy_negated(self, src);
  if (self.is_conj()) return copy_conjugated(self, src);
  if (is_tpu(self)) {
    copy_to_device(self, src);
  } else {
    TORCH_CHECK(self.device().is_cpu(), "tpu: copy_ between tpu and ", self.device());
    copy_to_host(self, src);
  }
  return self;
}

at::Tensor _copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor d = dst;
  copy_(d, self, non_blocking);
  return dst;
}

at::Tensor _copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (!dst.sizes().equals(self.sizes())) dst.resize_(self.sizes());
  at::Tensor d = dst;
  copy_(d, self, false);
  return dst;
}

// tpu -> tpu dtype conversion is one cast op; every other conversion (to or from the host,
// layouts) takes PyTorch's generic path (empty + copy_).
at::Tensor _to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                    std::optional<at::Layout> layout, std::optional<at::Device> device,
                    std::optional<bool> pin_memory, bool non_blocking,
                    std::optional<at::MemoryFormat> memory_format) {
  bool same_device = !device || device->type() == c10::DeviceType::PrivateUse1;
  bool plain = (!layout || *layout == at::kStrided) && !pin_memory.value_or(false) &&
               (!memory_format || *memory_format == at::MemoryFormat::Preserve ||
                *memory_format == at::MemoryFormat::Contiguous);
  // To or from complex64 (float32 pairs): empty + copy_, which writes the pairs.
  bool complex = self.is_complex() || (dtype && at::isComplexType(*dtype));
  if (is_tpu(self) && same_device && plain && dtype && *dtype != self.scalar_type() && !complex) {
    // The cast keeps a permuted input's layout (preserve_format, CPU's default);
    // memory_format=contiguous_format asks for a dense row-major result.
    auto r = cast(self, *dtype);
    if (memory_format == at::MemoryFormat::Contiguous) return r.contiguous();
    return r;
  }
  return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking,
                              memory_format);
}

at::Scalar _local_scalar_dense(const at::Tensor& self) {
  if (self.is_complex()) {
    // complex64: its pair read as two floats (a conjugate view's pair conjugated).
    auto p = pairs(self).cpu();
    return at::Scalar(c10::complex<double>(p[0].item<float>(), p[1].item<float>()));
  }
  Ref r = ref(self);
  DfuseScalar v{};
  note_sync("item");
  check(dfuse_tensor_item(rt(), r.get(), &v), "item");
  switch (v.kind) {
    case DFUSE_SCALAR_KIND_FLOAT: return at::Scalar(v.f);
    case DFUSE_SCALAR_KIND_BOOL: return at::Scalar(v.i != 0);
    default: return at::Scalar(static_cast<int64_t>(v.i));
  }
}

// The elements an expanded view (stride 0 along some dims: `x.expand(...)`) stands for, each
// once: those dims at size 1. Filling it fills every element of the view, as CPU's fill_ does
// (the runtime refuses to write through repeated elements).
at::Tensor without_expanded_dims(const at::Tensor& t) {
  std::vector<int64_t> sizes = t.sizes().vec();
  bool expanded = false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) == 0 && sizes[d] > 1) {
      sizes[d] = 1;
      expanded = true;
    }
  }
  return expanded ? t.as_strided(sizes, t.strides(), t.storage_offset()) : t;
}

at::Tensor& fill_scalar_(at::Tensor& self, const at::Scalar& value) {
  // CPU fills a one-element float16/bfloat16 tensor unchecked (1e5 becomes inf in float16:
  // torch.where(c, half, 1e5) fills such a 0-dim tensor); any other tensor must hold the value.
  if (!(is_reduced_float(self.scalar_type()) && self.numel() == 1)) {
    check_value_fits(value, self.scalar_type());
  }
  if (self.numel() == 0) return self;
  if (auto once = without_expanded_dims(self); !once.is_same(self)) {
    fill_scalar_(once, value);
    return self;
  }
  if (self.is_complex()) {
    auto v = value.toComplexDouble();
    auto p = pairs(self);
    auto re = p.select(-1, 0), im = p.select(-1, 1);
    fill_scalar_(re, v.real());
    fill_scalar_(im, v.imag());
    return self;
  }
  DfuseScalar v{};
  if (value.isBoolean()) {
    v.kind = DFUSE_SCALAR_KIND_BOOL;
    v.i = value.toBool();
  } else if (value.isIntegral(false)) {
    v.kind = DFUSE_SCALAR_KIND_INT;
    v.i = value.toLong();
  } else {
    v.kind = DFUSE_SCALAR_KIND_FLOAT;
    v.f = value.toDouble();
  }
  uint64_t h = 0;
  check(dfuse_tensor_full(rt(), current_stream(), self.sizes().data(), self.dim(), v,
                          to_dtype(self.scalar_type()), &h),
        "fill_");
  Ref full(h, true);
  Ref d = ref(self);
  note_op();
  note_storage_write(self);
  copy_handle(h, d.get(), "fill_");
  return self;
}

at::Tensor& fill_tensor_(at::Tensor& self, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "tpu: fill_ expects a 0-dim value tensor, got shape ",
              value.sizes());
  // CPU's fill_ by a tensor refuses repeated elements (its fill_ by a number takes them).
  at::assert_no_internal_overlap(self);
  if (!is_tpu(value)) return fill_scalar_(self, value.item());
  copy_to_device(self, value);
  return self;
}

at::Tensor& zero_(at::Tensor& self) { return fill_scalar_(self, at::Scalar(0)); }

// CPU's layout rules: Preserve keeps a dense input's strides (a transpose's clone is still
// transposed, a channels-last tensor's still channels-last) and otherwise takes the layout
// the input suggests; an explicit format is obeyed (`x.contiguous(memory_format=...)`).
at::Tensor clone(const at::Tensor& self, std::optional<at::MemoryFormat> mf) {
  // A negative view's clone holds its values, negated, with no bit (see copy_negated).
  if (self.is_neg()) return dft::clone(at::_neg_view(self), mf).neg_();
  auto fmt = mf.value_or(at::MemoryFormat::Preserve);
  if (self.is_complex()) {
    // The pairs' clone in the same layout, seen as complex again.
    auto p = pairs(self);
    bool dense = fmt == at::MemoryFormat::Preserve && self.is_non_overlapping_and_dense();
    auto out = dense ? at::empty_strided(self.sizes(), self.strides(), self.options())
                     : at::empty(self.sizes(), self.options().memory_format(
                           fmt == at::MemoryFormat::Preserve ? self.suggest_memory_format()
                                                             : fmt));
    at::view_as_real(out).copy_(p);
    return out;
  }
  if (self.is_contiguous() && fmt != at::MemoryFormat::ChannelsLast &&
      fmt != at::MemoryFormat::ChannelsLast3d) {
    return run(DFUSE_OP_KIND_COPY, nullptr, Operands().t(self), "clone");
  }
  at::Tensor out;
  if (fmt == at::MemoryFormat::Preserve && self.is_non_overlapping_and_dense()) {
    out = at::empty_strided(self.sizes(), self.strides(), self.options());
  } else {
    if (fmt == at::MemoryFormat::Preserve) fmt = self.suggest_memory_format();
    if (fmt == at::MemoryFormat::Contiguous) {
      return run(DFUSE_OP_KIND_COPY, nullptr, Operands().t(self), "clone");
    }
    out = at::empty(self.sizes(), self.options().memory_format(fmt));
  }
  run_into(DFUSE_OP_KIND_COPY, nullptr, Operands().t(self), out, "clone");
  return out;
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("copy_", TORCH_FN(dft::copy_));
  m.impl("_copy_from", TORCH_FN(dft::_copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(dft::_copy_from_and_resize));
  m.impl("_to_copy", TORCH_FN(dft::_to_copy));
  m.impl("_local_scalar_dense", TORCH_FN(dft::_local_scalar_dense));
  m.impl("fill_.Scalar", DFT_GROUPED(dft::fill_scalar_));
  m.impl("fill_.Tensor", DFT_GROUPED(dft::fill_tensor_));
  m.impl("zero_", TORCH_FN(dft::zero_));
  m.impl("clone", TORCH_FN(dft::clone));
}
