// Storage-level operations: set_ (tensors re-pointed at a storage, which torch.save/load and
// storage copies use) and byte views of typed storages (UntypedStorage.cpu() and friends view
// any storage as uint8; deferfuse buffers are typed, so such a view is translated back into a
// range of the buffer's own elements).
#include "common.h"
#include "indexed_grad.h"
#include "observe.h"

#include <ATen/EmptyTensor.h>
#include <torch/library.h>

namespace dft {

bool is_byte_view(const at::Tensor& t) {
  return t.scalar_type() == at::kByte && storage_ctx(t).dtype != DFUSE_DTYPE_U8;
}

Ref byte_view_ref(const at::Tensor& t, at::ScalarType* elem) {
  const StorageCtx& c = storage_ctx(t);
  *elem = from_dtype(c.dtype);
  int64_t item = static_cast<int64_t>(c10::elementSize(*elem));
  TORCH_CHECK(t.is_contiguous() && t.storage_offset() % item == 0 && t.numel() % item == 0,
              "tpu: a uint8 view of a ", *elem, " storage must cover whole elements contiguously "
              "(offset ", t.storage_offset(), ", ", t.numel(), " bytes)");
  int64_t n = t.numel() / item, one = 1;
  uint64_t h = 0;
  check(dfuse_as_strided(rt(), c.handle, &n, &one, 1, t.storage_offset() / item, &h),
        "byte view of a storage");
  return Ref(h, true);
}

// Gives t's storage a new buffer of `to` elements. keep_bytes: the old bytes carry over through
// the host (a sync point, once per storage: the runtime has no bit-cast); otherwise the buffer
// starts empty, for a caller about to overwrite all of it.
void retype_storage(const at::Tensor& t, at::ScalarType to, bool keep_bytes) {
  const StorageCtx& c = storage_ctx(t);
  size_t item = c10::elementSize(to), nbytes = t.storage().nbytes();
  TORCH_CHECK(c.dtype == DFUSE_DTYPE_U8 && nbytes % item == 0, "tpu: a ", t.scalar_type(),
              " tensor views a storage of ", nbytes, " bytes of another dtype; reinterpreting "
              "views (Tensor.view(dtype)) are not supported on tpu");
  int64_t n = static_cast<int64_t>(nbytes / item);
  uint64_t h = 0;
  if (keep_bytes) {
    std::vector<uint8_t> bytes(nbytes);
    check(dfuse_tensor_to_host(rt(), c.handle, bytes.data(), nbytes), "retyping a storage");
    check(dfuse_tensor_from_host(rt(), bytes.data(), nbytes, to_dtype(to), &n, 1, &h),
          "retyping a storage");
  } else {
    check(dfuse_tensor_empty(rt(), to_dtype(to), &n, 1, &h), "retyping a storage");
  }
  t.storage().unsafeGetStorageImpl()->set_data_ptr_noswap(data_ptr_for(h, to_dtype(to), {n}, {1}));
}

void retype_byte_storage(const at::Tensor& t) { retype_storage(t, t.scalar_type(), true); }

bool copy_storage_bytes(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.scalar_type() != at::kByte || !is_byte_view(src)) return false;
  TORCH_CHECK(dst.sizes().equals(src.sizes()), "tpu: copy_ of storage bytes: ", src.sizes(),
              " bytes into ", dst.sizes(), " (storage copies do not broadcast)");
  at::ScalarType elem, dst_elem;
  Ref s = byte_view_ref(src, &elem);
  if (storage_ctx(dst).dtype == DFUSE_DTYPE_U8) {
    // A raw byte storage (a new UntypedStorage: UntypedStorage.clone, copy.deepcopy) takes the
    // source's element type, the only one its bytes can be read back as.
    bool whole = dst.storage_offset() == 0 && size_t(dst.numel()) == dst.storage().nbytes();
    retype_storage(dst, elem, !whole);
  }
  Ref d = byte_view_ref(dst, &dst_elem);
  TORCH_CHECK(dst_elem == elem, "tpu: copy_ of the bytes of a ", elem, " storage into a ",
              dst_elem, " storage would reinterpret them, which tpu does not support; copy "
              "the tensors (dst.copy_(src)) instead of their storages");
  note_op();
  note_storage_write(dst);
  copy_handle(s.get(), d.get(), "copy_ of storage bytes");
  return true;
}

namespace {

at::Tensor& set_storage_offset(at::Tensor& self, at::Storage source, int64_t offset,
                               at::IntArrayRef size, at::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == c10::DeviceType::PrivateUse1,
              "tpu: set_ with a storage on ", source.device());
  TORCH_CHECK(offset >= 0, "tpu: set_: negative storage offset ", offset);
  size_t need = at::detail::computeStorageNbytes(size, stride, self.element_size(),
                                                 offset);
  TORCH_CHECK(need <= source.nbytes(), "tpu: set_: a view of ", need,
              " bytes does not fit a storage of ", source.nbytes(), " bytes");
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(offset);
  impl->set_sizes_and_strides(size, stride);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.element_size());
  return set_storage_offset(self, std::move(source), 0, {n}, {1});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& src) {
  return set_storage_offset(self, src.storage(), src.storage_offset(), src.sizes(),
                            src.strides());
}

// Whether self is a view of exactly src (same storage, offset, sizes, strides), as CPU
// answers it; on the CPU fallback it compared the two host copies' storages, always false.
bool is_set_to(const at::Tensor& self, const at::Tensor& src) {
  return self.storage().unsafeGetStorageImpl() == src.storage().unsafeGetStorageImpl() &&
         self.storage_offset() == src.storage_offset() && self.sizes().equals(src.sizes()) &&
         self.strides().equals(src.strides());
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("is_set_to", TORCH_FN(dft::is_set_to));
  m.impl("set_.source_Storage", TORCH_FN(dft::set_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(dft::set_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(dft::set_tensor));
}
