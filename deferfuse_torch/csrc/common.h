// Shared plumbing of the "tpu" device: the one deferfuse runtime, error checks that turn a
// runtime failure into a Python RuntimeError with the runtime's own message, tensor <-> handle
// conversion, and the helpers every kernel file uses to record an op.
//
// A tpu tensor's storage DataPtr holds a deferfuse handle (data = the handle value, ctx = a
// StorageCtx describing the layout that handle was created with). Views never get their own
// handle from PyTorch: a kernel asks for a handle of exactly (sizes, strides, storage_offset)
// with dfuse_as_strided on the storage's handle, so every alias reads and writes one buffer.
#pragma once

#include <c10/util/MaybeOwned.h>
#include <ATen/ATen.h>
#include <ATen/core/stack.h>
#include <ATen/native/Resize.h>
#include <c10/core/Allocator.h>
#include <c10/util/SmallVector.h>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

extern "C" {
#include "deferfuse.h"
}

namespace c10 {
class OperatorHandle;
}  // namespace c10

namespace dft {

// The process's runtime (created on first use with the mode from the TORCH_TPU_* variables).
// Every call also applies the process-wide mode to the calling thread (deferfuse's mode is per
// thread, and a backward may run on autograd's device thread, so a mode chosen in Python must
// follow the work there), and on a thread's first call makes its tpu backwards run on it.
DfuseRuntime* rt();

// The process-wide mode (a DfuseMode); set_mode returns the previous one.
uint32_t get_mode();
uint32_t set_mode(uint32_t mode);

// Raises a RuntimeError carrying dfuse_last_error() when `s` is not OK.
void check(DfuseStatus s, const char* what);

// Records a copy of the tensor handle `src` into the tensor handle `dst` (written in place, in
// dst's layout) on the current stream; `what` names the caller in its error.
void copy_handle(uint64_t src, uint64_t dst, const char* what);

// Dims kept inline: a layout of up to this many dims costs no heap allocation (every op's
// result makes one StorageCtx and every call one Operands, so heap vectors there were a
// malloc/free pair each, several per op).
constexpr size_t kInlineDims = 6;
using DimVec = c10::SmallVector<int64_t, kInlineDims>;

struct IndexedGrad;  // indexed_grad.cpp

// The layout the storage's handle was created with: a handle whose tensor matches it exactly
// is used as is, saving an as_strided call per operand.
struct StorageCtx {
  uint64_t handle;
  uint32_t dtype;
  DimVec sizes;
  DimVec strides;
  // Set on the result of select_backward / slice_backward only: which view of these zeros
  // holds the gradient, so that adding it touches that view alone (indexed_grad.h).
  std::shared_ptr<const IndexedGrad> indexed_grad;
  // Writes into the storage so far (note_storage_write), including those no version counter
  // sees (`x.data.copy_(...)`): kept convolution columns of x are x's only while it is
  // unchanged.
  uint64_t writes = 0;
};

// A handle for one kernel operand: borrowed (the storage's own) or owned (a view made for this
// call, released when the Ref dies).
class Ref {
 public:
  Ref() = default;
  Ref(uint64_t h, bool owned) : h_(h), owned_(owned) {}
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  Ref(Ref&& o) noexcept : h_(o.h_), owned_(o.owned_) { o.owned_ = false; }
  // Operands keeps its Refs in a SmallVector, whose move assigns element by element.
  Ref& operator=(Ref&& o) noexcept;
  ~Ref();
  uint64_t get() const { return h_; }

 private:
  uint64_t h_ = 0;
  bool owned_ = false;
};

// What complex64 (float32 pairs, complex.cpp) supports on tpu, for the errors of the ops that
// refuse it: one list, kept with the ops it names.
inline constexpr char kComplex64Supports[] =
    "complex64 supports copies, views, add, sub, mul, div, ==, !=, where, neg, abs, sgn, exp, "
    "conj, polar, sum, mean, cat, flip and matrix products";

// CPU's check that a fill value fits `dtype` (fill_, masked_fill, index_fill): its own
// conversion, which raises "value cannot be converted to type ... without overflow" (300 into
// uint8, inf into int32); the device would wrap or saturate it.
void check_value_fits(const at::Scalar& value, at::ScalarType dtype);

uint32_t to_dtype(at::ScalarType t);
at::ScalarType from_dtype(uint32_t d);

// The storage's context; raises a clear error for a tensor that is not on the tpu device.
const StorageCtx& storage_ctx(const at::Tensor& t);
// The same, or nullptr where t is not a tpu tensor with a storage of this device's making.
StorageCtx* find_storage_ctx(const at::Tensor& t);

// A handle addressing exactly t's elements (storage + storage_offset + strides).
Ref ref(const at::Tensor& t);

// Whether a kernel may record ops on t itself, below the dispatcher: a tpu tensor that is not
// one of the fake or functional tensors torch.compile traces with (those must reach the
// dispatcher, op by op, to be traced).
bool recordable(const at::Tensor& t);

// Wraps a new handle (this function takes over its one reference) as a tpu tensor.
at::Tensor wrap(uint64_t handle);

// A storage DataPtr owning `handle` (one reference), laid out as `sizes` and `strides`.
c10::DataPtr data_ptr_for(uint64_t handle, uint32_t dtype, std::vector<int64_t> sizes,
                          std::vector<int64_t> strides);

// A new storage of `nbytes`-worth of elements of `dtype` laid out as `sizes`, empty.
c10::Storage make_storage(at::ScalarType dtype, at::IntArrayRef sizes, at::IntArrayRef strides,
                          size_t nbytes);

// Where a tpu operand lies in its storage: what run_into's overlap check needs of it. Holding
// the storage (not the tensor) keeps a borrowed handle alive: a tensor copy would cost, for a
// tensor only Python held, a GIL round trip to incref its Python object (PyTorch does that
// when a C++ reference joins Python's), two per operand, ~6% of a tiny op's instructions.
struct Footprint {
  c10::Storage storage;
  int64_t begin = 0, end = 0;  // bytes; begin == end for an empty tensor
  bool dense = false;          // non-overlapping and dense (else PyTorch's check gives up)
  DimVec strides;
};

// Operands of one dfuse_op call, keeping the handles they name alive until the call is done.
class Operands {
 public:
  // A tpu tensor; a CPU wrapped number (Python scalar) becomes a scalar operand; another CPU
  // 0-dim tensor is uploaded (keeping PyTorch's zero-dim promotion priority). The tensor is
  // read again by run() (the result's layout: see result_order), so an lvalue is borrowed and
  // must outlive that run() call (function arguments and the caller's tensors do); a temporary
  // is kept. Borrowing saves a reference-count round trip per operand (~0.1 us an op).
  Operands& t(const at::Tensor& t);
  Operands& t(at::Tensor&& t);
  Operands& s(const at::Scalar& s);
  Operands& f(double v);
  Operands& absent();
  const DfuseOperand* data() const { return ops_.data(); }
  size_t size() const { return ops_.size(); }
  // The tpu tensor operands' footprints, for run_into's overlap check.
  c10::ArrayRef<Footprint> tpu_footprints() const { return tpu_; }
  // The dims of an elementwise result from slowest to fastest in memory, by PyTorch's
  // TensorIterator rule (reorder_dimensions) over these operands' strides; empty when that is
  // the contiguous order (always so when every tensor operand is contiguous).
  DimVec result_order() const;
  // These operands with every tensor of rank > 0 broadcast to the result's shape and permuted
  // by `order`.
  Operands permuted(at::IntArrayRef order) const;

 private:
  // Inline for the common arities (unary to where/clamp/addmm); cat's longer lists spill to
  // the heap.
  static constexpr unsigned kInline = 4;
  c10::SmallVector<DfuseOperand, kInline> ops_;
  c10::SmallVector<Ref, kInline> keep_;
  c10::SmallVector<Footprint, kInline> tpu_;
  Operands& add(c10::MaybeOwned<at::Tensor> kept);
  // The tensor operands' broadcast shape.
  DimVec result_shape() const;
  // Every tensor operand as given (index into ops_), for result_order and permuted.
  c10::SmallVector<std::pair<size_t, c10::MaybeOwned<at::Tensor>>, kInline> tensors_;
};

DfuseAttrs attrs_sub(uint32_t sub_op);

// Records an op producing a new tensor.
at::Tensor run(uint32_t kind, const DfuseAttrs* attrs, const Operands& in, const char* name);
// Records an op writing its result into `out` (any view) in place. Like PyTorch's
// TensorIterator it refuses an `out` that partially overlaps an input (the transpose of an
// input, a shifted window of it): the result would depend on the order elements are written.
void run_into(uint32_t kind, const DfuseAttrs* attrs, const Operands& in, const at::Tensor& out,
              const char* name);
// run_into for an op PyTorch does not check that way (addmm_): an input that partly overlaps
// `out` is read from a copy the runtime takes first, so the result is computed from the
// operands' values before the op.
void run_into_from_old_values(uint32_t kind, const DfuseAttrs* attrs, const Operands& in,
                              const at::Tensor& out, const char* name);

// A CPU copy of a tpu tensor whose values decide the size of an op's output (nonzero, boolean
// masks, unique): a sync point counted as DFUSE_SYNC_REASON_DATA_DEPENDENT_SIZE, not HOST_READ.
at::Tensor read_for_size(const at::Tensor& src);

// Shorthands used by composite kernels (softmax, losses, backward formulas).
at::Tensor unary(const at::Tensor& x, uint32_t op);
at::Tensor binary(const at::Tensor& a, const at::Tensor& b, uint32_t op);
at::Tensor binary(const at::Tensor& a, const at::Scalar& b, uint32_t op);
at::Tensor binary(const at::Scalar& a, const at::Tensor& b, uint32_t op);
at::Tensor reduce(const at::Tensor& x, uint32_t op, at::IntArrayRef dims, bool keepdim);

// Whether a torch.func transform (grad, vmap, jvp) is active: the check
// torch::autograd::Function::apply makes, which raises then. A kernel with a C++ autograd
// Function of its own takes PyTorch's composite instead.
bool under_functorch_transform();

// `s - t` and `s / t` for a double `s` in this namespace's kernels: ordinary lookup finds these
// before ATen's operators (TensorOperators.h), which fill a new tensor with `s` and subtract or
// divide in place: three recorded ops (empty_like, fill_, sub_) and three programs in strict
// mode for each `1.0 - y` of a backward formula. Below autograd, on a float32/float64 `t`, one
// binary op with the scalar first gives the same bits (the scalar is rounded to t's dtype
// either way); elsewhere ATen's form stays (it keeps an int64 `1 - t` int64, and above
// autograd it records the gradient graph).
at::Tensor operator-(double s, const at::Tensor& t);
at::Tensor operator/(double s, const at::Tensor& t);

// t [N, C, spatial...] summed (op SUM) or averaged (MEAN) over every dim but the channels
// (batch norm's statistics and gradients, group norm's and a conv's bias gradients). In
// float32/float64 the runtime reduces the spatial dims first, then the batch, with no
// channel-major copy of t (`trailing_then_leading` in fusion/src/reduce_geometry.rs).
at::Tensor reduce_but_channels(const at::Tensor& t, uint32_t op);
at::Tensor cast(const at::Tensor& x, at::ScalarType to);
// a @ b of float16/bfloat16 tensors (2-D, or batched), summed and returned in float32
// (DFUSE_OP_KIND_WIDE_MATMUL: on AVX512-BF16 cores at the bf16 kernel's rate, twice float32's):
// a convolution's contributions whose windows are summed in float32, an autocast RNN's products.
at::Tensor wide_matmul(const at::Tensor& a, const at::Tensor& b);

// float16 and bfloat16, which PyTorch's CPU kernels compute in float32 (their "opmath" type)
// and round once; composed kernels that round each op in the half type drift from CPU's bits.
bool is_reduced_float(at::ScalarType t);

// CPU's refusal of a kernel that takes floating and complex dtypes only: NotImplementedError
// `"kernel" not implemented for 'Long'` for any other dtype `t`.
void check_float_kernel(at::ScalarType t, const char* kernel);

// The dtype an op with a floating result gives for x: x's own when floating, else the default
// float dtype (integers and bools promote, as TensorIterator's float ops do on CPU).
at::ScalarType float_dtype(const at::Tensor& x);

// x in its opmath dtype: cast to float32 when float16 or bfloat16, else x itself.
at::Tensor opmath(const at::Tensor& x);
std::optional<at::Tensor> opmath(const std::optional<at::Tensor>& x);

// `kernel(x)` for a composed kernel whose CPU counterpart computes half inputs in float32:
// x is computed in float32 and the result rounded once to x's dtype.
template <typename Kernel>
at::Tensor rounded_once(const at::Tensor& x, Kernel kernel) {
  if (!is_reduced_float(x.scalar_type())) return kernel(x);
  return cast(kernel(cast(x, at::kFloat)), x.scalar_type());
}

// The same for a composed kernel of two tensors (an activation's backward of grad and its
// input or output): both computed in float32 when either is a half type, the result rounded
// once to their promoted dtype, as CPU's TensorIterator gives.
template <typename Kernel>
at::Tensor rounded_once(const at::Tensor& a, const at::Tensor& b, Kernel kernel) {
  if (!is_reduced_float(a.scalar_type()) && !is_reduced_float(b.scalar_type())) {
    return kernel(a, b);
  }
  return cast(kernel(opmath(a), opmath(b)), at::promote_types(a.scalar_type(), b.scalar_type()));
}
at::Tensor where(const at::Tensor& c, const at::Tensor& a, const at::Scalar& b);

// A uint8 view of a storage of another dtype (how PyTorch copies raw storages): true when `t`
// is one; byte_view_ref then gives a handle to the same bytes as the storage's own elements
// (and their dtype in *elem), or raises a clear error when the view splits elements.
bool is_byte_view(const at::Tensor& t);
Ref byte_view_ref(const at::Tensor& t, at::ScalarType* elem);

// Raw byte storages (torch.UntypedStorage on tpu, which torch.load fills) are retyped to the
// element dtype of the first typed tensor used on them.
void retype_byte_storage(const at::Tensor& t);

// tpu -> tpu copy_ between uint8 tensors where the source views a typed storage's bytes
// (UntypedStorage.clone, which copy.deepcopy of a tensor uses): the elements are copied, and a
// raw byte destination storage takes the source's element type. False when `src` is no such
// view; raises a clear error where the copy would reinterpret elements.
bool copy_storage_bytes(const at::Tensor& dst, const at::Tensor& src);

// The device's counters of ops that went to the CPU fallback.
void count_fallback(const std::string& name);

// Runs an out= or in-place op that has no tpu kernel through its functional overload's tpu
// kernel and a copy (out_variants.cpp); false, with the stack untouched, where it cannot, and
// the CPU fallback runs it.
bool run_through_functional(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// One ATen op whose kernel records several dfuse_op calls runs in strict mode as that op's own
// fused program(s), not one program per recorded piece (dfuse_op_group_begin/end): PyTorch's
// CPU kernel for layer_norm or lerp_ is one pass over memory, and strict mode's "each op its own
// program" means the ATen op. The group ends after the kernel has returned, when its
// intermediates are released, so they are never written. Only strict mode opens one (debug
// keeps its per-piece checks; defer fuses anyway). Register such a kernel with
// DFT_GROUPED(fn) in place of TORCH_FN(fn).
class OpGroup {
 public:
  OpGroup();
  OpGroup(const OpGroup&) = delete;
  OpGroup& operator=(const OpGroup&) = delete;
  // Ends a group end() did not (the kernel threw): its recorded ops still run, errors dropped.
  ~OpGroup();
  // Ends the group, running its ops; raises their launch's error.
  void end();

 private:
  bool open_ = false;
};

template <class F, F f>
struct Grouped;

template <class R, class... A, R (*f)(A...)>
struct Grouped<R (*)(A...), f> {
  static R call(A... a) {
    OpGroup g;
    if constexpr (std::is_void_v<R>) {
      f(std::forward<A>(a)...);
      g.end();
    } else {
      R r = f(std::forward<A>(a)...);
      g.end();
      return r;
    }
  }
};

#define DFT_GROUPED(fn) TORCH_FN((::dft::Grouped<decltype(&fn), &fn>::call))

}  // namespace dft
